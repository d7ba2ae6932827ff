"""The package's layers: imports flow one way, and no module imports itself back.

Layers, lowest first (a module may import its own layer and the ones below):

0. ``errors``, ``state``, ``checks``: the vocabulary every other part shares;
1. ``io``: the manifest, each epoch's layout, chunks, the reader, the source;
2. ``core``: the stage protocol and the execution of stages;
3. the stages: ``filter``, ``tokenize``, ``pack``;
4. ``distributed``: consumers, work, merged states, even-batches targets;
5. ``pipeline``: the description, its plan, its iterator;
6. what users reach first: ``pytorch`` (with ``collation``, what a
   DataLoader does with its batches, ``handover`` and ``slots``, how its
   workers hand batches over, and ``single_process``, how it is iterated
   without workers), ``huggingface``, ``analysis``,
   ``testing``, ``cli`` and the package itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "arrowstream"

LAYERS = {
    "errors": 0, "state": 0, "checks": 0,
    "io": 1,
    "core": 2,
    "filter": 3, "tokenize": 3, "pack": 3,
    "distributed": 4,
    "pipeline": 5,
    "pytorch": 6, "collation": 6, "handover": 6, "slots": 6, "single_process": 6, "mixture": 6, "huggingface": 6, "checkpoint": 6, "analysis": 6, "testing": 6, "cli": 6, "__init__": 6, "__main__": 6,
}

#: Imports allowed upward, each with its reason.
UPWARD = {
    # an optional dependency, imported when a user asks for it (torch is not required)
    ("arrowstream.pipeline.dataset", "arrowstream.pytorch"),
}


def _name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 1 else parts)


def _layer(module: str) -> int:
    parts = module.split(".")
    return LAYERS[parts[1]] if len(parts) > 1 else LAYERS["__init__"]


def _imports() -> dict[str, list[tuple[str, bool]]]:
    """Map every module to the package modules it imports, and whether at module level."""
    modules = {_name(p): p for p in PACKAGE.rglob("*.py")}
    out: dict[str, list[tuple[str, bool]]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        top = set(map(id, tree.body))
        found = []
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("arrowstream"):
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
                found += [(t, id(node) in top) for t in targets if t in modules]
            elif isinstance(node, ast.Import):
                found += [(a.name, id(node) in top) for a in node.names if a.name in modules]
        out[name] = found
    return out


def test_every_module_has_a_layer() -> None:
    missing = {m for m in _imports() if len(m.split(".")) > 1 and m.split(".")[1] not in LAYERS}
    assert not missing, f"give these a layer in LAYERS: {sorted(missing)}"


def test_imports_flow_down_the_layers() -> None:
    upward = [
        (m, t)
        for m, targets in _imports().items()
        for t, _ in targets
        if _layer(t) > _layer(m) and (m, t) not in UPWARD
    ]
    assert not upward, f"upward imports: {upward}"


def test_no_import_cycles() -> None:
    graph = {m: {t for t, at_top in ts if at_top and t != m} for m, ts in _imports().items()}
    # a package's __init__ importing its own submodules is how a package exports; the
    # submodules importing the package back is the cycle to catch
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                raise AssertionError(f"import cycle: {' -> '.join(path[path.index(nxt):] + [nxt])}")
            if nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])


def test_the_layering_test_sees_an_upward_import() -> None:
    """Guards the guard: the reader importing the pipeline would be upward."""
    assert _layer("arrowstream.pipeline.reading") > _layer("arrowstream.io.reader")
    assert ("arrowstream.io.source", True) in [
        (t, top) for t, top in _imports()["arrowstream.pipeline.reading"]
    ]


def test_no_module_is_over_500_lines() -> None:
    long = {
        str(p.relative_to(PACKAGE.parent)): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > 500
    }
    assert not long, f"split these into modules of one concept each: {long}"


def test_checkpoint_folders_need_no_transformers() -> None:
    """A plain PyTorch loop saves and loads data states without the Hugging Face extra."""
    tree = ast.parse((PACKAGE / "checkpoint.py").read_text(encoding="utf-8"))
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in (node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")])
    }
    assert "transformers" not in imported and "accelerate" not in imported, imported
