"""Argo CD core as background processes of one local cluster: Redis, the repo server, the controller.

Everything lives in ``<cluster folder>/argocd/``: each process's log, its PID and ports
(``process.json``), and the repo server's temporary folder (git checkouts, Helm renders) and ask-pass
socket, so two clusters side by side never share one. The controller and the repo server are one binary
(tool ``argocd``) that picks its role from ``ARGOCD_BINARY_NAME``. They talk over loopback without TLS;
the controller reaches kube-apiserver with the cluster's admin kubeconfig and treats it as the in-cluster
destination (``https://kubernetes.default.svc``). Redis comes from Debian (``redis-server``), installed
on first use (:mod:`llm_testbed.host_packages`).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path

from llm_testbed import host_packages
from llm_testbed.argocd.manifests import NAMESPACE, ArgoCDError
from llm_testbed.localcluster import daemons, ports, tools
from llm_testbed.localcluster.progress import say

TOOL = "argocd"
READY_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 15.0
PROCESSES = ("redis", "repo-server", "controller")  # started in this order, stopped in the reverse
PORT_NAMES = ("redis", "repo-server", "repo-server-metrics", "controller-metrics")
APP_RESYNC_S = 5
"""--app-resync (its jitter 0): how often the controller compares every Application with git again without a
reason. A write to a managed object's status alone does not make it compare (Argo CD drops status-only
updates), so this is the pace at which a test sees the operator's writes compared; upstream: 120 s plus up
to 60 s of jitter."""


def state_dir(cluster_dir: Path) -> Path:
    return cluster_dir / "argocd"


def log_path(folder: Path, process: str) -> Path:
    return folder / f"{process}.log"


def _read(folder: Path) -> dict[str, int]:
    try:
        data = json.loads((folder / "process.json").read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): int(v) for k, v in data.items()} if isinstance(data, dict) else {}


def _alive(pid: int | None, binary: str) -> bool:
    """``pid`` is a live process of ``binary`` (by its executable: Redis rewrites its command line)."""
    if pid is None:
        return False
    try:
        exe = Path(f"/proc/{pid}/exe").readlink()
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z" and exe.name.removesuffix(" (deleted)") == binary  # a rebuilt tool: still ours


def _binary(process: str) -> str:
    """The executable's file name (Debian's redis-server is a link to redis-check-rdb)."""
    if process != "redis":
        return TOOL
    return Path(shutil.which("redis-server") or "redis-server").resolve().name


def alive(folder: Path) -> dict[str, bool]:
    """Which of the processes run for this folder (live PIDs of the right binaries, not reused)."""
    data = _read(folder)
    return {p: _alive(data.get(f"pid-{p}"), _binary(p)) for p in PROCESSES}


def ports_of(folder: Path) -> dict[str, int]:
    return {k: v for k, v in _read(folder).items() if k in PORT_NAMES}


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _listens(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def argv_and_env(
    process: str, binaries: Mapping[str, Path], kubeconfig: Path, folder: Path, port_of: Mapping[str, int]
) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of one process (pure)."""
    binary, helm = binaries[TOOL], binaries["helm"]
    redis = f"127.0.0.1:{port_of['redis']}"
    if process == "redis":
        argv = ["redis-server", "--bind", "127.0.0.1", "--port", str(port_of["redis"]), "--save", "",
                "--appendonly", "no", "--protected-mode", "no", "--dir", str(folder)]  # fmt: skip
        return argv, dict(os.environ)
    # The repo server renders charts with the `helm` on its PATH (the test bed's pinned one) and runs
    # git-verify-wrapper.sh (:func:`_verify_wrapper`) for every commit.
    path = os.pathsep.join([str(folder / "bin"), str(helm.parent), os.environ.get("PATH", "")])
    common = {**os.environ, "PATH": path, "ARGOCD_GPG_ENABLED": "false", "TMPDIR": str(folder / "tmp")}
    if process == "repo-server":
        env = {**common, "ARGOCD_BINARY_NAME": "argocd-repo-server",
               "ARGOCD_ASK_PASS_SOCK": str(folder / "ask-pass.sock")}  # fmt: skip
        argv = [str(binary), "--address", "127.0.0.1", "--port", str(port_of["repo-server"]),
                "--metrics-address", "127.0.0.1", "--metrics-port", str(port_of["repo-server-metrics"]),
                "--disable-tls", "--client-ca-path=", "--redis", redis, "--logformat", "text"]  # fmt: skip
        return argv, env
    env = {**common, "ARGOCD_BINARY_NAME": "argocd-application-controller",
           "ARGOCD_CONTROLLER_REPLICAS": "1", "ARGOCD_CONTROLLER_SHARD": "0"}  # fmt: skip
    argv = [str(binary), "--kubeconfig", str(kubeconfig), "--namespace", NAMESPACE,
            "--repo-server", f"127.0.0.1:{port_of['repo-server']}", "--repo-server-plaintext",
            "--redis", redis, "--metrics-port", str(port_of["controller-metrics"]),
            "--app-resync", str(APP_RESYNC_S), "--app-resync-jitter", "0", "--self-heal-timeout-seconds", "2",
            "--persist-resource-health", "--logformat", "text"]  # fmt: skip
    return argv, env


