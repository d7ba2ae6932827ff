"""What a pipeline description implies before anything is read: its columns, options and prefetch depth.

:class:`Description` names what these read off a description
(:class:`~arrowstream.Dataset` has it all). :func:`columns_to_read` and
:func:`pipeline_options` give the columns a pipeline reads and the
JSON-able options that define its output (they enter every state and its
hash); :func:`prefetch_depth` how many chunks a background thread reads ahead.
"""

from __future__ import annotations

from typing import Any, Protocol

from arrowstream.core.stage import Stage
from arrowstream.errors import SchemaError
from arrowstream.io.manifest import Manifest
from arrowstream.pack import Packer

__all__ = ["Description", "columns_to_read", "pipeline_options", "prefetch_depth"]


class Description(Protocol):
    """What a plan reads off a pipeline description (:class:`~arrowstream.Dataset` has it all)."""

    manifest: Manifest
    columns: tuple[str, ...] | None
    num_epochs: int | None
    batch_rows: int
    prefetch: int | None
    seed: int | None
    window: int
    fragments: int
    stages: tuple[Stage, ...]
    packer: Packer | None
    added_files: str


def columns_to_read(description: Description) -> tuple[str, ...]:
    """Return the columns a pipeline reads: ``columns=`` if given; else, packed, those its stages name; else all.

    Raises
    ------
    SchemaError
        A column to read drifts between files (missing or of another type).
    """
    if description.columns is not None:
        return description.columns
    manifest = description.manifest
    names = list(manifest.schema.names)
    if description.packer is not None:
        needed: set[str] | None = set()
        for stage in description.stages:
            cols = stage.columns()
            needed = None if cols is None or needed is None else needed | cols
        if needed is not None:
            return tuple(n for n in names if n in needed)
    if manifest.drift:
        problem = next(iter(manifest.drift.values()))
        raise SchemaError(
            f"{problem}; this pipeline reads every column: pass `columns=` to read_parquet "
            "with the columns it needs"
        )
    return tuple(names)


def pipeline_options(description: Description, columns: tuple[str, ...]) -> dict[str, Any]:
    """Return the JSON-able options that define a pipeline's output (they enter every state)."""
    source: dict[str, Any] = {"columns": list(columns)}
    if description.packer is None:
        source["batch_rows"] = description.batch_rows
    if description.seed is not None:
        source["shuffle"] = {"seed": description.seed, "window": description.window, "fragments": description.fragments}
    return {
        "source": source,
        "stages": [{"name": s.name, **s.spec()} for s in description.stages],
        "pack": None if description.packer is None else description.packer.spec(),
    }


def prefetch_depth(prefetch: int | None, stages: tuple[Stage, ...]) -> int:
    """``prefetch``, or for ``None`` 2 when the pipeline reads token ids (reading is the work), else 0."""
    if prefetch is not None:
        return prefetch
    return 2 if any(s.reads_token_ids for s in stages) else 0
