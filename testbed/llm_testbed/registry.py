"""A real OCI registry on loopback: CNCF Distribution's reference ``registry``, in a scratch folder.

The binary comes from the pinned tool builder (``deploy/local/tools/distribution``); the configuration is
generated here: filesystem storage under the scratch folder, plain HTTP on ``127.0.0.1`` and a free port,
no authentication, the debug server off. Clients must be told it is plain HTTP (``helm push
--plain-http``, ``podman push --tls-verify=false``). docs/decisions.md, "OCI registry in the tests".
"""

from __future__ import annotations

import http.client
import os
import signal
import subprocess
import time
from pathlib import Path
from types import TracebackType

import yaml

from llm_testbed.local_etcd import free_port


class RegistryStartError(RuntimeError):
    """The registry did not answer ``/v2/``; the message carries the tail of its log."""


def registry_binary() -> Path:
    """The pinned ``registry`` binary, built into the per-machine cache on first use."""
    from llm_testbed.localcluster.tools import ensure

    return ensure(["registry"])["registry"]


def registry_config(storage: Path, port: int, host: str = "127.0.0.1") -> dict[str, object]:
    """The registry's configuration (pure): filesystem storage, plain HTTP on ``host:port``."""
    return {
        "version": 0.1,
        "log": {"level": "warn", "formatter": "text"},
        "storage": {
            "filesystem": {"rootdirectory": str(storage)},
            "delete": {"enabled": True},
            "maintenance": {"uploadpurging": {"enabled": False}},
        },
        "http": {"addr": f"{host}:{port}", "headers": {"X-Content-Type-Options": ["nosniff"]}},
    }


class LocalRegistry:
    """One registry process; use as a context manager or call :meth:`start` / :meth:`stop`."""

    def __init__(self, binary: Path, workdir: Path, host: str = "127.0.0.1") -> None:
        self.binary = binary
        self.workdir = workdir
        self.host = host
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / "registry.log"

    @property
    def address(self) -> str:
        """``host:port``, the registry part of an image reference or an ``oci://`` URL."""
        return f"{self.host}:{self.port}"

    def start(self, timeout: float = 30.0, attempts: int = 3) -> LocalRegistry:
        """Start the registry and wait until ``/v2/`` answers 200; retries on a new port if one was taken."""
        last = ""
        for _ in range(attempts):
            self.port = free_port(self.host)
            storage = self.workdir / "storage"
            storage.mkdir(parents=True, exist_ok=True)
            config = self.workdir / f"config-{self.port}.yml"
            config.write_text(yaml.safe_dump(registry_config(storage, self.port, self.host)))
            with self.log_path.open("ab") as log:
                self.proc = subprocess.Popen(
                    [str(self.binary), "serve", str(config)],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    env={**os.environ, "OTEL_TRACES_EXPORTER": "none"},
                )
            if self._wait_ready(timeout):
                return self
            last = self.log_tail()
            self.stop()
        raise RegistryStartError(f"the registry did not answer /v2/ after {attempts} attempts:\n{last}")

    def _wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                return False
            if self.ready():
                return True
            time.sleep(0.1)
        return False

    def ready(self) -> bool:
        """Whether the API root ``/v2/`` answers 200 (the OCI distribution spec's version check)."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=1)
        try:
            conn.request("GET", "/v2/")
            return conn.getresponse().status == 200
        except (OSError, http.client.HTTPException):
            return False
        finally:
            conn.close()

    def log_tail(self, lines: int = 20) -> str:
        """The last lines of the registry's log."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout``; waits for the process to exit."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def __enter__(self) -> LocalRegistry:
        return self.start() if self.proc is None else self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