def _verify_wrapper(folder: Path) -> None:
    """Argo CD's git-verify-wrapper.sh (copied from the module by the tool build), executable, in ``bin/``.

    Argo CD v3.6's repo server runs it for every revision it renders even with GPG off, and answers
    "permission denied" when it is missing; its container image carries it, a bare binary does not."""
    source = tools.files_dir(TOOL, "hack") / "git-verify-wrapper.sh"
    target = folder / "bin" / source.name
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
    target.chmod(0o755)


def _ready_probe(process: str, port_of: Mapping[str, int]) -> Callable[[], bool]:
    if process == "redis":
        return lambda: _listens(port_of["redis"])
    if process == "repo-server":
        return lambda: _healthy(port_of["repo-server-metrics"])
    return lambda: _healthy(port_of["controller-metrics"])


def start(kubeconfig: Path, folder: Path) -> dict[str, int]:
    """Start the processes that do not run; their PIDs once each answers its readiness probe."""
    running = alive(folder)
    if all(running.values()):
        data = _read(folder)
        return {p: data[f"pid-{p}"] for p in PROCESSES}
    stop(folder)  # a half-running set (one crashed): start all again, on fresh ports
    host_packages.ensure_commands(
        {"redis-server": "redis-server"}, host_packages.logged_run(folder, lambda m: say("argocd", m)),
        lambda m: say("argocd", m),
    )  # fmt: skip
    binaries = tools.ensure([TOOL, "helm"])
    (folder / "tmp").mkdir(parents=True, exist_ok=True)
    _verify_wrapper(folder)
    port_of = ports.pick(PORT_NAMES, taken=set())
    record: dict[str, int] = dict(port_of)
    pids: dict[str, int] = {}
    for process in PROCESSES:
        argv, env = argv_and_env(process, binaries, kubeconfig, folder, port_of)
        with log_path(folder, process).open("ab") as log:
            proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                    start_new_session=True)  # fmt: skip
        pids[process] = record[f"pid-{process}"] = proc.pid
        (folder / "process.json").write_text(json.dumps(record) + "\n")
        _wait_ready(process, proc, _ready_probe(process, port_of), folder)
    return pids


def _wait_ready(process: str, proc: subprocess.Popen[bytes], ready: Callable[[], bool], folder: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    log = log_path(folder, process)
    while not ready():
        if proc.poll() is not None:
            raise ArgoCDError(f"argocd {process} exited with code {proc.returncode} at start; log {log}:\n"
                              f"{log_tail(log)}")  # fmt: skip
        if time.monotonic() > deadline:
            proc.kill()
            raise ArgoCDError(f"argocd {process} was not ready within {READY_TIMEOUT_S:g}s; log {log}:\n"
                              f"{log_tail(log)}")  # fmt: skip
        time.sleep(0.2)


def stop(folder: Path) -> bool:
    """End the processes of this folder (controller first); True when one ran."""
    data = _read(folder)
    stopped = False
    for process in reversed(PROCESSES):
        pid = data.get(f"pid-{process}")
        binary = _binary(process)
        if pid is not None and _alive(pid, binary):
            daemons.terminate(pid, lambda p=pid, b=binary: _alive(p, b), STOP_TIMEOUT_S)  # type: ignore[misc]
            stopped = True
    (folder / "process.json").unlink(missing_ok=True)
    return stopped
