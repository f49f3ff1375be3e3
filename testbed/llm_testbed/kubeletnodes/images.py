"""The images the kubelet tier pulls, built here from static binaries and pushed to the local registry.

No image comes from outside. Each one is ``FROM scratch`` plus files of this machine, built with the image
builder's podman (its storage under the cache) and pushed to the tier's registry (CNCF Distribution):

- ``llmjob/pause``: the sandbox image, our static ``pause`` (built with containerd, ``cmd/pause``);
- ``llmjob/busybox``: Debian's ``busybox-static`` with its applets, for tests that need a shell, DNS
  look-ups and ``df`` in a pod;
- ``coreos/etcd`` under the rendezvous image's tag: our pinned, static etcd, so the operator's rendezvous
  pods (``quay.io/coreos/etcd``) are pulled from the local registry (containerd mirrors quay.io there).

Images that ``make images`` built (the trainer and the operator) are pushed as they are. The registry's
storage outlives clusters; before a registry starts, tags of those images that the builder's storage no
longer holds (it keeps the newest few of each) are removed and their blobs garbage-collected.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from llm_testbed.images.podman import Podman
from llm_testbed.localcluster.errors import LocalClusterError

PAUSE = "llmjob/pause"
BUSYBOX = "llmjob/busybox"
BUSYBOX_BINARY = Path("/bin/busybox")
LOCAL_PREFIX = "localhost/llmjob-kubelet"
BUILT_NAMESPACE = "elastic-llm-operator"
"""The registry namespace of the images `make images` builds (``localhost/elastic-llm-operator/<name>``)."""
MIRRORED_REGISTRIES = ("quay.io", "docker.io", "registry.k8s.io", "localhost")
"""Registries whose images containerd pulls from the local registry instead (same repository and tag)."""


class TierImageError(LocalClusterError):
    """An image of the kubelet tier could not be built or pushed; the message carries podman's error."""


@dataclass(frozen=True)
class ScratchImage:
    """An image of a few files: ``files`` maps a path in the image to a file of this machine."""

    repository: str  # without registry, e.g. "llmjob/pause"
    files: Mapping[str, Path]
    entrypoint: tuple[str, ...]
    links: Mapping[str, str] | None = None  # path in the image -> what the symlink points to

    def tag(self) -> str:
        """A tag from the content, so a new binary is a new tag and a pull never gets a stale one."""
        digest = hashlib.sha256()
        for dest in sorted(self.files):
            digest.update(dest.encode())
            digest.update(self.files[dest].read_bytes())
        for dest, target in sorted((self.links or {}).items()):
            digest.update(f"{dest}->{target}".encode())
        digest.update(" ".join(self.entrypoint).encode())
        return digest.hexdigest()[:12]


def containerfile(entrypoint: tuple[str, ...]) -> str:
    """The image's Containerfile (pure)."""
    quoted = ", ".join(f'"{part}"' for part in entrypoint)
    return f"FROM scratch\nCOPY rootfs/ /\nENTRYPOINT [{quoted}]\n"


def is_static(binary: Path) -> bool:
    """An ELF file without a program interpreter (runs in an image that has no libc)."""
    data = binary.read_bytes()[:8192]
    return data[:4] == b"\x7fELF" and b"/ld-linux" not in data and b"ld-musl" not in data


def busybox_image() -> ScratchImage:
    if not BUSYBOX_BINARY.is_file() or not is_static(BUSYBOX_BINARY):
        raise TierImageError(
            f"{BUSYBOX_BINARY} is missing or not static: install Debian's busybox-static package"
        )
    applets = subprocess.run(
        [str(BUSYBOX_BINARY), "--list"], capture_output=True, text=True, check=True
    ).stdout.split()
    links = {f"/bin/{a}": "busybox" for a in applets if a != "busybox"}
    return ScratchImage(BUSYBOX, {"/bin/busybox": BUSYBOX_BINARY}, ("/bin/sh",), links)


def _check(result: subprocess.CompletedProcess[str], what: str) -> None:
    if result.returncode != 0:
        raise TierImageError(f"{what} failed (exit {result.returncode}): {result.stderr.strip()[-800:]}")


