"""Start and stop the runner in the background for one local cluster (``llmjob cluster up/down``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from llm_testbed.localcluster import daemons
from llm_testbed.localcluster.errors import LocalClusterError
from llm_testbed.podrunner import containers, files, process

READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0
CONTAINERS_MARK = "containers"  # in the state dir: the runner runs in container mode


def _pid(state_dir: Path) -> int | None:
    try:
        return int((state_dir / "runner.pid").read_text().strip())
    except (OSError, ValueError):
        return None


def alive(state_dir: Path) -> bool:
    pid = _pid(state_dir)
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def start(
    cluster: str, kubeconfig: Path, state_dir: Path, programs: Mapping[str, Path], containers: bool = False
) -> int:
    """Start the runner unless it runs; return its PID once it acts for the cluster's pods.

    ``containers``: container mode (:mod:`.containermode`); a runner started again keeps the mode.
    """
    mark = state_dir / CONTAINERS_MARK
    if alive(state_dir):
        pid = _pid(state_dir)
        assert pid is not None
        if containers and not mark.is_file():
            raise LocalClusterError(
                f"the pod runner of {cluster} runs in process mode: "
                f"`llmjob cluster down --name {cluster}` first to start it with --containers"
            )
        return pid
    check_namespaces()
    state_dir.mkdir(parents=True, exist_ok=True)
    if containers:
        mark.write_text("pods of locally built images run in containers\n")
    (state_dir / "ready").unlink(missing_ok=True)
    argv = [sys.executable, "-m", "llm_testbed.podrunner", "--kubeconfig", str(kubeconfig),
            "--state-dir", str(state_dir), "--cluster", cluster]  # fmt: skip
    for name, path in programs.items():
        argv += ["--program", f"{name}={path}"]
    if mark.is_file():
        argv.append("--containers")
    with (state_dir / "runner.log").open("ab") as log:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
        )
    (state_dir / "runner.pid").write_text(str(proc.pid))
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not (state_dir / "ready").is_file():
        if proc.poll() is not None:
            raise LocalClusterError(
                f"the pod runner exited with code {proc.returncode} at start; see {state_dir / 'runner.log'}"
            )
        if time.monotonic() > deadline:
            proc.kill()
            raise LocalClusterError(f"the pod runner was not ready within {READY_TIMEOUT_S:g}s; "
                                    f"see {state_dir / 'runner.log'}")  # fmt: skip
        time.sleep(0.1)
    return proc.pid


def check_namespaces() -> None:
    """Fail early, in one line, where the launcher could not give a pod its own mount namespace."""
    probe = subprocess.run(
        [sys.executable, "-m", "llm_testbed.podrunner.launch", "--check"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    if probe.returncode != 0:
        why = probe.stderr.strip().splitlines()[-1] if probe.stderr.strip() else f"exit {probe.returncode}"
        raise LocalClusterError(
            f"the local pod runner needs private mount namespaces ({why}): run as root, or allow "
            "unprivileged user namespaces (e.g. sysctl kernel.apparmor_restrict_unprivileged_userns=0)"
        )


def stop(cluster: str, state_dir: Path) -> bool:
    """SIGTERM the runner (it kills every pod process), SIGKILL it if it hangs; sweep leftovers."""
    pid = _pid(state_dir)
    stopped = False
    if pid is not None and alive(state_dir):
        daemons.terminate(pid, lambda: alive(state_dir), STOP_TIMEOUT_S)
        stopped = True
    base = process.cgroup_base(cluster)
    if base is not None:  # a runner killed hard leaves its pods' cgroups: end them too
        for child in base.iterdir():
            if child.is_dir():
                process.kill_cgroup(child)
        process.remove_cgroup(base)
    shutil.rmtree(files.shm_dir(cluster), ignore_errors=True)
    if (state_dir / CONTAINERS_MARK).is_file():  # a runner killed hard leaves its containers
        containers.remove_all(cluster)
    return stopped
