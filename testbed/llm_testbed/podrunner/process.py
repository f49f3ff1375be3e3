"""One container's process tree: start it through :mod:`.launch`, signal it, kill all of it.

Each container gets a cgroup (v2) of its own when the machine allows it, and ``cgroup.kill`` ends the
whole tree at once, even processes that started their own session; otherwise the process group and
every descendant found in /proc are SIGKILLed. The main process gets SIGTERM alone (kubelet's way:
it is the one that forwards it, as torchrun does to its workers).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from llm_testbed.podrunner import faults

CGROUP_PARENT = "llmjob-podrunner"
CGROUP_EMPTY_TIMEOUT_S = 2.0


def cgroup2_root() -> Path | None:
    """Mount point of the cgroup v2 hierarchy, when it exists and we may create groups in it."""
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return None
    for line in mounts:
        parts = line.split()
        if len(parts) > 2 and parts[2] == "cgroup2":
            root = Path(parts[1])
            if (root / "cgroup.procs").exists() and os.access(root, os.W_OK):
                return root
    return None


def cgroup_base(cluster: str) -> Path | None:
    root = cgroup2_root()
    if root is None:
        return None
    base = root / CGROUP_PARENT / cluster
    try:
        base.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    if not (base / "cgroup.kill").exists():
        return None  # kernel < 5.14: no cgroup.kill, use process groups
    return base


def cgroup_parent(path: Path | None) -> str | None:
    """A container cgroup as podman's ``--cgroup-parent`` names it: its path from the hierarchy's root
    (the same path in the cgroup v1 hierarchies, so a v1 CPU quota of that group covers it as well)."""
    root = cgroup2_root()
    if path is None or root is None or not path.is_relative_to(root):
        return None
    return "/" + str(path.relative_to(root))


@dataclass(frozen=True)
class CpuGroups:
    """Where the containers' CPU quotas are set (a node's cpu fault): cgroup v2 (``cpu.max`` in each
    container's own cgroup) or, where the cpu controller is bound to cgroup v1, a v1 cpu hierarchy
    (``cpu.cfs_quota_us`` in a group the container joins as well)."""

    base: Path
    v2: bool


def cpu_groups(cluster: str, kill_base: Path | None) -> CpuGroups | None:
    """The CPU groups of this cluster's containers, or None when the machine offers no cpu controller."""
    if kill_base is not None:
        root = cgroup2_root()
        chain = [
            root,
            *[p for p in reversed(kill_base.parents) if root and p.is_relative_to(root) and p != root],
        ]
        for group in chain:  # enable the cpu controller down to our base (fails where v1 holds it)
            with contextlib.suppress(OSError):
                if group is not None:
                    (group / "cgroup.subtree_control").write_text("+cpu")
        with contextlib.suppress(OSError):
            if "cpu" in (kill_base / "cgroup.controllers").read_text().split():
                return CpuGroups(kill_base, v2=True)
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return None
    for line in mounts:
        parts = line.split()
        if len(parts) > 3 and parts[2] == "cgroup" and "cpu" in parts[3].split(","):
            base = Path(parts[1]) / CGROUP_PARENT / cluster
            try:
                base.mkdir(parents=True, exist_ok=True)
            except OSError:
                return None
            return CpuGroups(base, v2=False) if (base / "cpu.cfs_quota_us").exists() else None
    return None


def set_cpu(groups: CpuGroups, name: str, cores: float | None) -> Path:
    """Create (or update) the container's CPU group with a quota of ``cores`` (None: no limit)."""
    path = groups.base / name
    path.mkdir(parents=True, exist_ok=True)
    if groups.v2:
        (path / "cpu.max").write_text(faults.cpu_max(cores))
    else:
        (path / "cpu.cfs_period_us").write_text(str(faults.CPU_PERIOD_US))
        (path / "cpu.cfs_quota_us").write_text(str(faults.cpu_quota_us(cores)))
    return path


def remove_cpu(groups: CpuGroups | None, name: str) -> None:
    """Remove a v1 CPU group once its processes are gone (a v2 group goes with its kill cgroup)."""
    if groups is not None and not groups.v2:
        with contextlib.suppress(OSError):
            (groups.base / name).rmdir()


def kill_cgroup(path: Path) -> None:
    """SIGKILL every process of the cgroup and remove it once empty."""
    if not path.is_dir():
        return
    with contextlib.suppress(OSError):
        (path / "cgroup.kill").write_text("1")
    deadline = time.monotonic() + CGROUP_EMPTY_TIMEOUT_S
    while time.monotonic() < deadline:  # the kernel reaps the killed tasks within milliseconds
        try:
            if "populated 0" in (path / "cgroup.events").read_text():
                break
        except OSError:
            break
        time.sleep(0.01)
    remove_cgroup(path)


def cgroup_mounts() -> list[Path]:
    """Every cgroup hierarchy of this machine (v1 controllers and v2)."""
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return []
    return [
        Path(p[1]) for p in (line.split() for line in mounts) if len(p) > 2 and p[2] in ("cgroup", "cgroup2")
    ]


def remove_cgroup(path: Path) -> None:
    """Remove an empty cgroup with the groups under it (podman's ``libpod-<id>`` and ``conmon`` groups of
    a container started below it), here and at the same path in every other hierarchy (podman makes
    them in each v1 controller). What still holds a process stays."""
    root = cgroup2_root()
    relative = path.relative_to(root) if root is not None and path.is_relative_to(root) else None
    mirrors = [m / relative for m in cgroup_mounts()] if relative is not None else [path]
    for top in {path, *mirrors}:
        if not top.is_dir():
            continue
        for folder, _, _ in sorted(os.walk(top), key=lambda w: -len(Path(w[0]).parts)):
            with contextlib.suppress(OSError):
                Path(folder).rmdir()


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


class ContainerProcess:
    """The process of one container run (a restart is a new instance)."""

    def __init__(self, plan_file: Path, log_file: Path, cgroup: Path | None) -> None:
        self.plan_file = plan_file
        self.log_file = log_file
        self.cgroup = cgroup
        self.proc: asyncio.subprocess.Process | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    async def start(self) -> int:
        if self.cgroup is not None:
            self.cgroup.mkdir(parents=True, exist_ok=True)
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with self.log_file.open("ab") as log:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "llm_testbed.podrunner.launch", str(self.plan_file),
                stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
            )  # fmt: skip
        return self.proc.pid

    async def wait(self) -> int:
        """The main process's return code (negative: killed by that signal)."""
        assert self.proc is not None
        return await self.proc.wait()

    def terminate(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGTERM)

    def kill_tree(self) -> None:
        """SIGKILL the main process and everything it started (also after it exited: leftovers)."""
        if self.cgroup is not None:
            kill_cgroup(self.cgroup)
        if self.proc is None:
            return
        pid = self.proc.pid
        victims = descendants(pid) if self.proc.returncode is None else []
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        for victim in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)
