"""Fixtures of the trainer tests: a real etcd, a small prepared corpus, a process registry that kills
every process a test started, and a one-rank process group for in-process trainers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from llm_testbed.local_etcd import LocalEtcd, etcd_binary
from trainer_support import Processes, write_corpus


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
