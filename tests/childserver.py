"""A test server run as a child process on a free port of 127.0.0.1: started, waited for, stopped."""

from __future__ import annotations

import http.client
import socket
import subprocess
import time
from pathlib import Path

__all__ = ["ChildServer", "free_port", "free_ports_with_grpc"]


def free_port() -> int:
    """Return a TCP port of 127.0.0.1 that is free now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_ports_with_grpc(count: int) -> list[int]:
    """Return ``count`` ports of 127.0.0.1 that are free now, each with its port + 10000 free too (a gRPC port beside)."""
    out: list[int] = []
    while len(out) < count:
        port = free_port()
        if port + 10000 > 65535 or port in out or port + 10000 in out:
            continue
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", port + 10000))
        except OSError:
            continue
        out.append(port)
    return out


class ChildServer:
    """Run ``command`` (with ``{port}`` in it) until :meth:`stop`; ready once ``GET probe`` gets any HTTP answer.

    ``port``: the one to serve on (default: a free one). ``stop_wait``:
    seconds :meth:`stop` gives it to exit before killing it.

    Its output goes to ``workdir/<name>.log``; a server that exits or does
    not answer within 30 s is a ``RuntimeError`` naming that file.
    """

    def __init__(
        self, command: list[str], workdir: Path, *, name: str, probe: str, port: int | None = None, stop_wait: float = 10
    ) -> None:
        self._stop_wait = stop_wait
        port = port or free_port()
        self.endpoint = f"127.0.0.1:{port}"
        self._command = [part.replace("{port}", str(port)) for part in command]
        self._name, self._probe, self._log_path = name, probe, workdir / f"{name}.log"
        self._log = open(self._log_path, "ab")  # noqa: SIM115 (closed with the process)
        self.process: subprocess.Popen[bytes] | None = None
        self._start()

    def kill(self) -> None:
        """Kill the server at once (SIGKILL): no answer, no flush, its port closed."""
        assert self.process is not None
        self.process.kill()
        self.process.wait()

    def restart(self) -> None:
        """Start the same command again, on the same port, and wait until it answers."""
        self._start()

    def _start(self) -> None:
        name, probe, log_path = self._name, self._probe, self._log_path
        port = int(self.endpoint.rsplit(":", 1)[1])
        self.process = subprocess.Popen(self._command, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
                conn.request("GET", probe)
                conn.getresponse().read()
                conn.close()
                return
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"the test server {name} did not start: see {log_path}") from None
                time.sleep(0.1)

    def stop(self) -> None:
        """Stop the server (terminate, then kill after ``stop_wait`` seconds); nothing when stopped already."""
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=self._stop_wait)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self._log.close()
            self.process = None
