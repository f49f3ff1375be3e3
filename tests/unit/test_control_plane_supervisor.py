"""The test bed's control-plane supervisor against a test's own stop and start of a component (restart.py).

The components are stand-ins (``sleep`` processes with pid files where kwokctl keeps them): what is under
test is the bookkeeping of pids and holds, not Kubernetes."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from llm_testbed.localcluster import restart
from llm_testbed.localcluster.cluster import LocalCluster, pid_alive
from support.wait import wait_for

COMPONENT = "kube-scheduler"
STAND_IN = ["sleep", "3607"]  # an unusual length, so that only our stand-ins match it
PAUSE_S = 1.0  # how long the paused supervisor waits for the test before it goes on by itself


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalCluster]:
    """A cluster folder whose one component is a ``sleep``; every copy of it is killed at the end."""
    monkeypatch.setenv("LLMJOB_CACHE_DIR", str(tmp_path))
    local = LocalCluster("supervised", tool_paths={"kubectl": Path("/bin/true")})
    (local.workdir / "pids").mkdir(parents=True)
    local.logs_dir.mkdir()
    first = subprocess.Popen(STAND_IN, start_new_session=True)
    # Popen returns while execve is still publishing the new command line (read empty now and then).
    cmdline = Path(f"/proc/{first.pid}/cmdline")
    expected = "\0".join([*STAND_IN, ""]).encode()
    wait_for(lambda: cmdline.read_bytes() == expected, 5, "the stand-in's command line")
    (local.workdir / "pids" / f"{COMPONENT}.pid").write_text(str(first.pid))
    yield local
    for pid in _copies():
        os.kill(pid, signal.SIGKILL)
    first.wait()


def _copies() -> list[int]:
    """The live stand-ins (our component's copies: the first one and those the bed started)."""
    found = subprocess.run(["pgrep", "-f", "-x", " ".join(STAND_IN)], capture_output=True, text=True).stdout
    return [int(pid) for pid in found.split() if pid_alive(int(pid))]


def _supervisor(cluster: LocalCluster) -> restart.Supervisor:
    return restart.Supervisor(cluster, {COMPONENT: restart.capture(cluster, COMPONENT)}, interval=0.01)


def test_a_restart_racing_the_supervisor_starts_one_copy(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The supervisor reads a stopped component's pid, then the test starts it again before the supervisor
    looks at the hold: the supervisor must not take the released hold for a crash and start a second copy
    (which, for kube-apiserver, cannot bind its port, exits, and is started again for ever). The supervisor
    is paused between its two reads; the test's start waits for it (both hold the component's lock)."""
    real_dead = restart.dead
    armed, inside, go = threading.Event(), threading.Event(), threading.Event()

    def paused_after_reading_pids(local: LocalCluster) -> list[str]:
        found = real_dead(local)
        if armed.is_set() and threading.current_thread().name == "control-plane-supervisor":
            armed.clear()
            inside.set()
            go.wait(PAUSE_S)
        return found

    monkeypatch.setattr(restart, "dead", paused_after_reading_pids)
    supervisor = _supervisor(cluster).start()
    try:
        held = restart.stop(cluster, COMPONENT)
        armed.set()
        assert inside.wait(10), "the supervisor never looked at the stopped component"
        starter = threading.Thread(target=held.start, kwargs={"wait": False})
        starter.start()
        starter.join(timeout=10)
        assert not starter.is_alive(), "the test's start never finished"
        go.set()
        # One more whole pass of the supervisor after the start, so a second copy would be there by now.
        inside.clear()
        go.clear()
        armed.set()
        assert inside.wait(10), "the supervisor made no pass after the start"
        go.set()
        assert supervisor.take() == [], "the supervisor started a second copy"
        pid = cluster.component_pids()[COMPONENT]
        assert _copies() == [pid], "exactly the copy the test started runs, and the pid file names it"
    finally:
        go.set()
        supervisor.stop()


def test_a_component_that_dies_by_itself_is_started_again_once(cluster: LocalCluster) -> None:
    """Not held: the supervisor starts it again, once, and the pid file names the new copy."""
    supervisor = _supervisor(cluster).start()
    try:
        old = cluster.component_pids()[COMPONENT]
        os.kill(old, signal.SIGKILL)
        restarted = wait_for(supervisor.take, 10, f"{COMPONENT} started again")
        assert [r.component for r in restarted] == [COMPONENT]
        pid = cluster.component_pids()[COMPONENT]
        assert pid != old and _copies() == [pid]
        assert supervisor.check() == []
    finally:
        supervisor.stop()
