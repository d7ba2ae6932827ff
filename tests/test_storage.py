"""Object storage, held by a real server: a moto S3 server on loopback, a fault proxy in front, manifest files.

The server is a child process (``python -m moto.server``), so pyarrow's C++ S3
client talks HTTP to it as it would to a cloud store; set
``ARROWSTREAM_TEST_S3_ENDPOINT`` (with ``..._ACCESS_KEY`` and
``..._SECRET_KEY``) to run the same tests against another server. The proxy
(``tests/s3fixtures.py``) adds 503s, cut bodies, stalls and 403s, and counts
the requests.
"""

from __future__ import annotations

import itertools
import json
import os
import pickle
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.fs as pafs
import pytest

from arrowstream import read_parquet, write_manifest
from arrowstream.cli import main
from arrowstream.errors import ShardError

from .conftest import write_named_docs, write_parts
from .s3fixtures import FaultProxy, Faults, S3Server, seaweedfs_available

BUCKET = "corpus"
LENGTHS = [int(n) for n in np.random.default_rng(0).integers(20, 400, size=120)]


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_named_docs(tmp_path_factory.mktemp("data") / "docs", LENGTHS, files=3, rg=10)


# every test against moto's server and SeaweedFS (where its binary is installed), or the server the environment names
_SERVERS = ["external"] if os.environ.get("ARROWSTREAM_TEST_S3_ENDPOINT") else (
    ["moto", "seaweedfs"] if seaweedfs_available() else ["moto"]
)


@pytest.fixture(scope="module", params=_SERVERS)
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, local: Path) -> Iterator[S3Server]:
    os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")  # no 5 s probe of a cloud's metadata service
    srv = S3Server(tmp_path_factory.mktemp("s3"), kind=request.param)
    try:
        srv.upload(BUCKET, "docs", local)
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def proxy(server: S3Server) -> Iterator[FaultProxy]:
    p = FaultProxy(server.endpoint)
    try:
        yield p
    finally:
        p.stop()


def _pipeline(source: Any, **kw: Any) -> Any:
    ds = read_parquet(source, num_epochs=2, **kw).shuffle(seed=1, window=3)
    return ds.tokenize(None, column="input_ids", eos_id=0).pack(seq_len=64, batch_size=4)


def _batches(ds: Any, state: Any = None, limit: int | None = None) -> list[bytes]:
    it = ds.iter(state)
    try:
        return [b["input_ids"].tobytes() for _, b in zip(range(limit or 10**9), it)]
    finally:
        it.close()


def _fs(server: S3Server, proxy: FaultProxy, **options: Any) -> pafs.S3FileSystem:
    return server.filesystem(proxy.endpoint, **options)


def test_batches_from_the_server_equal_local_disk_with_and_without_a_manifest(
    server: S3Server, proxy: FaultProxy, local: Path, tmp_path: Path
) -> None:
    want = _batches(_pipeline(local))
    fs = _fs(server, proxy)
    assert _batches(_pipeline(f"{BUCKET}/docs", filesystem=fs)) == want
    # a manifest file, local and on the server
    manifest = tmp_path / "manifest.parquet"
    assert write_manifest(f"{BUCKET}/docs", manifest, filesystem=fs) == 3
    assert _batches(_pipeline(f"{BUCKET}/docs", filesystem=fs, manifest=manifest)) == want
    server.client().put_object(Bucket=BUCKET, Key="meta/manifest.parquet", Body=manifest.read_bytes())
    endpoint = f"s3://{BUCKET}/meta/manifest.parquet?endpoint_override={proxy.endpoint}&scheme=http&region=us-east-1"
    os.environ.setdefault("AWS_ACCESS_KEY_ID", server.access_key)
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", server.secret_key)
    remote = _pipeline(f"{BUCKET}/docs", filesystem=fs, manifest=endpoint)
    assert _batches(remote) == want
    # states move between local disk, the server and the manifest file
    it = _pipeline(f"{BUCKET}/docs", filesystem=fs).iter()
    for _ in range(7):
        next(it)
    state = json.loads(json.dumps(it.state_dict()))
    it.close()
    assert _batches(_pipeline(local), state) == want[7:]
    assert _batches(remote, state) == want[7:]


