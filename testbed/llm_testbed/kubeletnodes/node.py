"""One kubelet node: its containerd and kubelet processes, started, stopped and killed here.

Each process runs in a session of its own (it outlives ``llmjob cluster up``), with its log under
``logs/`` and its pid under ``pids/`` of the node's folder. The node's containers run under containerd's
runc shims in the node's cgroup (``NodeLayout.cgroup_root``), so "every process of this node" is: the
kubelet, containerd, the shims that serve this containerd's socket, and every task of that cgroup.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from llm_testbed.kubeletnodes import configs, network
from llm_testbed.kubeletnodes.layout import NodeLayout
from llm_testbed.kubeletnodes.procs import Processes, alive, reap

CGROUP_V1 = Path("/sys/fs/cgroup")
CONTAINERD_START_TIMEOUT_S = 30.0
PROCESSES = ("containerd", "kubelet")


@dataclass(frozen=True)
class NodeBinaries:
    containerd: Path
    shim: Path  # containerd-shim-runc-v2 (found by containerd on PATH)
    kubelet: Path
    cni_bin_dir: str


CAP_SYS_RESOURCE = 24


def has_capability(bit: int, status: Path = Path("/proc/self/status")) -> bool:
    """Whether this process's capability bounding set holds capability ``bit``."""
    for line in status.read_text().splitlines():
        if line.startswith("CapBnd:"):
            return bool(int(line.split()[1], 16) >> bit & 1)
    return False


def processes(node: NodeLayout) -> Processes:
    """The node's containerd and kubelet: pids and logs under the node's folder."""
    return Processes(node.root)


def running_pid(node: NodeLayout, process: str) -> int | None:
    return processes(node).running(process)


def cgroup_dirs(node: NodeLayout) -> list[Path]:
    """The node's cgroup in every mounted v1 hierarchy (and the v2 one of a hybrid machine)."""
    found = []
    for hierarchy in sorted(CGROUP_V1.iterdir()) if CGROUP_V1.is_dir() else []:
        if hierarchy.is_dir() and not hierarchy.is_symlink():
            found.append(hierarchy / node.cgroup_root.lstrip("/"))
    return found


def make_cgroups(node: NodeLayout) -> None:
    """The kubelet wants its ``cgroupRoot`` to exist in every hierarchy before it starts."""
    for folder in cgroup_dirs(node):
        folder.mkdir(parents=True, exist_ok=True)


def write_files(
    node: NodeLayout,
    binaries: NodeBinaries,
    *,
    sandbox_image: str,
    registry: str,
    mirrored: Sequence[str],
    kubelet_config: str,
    kubeconfig: str,
) -> None:
    """Every configuration file of the node (idempotent: a restarted node gets the same files)."""
    for folder in (node.root, node.cni_conf_dir, node.registry_hosts, node.kubelet_dir, node.pod_logs_dir):
        folder.mkdir(parents=True, exist_ok=True)
    node.containerd_config.write_text(
        configs.containerd_config(
            node,
            sandbox_image,
            binaries.cni_bin_dir,
            restrict_oom_score_adj=not has_capability(CAP_SYS_RESOURCE),
        )
    )
    for host in {registry, *mirrored}:
        hosts = node.registry_hosts / host / "hosts.toml"
        hosts.parent.mkdir(parents=True, exist_ok=True)
        hosts.write_text(configs.registry_hosts(registry))
    (node.cni_conf_dir / "10-llmjob.conflist").write_text(configs.cni_config(node))
    node.kubelet_config.write_text(kubelet_config)
    node.kubeconfig.write_text(kubeconfig)


def _path_env(binaries: NodeBinaries) -> dict[str, str]:
    """containerd finds its shim on PATH; runc and the CNI plugins are given by path."""
    return {"PATH": f"{binaries.shim.parent}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"}


def start_containerd(node: NodeLayout, binaries: NodeBinaries) -> int:
    pid = running_pid(node, "containerd")
    if pid is not None:
        return pid
    with contextlib.suppress(FileNotFoundError):
        node.containerd_socket.unlink()
    procs = processes(node)
    argv = [str(binaries.containerd), "--config", str(node.containerd_config)]
    proc = procs.launch("containerd", argv, _path_env(binaries))
    return procs.wait_started(
        "containerd", proc, node.containerd_socket.is_socket, CONTAINERD_START_TIMEOUT_S
    )


def start_kubelet(node: NodeLayout, binaries: NodeBinaries, labels: dict[str, str]) -> int:
    pid = running_pid(node, "kubelet")
    if pid is not None:
        return pid
    network.ensure_bridge(node.bridge, node.ip, network.prefix_of(node.pod_cidr))
    make_cgroups(node)
    argv = configs.kubelet_argv(str(binaries.kubelet), node, labels)
    return processes(node).launch("kubelet", argv, _path_env(binaries)).pid


def kubelet_exited(node: NodeLayout) -> str | None:
    """The tail of the kubelet's log if it is not running (it exited), else ``None``."""
    procs = processes(node)
    return None if procs.running("kubelet") is not None else procs.tail("kubelet")


def _proc_argvs() -> Iterator[tuple[int, bytes]]:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                yield int(entry.name), (entry / "cmdline").read_bytes()


def node_pids(node: NodeLayout) -> set[int]:
    """Every process of the node: kubelet, containerd, its shims (their argv names the node's folder) and
    every task in the node's cgroups (the containers)."""
    marker = str(node.root).encode()
    pids = {pid for pid, argv in _proc_argvs() if marker in argv}
    for folder in cgroup_dirs(node):
        if not folder.is_dir():
            continue
        for procs in folder.rglob("cgroup.procs"):
            with contextlib.suppress(OSError, ValueError):
                pids |= {int(p) for p in procs.read_text().split()}
    pids.discard(os.getpid())
    return pids


def kill_all(node: NodeLayout, timeout: float = 10.0) -> int:
    """SIGKILL every process of the node at once (an instance that terminates); returns how many."""
    pids = node_pids(node)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in pids:
        reap(pid)
    for process in PROCESSES:
        processes(node).pid_file(process).unlink(missing_ok=True)
    return len(pids)


def _mounts_below(root: Path) -> list[str]:
    prefix = str(root) + "/"
    found = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        target = line.split()[1].encode().decode("unicode_escape")
        if target.startswith(prefix):
            found.append(target)
    return sorted(found, key=len, reverse=True)


def remove_files(node: NodeLayout) -> None:
    """Unmount what the node left mounted (volumes, rootfs, netns), delete its cgroups, bridge and folder."""
    for target in _mounts_below(node.root):
        subprocess.run(["umount", "-l", target], capture_output=True, check=False)
    for folder in cgroup_dirs(node):
        if folder.is_dir():
            for sub in sorted(
                (p for p in folder.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True
            ):
                with contextlib.suppress(OSError):
                    sub.rmdir()
            with contextlib.suppress(OSError):
                folder.rmdir()
    network.delete_link(node.bridge)
    shutil.rmtree(node.root, ignore_errors=True)
