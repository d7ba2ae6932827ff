"""What a ``DataLoader`` does with an arrowstream batch: never stacks it, and may hand it over as it is.

A batch from :meth:`Dataset.to_torch <arrowstream.Dataset.to_torch>` is a
:class:`Batch`: a ``dict`` of tensors and Python ints, already formed by
``.pack`` or ``.bucket``. Two things a ``DataLoader`` does to each item:

- with a ``batch_size``, ``default_collate`` would stack batches into a new
  leading dimension: it refuses a :class:`Batch` with a
  :class:`~arrowstream.errors.ConfigError` saying to pass ``batch_size=None``;
- with ``batch_size=None``, ``default_convert`` walks every batch (a copy of
  the dict, a test of each value for numpy arrays it would make tensors of),
  which finds nothing to do: arrowstream's arrays are tensors already.
  :func:`no_collate` as the ``collate_fn`` hands each batch over as it is.
  :class:`~arrowstream.pytorch.StatefulLoader` uses it unless told otherwise.
"""

from __future__ import annotations

from typing import Any, TypeVar

from torch.utils.data._utils.collate import default_collate_fn_map

from arrowstream.errors import ConfigError

__all__ = ["COLLATING", "Batch", "no_collate"]

T = TypeVar("T")


class Batch(dict):  # type: ignore[type-arg]
    """One packed batch as tensors: a ``dict``, which a DataLoader must not batch again.

    ``torch``'s default collation refuses it (a ``DataLoader`` left at its
    default ``batch_size=1`` would stack batches into a new leading
    dimension, and its state would no longer match what was trained on).
    """


#: What a DataLoader that would stack arrowstream batches is told.
COLLATING = (
    "a DataLoader with a batch size would stack arrowstream batches into one: they are already "
    "batches (`.pack` formed them). Pass `batch_size=None` to the DataLoader (or torchdata's "
    "`StatefulDataLoader`), or use `arrowstream.pytorch.StatefulLoader`, which sets it; with the "
    "Hugging Face Trainer, return such a loader from `get_train_dataloader` (docs/training.md)"
)


def _refuse_collate(batch: Any, *, collate_fn_map: Any = None) -> Any:
    raise ConfigError(COLLATING)


default_collate_fn_map[Batch] = _refuse_collate


def no_collate(batch: T) -> T:
    """Return ``batch`` as it is: a ``DataLoader``'s ``collate_fn`` for batches that are tensors already.

    Saves what ``default_convert`` spends walking each batch for numpy arrays
    it would convert: 4-8 us a batch here, and tens of microseconds on a CPU
    that comes back cold from a step (``docs/training.md``). Use it with
    ``batch_size=None``; it converts nothing, so a dataset of your own that
    yields numpy arrays keeps them as numpy arrays.

    Examples
    --------
    >>> from torch.utils.data import DataLoader
    >>> from arrowstream import read_parquet
    >>> from arrowstream.testing import example_dir
    >>> ds = read_parquet(example_dir()).tokenize(None, column="ids", eos_id=0).pack(seq_len=4, batch_size=2)
    >>> batch = next(iter(DataLoader(ds.to_torch(), batch_size=None, collate_fn=no_collate)))
    >>> type(batch).__name__, tuple(batch["input_ids"].shape)
    ('Batch', (2, 4))
    """
    return batch
