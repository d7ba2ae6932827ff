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

__all__ = ["STATE_DIR", "load_data_state", "save_data_state"]

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
    text = json.dumps(loader.state_dict())
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise StateError(f"cannot write the data state in {str(folder)!r}: {exc.strerror or exc}") from exc
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:  # a full disk, a quota, a file-size limit: the checkpoint is not complete
        Path(tmp).unlink(missing_ok=True)
        raise StateError(
            f"cannot write the data state {str(path)!r}: {exc.strerror or exc}; the checkpoint has no "
            "data state: free space (or raise the limit) and save again"
        ) from exc
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    for stale in folder.iterdir():
        match = _FILE_RE.match(stale.name)
        if match and int(match.group(2)) != world_size:
            stale.unlink(missing_ok=True)  # several ranks may remove the same file
    return path


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
    loader.load_state_dict(merge_states([_read(ranks[r]) for r in range(saved_world)]))


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
