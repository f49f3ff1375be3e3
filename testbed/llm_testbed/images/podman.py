"""podman as the image builder uses it: its storage under the cache root, runc, no systemd.

Every call names its storage (``--root``/``--runroot`` under ``<cache>/images``), so moving
``LLMJOB_CACHE_DIR`` aside really means an empty store, and nothing touches the machine's own podman
images. podman refuses a ``--runroot`` longer than 50 characters; under a longer cache path (a long home
folder, a cache moved under ``/tmp``) the run-time state goes to ``/tmp/llmjob-podman-<hash of the root>``.
The runtime is runc (crun fails on hosts whose cgroups are in hybrid mode), cgroups are managed through
cgroupfs and events go to a file (no systemd needed). Containers get this machine's hard limits
for open files and processes: podman's defaults can exceed them, and then no container starts.
"""

from __future__ import annotations

import hashlib
import json
import resource
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llm_testbed.images.errors import ImageError
from llm_testbed.localcluster.paths import cache_root

RUNTIME = "runc"
RUNROOT_MAX = 50
"""The longest ``--runroot`` podman accepts ("the specified runroot is longer than 50 characters")."""


def images_root() -> Path:
    """Everything the image builder keeps: ``<cache root>/images``."""
    return cache_root() / "images"


def runroot_of(root: Path) -> Path:
    """podman's run-time state (locks, mounts) for the storage under ``root``: ``<root>/run``, or where
    that path is too long for podman, a folder under ``/tmp`` named by a hash of ``root`` (one per root)."""
    inside = root / "run"
    if len(str(inside)) <= RUNROOT_MAX:
        return inside
    return Path("/tmp") / f"llmjob-podman-{hashlib.sha256(str(root).encode()).hexdigest()[:16]}"


def _limit(value: int) -> str:
    return "-1" if value == resource.RLIM_INFINITY else str(value)


def _pid_max() -> int:
    try:
        return int(Path("/proc/sys/kernel/pid_max").read_text())
    except (OSError, ValueError):
        return resource.RLIM_INFINITY


def container_limits() -> dict[str, int]:
    """The open-file and process limits a container can get here: the hard limits, and for processes at
    most ``kernel.pid_max`` (podman lowers its own RLIMIT_NPROC to it, and runc cannot go above podman's)."""
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    pid_max = _pid_max()
    return {
        "nofile": resource.getrlimit(resource.RLIMIT_NOFILE)[1],
        "nproc": pid_max if nproc == resource.RLIM_INFINITY else min(nproc, pid_max),
    }


def ulimit_flags(limits: dict[str, int] | None = None) -> list[str]:
    """``--ulimit`` flags for ``podman build`` and ``run``: soft = hard = :func:`container_limits`."""
    if limits is None:
        limits = container_limits()
    flags: list[str] = []
    for name in sorted(limits):
        value = _limit(limits[name])
        flags += ["--ulimit", f"{name}={value}:{value}"]
    return flags


@dataclass(frozen=True)
class Podman:
    """The ``podman`` command with this cache's storage; ``argv(...)`` is a whole command line."""

    executable: str
    root: Path

    @classmethod
    def of_cache(cls) -> Podman:
        found = shutil.which("podman")
        if found is None:
            raise ImageError(
                "podman is not on PATH: `make images` installs it (Debian: apt-get install podman)"
            )
        return cls(found, images_root())

    def argv(self, *args: str) -> list[str]:
        return [
            self.executable,
            "--root",
            str(self.root / "storage"),
            "--runroot",
            str(runroot_of(self.root)),
            "--runtime",
            RUNTIME,
            "--cgroup-manager",
            "cgroupfs",
            "--events-backend",
            "file",
            "--storage-driver",
            "overlay",
            *args,
        ]

    def _call(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(*args), capture_output=True, text=True, check=False, timeout=timeout)

    def image_exists(self, reference: str) -> bool:
        return self._call("image", "exists", reference).returncode == 0

    def inspect(self, reference: str) -> dict[str, Any]:
        """``podman image inspect`` of one image (its config: ``Config.User``, ``Config.Entrypoint``...)."""
        result = self._call("image", "inspect", reference)
        if result.returncode != 0:
            raise ImageError(f"podman image inspect {reference} failed: {result.stderr.strip()}")
        found: list[dict[str, Any]] = json.loads(result.stdout)
        return found[0]

    def size(self, reference: str) -> int:
        """The image's size in bytes, as podman counts it (every layer)."""
        return int(self.inspect(reference).get("Size", 0))

    def tags(self, repository: str) -> list[str]:
        """Tagged images of a repository, newest first."""
        result = self._call(
            "images",
            "--filter",
            f"reference={repository}",
            "--sort",
            "created",
            "--format",
            "{{.Repository}}:{{.Tag}}",
        )
        if result.returncode != 0:
            return []
        return [line for line in result.stdout.split() if line.startswith(repository + ":")]

    def remove(self, reference: str) -> None:
        self._call("rmi", reference)

    def keep_newest(self, repository: str, count: int) -> None:
        """Untag (and free what only they used) all but the newest ``count`` images of a repository."""
        for old in self.tags(repository)[count:]:
            self.remove(old)
