"""The Hugging Face ``Trainer`` integration: the data state saved and restored with every checkpoint.

A :class:`~arrowstream.pytorch.StatefulLoader` knows exactly which batches the
trainer has received. :class:`DataStateCallback` writes that state next to
each ``Trainer`` checkpoint, one JSON file per rank in
``<checkpoint>/arrowstream/rank-<rank>-of-<world_size>.json``, and loads it
back before the first batch of a resumed run. On the same number of ranks and
DataLoader workers each rank takes its own state back and the run continues
with exactly the batches an uninterrupted run would have seen; on another
topology every rank's file is merged (:func:`arrowstream.merge_states`) and
the documents not yet emitted are dealt out again, each exactly once.

The ``Trainer`` must iterate the loader itself, not a copy prepared by
``accelerate`` (which re-shards an ``IterableDataset`` and reads a batch
ahead): subclass ``Trainer`` and override ``get_train_dataloader`` to return
the loader. Run with ``TrainingArguments(ignore_data_skip=True, max_steps=...)``
over an endless stream (``read_parquet(..., num_epochs=None)``).

Files are replaced atomically (written to a temporary file, then renamed), so
a crash while saving never leaves half a state behind. See
``docs/training.md``.

Requires ``pip install 'arrowstream[huggingface]'``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

try:
    from transformers import TrainerCallback
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
except ImportError as exc:  # pragma: no cover - exercised only without transformers
    raise ImportError(
        "the Hugging Face integration needs transformers and accelerate: "
        "pip install 'arrowstream[huggingface]'"
    ) from exc

from arrowstream.checkpoint import STATE_DIR, load_data_state, save_data_state
from arrowstream.errors import ConfigError, StateError

if TYPE_CHECKING:
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from arrowstream.pytorch import StatefulLoader

__all__ = ["STATE_DIR", "DataStateCallback", "load_data_state", "save_data_state"]


class DataStateCallback(TrainerCallback):
    """Save the loader's state with every ``Trainer`` checkpoint and restore it on resume.

    The ``Trainer`` must iterate ``loader`` itself (override
    ``get_train_dataloader`` to return it) with
    ``TrainingArguments(ignore_data_skip=True)``, over an endless pipeline
    (``num_epochs=None``) bounded by ``max_steps``; ``on_train_begin`` refuses
    anything else. On resume the state is read from ``resume_from`` or, by
    default, from ``<output_dir>/checkpoint-<global_step>``.

    Parameters
    ----------
    loader
        The loader the ``Trainer`` trains on.
    resume_from
        The checkpoint folder the run resumes from, when it is not
        ``<output_dir>/checkpoint-<global_step>`` (say, copied from elsewhere).

    Examples
    --------
    >>> from transformers import TrainerControl, TrainerState, TrainingArguments
    >>> from arrowstream import read_parquet
    >>> from arrowstream.pytorch import StatefulLoader
    >>> from arrowstream.testing import example_dir
    >>> d = example_dir()
    >>> ds = read_parquet(d, num_epochs=None).tokenize(None, column="ids", eos_id=0).pack(seq_len=4, batch_size=2)
    >>> callback = DataStateCallback(StatefulLoader(ds.to_torch()))
    >>> args = TrainingArguments(d, max_steps=10, use_cpu=True, report_to=[])  # ignore_data_skip=False
    >>> callback.on_train_begin(args, TrainerState(), TrainerControl())
    Traceback (most recent call last):
    ...
    arrowstream.errors.ConfigError: `DataStateCallback` needs `TrainingArguments(ignore_data_skip=True)`...
    """

    def __init__(
        self, loader: StatefulLoader, *, resume_from: str | os.PathLike[str] | None = None
    ) -> None:
        self.loader = loader
        self.resume_from = resume_from

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Check the run's settings and, on a resume, load the saved data state."""
        if args.ignore_data_skip is not True:
            raise ConfigError(
                "`DataStateCallback` needs `TrainingArguments(ignore_data_skip=True)`, got "
                f"`ignore_data_skip={args.ignore_data_skip!r}`: on resume the Trainer would skip "
                "batches on top of the restored data state and lose them"
            )
        dataset = self.loader.dataset.dataset
        if getattr(dataset, "num_rows", None) is not None:  # a mixture's token budget
            raise ConfigError(
                "`DataStateCallback` needs an endless mixture, got one packed with `num_tokens`: a "
                "Trainer re-iterates its loader when it ends, which would repeat data from the "
                "restored state; drop `num_tokens` and bound the run with `TrainingArguments(max_steps=...)`"
            )
        if getattr(dataset, "num_epochs", None) is not None:
            raise ConfigError(
                "`DataStateCallback` needs an endless pipeline, got "
                f"`num_epochs={dataset.num_epochs!r}`: a Trainer re-iterates its loader when it "
                "ends, which would repeat data from the restored state; use "
                "`read_parquet(..., num_epochs=None)` and bound the run with "
                "`TrainingArguments(max_steps=...)`"
            )
        dataloader = kwargs.get("train_dataloader")
        if dataloader is not None and dataloader is not self.loader:
            raise ConfigError(
                "the Trainer iterates another loader than the one given to `DataStateCallback` "
                f"(got {type(dataloader).__name__!r}): subclass `Trainer` and override "
                "`get_train_dataloader` to return this `StatefulLoader`"
            )
        if state.global_step == 0:
            if self.resume_from is not None:
                raise ConfigError(
                    f"`resume_from={str(self.resume_from)!r}` is set but the Trainer starts at "
                    "step 0: pass the same checkpoint to `trainer.train(resume_from_checkpoint=...)`"
                )
            return
        checkpoint = (
            Path(self.resume_from)
            if self.resume_from is not None
            else Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        )
        if self.resume_from is None and not (checkpoint / STATE_DIR).is_dir():
            raise StateError(
                f"resuming at step {state.global_step}, but {str(checkpoint)!r} has no "
                f"`{STATE_DIR}` data state: pass `DataStateCallback(..., resume_from=...)` the "
                "checkpoint folder given to `trainer.train(resume_from_checkpoint=...)`"
            )
        load_data_state(checkpoint, self.loader)

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Write this rank's data state into the checkpoint the Trainer has just saved."""
        save_data_state(
            Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}", self.loader
        )
