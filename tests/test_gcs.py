"""Google Cloud Storage, held by a real server: the GCS JSON API emulator on loopback (``tests/gcsfixtures.py``).

The same corpus is read through pyarrow's ``GcsFileSystem`` (an object and
a ``gs://`` URI) and through gcsfs (fsspec): the batches equal those read
from local disk, states move between the three, a manifest file on the
bucket starts the dataset, an object replaced after its manifest was written
is refused by its ETag, and forked DataLoader workers read through a gcsfs
filesystem their parent made and used.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from arrowstream import read_parquet, write_manifest
from arrowstream.errors import ShardError

from .conftest import write_named_docs
from .gcsfixtures import GcsServer

BUCKET = "corpus"
LENGTHS = [int(n) for n in np.random.default_rng(1).integers(20, 400, size=90)]


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_named_docs(tmp_path_factory.mktemp("data") / "docs", LENGTHS, files=3, rg=10)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, local: Path) -> Iterator[GcsServer]:
    srv = GcsServer(tmp_path_factory.mktemp("gcs"))
    try:
        srv.upload(BUCKET, "docs", local)
        yield srv
    finally:
        srv.stop()


def _pipeline(source: Any, **kw: Any) -> Any:
    ds = read_parquet(source, num_epochs=2, **kw).shuffle(seed=3, window=3)
    return ds.tokenize(None, column="input_ids", eos_id=0).pack(seq_len=64, batch_size=4)


def _batches(ds: Any, state: Any = None) -> list[bytes]:
    it = ds.iter(state)
    try:
        return [b["input_ids"].tobytes() for b in it]
    finally:
        it.close()


def _state_after(ds: Any, steps: int) -> Any:
    it = ds.iter()
    try:
        for _ in range(steps):
            next(it)
        return json.loads(json.dumps(it.state_dict()))
    finally:
        it.close()


def test_batches_through_pyarrow_and_gcsfs_equal_local_disk_and_states_move_between_them(
    server: GcsServer, local: Path
) -> None:
    want = _batches(_pipeline(local))
    assert len(want) > 20
    by_object = _pipeline(f"{BUCKET}/docs", filesystem=server.filesystem())
    by_uri = _pipeline(server.uri(f"{BUCKET}/docs"))
    by_fsspec = _pipeline(f"{BUCKET}/docs", filesystem=server.gcsfs())
    for ds in (by_object, by_uri, by_fsspec):
        assert _batches(ds) == want
    # a state saved reading one way resumes the rest the others
    for saved_from, resumed_by in ((by_uri, local), (local, by_fsspec), (by_fsspec, by_object)):
        source = saved_from if not isinstance(saved_from, Path) else _pipeline(saved_from)
        target = resumed_by if not isinstance(resumed_by, Path) else _pipeline(resumed_by)
        assert _batches(target, _state_after(source, 9)) == want[9:]


def test_a_manifest_file_on_the_bucket_starts_the_dataset_without_listing(
    server: GcsServer, local: Path, tmp_path: Path
) -> None:
    want = _batches(_pipeline(local))
    manifest = tmp_path / "manifest.parquet"
    assert write_manifest(f"{BUCKET}/docs", manifest, filesystem=server.filesystem()) == 3
    server.put(f"{BUCKET}/meta/manifest.parquet", manifest.read_bytes())
    fs = server.filesystem()
    assert _batches(_pipeline(f"{BUCKET}/docs", filesystem=fs, manifest=f"{BUCKET}/meta/manifest.parquet")) == want
    via_fsspec = _pipeline(f"{BUCKET}/docs", filesystem=server.gcsfs(), manifest=f"{BUCKET}/meta/manifest.parquet")
    assert _batches(via_fsspec) == want


@pytest.mark.parametrize("client", ["pyarrow", "gcsfs"])
def test_an_object_replaced_after_its_manifest_was_written_is_refused_by_its_etag(
    server: GcsServer, tmp_path: Path, local: Path, client: str
) -> None:
    prefix = f"replaced-{client}"
    server.upload(BUCKET, prefix, local)
    manifest = tmp_path / "manifest.parquet"
    write_manifest(f"{BUCKET}/{prefix}", manifest, filesystem=server.filesystem())
    key = f"{BUCKET}/{prefix}/part-002.parquet"
    changed = bytearray(server.get(key))
    changed[len(changed) // 3] ^= 0xFF  # the same size, other bytes: read with the old footer, other batches
    server.put(key, bytes(changed))
    fs = server.filesystem() if client == "pyarrow" else server.gcsfs()
    ds = _pipeline(f"{BUCKET}/{prefix}", filesystem=fs, manifest=manifest)
    with pytest.raises(ShardError, match=rf"'{BUCKET}/{prefix}/part-002\.parquet' changed since the dataset was opened"):
        _batches(ds)


def test_an_object_deleted_while_read_is_an_error_naming_it(
    server: GcsServer, local: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ARROWSTREAM_READ_AHEAD", "0")
    monkeypatch.setenv("ARROWSTREAM_READ_BACKOFF", "0.01")
    server.upload(BUCKET, "deleted", local)
    fs = server.filesystem()
    ds = read_parquet(f"{BUCKET}/deleted", filesystem=fs, on_error="skip")
    it = ds.tokenize(None, column="input_ids", eos_id=0).pack(seq_len=64, batch_size=1).iter()
    next(it)  # part-000 is open now
    fs.delete_file(f"{BUCKET}/deleted/part-000.parquet")
    with pytest.raises(ShardError, match=r"deleted/part-000\.parquet"):
        for _ in it:
            pass
    assert it.stats.get("unreadable", 0) == 0  # a missing object is never skipped as bad bytes


_FORKED = """
import sys
from gcsfs.core import GCSFileSystem
from arrowstream import read_parquet
from arrowstream.pytorch import StatefulLoader
fs = GCSFileSystem(endpoint_url=f"http://{sys.argv[1]}", token="anon", project="test")
ds = read_parquet("corpus/docs", filesystem=fs).tokenize(None, column="input_ids", eos_id=0).pack(seq_len=64, batch_size=4)
parent = sorted(b["input_ids"].tobytes() for b in ds.iter())  # the parent reads through the filesystem first
loader = StatefulLoader(ds.to_torch(), num_workers=2)  # forked workers inherit that filesystem object
workers = sorted(b["input_ids"].numpy().tobytes() for b in loader)
print(len(parent), parent == workers)
"""


def test_forked_workers_read_through_a_gcsfs_filesystem_the_parent_made_and_used(server: GcsServer) -> None:
    out = subprocess.run([sys.executable, "-c", _FORKED, server.endpoint], capture_output=True, text=True,
                         timeout=180, env=dict(os.environ))
    assert out.returncode == 0, out.stderr[-2000:]
    count, same = out.stdout.split()
    assert int(count) > 20 and same == "True", "the workers read the whole corpus, as the parent did"