def test_a_manifest_starts_16_consumers_with_no_listing_and_no_footer_read(
    server: S3Server, proxy: FaultProxy, tmp_path: Path
) -> None:
    fs = _fs(server, proxy)
    sizes = {info.path: info.size for info in fs.get_file_info(pafs.FileSelector(f"{BUCKET}/docs"))}
    manifest = tmp_path / "manifest.parquet"
    write_manifest(f"{BUCKET}/docs", manifest, filesystem=fs)

    proxy.set(Faults())
    its = [_pipeline(f"{BUCKET}/docs", filesystem=fs).iter(rank=r, world_size=16) for r in range(16)]
    without = proxy.counts()
    for it in its:
        it.close()
    assert without["list"] >= 16 and without["get"] >= 16 * 3, "discovery lists and reads footers in every consumer"

    proxy.set(Faults())
    ds = _pipeline(f"{BUCKET}/docs", filesystem=fs, manifest=manifest)
    its = [ds.iter(rank=r, world_size=16) for r in range(16)]
    assert proxy.counts() == {"list": 0, "head": 0, "get": 0, "other": 0}, "a start from a manifest file asks nothing"
    batches = [next(it) for it in its]
    assert all(b["num_tokens"] for b in batches)
    for it in its:
        it.close()
    counts = proxy.counts()
    assert counts["list"] == 0
    footer_reads = [
        r for r in proxy.requests
        if r.method == "GET" and r.range and _touches_end(r.range, sizes[r.path.lstrip("/")])
    ]
    assert footer_reads == [], "reading row groups re-reads no footer: the manifest's is used"
    # HEADs only of data files a consumer opens (their size and ETag, checked against the manifest), and
    # once in the process, of where a length index of the ids would be (opened, not looked up: no LIST)
    heads = [r.path.lstrip("/") for r in proxy.requests if r.method == "HEAD"]
    index = [h for h in heads if "/_arrowstream_index/" in h]
    assert len(index) == 1 and index[0].endswith("/index.json"), index
    assert set(heads) - set(index) <= set(sizes)


