"""Data states in checkpoint folders: one JSON file per rank, written whole, loaded on any topology.

:func:`save_data_state` writes a :class:`~arrowstream.pytorch.StatefulLoader`'s
state into ``<checkpoint>/arrowstream/rank-<rank>-of-<world_size>.json``
(a temporary file, then a rename: never half a file); :func:`load_data_state`
loads it back: each rank its own file on the topology that saved it,
every rank's files merged (:func:`arrowstream.merge_states`) on another.
A plain PyTorch loop calls them next to its model checkpoint;
:class:`arrowstream.huggingface.DataStateCallback` calls them for the
Hugging Face ``Trainer``. Needs ``torch`` (``pip install 'arrowstream[torch]'``),
not transformers.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from arrowstream.errors import StateError
from arrowstream.mixture.merge import merge_states

if TYPE_CHECKING:
    from arrowstream.pytorch import StatefulLoader

__all__ = ["STATE_DIR", "load_data_state", "load_state", "save_data_state", "save_state"]

#: Folder inside a checkpoint that holds one data-state file per rank.
STATE_DIR = "arrowstream"

_FILE_RE = re.compile(r"^rank-(\d{5})-of-(\d{5})\.json$")


def _file_name(rank: int, world_size: int) -> str:
    return f"rank-{rank:05d}-of-{world_size:05d}.json"


def _num_workers(loader: StatefulLoader) -> int:
    """Return how many consumers the loader runs on this rank (no workers is one consumer)."""
    return max(1, int(loader.kwargs.get("num_workers") or 0))


def save_data_state(checkpoint_dir: str | os.PathLike[str], loader: StatefulLoader) -> Path:
    """Write this rank's data state into a checkpoint folder, atomically.

    Every rank calls it at the same step; each writes its own file
    ``<checkpoint_dir>/arrowstream/rank-<rank:05d>-of-<world_size:05d>.json``.
    Files left there by a run with another world size no longer describe the
    checkpoint (its model was just overwritten) and are removed.

    Parameters
    ----------
    checkpoint_dir
        The checkpoint folder (created if missing).
    loader
        The loader the trainer iterates.

    Returns
    -------
    Path
        The file written.

    Examples
    --------
    >>> from arrowstream import read_parquet
    >>> from arrowstream.pytorch import StatefulLoader
    >>> from arrowstream.testing import example_dir
    >>> d = example_dir()
    >>> ds = read_parquet(d).tokenize(None, column="ids", eos_id=0).pack(seq_len=4, batch_size=2)
    >>> loader = StatefulLoader(ds.to_torch())
    >>> first = next(iter(loader))
    >>> save_data_state(f"{d}/checkpoint-1", loader).relative_to(d).as_posix()
    'checkpoint-1/arrowstream/rank-00000-of-00001.json'
    """
    rank, world_size, _, _ = loader.dataset.topology()
    folder = Path(checkpoint_dir) / STATE_DIR
    path = folder / _file_name(rank, world_size)
    save_state(path, loader.state_dict())
    for stale in folder.iterdir():
        match = _FILE_RE.match(stale.name)
        if match and int(match.group(2)) != world_size:
            stale.unlink(missing_ok=True)  # several ranks may remove the same file
    return path


def save_state(path: str | os.PathLike[str], state: dict[str, Any]) -> Path:
    """Write ``state`` (any iterator's or loader's ``state_dict()``) to ``path`` as JSON, whole or not at all.

    For a plain training loop next to its model checkpoint. The JSON goes to
    a temporary file beside ``path``, is flushed to disk, then renamed over
    ``path``: a crash, a full disk or a file-size limit leaves the previous
    file as it was, never half a state.

    Raises
    ------
    StateError
        The file could not be written (the message says why); ``path``
        still holds the previous state, if there was one.

    Examples
    --------
    >>> import tempfile
    >>> from arrowstream import read_parquet
    >>> from arrowstream.testing import example_dir
    >>> it = read_parquet(example_dir()).iter()
    >>> _ = next(it)
    >>> path = save_state(f"{tempfile.mkdtemp()}/data-state.json", it.state_dict())
    >>> load_state(path) == it.state_dict()
    True
    """
    target = Path(path)
    text = json.dumps(state)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as exc:
        raise StateError(f"cannot write the data state in {str(target.parent)!r}: {exc.strerror or exc}") from exc
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except OSError as exc:  # a full disk, a quota, a file-size limit: the checkpoint is not complete
        Path(tmp).unlink(missing_ok=True)
        raise StateError(
            f"cannot write the data state {str(target)!r}: {exc.strerror or exc}; the previous state file "
            "(if any) is unchanged: free space (or raise the limit) and save again"
        ) from exc
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def load_state(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a state :func:`save_state` wrote (pass it to ``iter(state)`` or ``load_state_dict``).

    Raises
    ------
    StateError
        The file is missing, unreadable or not JSON.
    """
    try:
        state = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise StateError(f"cannot read the data state {os.fspath(path)!r}: {exc}; resume from an intact checkpoint") from exc
    if not isinstance(state, dict):
        raise StateError(f"{os.fspath(path)!r} holds no state (expected a JSON object): write it with `save_state`")
    return state


