"""Control-plane faults: stop one component of a running local cluster and start it again.

kwokctl's binary runtime runs each component as a process with its pid in ``pids/<component>.pid`` and
its output in ``logs/<component>.log``, but has no command to restart one. :func:`stop` takes the
process's own command line, working folder and environment from ``/proc`` (:func:`capture`) before it
kills it, so the restart (:meth:`Launch.start`) is the same component with the same flags, data and
ports, like a crashed control-plane process that its supervisor brings back.

:class:`Supervisor` is that supervisor for components that exit by themselves, as kubelet is for a real
control plane's static pods: kube-scheduler, for one, exits on purpose when its cache sees a pod bound to
another node than it assumed (a bind whose answer was lost while etcd was down). A component stopped with
:func:`stop` is held (a ``<component>.held`` file beside its pid file) until :meth:`Launch.start`, so the
supervisor never undoes a fault a test made on purpose. Every step that reads or changes a component's
pid and hold (a stop, a start, the supervisor's look and restart) runs under that component's lock (a
``<component>.lock`` file, :func:`_exclusive`): without it the supervisor could read the old pid of a
component a test had just stopped, then find the hold already released by the test's start, and start a
second copy, which cannot bind the port, exits, and is started again for ever (seen under load).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from llm_testbed.localcluster.cluster import COMPONENTS, LocalCluster, pid_alive
from llm_testbed.localcluster.errors import LocalClusterError
from llm_testbed.localcluster.filelock import locked
from llm_testbed.localcluster.waiting import poll

STOP_TIMEOUT_S = 20.0
READY_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Launch:
    """How a component was started: what it takes to start it again the same way."""

    cluster: LocalCluster
    component: str
    argv: list[str]
    cwd: str
    env: dict[str, str]

    def start(self, wait: bool = True) -> int:
        """Start the component as it was (and release its hold); with ``wait``, wait until the apiserver
        answers /readyz again. Its pid."""
        with _exclusive(self.cluster, self.component):
            pid = self._spawn()
        if wait:
            what = f"kube-apiserver of {self.cluster.name} to answer /readyz after {self.component} restarted"
            poll(self.cluster.is_running, timeout=READY_TIMEOUT_S, what=what, interval=0.2)
        return pid

    def _spawn(self) -> int:
        """Start the process, record its pid, release the hold (the caller holds the component's lock)."""
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
        # As kwokctl writes it (a bare number: its `delete` parses the file with Atoi and, on a newline,
        # skips the kill and leaves the process running).
        _pid_file(self.cluster, self.component).write_text(str(proc.pid))
        _held_file(self.cluster, self.component).unlink(missing_ok=True)
        return proc.pid


def _pid_file(cluster: LocalCluster, component: str) -> Path:
    return cluster.workdir / "pids" / f"{component}.pid"


def _held_file(cluster: LocalCluster, component: str) -> Path:
    return cluster.workdir / "pids" / f"{component}.held"


@contextlib.contextmanager
def _exclusive(cluster: LocalCluster, component: str) -> Iterator[None]:
    """Hold ``component``'s lock: no other stop, start or supervisor look at it meanwhile (threads or
    processes)."""
    with locked(cluster.workdir / "pids" / f"{component}.lock"):
        yield


def _live_pid(cluster: LocalCluster, component: str) -> int:
    if component not in COMPONENTS:
        raise LocalClusterError(f"unknown component {component!r}: one of {', '.join(COMPONENTS)}")
    pid = cluster.component_pids().get(component)
    if pid is None or not pid_alive(pid):
        raise LocalClusterError(f"{component} of cluster {cluster.name} is not running")
    return pid


def capture(cluster: LocalCluster, component: str) -> Launch:
    """How the running ``component`` was started (its command line, folder and environment)."""
    return _launch_of(cluster, component, _live_pid(cluster, component))


def _launch_of(cluster: LocalCluster, component: str, pid: int) -> Launch:
    proc = Path(f"/proc/{pid}")
    argv = [part.decode() for part in (proc / "cmdline").read_bytes().split(b"\0") if part]
    if not argv:  # a zombie, or a process still inside execve
        raise LocalClusterError(f"{component} (pid {pid}) shows no command line to start it again with")
    cwd = str((proc / "cwd").readlink())
    env = dict(
        entry.decode().split("=", 1)
        for entry in (proc / "environ").read_bytes().split(b"\0")
        if b"=" in entry
    )
    return Launch(cluster, component, argv, cwd, env)


def dead(cluster: LocalCluster) -> list[str]:
    """The components of ``cluster`` that are wholly gone (see :func:`_running`), in start order."""
    pids = cluster.component_pids()
    return [c for c in COMPONENTS if c not in pids or not _running(pids[c])]


def stop(cluster: LocalCluster, component: str) -> Launch:
    """SIGKILL one component (like a crash: no graceful shutdown) and wait until it is gone."""
    with _exclusive(cluster, component):
        pid = _live_pid(cluster, component)
        launch = _launch_of(cluster, component, pid)
        _held_file(cluster, component).touch()
        os.kill(pid, signal.SIGKILL)
    poll(
        lambda: not _running(pid),
        timeout=STOP_TIMEOUT_S,
        what=f"{component} (pid {pid}) to exit",
        interval=0.05,
    )
    return launch


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


@dataclass(frozen=True)
class Restarted:
    """One restart the supervisor made: which component, when (epoch seconds), its log's last line."""

    component: str
    at: float
    last_log_line: str

    def describe(self) -> str:
        return f"{self.component} exited and was started again ({self.last_log_line[:300]})"


class Supervisor:
    """Starts again, the way it was started, any component of ``cluster`` that exits while not held."""

    def __init__(self, cluster: LocalCluster, launches: dict[str, Launch], interval: float = 0.5) -> None:
        self._cluster = cluster
        self._launches = launches
        self._interval = interval
        self._restarted: list[Restarted] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="control-plane-supervisor", daemon=True)

    @classmethod
    def of(cls, cluster: LocalCluster) -> Supervisor:
        """A supervisor of every component of ``cluster``, as each runs now."""
        return cls(cluster, {component: capture(cluster, component) for component in COMPONENTS})

    def start(self) -> Supervisor:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def take(self) -> list[Restarted]:
        """The restarts made since the last call."""
        with self._lock:
            taken, self._restarted = self._restarted, []
        return taken

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            for component, launch in self._launches.items():
                with _exclusive(self._cluster, component):
                    if not self._exited(component):
                        continue
                    last = _last_line(self._cluster.logs_dir / f"{component}.log")
                    launch._spawn()
                with self._lock:
                    self._restarted.append(Restarted(component, time.time(), last))

    def check(self) -> list[str]:
        """The components that exited and are not held."""
        exited = []
        for component in self._launches:
            with _exclusive(self._cluster, component):
                if self._exited(component):
                    exited.append(component)
        return exited

    def _exited(self, component: str) -> bool:
        """Gone, and not held (the caller holds the component's lock)."""
        return component in dead(self._cluster) and not _held_file(self._cluster, component).exists()


def _last_line(log: Path) -> str:
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return "no log"
    return lines[-1] if lines else "empty log"
