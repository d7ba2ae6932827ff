"""A real Google Cloud Storage API server on loopback: the ``gcp-storage-emulator`` package's, as a child process.

:class:`GcsServer` starts it in memory on a free port of 127.0.0.1 and hands
out clients of it: pyarrow's ``GcsFileSystem`` (anonymous, plain HTTP) and
gcsfs's filesystem. The same JSON API a cloud bucket answers: listing,
object metadata with ETags, ranged reads.
"""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

from .childserver import ChildServer

__all__ = ["GcsServer"]


class GcsServer(ChildServer):
    """A GCS-compatible server for the tests, started as a child process and stopped with :meth:`stop`."""

    def __init__(self, workdir: Path) -> None:
        super().__init__(
            [sys.executable, "-m", "gcp_storage_emulator", "start", "--host", "127.0.0.1", "--port", "{port}",
             "--in-memory"],
            workdir, name="gcsserver", probe="/storage/v1/b?project=test",
        )

    def filesystem(self) -> Any:
        """Return a ``pyarrow.fs.GcsFileSystem`` of the server (anonymous, plain HTTP, retries for 5 s at most)."""
        import pyarrow.fs as pafs

        return pafs.GcsFileSystem(
            anonymous=True, scheme="http", endpoint_override=self.endpoint, project_id="test",
            retry_time_limit=timedelta(seconds=5),
        )

    def uri(self, path: str) -> str:
        """Return the ``gs://`` URI of ``bucket/path`` on this server, as pyarrow reads it (anonymous)."""
        return f"gs://anonymous@{path}?endpoint_override={self.endpoint}&scheme=http"

    def gcsfs(self, **options: Any) -> Any:
        """Return a gcsfs filesystem of the server (its plain class: no probe of a bucket's type over gRPC)."""
        from gcsfs.core import GCSFileSystem

        return GCSFileSystem(endpoint_url=f"http://{self.endpoint}", token="anon", project="test",
                             skip_instance_cache=True, **options)

    def upload(self, bucket: str, prefix: str, local: Path) -> None:
        """Create ``bucket`` if needed and copy every file under ``local`` to ``prefix/<its relative path>``."""
        fs = self.filesystem()
        fs.create_dir(bucket)
        for path in sorted(local.rglob("*")):
            if path.is_file():
                self.put(f"{bucket}/{prefix}/{path.relative_to(local).as_posix()}", path.read_bytes())

    def put(self, path: str, data: bytes) -> None:
        """Write the object ``bucket/key`` with ``data``."""
        with self.filesystem().open_output_stream(path) as out:
            out.write(data)

    def get(self, path: str) -> bytes:
        """Return the bytes of the object ``bucket/key``."""
        with self.filesystem().open_input_stream(path) as f:
            return bytes(f.read())
