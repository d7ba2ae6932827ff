"""What the commands share: the usage error, argument types, the progress bar, state files."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

from tqdm import tqdm

__all__ = [
    "HelpFormatter",
    "Parser",
    "Terminated",
    "UsageError",
    "on_sigterm",
    "check_output",
    "check_tokenizer",
    "natural_int",
    "positive_int",
    "progress",
    "read_json",
    "read_state",
    "write_state",
]


class HelpFormatter(argparse.HelpFormatter):
    """Help that shows each option's default, unless it has none or its help says it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        # by identity: a default of 0 is shown (0 == False)
        shown = not (default is None or default is False or default is argparse.SUPPRESS) and action.option_strings
        if shown and "default" not in text:
            text += " (default: %(default)s)"
        return text


class Terminated(KeyboardInterrupt):
    """SIGTERM, which schedulers send before they kill a job: handled as Ctrl-C is, exit status 143."""


def on_sigterm(signum: int, frame: Any) -> None:
    """A SIGTERM handler that raises :class:`Terminated` in the main thread."""
    raise Terminated


class Parser(argparse.ArgumentParser):
    """An argument parser whose mistakes print one ``error:`` line and where help is, not the whole usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class UsageError(Exception):
    """A command-line argument that cannot be used (printed as one line, exit status 2)."""


def natural_int(text: str) -> int:
    """An ``argparse`` type: an integer of at least 0 (a seed, a rank).

    Examples
    --------
    >>> natural_int("0")
    0
    >>> natural_int("-1")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: must be a whole number of at least 0, got '-1'
    """
    return _whole(text, 0)


def positive_int(text: str) -> int:
    """An ``argparse`` type: an integer of at least 1.

    Examples
    --------
    >>> positive_int("3")
    3
    >>> positive_int("0")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: must be a whole number of at least 1, got '0'
    """
    return _whole(text, 1)


def _whole(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        value = low - 1
    if value < low:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least {low}, got {text!r}")
    return value


def check_tokenizer(path: str) -> None:
    """Refuse a ``--tokenizer`` that is not a file, before any work."""
    p = Path(path)
    if p.is_dir():
        if (p / "tokenizer.json").is_file():
            return  # a saved Hugging Face tokenizer: its tokenizer.json is used
        raise UsageError(f"--tokenizer {path!r} is a directory without a tokenizer.json: pass a tokenizer.json")
    if not p.is_file():
        raise UsageError(f"--tokenizer {path!r} does not exist: pass the path of a tokenizer.json")


def check_output(flag: str, path: str | None) -> None:
    """Refuse an output file whose directory does not exist, before any work."""
    if path is None:
        return
    parent = Path(path).resolve().parent
    for folder in (parent, *parent.parents):  # the nearest part of the path that exists
        if folder.exists():
            break
    if folder != parent:
        raise UsageError(f"{flag} {path!r}: its directory does not exist; create it first")
    if not parent.is_dir():
        raise UsageError(f"{flag} {path!r}: {str(parent)!r} is a file, not a directory; write elsewhere")


def progress(total: int | None, desc: str) -> tqdm:
    """A progress bar on stderr, counting batches."""
    return tqdm(total=total, desc=desc, unit="batch", file=sys.stderr, dynamic_ncols=True)


def read_json(flag: str, path: str, what: str) -> Any:
    """Return the JSON file ``path`` given to ``flag``, or raise :class:`UsageError` naming both and ``what`` it should be."""
    try:
        return json.loads(Path(path).read_text())
    except OSError as exc:
        raise UsageError(f"{flag} {path}: cannot read it: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:  # bytes that are not UTF-8 text: not JSON either
        raise UsageError(f"{flag} {path}: the file is not JSON (not UTF-8 text: {exc.reason} at byte {exc.start}): pass {what}") from exc
    except json.JSONDecodeError as exc:
        raise UsageError(f"{flag} {path}: the file is not JSON ({exc}): pass {what}") from exc


def read_state(path: str) -> dict[str, Any]:
    """Read a state file written by ``--save-state``."""
    state = read_json("--resume", path, "a file written by --save-state")
    if not isinstance(state, dict) or state.get("format") != "arrowstream.state":
        raise UsageError(f"--resume {path}: the file is not an arrowstream state: pass a file written by --save-state")
    return state


def write_state(path: str, state: dict[str, Any]) -> None:
    """Write ``state`` to ``path`` whole: a temporary file beside it, then a rename."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(state, indent=2))
    os.replace(tmp, target)


#: The launchers' environment variables for (this process, processes): torchrun, a Slurm job array, Slurm tasks.
_LAUNCHERS = (
    ("RANK", "WORLD_SIZE"),
    ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT"),
    ("SLURM_PROCID", "SLURM_NTASKS"),
)


def parse_shard(text: str) -> tuple[int, int]:
    """Return ``(i, n)`` from ``"I/N"``, or from the launcher's environment for ``"auto"``.

    ``auto`` reads torchrun's ``RANK``/``WORLD_SIZE``, else a Slurm job
    array's ``SLURM_ARRAY_TASK_ID``/``SLURM_ARRAY_TASK_COUNT`` (counted from
    ``SLURM_ARRAY_TASK_MIN``), else Slurm's ``SLURM_PROCID``/``SLURM_NTASKS``.

    Examples
    --------
    >>> parse_shard("2/8")
    (2, 8)
    """
    if text == "auto":
        for index, count in _LAUNCHERS:
            if index in os.environ and count in os.environ:
                i = int(os.environ[index]) - (int(os.environ.get("SLURM_ARRAY_TASK_MIN", 0)) if index.startswith("SLURM_ARRAY") else 0)
                text = f"{i}/{os.environ[count]}"
                break
        else:
            raise argparse.ArgumentTypeError(
                "auto found no launcher's variables (RANK and WORLD_SIZE, SLURM_ARRAY_TASK_ID and "
                "SLURM_ARRAY_TASK_COUNT, SLURM_PROCID and SLURM_NTASKS): give I/N"
            )
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected I/N (this part and the number of parts, like 0/4) or auto, got {text!r}") from None
    if not (n >= 1 and 0 <= i < n):
        raise argparse.ArgumentTypeError(f"expected I/N with 0 <= I < N, got {text!r}")
    return i, n
