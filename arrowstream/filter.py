"""Row filtering with a ``pyarrow.compute`` expression.

The expression is evaluated vectorized on each record batch; rows where it is
false or null are dropped and counted as ``filtered``. Before reading, the
row-group statistics the manifest kept from the Parquet footers rule out whole
row groups that cannot match (pyarrow's own rules judge them), so they are
never read.

Deterministic: the same expression on the same data keeps the same rows.
"""

from __future__ import annotations

import hashlib
import pickle
import re
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from arrowstream.core.stage import Stage
from arrowstream.errors import ConfigError, SchemaError
from arrowstream.io.chunk import Chunk
from arrowstream.io.manifest import Manifest

__all__ = ["Filter", "matching", "prune_shards"]

_SEQ = "__arrowstream_seq__"


class Filter(Stage):
    """Keep the rows where ``expr`` is true.

    Parameters
    ----------
    expr
        A boolean ``pyarrow.compute.Expression`` over the dataset's columns,
        for example ``pc.field("lang") == "en"``.

    Examples
    --------
    >>> import numpy as np, pyarrow as pa, pyarrow.compute as pc
    >>> from arrowstream.io.chunk import Chunk
    >>> batch = pa.record_batch({"n": [1, 5, 9]})
    >>> chunk = Chunk(epoch=0, shard=0, seq_start=0, seq_end=3, row_start=0,
    ...               seq=np.arange(3), batch=batch)
    >>> [out] = Filter(pc.field("n") > 2).apply(chunk)
    >>> out.seq.tolist(), out.skipped["filtered"].tolist()
    ([1, 2], [0])
    """

    name = "filter"
    counters = ("filtered", "pruned_rows")

    def __init__(self, expr: pc.Expression) -> None:
        if not isinstance(expr, pc.Expression):
            raise ConfigError(
                f"`filter` expects a pyarrow.compute.Expression such as "
                f"`pc.field('lang') == 'en'`, got {type(expr).__name__!r}"
            )
        self.expr = expr

    def spec(self) -> dict[str, Any]:
        # str() abbreviates long expressions (large `isin` lists), so the identity
        # also hashes the expression's full serialized form.
        digest = hashlib.sha256(pickle.dumps(self.expr, protocol=4)).hexdigest()[:16]
        return {"expr": str(self.expr), "expr_hash": digest}

    def columns(self) -> set[str] | None:
        return None  # pyarrow does not expose an expression's fields: read every column

    def check(self, manifest: Manifest, schema: pa.Schema) -> pa.Schema:
        try:
            schema.empty_table().filter(self.expr)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            drift = "".join(f"; {m}" for m in manifest.drift.values())
            missing = re.search(r"No match for FieldRef\.Name\(([^)]*)\)", str(exc))
            if missing and missing.group(1) in manifest.drift:  # in some files only: `columns=` cannot help
                reason = f"column `{missing.group(1)}` is not among them: {manifest.drift[missing.group(1)].split(': every')[0]}"
                fix = "filter on a column every file has, or add it to the files that lack it"
                drift = ""
            elif missing:
                reason = f"column `{missing.group(1)}` is not among them"
                fix = "add the columns it uses to `columns=` or fix the expression"
            else:  # a value of another type, most often
                reason = " ".join(str(exc).split())
                fix = "compare each column with a value of its type"
            raise SchemaError(
                f"filter {self.expr} does not apply to the columns read {schema.names!r} "
                f"(first file {manifest.paths[0]!r}): {reason}; {fix}{drift}"
            ) from exc
        return schema

    def prune(self, manifest: Manifest) -> np.ndarray:
        return prune_shards(manifest, self.expr)

    def run(self, piece: Chunk) -> Chunk:
        assert piece.batch is not None
        tagged = piece.batch.append_column(_SEQ, pa.array(piece.seq, type=pa.int64()))
        kept = matching(tagged, self.expr).column(_SEQ).to_numpy()
        keep = np.isin(piece.seq, kept, assume_unique=True)
        return piece.with_rows(keep, "filtered")


def matching(batch: pa.RecordBatch, expr: pc.Expression) -> pa.Table:
    """Return the rows of ``batch`` where ``expr`` is true, computed in the calling thread.

    ``RecordBatch.filter(expr)`` runs an Acero plan on Arrow's thread pool, whose
    threads may still be releasing the batch's buffers just after it returns; a
    buffer that wraps a numpy array (the sequence column, token ids) takes the
    GIL to be released, and a thread that does so while Python finalizes aborts
    the process ("terminate called without an active exception"). Run without
    threads, the plan is done when this returns.

    Examples
    --------
    >>> import pyarrow as pa, pyarrow.compute as pc
    >>> matching(pa.record_batch({"n": [1, 2, 3]}), pc.field("n") > 1).column("n").to_pylist()
    [2, 3]
    """
    acero = _acero()
    plan = acero.Declaration.from_sequence([
        acero.Declaration("table_source", acero.TableSourceNodeOptions(pa.Table.from_batches([batch]))),
        acero.Declaration("filter", acero.FilterNodeOptions(expr)),
    ])
    return plan.to_table(use_threads=False)


def _acero() -> Any:
    """Return ``pyarrow.acero``, imported on first use: importing it costs a process about 0.15 s (it imports pandas)."""
    import pyarrow.acero as acero

    return acero


def prune_shards(manifest: Manifest, expr: pc.Expression) -> np.ndarray:
    """Return a boolean mask over shards: false where statistics prove no row matches.

    The statistics come from the manifest's one footer pass (no file is read
    again); row groups without statistics are kept.
    """
    return manifest.matching_shards(expr)
