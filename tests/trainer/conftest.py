"""Fixtures of the trainer tests: a real etcd, a small prepared corpus, and a process registry that kills
every process a test started."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from llm_trainer.testing.local_etcd import LocalEtcd, etcd_binary
from trainer_support import write_corpus

VENV_BIN = Path(sys.executable).parent


@pytest.fixture(scope="session")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalEtcd]:
    """One etcd 3.6 for the session (built by the project's pinned tool builder on first use)."""
    with LocalEtcd(etcd_binary(), tmp_path_factory.mktemp("etcd")) as server:
        yield server


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Byte-level token shards of a small generated corpus (several shards)."""
    from llm_trainer.data.prepare import main as prepare

    root = tmp_path_factory.mktemp("corpus")
    write_corpus(root / "text")
    assert prepare([str(root / "text"), "--output", str(root / "shards"), "--shard-tokens", "20000"]) == 0
    return root / "shards"


def trainer_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment of trainer subprocesses: one thread each (2-core CI), unbuffered output."""
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "LOGLEVEL": "WARNING"})
    env.pop("LLMJOB_CHECKPOINT_DIR", None)
    env.update(extra or {})
    return env


class Processes:
    """Starts processes in their own process group and kills every group that is still alive at the end."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.started: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(
        self, argv: Sequence[str], name: str, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """Run ``argv`` with output in ``<logs>/<name>.log``."""
        self.logs.mkdir(parents=True, exist_ok=True)
        log_path = self.logs / f"{name}.log"
        with log_path.open("ab") as log:
            proc = subprocess.Popen(
                list(argv),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env or trainer_env(),
                start_new_session=True,
            )
        self.started.append((proc, log_path))
        return proc

    def log_of(self, proc: subprocess.Popen[bytes]) -> str:
        """Everything the process printed so far."""
        for candidate, path in self.started:
            if candidate is proc:
                return path.read_text(errors="replace")
        return ""

    @staticmethod
    def kill_group(proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
        """Signal the process and everything it started (a lost node)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)

    def close(self) -> None:
        """SIGKILL every group still alive and reap it."""
        for proc, _ in self.started:
            self.kill_group(proc)
        for proc, _ in self.started:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)

    def dump(self) -> str:
        """The tail of every log, for failure messages."""
        parts = []
        for proc, path in self.started:
            tail = "\n".join(path.read_text(errors="replace").splitlines()[-40:])
            parts.append(f"--- {path.name} (pid {proc.pid}, rc {proc.poll()}) ---\n{tail}")
        return "\n".join(parts)


@pytest.fixture
def procs(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Processes]:
    """A process registry whose processes are all killed after the test; logs are printed on failure."""
    registry = Processes(tmp_path / "logs")
    try:
        yield registry
    finally:
        registry.close()
        report = getattr(request.node, "rep_call", None)
        if report is not None and report.failed:
            print(registry.dump())


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Keep each phase's report on the item so fixtures can tell whether the test failed."""
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


def train_argv(data: Path, checkpoint_dir: Path, *extra: str) -> list[str]:
    """``python -m llm_trainer`` with the tiny model and small, fast settings."""
    return [
        sys.executable,
        "-m",
        "llm_trainer",
        "--data",
        str(data),
        "--checkpoint-dir",
        str(checkpoint_dir),
        "--model",
        "tiny",
        "--seq-len",
        "32",
        "--global-batch",
        "12",
        "--micro-batch",
        "2",
        "--metrics-port",
        "0",
        *extra,
    ]
