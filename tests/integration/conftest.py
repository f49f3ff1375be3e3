"""The operator under test: in-process (kopf KopfRunner) or as a real subprocess that can be killed."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kopf.testing import KopfRunner
from llm_testbed.local_etcd import free_port
from llm_testbed.localcluster.cluster import LocalCluster

from .e2e_support import PROGRESS_SECONDS, Training


@pytest.fixture
def operator(cluster: Any, namespace: str) -> Iterator[KopfRunner]:
    """The operator, in this process, watching the test's namespace only."""
    args = ["run", "--standalone", "--namespace", namespace, "-m", "llm_operator.handlers", "--verbose"]
    with KopfRunner(args, timeout=60) as runner:
        yield runner
    assert runner.exception is None, runner.output[-4000:]


class OperatorProcess:
    """`llmjob operator` as a child process with its log in a file."""

    def __init__(self, namespace: str, log_dir: Path) -> None:
        self.namespace = namespace
        self.log_dir = log_dir
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        log = (self.log_dir / f"operator-{self.starts}.log").open("wb")
        argv = [
            sys.executable,
            "-m",
            "llm_operator.cli",
            "operator",
            "--standalone",
            "--namespace",
            self.namespace,
            "--metrics-port",
            "0",
            "--liveness-port",
            "0",
            "--log-level",
            "debug",
        ]
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))

    def kill(self) -> None:
        """SIGKILL: no cleanup, like a crashed or evicted operator pod."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()

    def logs(self) -> str:
        return "\n".join(
            p.read_text(errors="replace")[-3000:] for p in sorted(self.log_dir.glob("operator-*.log"))
        )

    def full_log(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in sorted(self.log_dir.glob("operator-*.log")))


@pytest.fixture
def operator_process(cluster: Any, namespace: str, tmp_path: Path) -> Iterator[Callable[[], OperatorProcess]]:
    """A factory for an operator subprocess (started on demand, stopped at the end)."""
    made: list[OperatorProcess] = []

    def make() -> OperatorProcess:
        proc = OperatorProcess(namespace, tmp_path)
        made.append(proc)
        return proc

    yield make
    for proc in made:
        proc.stop()


class PeeredOperatorProcess(OperatorProcess):
    """`llmjob operator` as the README and the chart start it: with kopf peering (no --standalone).

    ``scope`` is ``["--all-namespaces"]`` or ``["--namespace", NS]``; /healthz and /readyz on ``probe_port``.
    """

    def __init__(
        self, namespace: str, log_dir: Path, scope: list[str], extra: list[str], env: dict[str, str]
    ) -> None:
        super().__init__(namespace, log_dir)
        self.scope = scope
        self.extra = extra
        self.env = env
        self.probe_port = free_port()

    def start(self) -> None:
        self.starts += 1
        log = (self.log_dir / f"operator-{self.starts}.log").open("wb")
        argv = [sys.executable, "-m", "llm_operator.cli", "operator", *self.scope]
        argv += ["--metrics-port", "0", "--liveness-port", str(self.probe_port), *self.extra]
        self.proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **self.env}
        )

    def probe(self, path: str) -> tuple[int, dict[str, Any]]:
        """(HTTP status, JSON body) of /healthz or /readyz; (0, {}) while nothing answers."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.probe_port}{path}", timeout=5) as rsp:
                return rsp.status, json.loads(rsp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}")
        except OSError:
            return 0, {}


@pytest.fixture
def peered_operator(
    cluster: Any, namespace: str, tmp_path: Path
) -> Iterator[Callable[..., PeeredOperatorProcess]]:
    """A factory for a peered operator subprocess: make(scope, extra=[], env={}); stopped at the end."""
    made: list[PeeredOperatorProcess] = []

    def make(
        scope: list[str], extra: list[str] | None = None, env: dict[str, str] | None = None
    ) -> PeeredOperatorProcess:
        proc = PeeredOperatorProcess(namespace, tmp_path, scope, extra or [], env or {})
        made.append(proc)
        return proc

    yield make
    for proc in made:
        proc.stop()


def _training(
    cluster: LocalCluster,
    namespace: str,
    tmp_path: Path,
    extra_env: dict[str, str] | None = None,
    extra_args: list[str] | None = None,
) -> Iterator[Training]:
    env = {"LLMJOB_PROGRESS_SECONDS": str(PROGRESS_SECONDS), **(extra_env or {})}
    scope = ["--namespace", namespace]
    operator = PeeredOperatorProcess(namespace, tmp_path, scope, extra_args or [], env)
    world = Training(cluster, namespace, operator)
    world.setup_volume()
    operator.start()
    try:
        yield world
    finally:
        cluster.kubectl("delete", "llmtrainingjob", "--all", "-n", namespace,
                        "--wait=true", "--timeout=60s", check=False)  # fmt: skip
        operator.stop()
        cluster.kubectl("delete", "pv", world.pv, "--wait=false", check=False)
        shutil.rmtree(world.volume, ignore_errors=True)


@pytest.fixture
def train(process_cluster: LocalCluster, process_namespace: str, tmp_path: Path) -> Iterator[Training]:
    """A namespace with a shared volume of prepared data and the operator started as the README does."""
    yield from _training(process_cluster, process_namespace, tmp_path)


@pytest.fixture
def container_train(
    container_cluster: LocalCluster, container_namespace: str, tmp_path: Path
) -> Iterator[Training]:
    """``train`` on the container-mode cluster: workers of a built image run in containers of it."""
    yield from _training(container_cluster, container_namespace, tmp_path)
