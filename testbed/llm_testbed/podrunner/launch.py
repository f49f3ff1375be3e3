"""The launcher every container starts through: ``python -m llm_testbed.podrunner.launch PLAN.json``.

It joins the container's cgroup (so the runner can kill the whole process tree at once), enters a
private mount and UTS namespace (``unshare(CLONE_NEWNS | CLONE_NEWUTS)``: root, or a user namespace
where unprivileged ones are allowed), bind-mounts the pod's volumes at their mountPaths and the pod's
hosts file over ``/etc/hosts``, sets the pod's hostname, changes to ``workingDir`` and ``exec``s the
command: the container's main process keeps this PID. Nothing here is visible outside the pod.
The runner's own Python environment (its prefix, the checkout it runs from, the ``PYTHONPATH`` it hands the
container) stays visible even where a pod volume is mounted over a folder above it: a checkout under
``/tmp`` with an ``emptyDir`` at ``/tmp`` (the chart's operator pod) would otherwise lose its ``llmjob``.
So do the pod's own files (its volumes' folders, its termination-message file, its hosts file) where the
runner's cache is under such a folder: every bind source is opened before the first mount and bound from
its descriptor.
In container mode (``in_image``) it joins the cgroups and ``exec``s ``podman run`` instead.
Failures print one line and exit 127 (the runner reports it as the container's exit code).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import socket
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWUSER = 0x10000000
MS_RDONLY = 0x1
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000
LAUNCH_FAILED = 127

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


class LaunchError(RuntimeError):
    pass


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise LaunchError(f"{what}: {os.strerror(err)}")


def _mount(
    source: str | None, target: str, flags: int, fstype: str | None = None, data: str | None = None
) -> None:
    src = source.encode() if source is not None else None
    kind = fstype.encode() if fstype is not None else None
    options = data.encode() if data is not None else None
    _check(
        _libc.mount(src, target.encode(), kind, ctypes.c_ulong(flags), options), f"mount {source} on {target}"
    )


def enter_namespaces() -> None:
    """Private mount + UTS namespaces; falls back to a user namespace when not root."""
    if _libc.unshare(CLONE_NEWNS | CLONE_NEWUTS) != 0:
        uid, gid = os.getuid(), os.getgid()
        _check(_libc.unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWUTS), "unshare (mount, uts, user)")
        Path("/proc/self/setgroups").write_text("deny")
        Path("/proc/self/uid_map").write_text(f"0 {uid} 1")
        Path("/proc/self/gid_map").write_text(f"0 {gid} 1")
    _mount(None, "/", MS_REC | MS_PRIVATE)  # nothing we mount propagates back to the machine


def _target(path: str, is_file: bool) -> None:
    p = Path(path)
    if is_file:
        p.parent.mkdir(parents=True, exist_ok=True)
        if not p.exists():
            p.touch()
    else:
        p.mkdir(parents=True, exist_ok=True)


@dataclass(frozen=True)
class Source:
    """A bind mount's source, opened (``O_PATH``) before any mount: a pod volume mounted over a folder above
    it later cannot hide it."""

    fd: int
    is_file: bool


def open_source(path: str) -> Source:
    """Open ``path`` to bind it later (a folder that does not exist yet is made, as a bind mount needs)."""
    if not Path(path).is_file():
        Path(path).mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_PATH)
    return Source(fd, stat.S_ISREG(os.fstat(fd).st_mode))


def bind(source: Source, target: str, read_only: bool) -> None:
    _target(target, source.is_file)
    _mount(f"/proc/self/fd/{source.fd}", target, MS_BIND | MS_REC)
    os.close(source.fd)
    if read_only:
        _mount(None, target, MS_REMOUNT | MS_BIND | MS_RDONLY)


def tmpfs(target: str, size: int) -> None:
    """A memory file system of ``size`` bytes at ``target`` (a node's small-/dev/shm fault)."""
    Path(target).mkdir(parents=True, exist_ok=True)
    _mount("tmpfs", target, 0, "tmpfs", f"size={size},mode=1777")


def runner_paths(env: dict[str, str]) -> list[str]:
    """The folders a process-mode container needs from this machine: the interpreter's prefixes, the
    checkout the test bed runs from, and every ``PYTHONPATH`` entry the plan gives the container."""
    checkout = str(Path(__file__).resolve().parents[3])
    entries = [sys.prefix, sys.base_prefix, checkout, *env.get("PYTHONPATH", "").split(":")]
    return sorted({os.path.realpath(e) for e in entries if e and Path(e).is_dir()})


def hidden_by(targets: list[str], paths: list[str]) -> list[str]:
    """The ``paths`` that a mount at one of ``targets`` (a folder at or above them) would cover."""

    def under(path: str, target: str) -> bool:
        return path == target or path.startswith(target.rstrip("/") + "/")

    return [p for p in paths if any(under(p, os.path.realpath(t)) for t in targets)]


def keep_visible(paths: list[str]) -> list[tuple[int, str]]:
    """Open each of ``paths`` (``O_PATH``) before the pod's mounts, so they can be bound back after."""
    return [(os.open(p, os.O_PATH | os.O_DIRECTORY), p) for p in paths]


def bind_back(kept: list[tuple[int, str]]) -> None:
    for fd, path in kept:
        Path(path).mkdir(parents=True, exist_ok=True)
        _mount(f"/proc/self/fd/{fd}", path, MS_BIND | MS_REC)
        os.close(fd)


def join_cgroup(cgroup: str | None) -> None:
    if cgroup:
        Path(cgroup, "cgroup.procs").write_text(str(os.getpid()))


def run(plan: dict[str, Any]) -> None:
    join_cgroup(plan.get("cgroup"))
    join_cgroup(plan.get("cpu_cgroup"))
    if plan.get("in_image"):  # podman makes the container: namespaces, mounts, hostname, user
        os.execvpe(plan["argv"][0], plan["argv"], plan["env"])  # noqa: S606 - an argv list
    enter_namespaces()
    env: dict[str, str] = plan["env"]
    targets = [m["target"] for m in plan["mounts"]]
    kept = keep_visible(hidden_by(targets, runner_paths(env)))
    sources = [None if m.get("tmpfs_bytes") else open_source(m["source"]) for m in plan["mounts"]]
    hosts = open_source(plan["hosts_file"])
    for m, source in zip(plan["mounts"], sources, strict=True):
        if source is None:
            tmpfs(m["target"], int(m["tmpfs_bytes"]))
        else:
            bind(source, m["target"], m["read_only"])
    bind_back(kept)
    bind(hosts, "/etc/hosts", read_only=True)
    socket.sethostname(plan["hostname"])
    if plan.get("cwd"):
        Path(plan["cwd"]).mkdir(parents=True, exist_ok=True)
        os.chdir(plan["cwd"])
    argv: list[str] = plan["argv"]
    os.execvpe(argv[0], argv, env)  # noqa: S606 - an argv list, as the pod spec gives it


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["--check"]:  # can this machine give a process its own mount and UTS namespaces?
        try:
            enter_namespaces()
        except (OSError, LaunchError) as exc:
            print(f"{exc}", file=sys.stderr, flush=True)
            return 1
        return 0
    try:
        plan = json.loads(Path(args[0]).read_text())
        run(plan)
    except (OSError, LaunchError, ValueError, IndexError, KeyError) as exc:
        print(f"llmjob pod runner: cannot start container: {exc}", file=sys.stderr, flush=True)
        return LAUNCH_FAILED
    return LAUNCH_FAILED  # pragma: no cover - execvpe does not return


if __name__ == "__main__":
    sys.exit(main())