def load_data_state(checkpoint_dir: str | os.PathLike[str], loader: StatefulLoader) -> None:
    """Load the data state saved in a checkpoint folder into ``loader``.

    With the world size and the number of DataLoader workers of the run that
    saved it, this rank loads its own file and continues byte for byte (only
    that file is needed, so node-local checkpoint folders work). Otherwise
    every rank's file is merged with :func:`~arrowstream.merge_states` and the
    merged state loads on this topology. Call it before iterating the loader.

    Parameters
    ----------
    checkpoint_dir
        The checkpoint folder given to :func:`save_data_state`.
    loader
        A new loader over the same pipeline.

    Raises
    ------
    StateError
        The folder holds no data state, the file of a rank needed is missing,
        or the files come from runs of different world sizes (the error says
        which and how to fix it); ``merge_states`` errors pass through.

    Examples
    --------
    >>> from arrowstream import read_parquet
    >>> from arrowstream.pytorch import StatefulLoader
    >>> from arrowstream.testing import example_dir
    >>> d = example_dir()
    >>> ds = read_parquet(d).tokenize(None, column="ids", eos_id=0).pack(seq_len=4, batch_size=2)
    >>> loader = StatefulLoader(ds.to_torch())
    >>> first = next(iter(loader))
    >>> _ = save_data_state(f"{d}/checkpoint-1", loader)
    >>> resumed = StatefulLoader(ds.to_torch())
    >>> load_data_state(f"{d}/checkpoint-1", resumed)
    >>> len(list(resumed))  # the 5 batches (of 6) the first loader had not handed out yet
    5
    """
    folder = Path(checkpoint_dir) / STATE_DIR
    files: dict[int, dict[int, Path]] = {}
    if folder.is_dir():
        for path in folder.iterdir():
            match = _FILE_RE.match(path.name)
            if match:
                files.setdefault(int(match.group(2)), {})[int(match.group(1))] = path
    if not files:
        raise StateError(
            f"no arrowstream data state in {str(folder)!r} (expected files "
            f"{_file_name(0, 1)!r}, ...): resume from a checkpoint saved with "
            "`DataStateCallback` (or `save_data_state`), or point to the right checkpoint folder"
        )
    if len(files) > 1:
        found = sorted(p.name for ranks in files.values() for p in ranks.values())
        raise StateError(
            f"{str(folder)!r} holds data states of runs with world sizes {sorted(files)!r}: "
            f"{found!r}; keep only the files of the run that saved this checkpoint"
        )
    (saved_world, ranks), = files.items()
    rank, world_size, _, _ = loader.dataset.topology()
    num_workers = _num_workers(loader)
    if saved_world == world_size and rank in ranks:
        own = _read(ranks[rank])
        count = world_size * num_workers
        consumers = [
            (st.get("consumer", {}).get("index"), st.get("consumer", {}).get("count"))
            for st in own.get("states", [])
        ]
        if consumers == [(rank * num_workers + w, count) for w in range(num_workers)]:
            loader.load_state_dict(own)  # same topology: continue byte for byte
            return
    missing = sorted(set(range(saved_world)) - set(ranks))
    if missing:
        raise StateError(
            f"the data state in {str(folder)!r} has no file for rank(s) {missing!r} of "
            f"{saved_world}, needed to resume on rank {rank} of {world_size} with "
            f"{num_workers} worker(s): copy every rank's file (each rank writes its own, "
            "so node-local folders must be gathered) into that folder, or resume with the "
            "saving run's number of ranks and workers"
        )
    # one checkpoint is one training step: its consumers may be epochs apart (a rank's DataLoader workers
    # whose shares of an epoch hold different batch counts drift apart), never steps apart
    states = [_read(ranks[r]) for r in range(saved_world)]
    _check_one_step(folder, states)
    loader.load_state_dict(merge_states(states, drift=True))


def _check_one_step(folder: Path, states: list[dict[str, Any]]) -> None:
    """Raise unless every rank's file handed out as many batches: files of one training step.

    Every rank takes a batch a step (even batches keep their counts equal),
    and the counters of a re-dealt run restart together, so files of
    different steps (a stale file left from an earlier checkpoint, say) show
    as different totals. Merged, they would put the model's step and the data
    out of step without a word.
    """
    totals = [
        sum(int(own.get("stats", {}).get("batches", 0)) for own in st.get("states", []) if isinstance(own, dict))
        for st in states
    ]
    if len(set(totals)) > 1:
        shown = ", ".join(f"rank {r}: {n:,}" for r, n in enumerate(totals))
        raise StateError(
            f"the rank files in {str(folder)!r} come from different training steps (batches handed out: {shown}): "
            "keep the files every rank wrote at this checkpoint's step (a file left from another checkpoint?)"
        )


def _read(path: Path) -> dict[str, Any]:
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise StateError(
            f"cannot read the data state {str(path)!r}: {exc}; resume from an intact checkpoint"
        ) from exc
    if not isinstance(state, dict) or state.get("kind") != "rank":
        raise StateError(
            f"{str(path)!r} is not a loader's rank state (expected `kind` 'rank', got "
            f"{state.get('kind') if isinstance(state, dict) else type(state).__name__!r}): "
            "write it with `save_data_state`"
        )
    return state
