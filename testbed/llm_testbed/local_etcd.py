"""Start and stop a real single-member etcd on free loopback ports in a scratch folder.

The binary comes from the project's pinned tool builder (``llm_testbed.localcluster.tools.ensure``), so a
fresh machine builds the same etcd version the tests were written against.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import time
from pathlib import Path

from llm_testbed.local_server import LocalServer


class EtcdStartError(RuntimeError):
    """etcd did not become healthy; the message carries the tail of its log."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def etcd_binary() -> Path:
    """The pinned etcd binary, built into the per-machine cache on first use."""
    from llm_testbed.localcluster.tools import ensure

    return ensure(["etcd"])["etcd"]


class LocalEtcd(LocalServer):
    """One etcd process; use as a context manager or call :meth:`start` / :meth:`stop`."""

    def __init__(self, binary: Path, workdir: Path, host: str = "127.0.0.1") -> None:
        super().__init__(binary, workdir, "etcd.log", host)
        self.client_port = 0

    @property
    def endpoint(self) -> str:
        """``host:port`` of the client URL."""
        return f"{self.host}:{self.client_port}"

    def start(self, timeout: float = 30.0, attempts: int = 3, port: int = 0) -> LocalEtcd:
        """Start etcd and wait until it answers ``/health``; retries with new ports if one was taken
        (``port``: this client port, for a fresh etcd at the same address)."""
        last = ""
        for attempt in range(attempts):
            self.client_port = port or free_port(self.host)
            peer_port = free_port(self.host)
            client_url = f"http://{self.host}:{self.client_port}"
            peer_url = f"http://{self.host}:{peer_port}"
            data_dir = self.workdir / f"data-{self.client_port}-{attempt}-{time.monotonic_ns()}"
            argv = [
                str(self.binary),
                "--name=default",
                f"--data-dir={data_dir}",
                f"--listen-client-urls={client_url}",
                f"--advertise-client-urls={client_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=default={peer_url}",
                "--log-level=warn",
                "--unsafe-no-fsync",
            ]
            if self._launch(argv, self.healthy, timeout):
                return self
            last = self.log_tail()
            self.stop()
        raise EtcdStartError(f"etcd did not become healthy after {attempts} attempts; log tail:\n{last}")

    def healthy(self) -> bool:
        """Whether ``/health`` answers ``{"health": "true"}``."""
        conn = http.client.HTTPConnection(self.host, self.client_port, timeout=1)
        try:
            conn.request("GET", "/health")
            body = json.loads(conn.getresponse().read() or b"{}")
            return bool(body.get("health") == "true")
        except (OSError, ValueError, http.client.HTTPException):
            return False
        finally:
            conn.close()

    def kill(self) -> None:
        """SIGKILL: the store is gone (its node died)."""
        if self.proc is not None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            self.proc = None

    def start_fresh(self) -> None:
        """An empty etcd at the same address, as the operator's Deployment brings one up behind the same
        Service after the rendezvous pod's node was lost."""
        self.start(port=self.client_port)