def test_a_pickled_remote_dataset_sends_its_footers_through_a_local_file_and_asks_the_store_nothing(
    server: S3Server, proxy: FaultProxy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A spawned DataLoader worker's start() waited for the worker's imports while the footers filled the pipe."""
    monkeypatch.setenv("ARROWSTREAM_CACHE_DIR", str(tmp_path / "cache"))
    parts = [{"text": [f"doc {f}-{i}" for i in range(300)], "n": list(range(300))} for f in range(3)]
    write_parts(tmp_path / "many", parts, row_group_size=2)  # 150 row groups a file: footers past 64 KB
    server.upload(BUCKET, "many", tmp_path / "many")
    ds = read_parquet(f"{BUCKET}/many", filesystem=_fs(server, proxy))
    paths = ds.manifest.paths
    footers = [ds.manifest.footer(p).to_dict() for p in paths]
    assert sum(len(pickle.dumps(ds.manifest.footer(p))) for p in paths) > 64_000
    data = pickle.dumps(ds)
    assert len(data) < 8_000, f"the pickled dataset is {len(data):,} bytes: it carries the footers or records"
    assert len(list((tmp_path / "cache" / "footers").glob("*.pickle"))) == 1

    proxy.set(Faults())
    clone = pickle.loads(data)
    assert [clone.manifest.footer(p).to_dict() for p in paths] == footers
    assert proxy.counts()["get"] == 0, "the footers came from the store, not the local file"
    assert _first_batches(clone, 5) == _first_batches(ds, 5)  # closed: their read-ahead ends before the counts below

    for kept in (tmp_path / "cache" / "footers").glob("*.pickle"):
        kept.write_bytes(kept.read_bytes()[:-1] + b"?")  # changed: never unpickled, the store is asked again
    proxy.set(Faults())
    assert [pickle.loads(data).manifest.footer(p).to_dict() for p in paths] == footers
    assert proxy.counts()["get"] >= len(paths)
    again = pickle.dumps(ds)  # pickled anew: the changed file is written again, whole
    proxy.set(Faults())
    assert [pickle.loads(again).manifest.footer(p).to_dict() for p in paths] == footers
    assert proxy.counts()["get"] == 0

    monkeypatch.setenv("ARROWSTREAM_CACHE_DIR", "off")  # no local file: the footers travel in the pickle
    assert len(pickle.dumps(ds)) > 64_000


def test_a_pickled_dataset_read_from_a_manifest_file_names_that_file_instead_of_every_file(
    server: S3Server, proxy: FaultProxy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The files' pins grow with the files (35-55 bytes each); a manifest file already describes them all."""
    monkeypatch.setenv("ARROWSTREAM_CACHE_DIR", str(tmp_path / "cache"))
    parts = [{"text": [f"doc {f}-{i}" for i in range(300)], "n": list(range(300))} for f in range(3)]
    write_parts(tmp_path / "many", parts, row_group_size=2)
    server.upload(BUCKET, "many", tmp_path / "many")
    fs = _fs(server, proxy)
    manifest = tmp_path / "manifest.parquet"
    write_manifest(f"{BUCKET}/many", manifest, filesystem=fs)
    ds = read_parquet(f"{BUCKET}/many", filesystem=fs, manifest=manifest)
    data = pickle.dumps(ds)
    assert not any(path.encode() in data for path in ds.manifest.paths), "the pickle names each file"
    expected = _first_batches(ds, 5)  # closed: no read of its read-ahead reaches the proxy after the reset below

    for kept in (tmp_path / "cache" / "footers").glob("*.pickle"):
        kept.unlink()  # gone (another machine, say): the records are read again from the manifest file
    proxy.set(Faults())
    clone = pickle.loads(data)
    assert proxy.counts()["get"] == 0 and proxy.counts()["list"] == 0, f"read from the store: {proxy.requests}"
    assert clone.manifest.fingerprint == ds.manifest.fingerprint
    assert _first_batches(clone, 5) == expected

    parts[1]["text"][0] = "changed"
    write_parts(tmp_path / "changed", parts, row_group_size=2)
    server.upload(BUCKET, "many", tmp_path / "changed")
    write_manifest(f"{BUCKET}/many", manifest, filesystem=fs)  # describes other bytes now
    with pytest.raises(ShardError, match=rf"manifest file '{manifest}' changed since the dataset was opened"):
        pickle.loads(data)


def _first_batches(ds: Any, n: int) -> list[Any]:
    """The first ``n`` batches of ``ds`` as Python lists, the iterator closed after them (its threads joined)."""
    it = ds.iter()
    try:
        return [b.to_pylist() for b in itertools.islice(it, n)]
    finally:
        it.close()


def _touches_end(header: str, size: int) -> bool:
    """Whether an HTTP Range header reaches the last byte of an object of ``size`` bytes (a footer read)."""
    spec = header.split("=", 1)[1]
    start, _, end = spec.partition("-")
    if not start:  # a suffix range: the last bytes
        return True
    return (int(end) if end else size - 1) >= size - 1


def test_503s_and_cut_bodies_change_nothing(server: S3Server, proxy: FaultProxy, local: Path) -> None:
    want = _batches(_pipeline(local))
    fs = _fs(server, proxy)
    proxy.set(Faults(slow_down=0.10, cut=0.05, seed=3))
    got = _batches(_pipeline(f"{BUCKET}/docs", filesystem=fs))
    faults = [r.fault for r in proxy.requests if r.fault]
    assert "slow_down" in faults and "cut" in faults, "the proxy injected both kinds of fault"
    assert got == want


def test_a_stall_ends_in_a_named_error_within_the_deadline_and_a_resume_goes_on(
    server: S3Server, proxy: FaultProxy, local: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    want = _batches(_pipeline(local))
    monkeypatch.setenv("ARROWSTREAM_READ_ATTEMPTS", "2")
    monkeypatch.setenv("ARROWSTREAM_READ_BACKOFF", "0.1")
    # the documented deadline: attempts x (the client's attempts x request_timeout + its backoff)
    fs = _fs(server, proxy, request_timeout=1, connect_timeout=1,
             retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=1))
    _stall_ends_named_and_resumes(proxy, _pipeline(f"{BUCKET}/docs", filesystem=fs, prefetch=0), want, "Timeout")


def _stall_ends_named_and_resumes(proxy: FaultProxy, ds: Any, want: list[bytes], cause: str) -> None:
    """Stall the server after 5 batches: a ShardError naming file, row group, attempts and ``cause`` within
    the deadline, the read tried again, and the same pipeline resuming from the last state once it answers."""
    it = ds.iter()
    for _ in range(5):
        next(it)
    state = json.loads(json.dumps(it.state_dict()))
    proxy.set(Faults(stall=60))
    start = time.monotonic()
    with pytest.raises(ShardError, match=rf"docs/part-\d+\.parquet.*row group \d+.*after 2 attempts.*{cause}"):
        for _ in range(100):
            next(it)
    assert time.monotonic() - start < 10, "a stall ends within the deadline (about 2.3 s here)"
    assert it.read_retries >= 1, "the read was tried again"
    it.close()
    proxy.set(Faults())
    assert _batches(ds, state) == want[5:]


def test_access_denied_fails_at_once_naming_the_file(server: S3Server, proxy: FaultProxy, tmp_path: Path) -> None:
    fs = _fs(server, proxy)
    manifest = tmp_path / "manifest.parquet"
    write_manifest(f"{BUCKET}/docs", manifest, filesystem=fs)
    ds = _pipeline(f"{BUCKET}/docs", filesystem=fs, manifest=manifest)
    proxy.set(Faults(forbid=0))
    start = time.monotonic()
    with pytest.raises(ShardError, match=r"cannot open 'corpus/docs/part-\d+\.parquet'.*(ACCESS_DENIED|AccessDenied|403)"):
        _batches(ds)
    assert time.monotonic() - start < 5, "a refusal is not retried"


def test_an_object_replaced_mid_run_is_refused_by_name(server: S3Server, proxy: FaultProxy, local: Path) -> None:
    fs = _fs(server, proxy)
    ds = read_parquet(f"{BUCKET}/docs", filesystem=fs, prefetch=0).tokenize(None, column="input_ids", eos_id=0)
    ds = ds.pack(seq_len=64, batch_size=4)
    it = ds.iter()
    next(it)  # part-000 is open now; part-002 is not
    client = server.client()
    original = client.get_object(Bucket=BUCKET, Key="docs/part-002.parquet")["Body"].read()
    try:
        changed = bytearray(original)
        changed[len(changed) // 3] ^= 0xFF  # the same size, other bytes: only the ETag tells
        client.put_object(Bucket=BUCKET, Key="docs/part-002.parquet", Body=bytes(changed))
        with pytest.raises(ShardError, match=r"'corpus/docs/part-002\.parquet' changed since the dataset was opened: its ETag"):
            for _ in it:
                pass
    finally:
        it.close()
        client.put_object(Bucket=BUCKET, Key="docs/part-002.parquet", Body=original)


def test_the_manifest_command_builds_in_parts_and_joins_them(
    server: S3Server, proxy: FaultProxy, local: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    whole = tmp_path / "whole.parquet"
    assert main(["manifest", str(local), "-o", str(whole)]) == 0
    parts = [tmp_path / f"part-{i}.parquet" for i in range(2)]
    for i, part in enumerate(parts):
        assert main(["manifest", str(local), "-o", str(part), "--shard", f"{i}/2"]) == 0
    joined = tmp_path / "joined.parquet"
    assert main(["manifest", "--merge", *map(str, parts), "-o", str(joined)]) == 0
    assert "joined 2 parts: 3 files" in capsys.readouterr().out
    import pyarrow.parquet as pq

    assert pq.read_table(joined).equals(pq.read_table(whole))
    assert _batches(_pipeline(local, manifest=joined)) == _batches(_pipeline(local))
    # a part alone, or parts missing one, are refused with the way out
    with pytest.raises(ShardError, match="part 0 of 2 of a sharded build: join the parts"):
        read_parquet(local, manifest=parts[0])
    assert main(["manifest", "--merge", str(parts[1]), "-o", str(tmp_path / "x.parquet")]) == 2
    assert "needs parts 0..1 once each, got parts [1]" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["manifest", str(local), "-o", str(whole), "--shard", "2/2"])
    assert "expected I/N with 0 <= I < N, got '2/2'" in capsys.readouterr().err


_FORKED = """
import sys
from arrowstream import read_parquet
from arrowstream.pytorch import StatefulLoader
endpoint, key, secret = sys.argv[1:4]
{make_fs}
ds = read_parquet("corpus/docs", filesystem=fs).tokenize(None, column="input_ids", eos_id=0).pack(seq_len=64, batch_size=4)
parent = sorted(b["input_ids"].tobytes() for b in ds.iter())  # the parent reads through the filesystem first
loader = StatefulLoader(ds.to_torch(), num_workers=2)  # forked workers inherit that filesystem object
workers = sorted(b["input_ids"].numpy().tobytes() for b in loader)
print(len(parent), parent == workers)
"""

_MAKE_FS = {
    "pyarrow": "import pyarrow.fs as pafs\nfs = pafs.S3FileSystem(access_key=key, secret_key=secret, "
    "endpoint_override=endpoint, scheme='http', region='us-east-1')",
    # an async fsspec filesystem refuses use after a fork: each worker makes its own from the same arguments
    "s3fs": "import s3fs\nfs = s3fs.S3FileSystem(key=key, secret=secret, "
    "client_kwargs={'endpoint_url': f'http://{endpoint}', 'region_name': 'us-east-1'})",
}


@pytest.mark.parametrize("client", sorted(_MAKE_FS))
def test_forked_workers_read_through_a_filesystem_the_parent_created_and_used(server: S3Server, client: str) -> None:
    import subprocess
    import sys

    script = _FORKED.replace("{make_fs}", _MAKE_FS[client])
    out = subprocess.run(
        [sys.executable, "-c", script, server.endpoint, server.access_key, server.secret_key],
        capture_output=True, text=True, timeout=120, env={**os.environ, "AWS_EC2_METADATA_DISABLED": "true"},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    count, same = out.stdout.split()
    assert int(count) > 50 and same == "True", "the workers read the whole corpus, as the parent did"


@pytest.mark.parametrize("kind", [k for k in _SERVERS if k == "seaweedfs"])  # keeps its objects when killed
def test_a_server_killed_and_back_within_the_retries_changes_nothing(
    kind: str, local: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    monkeypatch.setenv("ARROWSTREAM_READ_AHEAD", "0")  # row groups read as batches are asked for: during the outage
    monkeypatch.setenv("ARROWSTREAM_READ_ATTEMPTS", "8")
    monkeypatch.setenv("ARROWSTREAM_READ_BACKOFF", "0.25")  # tries for about 30 s
    want = _batches(_pipeline(local))
    srv = S3Server(tmp_path, kind=kind)
    back = threading.Timer(1.5, srv.restart)
    try:
        srv.upload(BUCKET, "docs", local)
        fs = srv.filesystem(connect_timeout=0.5, request_timeout=2)
        it = _pipeline(f"{BUCKET}/docs", filesystem=fs).iter()
        got = [next(it)["input_ids"].tobytes() for _ in range(5)]
        srv.kill()
        back.start()
        got += [b["input_ids"].tobytes() for b in it]
        assert got == want, "the same batches, none lost or repeated"
        assert it.read_retries >= 1, "reads failed while the server was down and were tried again"
        it.close()
    finally:
        back.cancel()
        if back.is_alive():
            back.join()
        srv.stop()


def _child_filesystem(manifest: Any, parent_id: int, out: Any) -> None:
    """In a forked process: is the manifest's filesystem its own (not the parent's object), and does it read?"""
    fs = manifest.filesystem
    own = id(fs) != parent_id and manifest.filesystem is fs  # made once, then kept
    out.send((own, type(fs).__name__, fs.get_file_info(f"{BUCKET}/docs/part-000.parquet").size))


def test_a_forked_process_reads_through_a_pyarrow_filesystem_of_its_own(server: S3Server) -> None:
    # the parent's connections, shared by every forked worker, gave one worker the answer to another's
    # request (seen against SeaweedFS: a ranged GET's length and another object's ETag for a lookup)
    import multiprocessing

    from arrowstream.pipeline.plan import Plan

    fs = server.filesystem()
    manifest = Plan.of(read_parquet(f"{BUCKET}/docs", filesystem=fs)).manifest
    assert manifest.filesystem is fs
    ctx = multiprocessing.get_context("fork")
    here, there = ctx.Pipe()
    proc = ctx.Process(target=_child_filesystem, args=(manifest, id(fs), there))
    proc.start()
    assert here.poll(60), "the forked process answered"
    own, kind, size = here.recv()
    proc.join(30)
    assert own and kind == type(fs).__name__ and size > 0
    assert manifest.filesystem is fs  # the parent keeps its own


# -- the same faults through fsspec (s3fs): its client raises classes of its own -------------------


def _s3fs(server: S3Server, proxy: FaultProxy, *, attempts: int = 5, **config: Any) -> Any:
    """An s3fs filesystem through the proxy; ``attempts``: its own tries per request (s3fs's ``retries``)."""
    import s3fs

    fs = s3fs.S3FileSystem(
        key=server.access_key, secret=server.secret_key, skip_instance_cache=True,
        default_block_size=1 << 16,  # reads of 64 KiB: several GETs a row group, so faults fall inside reads
        client_kwargs={"endpoint_url": f"http://{proxy.endpoint}", "region_name": "us-east-1"},
        config_kwargs=config,
    )
    fs.retries = attempts
    return fs


def test_through_s3fs_503s_and_cut_bodies_are_retried_and_change_nothing(
    server: S3Server, proxy: FaultProxy, local: Path
) -> None:
    want = _batches(_pipeline(local))
    # the client's own retries off: arrowstream's alone must carry the faults
    fs = _s3fs(server, proxy, attempts=1, retries={"max_attempts": 1})
    it = _pipeline(f"{BUCKET}/docs", filesystem=fs).iter()
    got = [next(it)["input_ids"].tobytes()]  # the faults fall on row-group reads (discovery: a test below)
    proxy.set(Faults(slow_down=0.3, cut=0.3, seed=3))
    got += [b["input_ids"].tobytes() for b in it]
    faults = [r.fault for r in proxy.requests if r.fault]
    assert "slow_down" in faults and "cut" in faults, "the proxy injected both kinds of fault"
    assert it.read_retries >= 2, "aiohttp's cut bodies and botocore's 503s were taken for transient"
    assert got == want


def test_through_s3fs_a_stall_ends_in_a_named_error_within_the_deadline_and_a_resume_goes_on(
    server: S3Server, proxy: FaultProxy, local: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    want = _batches(_pipeline(local))
    monkeypatch.setenv("ARROWSTREAM_READ_ATTEMPTS", "2")
    monkeypatch.setenv("ARROWSTREAM_READ_BACKOFF", "0.1")
    fs = _s3fs(server, proxy, attempts=1, read_timeout=1, connect_timeout=1, retries={"max_attempts": 1})
    # s3fs raises an IndexError while handling the timeout: the error names what it began as
    _stall_ends_named_and_resumes(
        proxy, _pipeline(f"{BUCKET}/docs", filesystem=fs, prefetch=0), want, "raised while handling .*Read timeout"
    )


def test_through_s3fs_access_denied_fails_at_once_naming_the_file(
    server: S3Server, proxy: FaultProxy, tmp_path: Path
) -> None:
    fs = _s3fs(server, proxy)
    manifest = tmp_path / "manifest.parquet"
    write_manifest(f"{BUCKET}/docs", manifest, filesystem=fs)
    ds = _pipeline(f"{BUCKET}/docs", filesystem=fs, manifest=manifest)
    proxy.set(Faults(forbid=0))
    start = time.monotonic()
    # s3fs opens from the listing it keeps (no request): the refusal comes with the first read
    with pytest.raises(
        ShardError, match=r"cannot read 'corpus/docs/part-\d+\.parquet', row group \d+.*AccessDenied.*the storage refused it"
    ):
        _batches(ds)
    assert time.monotonic() - start < 5, "a refusal is not retried"


def test_through_s3fs_a_refused_dataset_is_an_error_not_an_empty_stream(
    server: S3Server, proxy: FaultProxy, tmp_path: Path
) -> None:
    """Counting tokens read every row group first: a refusal there was counted as no token, and no batch came."""
    fs = _s3fs(server, proxy)
    manifest = tmp_path / "manifest.parquet"
    write_manifest(f"{BUCKET}/docs", manifest, filesystem=fs)
    for on_error in ("raise", "skip"):  # a refusal is never skipped: the bytes were not even seen
        ds = _pipeline(f"{BUCKET}/docs", filesystem=fs, manifest=manifest, on_error=on_error)
        proxy.set(Faults(forbid=0))
        with pytest.raises(ShardError, match=r"part-\d+\.parquet', row group \d+.*AccessDenied"):
            _batches(ds)
        proxy.set(Faults())


def test_through_s3fs_the_listing_and_footer_reads_are_retried_when_the_dataset_opens(
    server: S3Server, proxy: FaultProxy, local: Path
) -> None:
    want = _batches(_pipeline(local))
    fs = _s3fs(server, proxy, attempts=1, retries={"max_attempts": 1})
    proxy.set(Faults(slow_down=0.5, seed=1))
    ds = _pipeline(f"{BUCKET}/docs", filesystem=fs)  # listed and every footer read here, half the GETs 503
    faults = [r for r in proxy.requests if r.fault == "slow_down"]
    assert any(r.is_list for r in faults) and any(not r.is_list for r in faults), "the listing and footer reads met 503s"
    proxy.set(Faults())
    assert _batches(ds) == want


def test_through_s3fs_an_object_replaced_after_its_manifest_was_written_is_refused_by_its_etag(
    server: S3Server, proxy: FaultProxy, local: Path, tmp_path: Path
) -> None:
    """fsspec files state no ETag in their metadata: it comes from the filesystem's ``info`` (before, only the size)."""
    manifest = tmp_path / "manifest.parquet"
    write_manifest(f"{BUCKET}/docs", manifest, filesystem=_s3fs(server, proxy))
    client = server.client()
    original = client.get_object(Bucket=BUCKET, Key="docs/part-002.parquet")["Body"].read()
    try:
        changed = bytearray(original)
        changed[len(changed) // 3] ^= 0xFF  # the same size, other bytes: read with the old footer, other batches
        client.put_object(Bucket=BUCKET, Key="docs/part-002.parquet", Body=bytes(changed))
        ds = _pipeline(f"{BUCKET}/docs", filesystem=_s3fs(server, proxy), manifest=manifest)
        with pytest.raises(ShardError, match=r"'corpus/docs/part-002\.parquet' changed since the dataset was opened: its ETag"):
            _batches(ds)
    finally:
        client.put_object(Bucket=BUCKET, Key="docs/part-002.parquet", Body=original)



def test_the_lookup_listing_and_footer_reads_are_retried_when_the_dataset_opens(
    server: S3Server, proxy: FaultProxy, local: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    want = _batches(_pipeline(local))
    monkeypatch.setenv("ARROWSTREAM_READ_ATTEMPTS", "8")  # half the GETs fail: a few in a row, now and then
    monkeypatch.setenv("ARROWSTREAM_READ_BACKOFF", "0.01")
    fs = _fs(server, proxy, retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=1))  # the client's off
    proxy.set(Faults(slow_down=0.5, seed=5))  # seed 5: the first GET is answered 503
    ds = _pipeline(f"{BUCKET}/docs", filesystem=fs)
    gets = [r for r in proxy.requests if r.method == "GET"]
    # the path's lookup asks for one key under it (a HEAD, then this LIST): its first answer was a 503
    assert gets[0].is_list and "max-keys=1" in gets[0].query and gets[0].fault == "slow_down", gets[0]
    faults = [r for r in gets if r.fault == "slow_down"]
    assert any(r.is_list for r in faults[1:]) and any(not r.is_list for r in faults), "the listing and footer reads met 503s"
    proxy.set(Faults())
    assert _batches(ds) == want


def _ids_file(path: Path, first: int, rows: int = 80, **options: Any) -> None:
    """A file of ``rows`` documents of 8 ids from ``first``, uncompressed: the same size whatever ``first``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    docs = [[first + i * 100 + j for j in range(8)] for i in range(rows)]
    layout = {"row_group_size": 10, "compression": "none", "use_dictionary": False, "write_statistics": False}
    pq.write_table(pa.table({"ids": pa.array(docs, pa.list_(pa.int32()))}), path, **{**layout, **options})


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_an_object_deleted_or_replaced_while_read_always_raises_naming_it(
    server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, on_error: str
) -> None:
    # pyarrow says NO_SUCH_KEY, which was not known as a refusal: with on_error="skip" a deleted object was skipped
    # as bad bytes; one rewritten with another size mid-epoch too; and one rewritten with the same size was read
    # with its old footer for the rest of the run (its new ids came out)
    monkeypatch.setenv("ARROWSTREAM_READ_AHEAD", "0")
    monkeypatch.setenv("ARROWSTREAM_READ_BACKOFF", "0.01")
    (tmp_path / "ds").mkdir()
    _ids_file(tmp_path / "ds" / "part-0.parquet", 1)
    _ids_file(tmp_path / "ds" / "part-1.parquet", 20_001)
    _ids_file(tmp_path / "same.parquet", 70_001)  # other ids, the same size and layout
    _ids_file(tmp_path / "other.parquet", 1, rows=90, compression="zstd", row_group_size=7)  # reads fail
    s3 = server.client()
    fs = server.filesystem()

    def pipeline(prefix: str) -> Any:
        server.upload(BUCKET, prefix, tmp_path / "ds")
        ds = read_parquet(f"{BUCKET}/{prefix}", filesystem=fs, num_epochs=2, on_error=on_error)
        return ds.tokenize(None, column="ids", eos_id=0).pack(seq_len=36, batch_size=1)

    cases = {
        "deleted": (lambda key: s3.delete_object(Bucket=BUCKET, Key=key), r"cannot be opened any more .*deleted"),
        "other size": (lambda key: s3.put_object(Bucket=BUCKET, Key=key, Body=(tmp_path / "other.parquet").read_bytes()),
                       r"changed since the dataset was opened: its size was"),
        "same size": (lambda key: s3.put_object(Bucket=BUCKET, Key=key, Body=(tmp_path / "same.parquet").read_bytes()),
                      r"changed since the dataset was opened: its ETag was .*while it was open for reading"),
    }
    for n, (name, (change, says)) in enumerate(cases.items()):
        it = pipeline(f"{on_error}-{n}").iter()
        next(it)  # part-0 is open now
        change(f"{on_error}-{n}/part-0.parquet")
        seen = []
        with pytest.raises(ShardError, match=rf"part-0\.parquet.*({says})"):
            for batch in it:
                seen += batch["input_ids"].ravel().tolist()
        assert not any(t >= 70_001 for t in seen) or name == "same size", name
        assert it.stats.get("unreadable", 0) == 0, name  # nothing skipped as bad bytes on the way


def test_a_manifest_file_on_the_data_store_is_read_through_the_filesystem_given(
    server: S3Server, proxy: FaultProxy, local: Path, tmp_path: Path
) -> None:
    # it was opened as a local path (or, as an s3:// URI, on AWS itself, without the endpoint the filesystem has)
    fs = _fs(server, proxy)
    manifest = tmp_path / "manifest.parquet"
    write_manifest(f"{BUCKET}/docs", manifest, filesystem=fs)
    server.client().put_object(Bucket=BUCKET, Key="meta/through-fs.parquet", Body=manifest.read_bytes())
    want = _batches(_pipeline(local))
    for where in (f"{BUCKET}/meta/through-fs.parquet", f"s3://{BUCKET}/meta/through-fs.parquet"):
        assert _batches(_pipeline(f"{BUCKET}/docs", filesystem=fs, manifest=where)) == want, where
    assert _batches(_pipeline(f"{BUCKET}/docs", filesystem=fs, manifest=manifest)) == want  # a local one still is
    # written through it too (s3fs here: the test server refuses pyarrow's own uploads)
    import s3fs

    s3 = s3fs.S3FileSystem(key=server.access_key, secret=server.secret_key, skip_instance_cache=True,
                           client_kwargs={"endpoint_url": f"http://{proxy.endpoint}", "region_name": "us-east-1"})
    assert write_manifest(f"{BUCKET}/docs", f"{BUCKET}/meta/written.parquet", filesystem=s3) == 3
    assert not (Path.cwd() / BUCKET).exists()
    assert _batches(_pipeline(f"{BUCKET}/docs", filesystem=s3, manifest=f"s3://{BUCKET}/meta/written.parquet")) == want


@pytest.mark.parametrize(
    "text",
    ["AWS Error NO_SUCH_KEY during GetObject operation: The specified key does not exist.",
     "AWS Error NO_SUCH_BUCKET during GetObject operation: The specified bucket does not exist"],
)
def test_pyarrows_words_for_a_missing_object_are_a_refusal_never_a_skip(text: str) -> None:
    # a read through an already-open file of a deleted object says NO_SUCH_KEY: not bad bytes to skip
    from arrowstream.io.failures import refused, skippable

    assert refused(OSError(text)) and not skippable(OSError(text))
