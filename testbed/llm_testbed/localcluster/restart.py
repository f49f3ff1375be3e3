"""Control-plane faults: stop one component of a running local cluster and start it again.

kwokctl's binary runtime runs each component as a process with its pid in ``pids/<component>.pid`` and
its output in ``logs/<component>.log``, but has no command to restart one. :func:`stop` takes the
process's own command line, working folder and environment from ``/proc`` before it kills it, so the
restart (:meth:`Stopped.start`) is the same component with the same flags, data and ports, like a
crashed control-plane process that its supervisor brings back.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from llm_testbed.localcluster.cluster import COMPONENTS, LocalCluster, pid_alive
from llm_testbed.localcluster.errors import LocalClusterError
from llm_testbed.localcluster.waiting import poll

STOP_TIMEOUT_S = 20.0
READY_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Stopped:
    """A component that :func:`stop` ended, with what it takes to start it again."""

    cluster: LocalCluster
    component: str
    argv: list[str]
    cwd: str
    env: dict[str, str]

    def start(self) -> int:
        """Start the component as it was; wait until the apiserver answers /readyz again. Its pid."""
        log = (self.cluster.logs_dir / f"{self.component}.log").open("ab")
        proc = subprocess.Popen(
            self.argv,
            cwd=self.cwd,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        # kwokctl stops components by pid later; reap ours when it exits so no zombie looks alive.
        threading.Thread(target=proc.wait, name=f"reap-{self.component}", daemon=True).start()
        _pid_file(self.cluster, self.component).write_text(f"{proc.pid}\n")
        poll(
            self.cluster.is_running,
            timeout=READY_TIMEOUT_S,
            what=f"kube-apiserver of {self.cluster.name} to answer /readyz after {self.component} restarted",
            interval=0.2,
        )
        return proc.pid


def _pid_file(cluster: LocalCluster, component: str) -> Path:
    return cluster.workdir / "pids" / f"{component}.pid"


def stop(cluster: LocalCluster, component: str) -> Stopped:
    """SIGKILL one component (like a crash: no graceful shutdown) and wait until it is gone."""
    if component not in COMPONENTS:
        raise LocalClusterError(f"unknown component {component!r}: one of {', '.join(COMPONENTS)}")
    pid = cluster.component_pids().get(component)
    if pid is None or not pid_alive(pid):
        raise LocalClusterError(f"{component} of cluster {cluster.name} is not running")
    proc = Path(f"/proc/{pid}")
    argv = [part.decode() for part in (proc / "cmdline").read_bytes().split(b"\0") if part]
    cwd = str((proc / "cwd").readlink())
    env = dict(
        entry.decode().split("=", 1)
        for entry in (proc / "environ").read_bytes().split(b"\0")
        if b"=" in entry
    )
    os.kill(pid, signal.SIGKILL)
    poll(
        lambda: not _running(pid),
        timeout=STOP_TIMEOUT_S,
        what=f"{component} (pid {pid}) to exit",
        interval=0.05,
    )
    return Stopped(cluster, component, argv, cwd, env)


def _running(pid: int) -> bool:
    """Not wholly gone yet. A killed Go process's main thread turns zombie while its other threads still
    exit and hold its files (the listening port among them): gone means reaped, or a zombie whose
    every other thread has ended."""
    proc = Path(f"/proc/{pid}")
    try:
        state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        threads = len(list((proc / "task").iterdir()))
    except (OSError, IndexError):
        return False
    return not (state == "Z" and threads <= 1)


def restart(cluster: LocalCluster, component: str) -> float:
    """Kill one component and start it again; the seconds until the apiserver answered again."""
    started = time.monotonic()
    stop(cluster, component).start()
    return time.monotonic() - started