def build(podman: Podman, image: ScratchImage) -> str:
    """Build ``image`` into podman's storage (skipped when its tag is there); returns the local name."""
    local = f"{LOCAL_PREFIX}/{image.repository}:{image.tag()}"
    if podman.image_exists(local):
        return local
    with tempfile.TemporaryDirectory(prefix="llmjob-image-") as tmp:
        context = Path(tmp)
        rootfs = context / "rootfs"
        for dest, source in image.files.items():
            target = rootfs / dest.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
        for dest, points_to in (image.links or {}).items():
            link = rootfs / dest.lstrip("/")
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(points_to)
        (context / "Containerfile").write_text(containerfile(image.entrypoint))
        argv = podman.argv(
            "build", "--network=none", "--pull=never", "--format=oci", "-t", local, str(context)
        )
        _check(
            subprocess.run(argv, capture_output=True, text=True, check=False, timeout=300),
            f"building {local}",
        )
    return local


def push(podman: Podman, local: str, registry: str, reference: str) -> str:
    """Push ``local`` (podman storage) to ``registry`` as ``reference`` (repository:tag); returns the
    pullable name ``<registry>/<reference>``."""
    remote = f"{registry}/{reference}"
    # zstd: the trainer image is 6 GB, and gzip at push time costs minutes of this machine's two cores.
    argv = podman.argv(
        "push", "--tls-verify=false", "--quiet", "--compression-format=zstd", local, f"docker://{remote}"
    )
    _check(
        subprocess.run(argv, capture_output=True, text=True, check=False, timeout=600), f"pushing {remote}"
    )
    return remote


def publish_built(podman: Podman, local: str, registry: str) -> str:
    """Push an image of the builder's storage (``localhost/<repository>:<tag>``, what ``make images``
    tags) to ``registry`` under the same repository and tag; pods keep naming it ``localhost/...``:
    containerd sends ``localhost`` to the registry (``MIRRORED_REGISTRIES``)."""
    host, _, reference = local.partition("/")
    if host != "localhost" or not reference:
        raise TierImageError(
            f"{local} is not an image of the builder's storage (localhost/<repository>:<tag>)"
        )
    push(podman, local, registry, reference)
    return local


def publish(podman: Podman, image: ScratchImage, registry: str, reference: str | None = None) -> str:
    """Build and push ``image``; ``reference`` (default: its repository and content tag)."""
    local = build(podman, image)
    return push(podman, local, registry, reference or f"{image.repository}:{image.tag()}")


def stale_tags(storage: Path, built: Mapping[str, set[str]]) -> list[Path]:
    """Tag folders of ``make images``' repositories in the registry's storage whose image is no longer
    among ``built`` (repository -> tags the builder holds); a repository it holds nothing of is left
    alone (pure apart from listing folders)."""
    root = storage / "docker/registry/v2/repositories" / BUILT_NAMESPACE
    stale = []
    for tag in sorted(root.glob("*/_manifests/tags/*")):
        kept = built.get(tag.parents[2].name)
        if kept and tag.name not in kept:
            stale.append(tag)
    return stale


def prune_registry(podman: Podman, storage: Path, binary: Path) -> list[str]:
    """Untag what :func:`stale_tags` finds and garbage-collect the registry's storage (the registry must
    not run); returns the ``repository:tag`` removed."""
    root = storage / "docker/registry/v2/repositories" / BUILT_NAMESPACE
    built = {
        repo.name: {ref.rpartition(":")[2] for ref in podman.tags(f"localhost/{BUILT_NAMESPACE}/{repo.name}")}
        for repo in (root.iterdir() if root.is_dir() else [])
    }
    stale = stale_tags(storage, built)
    if not stale:
        return []
    for tag in stale:
        shutil.rmtree(tag)
    from llm_testbed.registry import registry_config

    with tempfile.TemporaryDirectory(prefix="llmjob-registry-gc-") as tmp:
        config = Path(tmp) / "config.yml"
        config.write_text(yaml.safe_dump(registry_config(storage, 0)))
        argv = [str(binary), "garbage-collect", "--delete-untagged", str(config)]
        done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=600)
    _check(done, "garbage-collecting the kubelet tier's registry")
    return [f"{t.parents[2].name}:{t.name}" for t in stale]
