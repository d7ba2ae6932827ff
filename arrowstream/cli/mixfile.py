"""A mixture described in a file, for ``stream --mixture`` and ``analyze --mixture``.

The file is JSON (or YAML, with the same keys, when its name ends in
``.yaml`` or ``.yml``; reading it needs PyYAML)::

    {
      "sources": {
        "web":  {"path": "data/web", "filter": "lang == 'en'"},
        "code": {"path": "data/code", "column": "content"}
      },
      "weights": {"web": 0.7, "code": 0.3},
      "seed": 0,
      "max_epochs": {"code": 4},
      "num_tokens": 1000000000
    }

``weights`` may also be stages, ``[[0, {...}], [start_tokens, {...}]]``.
Relative paths are taken from the file's directory. Every source is
tokenized with ``--tokenizer``; ``column`` defaults to ``--column``;
``filter`` takes the ``--filter`` syntax; ``manifest`` names the source's
manifest file (``arrowstream manifest``). ``num_tokens`` (optional) is the
run's budget: ``analyze`` reports on it, ``stream`` ends there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from arrowstream.cli.common import UsageError, read_json
from arrowstream.cli.expressions import FilterSyntaxError, parse_filter
from arrowstream.errors import ArrowStreamError
from arrowstream.mixture import Mixture, mix
from arrowstream.pipeline.dataset import read_parquet

__all__ = ["load_mixture"]

_KEYS = {"sources", "weights", "seed", "max_epochs", "num_tokens", "reweight"}
_SOURCE_KEYS = {"path", "column", "filter", "manifest"}


def load_mixture(
    path: str, *, tokenizer: str, column: str, add_special_tokens: bool = True, cache: str | None = None,
    cache_write: bool = True,
) -> tuple[Mixture, int | None]:
    """Return the mixture ``path`` describes (tokenized with ``tokenizer``) and its token budget, if any.

    Raises
    ------
    UsageError
        The file cannot be read, is not JSON, or misses or misnames a key;
        the message starts with ``--mixture PATH`` and names the key.
    """
    where = f"--mixture {path}"
    yaml_file = Path(path).suffix.lower() in (".yaml", ".yml")
    spec = _read_yaml(path) if yaml_file else read_json("--mixture", path, "a mixture file (see docs/mixtures.md)")
    if not isinstance(spec, dict) or not isinstance(spec.get("sources"), dict) or "weights" not in spec:
        kind = "a YAML mapping" if yaml_file else "a JSON object"
        raise UsageError(f"{where}: expected {kind} with `sources` (name -> {{\"path\": ...}}) and `weights`")
    unknown = sorted(set(spec) - _KEYS)
    if unknown:
        raise UsageError(f"{where}: unknown key(s) {unknown}; the keys are {sorted(_KEYS)}")
    base = Path(path).resolve().parent
    sources = {}
    for name, src in spec["sources"].items():
        if not isinstance(src, dict) or "path" not in src:
            raise UsageError(f"{where}: source {name!r} should be an object with a `path`, got {src!r}")
        odd = sorted(set(src) - _SOURCE_KEYS)
        if odd:
            raise UsageError(f"{where}: source {name!r} has unknown key(s) {odd}; its keys are {sorted(_SOURCE_KEYS)}")
        data = src["path"] if "://" in str(src["path"]) else str(base / src["path"])
        try:
            manifest = src.get("manifest")
            if manifest is not None and "://" not in str(manifest):
                manifest = str(base / manifest)
            ds = read_parquet(data, manifest=manifest)
            if src.get("filter"):
                ds = ds.filter(parse_filter(src["filter"]))
            options: dict[str, Any] = {"column": src.get("column", column), "add_special_tokens": add_special_tokens}
            if cache:  # one directory a source: their files may share relative paths
                options.update(cache=str(Path(cache) / name), cache_write=cache_write)
            sources[name] = ds.tokenize(tokenizer, **options)
        except FilterSyntaxError as exc:
            raise UsageError(f"{where}: source {name!r}: filter {src['filter']!r}: {exc}") from exc
        except ArrowStreamError as exc:
            raise UsageError(f"{where}: source {name!r}: {exc}") from exc
    weights = spec["weights"]
    if isinstance(weights, list):
        weights = [tuple(stage) if isinstance(stage, list) else stage for stage in weights]
    reweight = spec.get("reweight", False)
    if not isinstance(reweight, bool):
        raise UsageError(f"{where}: `reweight` should be true or false, got {reweight!r}")
    try:
        mixture = mix(sources, weights, seed=spec.get("seed", 0), max_epochs=spec.get("max_epochs"), reweight=reweight)
    except ArrowStreamError as exc:
        raise UsageError(f"{where}: {exc}") from exc
    budget = spec.get("num_tokens")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
        raise UsageError(f"{where}: `num_tokens` should be a whole number of at least 1, got {budget!r}")
    return mixture, budget


def _read_yaml(path: str) -> Any:
    """Return the YAML file ``path`` (a mixture file ending in ``.yaml`` or ``.yml``), read with PyYAML."""
    try:
        import yaml
    except ImportError as exc:
        raise UsageError(
            f"--mixture {path}: reading YAML needs PyYAML: pip install 'arrowstream[yaml]', or write the file as JSON"
        ) from exc
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise UsageError(f"--mixture {path}: cannot read it: {exc.strerror or exc}") from exc
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise UsageError(f"--mixture {path}: the file is not YAML ({exc}): pass a mixture file (see docs/mixtures.md)") from exc
