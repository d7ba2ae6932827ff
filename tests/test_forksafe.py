"""Each process its own filesystem: made again in a process forked since (no connection shared with the parent)."""

from __future__ import annotations

import multiprocessing
from typing import Any

import pyarrow.fs as pafs

from arrowstream.io.forksafe import PerProcess


def _in_child(held: PerProcess, parent: pafs.FileSystem, out: Any) -> None:
    fs = held.get()
    out.send((fs is not parent, held.get() is fs, type(fs).__name__, fs.equals(parent)))


def _fork_and_ask(held: PerProcess, parent: pafs.FileSystem) -> tuple[bool, bool, str, bool]:
    ctx = multiprocessing.get_context("fork")
    here, there = ctx.Pipe()
    proc = ctx.Process(target=_in_child, args=(held, parent, there))
    proc.start()
    assert here.poll(60), "the forked process answered"
    answer = here.recv()
    proc.join(30)
    return answer  # type: ignore[no-any-return]


def test_a_forked_process_gets_its_own_pyarrow_filesystem_with_the_same_options() -> None:
    s3 = pafs.S3FileSystem(anonymous=True, endpoint_override="127.0.0.1:9", scheme="http", region="us-east-1")
    held = PerProcess(s3)
    assert held.get() is s3
    own, kept, kind, same_options = _fork_and_ask(held, s3)
    assert own and kept and kind == "S3FileSystem" and same_options  # made again once, with the same options
    assert held.get() is s3  # the parent keeps its own


def test_a_local_filesystem_is_handed_out_as_it_is_after_a_fork() -> None:
    local = pafs.LocalFileSystem()
    own, kept, kind, _ = _fork_and_ask(PerProcess(local), local)
    assert not own and kept and kind == "LocalFileSystem"  # no connection to keep apart
