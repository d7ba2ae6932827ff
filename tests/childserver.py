"""A test server run as a child process on a free port of 127.0.0.1: started, waited for, stopped."""

from __future__ import annotations

import http.client
import socket
import subprocess
import time
from pathlib import Path

__all__ = ["ChildServer", "free_port"]


def free_port() -> int:
    """Return a TCP port of 127.0.0.1 that is free now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ChildServer:
    """Run ``command`` (with ``{port}`` in it) until :meth:`stop`; ready once ``GET probe`` gets any HTTP answer.

    Its output goes to ``workdir/<name>.log``; a server that exits or does
    not answer within 30 s is a ``RuntimeError`` naming that file.
    """

    def __init__(self, command: list[str], workdir: Path, *, name: str, probe: str) -> None:
        port = free_port()
        self.endpoint = f"127.0.0.1:{port}"
        log_path = workdir / f"{name}.log"
        self._log = open(log_path, "wb")  # noqa: SIM115 (closed with the process)
        self.process: subprocess.Popen[bytes] | None = subprocess.Popen(
            [part.replace("{port}", str(port)) for part in command], stdout=self._log, stderr=subprocess.STDOUT
        )
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
        """Stop the server (terminate, then kill after 10 s); nothing when stopped already."""
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self._log.close()
            self.process = None
