"""Container mode: which pods run as containers of their image, and podman's side of it (I/O).

``llmjob cluster up --run-pods --containers`` (the runner's ``--containers``): a pod whose every
container's image is in the image builder's podman storage (``make images``,
:mod:`llm_testbed.images.podman`) runs in containers of those images, through podman + runc; a pod
with an image that is not there (the rendezvous etcd's ``quay.io/coreos/etcd``...) stays a process-mode
pod, and the runner says so once per pod. Nothing is ever pulled.

Here: the image look-ups (cached: an image's content key names it, so what a reference means never
changes while the runner lives), the volumes a kubelet would hand over (``fsGroup`` ownership, an
emptyDir anyone may write, the termination-message file), and the removal of containers (one, or every
container of a cluster: nothing stays behind a runner that stopped).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llm_testbed.images.errors import ImageError
from llm_testbed.images.podman import Podman, ulimit_flags
from llm_testbed.podrunner.incontainer import LABEL_CLUSTER
from llm_testbed.podrunner.plan import Mount

REMOVE_TIMEOUT_S = 60.0
REMOVE_TRIES = 3
PODMAN_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
"""The environment of the podman process itself (none of it reaches a container)."""


class ContainerModeError(RuntimeError):
    """Container mode cannot work on this machine; the message says what is missing."""


@dataclass(frozen=True)
class Image:
    reference: str
    user: str
    """The image's ``USER`` (``""``: root)."""
    pythonpath: str = ""
    """The image's own ``PYTHONPATH`` (its ENV), kept in front of the runner's bind shim."""


def make_podman() -> Podman:
    """The image builder's podman (its storage under the cache root, runc, cgroupfs)."""
    try:
        return Podman.of_cache()
    except ImageError as exc:
        raise ContainerModeError(f"container mode needs podman: {exc}") from None


@dataclass
class Images:
    """Which images the local storage holds (asked once per reference)."""

    podman: Podman
    known: dict[str, Image | None] = field(default_factory=dict)

    def find(self, reference: str) -> Image | None:
        if reference not in self.known:
            found: Image | None = None
            if reference and self.podman.image_exists(reference):
                config = self.podman.inspect(reference).get("Config") or {}
                env = dict(str(e).partition("=")[::2] for e in config.get("Env") or [])
                found = Image(reference, str(config.get("User") or ""), env.get("PYTHONPATH", ""))
            self.known[reference] = found
        return self.known[reference]

    async def of_pod(self, pod: Mapping[str, Any]) -> tuple[dict[str, Image], list[str]]:
        """The pod's images found in storage, by container name, and the references that are missing."""
        spec = pod.get("spec", {})
        found: dict[str, Image] = {}
        missing: list[str] = []
        for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
            image = await asyncio.to_thread(self.find, str(c.get("image") or ""))
            if image is None:
                missing.append(str(c.get("image") or "(none)"))
            else:
                found[str(c["name"])] = image
        return found, missing


def run_flags() -> list[str]:
    """Flags of every container beside the pod's: ulimits within this machine's and podman's limits
    (podman's defaults can exceed them, and then no container starts)."""
    return ulimit_flags()


def give_volume(folder: Path, fs_group: int | None, anyone: bool) -> None:
    """A writable volume as a kubelet hands it over: to ``fsGroup`` (group-owned, group-writable,
    set-group-ID folders, recursively), and an emptyDir with mode 0777 (no fsGroup: anyone writes)."""
    if not folder.is_dir():
        return
    if anyone:
        folder.chmod(0o777)
    if fs_group is None:
        return
    for root, dirs, files in os.walk(folder):
        for name in [*dirs, *files]:
            path = Path(root, name)
            with contextlib.suppress(OSError):
                os.lchown(path, -1, fs_group)
                if not path.is_symlink():
                    path.chmod(path.stat().st_mode | (0o2070 if path.is_dir() else 0o060))
    os.chown(folder, -1, fs_group)
    folder.chmod(folder.stat().st_mode | 0o2070)


def volume_owners(
    pod: Mapping[str, Any], volume_dirs: Mapping[str, str | None], fs_group: int | None
) -> None:
    """Apply :func:`give_volume` to the pod's emptyDir, API and PersistentVolumeClaim folders."""
    for vol in pod.get("spec", {}).get("volumes") or []:
        folder = volume_dirs.get(vol["name"])
        if folder is None or "hostPath" in vol:
            continue
        Path(folder).mkdir(parents=True, exist_ok=True)
        give_volume(Path(folder), fs_group, anyone="emptyDir" in vol)


def make_sources(mounts: Iterable[Mount]) -> None:
    """Create the missing folders the container's bind mounts name (a ``subPath``, a new volume), as the
    process mode's launcher does; podman refuses to bind a path that does not exist."""
    for m in mounts:
        if not m.tmpfs_bytes and not Path(m.source).exists():
            Path(m.source).mkdir(parents=True)


def message_file(path: Path) -> None:
    """The termination-message file, writable by whatever user the container runs as."""
    path.touch()
    path.chmod(0o666)


async def remove(podman: Podman, name: str) -> None:
    """``podman rm --force`` one container (gone already: nothing to do).

    After its ``conmon`` was killed with it (a lost node, the cgroup's kill) podman still thinks the
    container is stopping: the first removal fails ("container state improper") and records it stopped;
    the next one removes it. Hence a few tries.
    """
    for _ in range(REMOVE_TRIES):
        proc = await asyncio.create_subprocess_exec(
            *podman.argv("rm", "--force", "--ignore", "--time", "0", name),
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL, env=PODMAN_ENV,
        )  # fmt: skip
        try:
            if await asyncio.wait_for(proc.wait(), REMOVE_TIMEOUT_S) == 0:
                return
        except TimeoutError:
            proc.kill()
            await proc.wait()


def remove_all(cluster: str, p: Podman | None = None) -> list[str]:
    """Remove every container of the cluster's pods (by label); their names. No podman: none."""
    if p is None:
        if shutil.which("podman") is None:
            return []
        p = Podman.of_cache()
    listed = subprocess.run(
        p.argv("ps", "--all", "--filter", f"label={LABEL_CLUSTER}={cluster}", "--format", "{{.Names}}"),
        capture_output=True, text=True, check=False, timeout=REMOVE_TIMEOUT_S, env=PODMAN_ENV,
    )  # fmt: skip
    names = listed.stdout.split()
    for _ in range(REMOVE_TRIES if names else 0):  # see remove(): a killed conmon takes two
        done = subprocess.run(
            p.argv("rm", "--force", "--ignore", "--time", "0", *names),
            capture_output=True, check=False, timeout=REMOVE_TIMEOUT_S, env=PODMAN_ENV,
        )  # fmt: skip
        if done.returncode == 0:
            break
    return names
