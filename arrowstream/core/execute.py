"""Running a pipeline's stages over its source chunks: lazily, in order, errors located.

Each stage first *splits* a chunk into pieces (cheap, in order) and then
*runs* each piece. A stage marked ``expensive`` (tokenization) runs its pieces
in the iterator's thread pool, a bounded number at once, and the results come
back in order: two batch-encoder calls in flight keep the tokenizer's own
thread pool busy between calls, where one call at a time leaves a core idle
while the slowest document of a slice finishes. Output never depends on the
pool: pieces are independent and their order is kept.

Any error of the library's raised while splitting or running gets the file,
row group and rows it happened in prepended, keeping its type; another
(raised by a stage of the user's own) keeps its message, with a note of
where. Every chunk a stage gives back must keep its batch's rows, its
documents and its token offsets in step: rows dropped without
``Chunk.with_rows`` (which counts them) would be lost silently.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

import pyarrow as pa

from arrowstream.core.stage import Stage
from arrowstream.errors import ArrowStreamError, SchemaError, Sink, forward_warnings, warn_user, warnings_sink
from arrowstream.io.chunk import Chunk

__all__ = ["ordered_map", "run_stages"]

T = TypeVar("T")
R = TypeVar("R")


def ordered_map(
    pool: Executor, fn: Callable[[T], R], items: Iterable[T], *, in_flight: int
) -> Iterator[R]:
    """Apply ``fn`` to ``items`` in ``pool``, at most ``in_flight`` at once, yielding in order.

    The first item runs alone and the allowance grows by one with each result,
    so the first result is not slowed by work submitted beside it. An exception
    raised by ``fn`` is raised here, with its traceback, when its item's turn
    comes; pending work is cancelled.

    Examples
    --------
    >>> from concurrent.futures import ThreadPoolExecutor
    >>> with ThreadPoolExecutor(2) as pool:
    ...     list(ordered_map(pool, lambda x: x * x, range(6), in_flight=2))
    [0, 1, 4, 9, 16, 25]
    """
    pending: deque[Future[R]] = deque()
    done = 0
    outbox: deque[Any] = deque()  # the pool's warnings, warned here (or sent where this thread's go)
    sink = warnings_sink() or outbox.append

    def result() -> R:
        out = pending.popleft().result()
        while outbox:
            warn_user(*outbox.popleft())
        return out

    try:
        for item in items:
            pending.append(pool.submit(_warning_to, sink, fn, item))
            if len(pending) >= min(in_flight, done + 1):
                yield result()
                done += 1
        while pending:
            yield result()
    finally:
        for future in pending:
            future.cancel()


def _warning_to(sink: Sink | None, fn: Callable[[T], R], item: T) -> R:
    """``fn(item)`` in a pool thread, its warnings sent to ``sink`` (that of the thread that submitted it)."""
    forward_warnings(sink)
    try:
        return fn(item)
    finally:
        forward_warnings(None)


def run_stages(
    stages: Iterable[Stage],
    chunks: Iterable[Chunk],
    *,
    where: Callable[[Chunk], str],
    pool: Executor | None,
    in_flight: int,
) -> Iterator[Chunk]:
    """Chain ``stages`` over ``chunks``; ``where(chunk)`` names a chunk's place for errors."""
    stream: Iterable[Chunk] = chunks
    for stage in stages:
        stream = _run_stage(stage, stream, where, pool, in_flight)
    return iter(stream)


def _run_stage(
    stage: Stage,
    stream: Iterable[Chunk],
    where: Callable[[Chunk], str],
    pool: Executor | None,
    in_flight: int,
) -> Iterator[Chunk]:
    def split_all() -> Iterator[Chunk]:
        warm = 0
        for chunk in stream:
            pieces = _located(stage, chunk, where, lambda: list(stage.split(chunk, warm=warm)))
            warm += len(pieces)
            for piece in pieces:
                yield _in_step(stage, piece, where)

    pieces = split_all()

    def run(piece: Chunk) -> Chunk:
        return _in_step(stage, _located(stage, piece, where, lambda: stage.run(piece)), where)

    if pool is None or not stage.expensive or in_flight < 2:
        return map(run, pieces)
    return ordered_map(pool, run, pieces, in_flight=in_flight)


def _located(stage: Stage, chunk: Chunk, where: Callable[[Chunk], str], call: Callable[[], Any]) -> Any:
    try:
        return call()
    except ArrowStreamError as exc:
        raise type(exc)(f"{where(chunk)}: {exc}") from exc
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
        raise SchemaError(f"{where(chunk)}: `{stage.name}` failed: {exc}") from exc
    except Exception as exc:  # a stage of the user's own (`.pipe`): its error keeps its type, with a note of where
        if hasattr(exc, "add_note"):  # Python 3.11 on
            exc.add_note(f"arrowstream: raised by stage `{stage.name}` {where(chunk)}")
        raise


def _in_step(stage: Stage, chunk: Chunk, where: Callable[[Chunk], str]) -> Chunk:
    """``chunk``, once its rows, documents and token offsets are checked to agree (a stage's own may not)."""
    docs = chunk.num_docs
    rows = None if chunk.batch is None else chunk.batch.num_rows
    offsets = None if chunk.offsets is None else chunk.offsets.size - 1
    if (rows is not None and rows != docs) or (offsets is not None and offsets != docs):
        found = [f"{rows} rows in `batch`"] if rows is not None else []
        found += [f"{offsets} documents of tokens (`offsets`)"] if offsets is not None else []
        raise SchemaError(
            f"{where(chunk)}: stage `{stage.name}` gave {docs} documents (`seq`) but {' and '.join(found)}: a "
            "stage keeps them in step; to drop rows use `chunk.with_rows(keep, reason)`, which counts them"
        )
    return chunk
