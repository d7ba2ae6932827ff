"""Errors and warnings in the words of the command line: flags, not Python parameters.

The library's messages name what to pass in Python (``column=``,
``cache_write=False``, what ``state_dict()`` returned). On the command line the
same advice is a flag; :func:`as_flags` rewrites a message for the command
that raised it, and :func:`show_warning` prints warnings the same way.
"""

from __future__ import annotations

import re
import sys
from typing import Any

__all__ = ["as_flags", "show_warning"]

#: (what the library says, what the command line says), per command ("*": every command).
_WORDS: dict[str, tuple[tuple[str, str], ...]] = {
    "*": (
        ("pass `column=` or add it to `columns=`", "pass --column with one of the data's columns"),
        ("pass `column=` the text column", "pass the text column with --column"),
        ("pass cache_write=False", "pass --cache-read-only"),
        ("pass what `state_dict()` returned", "pass a state file written by --save-state"),
        ("Rebuild the pipeline with the saved options", "Run with the options the state was saved with"),
        ('pass `added_files="next_epoch"` to read_parquet', "pass --added-files next_epoch"),
        ("start without the state", "run without --resume"),
        (
            ", or merge all consumers' states with `arrowstream.merge_states` to resume on any topology",
            "",
        ),
        ("this iterator is consumer", "this run is consumer"),
        ("pass the name of a text column with `column=`", "pass the name of a text column with --column"),
    ),
    "index": (
        (" (`length_index=DIR` in Python)", ""),
        ("(`--length-index`, or `.tokenize(..., length_index=DIR)`)", "(--length-index of `arrowstream stream`)"),
        ("fix `columns=` or the data", "fix --column or the data"),
    ),
    "cache": (
        ("fix `columns=` or the data", "fix --column or the data"),
        ("free space or fix the permissions, or pass cache_write=False", "free space or fix the permissions"),
    ),
    "inspect": (
        ("fix `columns=` or the data", "fix --columns (or --column) or the data"),
        ("read the others only (`columns=`)", "read the others only (--columns)"),
    ),
    "analyze": (
        ("fix `columns=` or the data", "fix --column (or --by) or the data"),
        ('pass on_error="skip" to leave', "pass --on-error skip to leave"),
        ("read the others only (`columns=`), add it", "add it"),
    ),
    "stream": (
        ("fix `columns=` or the data", "fix --column (or --filter) or the data"),
        ("read the others only (`columns=`), add it", "add it"),
        ("add the columns it uses to `columns=` or fix the expression", "fix the column names in --filter"),
        ("for a column of token ids use `.tokenize(None, column=...)`", "this command tokenizes text: pass a text column with --column"),
        ("; `ds.balance` says which applies), or pass even_batches=False",
         "; `arrowstream inspect PATH --tokenizer T` says which applies)"),
        (
            "(rank x DataLoader worker): load the state saved by this consumer",
            "(--rank and --world-size): pass the --rank and --world-size the state was saved with",
        ),
    ),
}


#: Pipeline options (as a state mismatch names them) and the ``stream`` flags that set them.
_OPTION_FLAGS = (
    (r"`pack\.seq_len`", "--seq-len"),
    (r"`pack\.batch_size`", "--batch-size"),
    (r"`pack\.strategy`", "--strategy"),
    (r"`pack\.window`", "--window"),
    (r"`pack\.drop_last`", "--drop-last"),
    (r"`source\.shuffle\.window`", "--shuffle-window"),
    (r"`source\.shuffle(\.seed)?`", "--shuffle"),
    (r"`source\.columns`", "the columns read (--column, --filter)"),
    (r"`stages\.\d+\.expr(_hash)?`", "--filter"),
    (r"`stages\.\d+\.column`", "--column"),
    (r"`stages\.\d+\.tokenizer`", "--tokenizer"),
    (r"`stages\.\d+\.add_special_tokens`", "--no-special-tokens"),
    (r"`stages`", "the steps (--filter)"),
)


#: A mixture's options (as a state mismatch names them) and what sets them on the command line.
_MIXTURE_FLAGS = (
    (r"`seq_len`", "--seq-len"),
    (r"`batch_size`", "--batch-size"),
    (r"`strategy`", "--strategy"),
    (r"`window`", "--window"),
    (r"`stages`", "the weights (`weights` in the mixture file)"),
    (r"`sources`", "the sources (`sources` in the mixture file)"),
    (r"`seed`", "the seed (`seed` in the mixture file)"),
    (r"`max_epochs`", "`max_epochs` in the mixture file"),
    (r"Build the mixture with the saved sources and weights", "Use the mixture file and flags the state was saved with"),
    (r"pass reweight=True to mix\(\)", 'set `"reweight": true` in the mixture file'),
)


def as_flags(message: str, command: str | None) -> str:
    """Return ``message`` with the library's Python advice in the flags of ``command``.

    Examples
    --------
    >>> as_flags("no column `x`: pass `column=` or add it to `columns=`", "stream")
    "no column `x`: pass --column with one of the data's columns"
    """
    for table in (_WORDS.get(command or "", ()), _WORDS["*"]):
        for python, flags in table:
            message = message.replace(python, flags)
    if command == "stream":
        flags = _MIXTURE_FLAGS if "another mixture" in message else _OPTION_FLAGS
        for pattern, flag in flags:
            message = re.sub(pattern, flag, message)
    return message


def show_warning(command: str | None) -> Any:
    """Return a ``warnings.showwarning`` that prints ``warning: <message>`` in the words of ``command``."""

    def show(message: Warning | str, category: type[Warning], *_: Any, **__: Any) -> None:
        print(f"warning: {as_flags(str(message), command)}", file=sys.stderr)

    return show
