"""Both images for the release: built (or found cached) by the image builder, tagged with the version.

The images come from ``llm_testbed.images`` (``make images``: cached by content, so a release reuses
what the image tests built), get the tag ``localhost/elastic-llm-operator/<name>:<version>`` in the
builder's podman storage, and must carry the version in their ``org.opencontainers.image.version`` label.
What a container of each image's Python sees (every distribution's METADATA) feeds its SBOM.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

from llm_testbed.images import build as images
from llm_testbed.images.podman import Podman, ulimit_flags
from llm_testbed.images.recipe import RECIPES
from llm_testbed.images.steps import report, run_step
from llm_testbed.release.errors import ReleaseError

TOPIC = "release"
VERSION_LABEL = "org.opencontainers.image.version"
_DISTRIBUTIONS = (
    "import importlib.metadata as m, json, re, sys\n"
    "seen = {}\n"
    "for d in m.distributions():\n"
    "    key = re.sub(r'[-_.]+', '-', d.metadata['Name'] or '').lower()\n"
    "    if key and key not in seen:\n"
    "        seen[key] = d.read_text('METADATA') or d.read_text('PKG-INFO') or ''\n"
    "json.dump(list(seen.values()), sys.stdout)\n"
)


@dataclass(frozen=True)
class ReleasedImage:
    name: str
    reference: str
    """``localhost/elastic-llm-operator/<name>:<version>``"""
    image_id: str
    size: int
    left_out: str
    """What the local build leaves out of the production image (the recipe's words)."""


def _podman_ok(podman: Podman, what: str, *args: str, timeout: float = 600) -> str:
    result = subprocess.run(podman.argv(*args), capture_output=True, text=True, check=False, timeout=timeout)
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise ReleaseError(f"{what}: podman {args[0]} failed (exit {result.returncode}): {last}")
    return result.stdout


def tag(version: str) -> list[ReleasedImage]:
    """Both images, built if the cache lacks them, tagged with ``version``; their label is checked."""
    refs = images.ensure(list(RECIPES))
    podman = Podman.of_cache()
    released: list[ReleasedImage] = []
    for name, ref in refs.items():
        target = f"{RECIPES[name].repository}:{version}"
        _podman_ok(podman, f"tagging {ref} as {target}", "tag", ref, target)
        info = podman.inspect(target)
        labelled = (info.get("Config", {}).get("Labels") or {}).get(VERSION_LABEL)
        if labelled != version:
            raise ReleaseError(f"image {target}: label {VERSION_LABEL} is {labelled!r}, not {version!r}")
        size = int(info.get("Size", 0))
        released.append(ReleasedImage(name, target, str(info["Id"]), size, RECIPES[name].left_out))
        report(f"image {name}: tagged {target} ({info['Id'][:12]})", TOPIC)
        report(f"image {name}: the local build leaves out {RECIPES[name].left_out}", TOPIC)
    return released


def distributions(image: ReleasedImage) -> list[str]:
    """Core metadata of every distribution the image's ``python`` sees (a container: no network, read-only):
    ``METADATA`` of a dist-info, ``PKG-INFO`` of an egg-info (Debian's own Python packages have those)."""
    podman = Podman.of_cache()
    out = _podman_ok(
        podman,
        f"listing the Python distributions of {image.reference}",
        "run",
        "--rm",
        "--network",
        "none",
        "--read-only",
        *ulimit_flags(),
        "--entrypoint",
        "python",
        image.reference,
        "-c",
        _DISTRIBUTIONS,
        timeout=300,
    )
    found: list[str] = json.loads(out)
    if not found:
        raise ReleaseError(f"image {image.reference}: its Python lists no installed distribution")
    return found


def save(image: ReleasedImage, dest: Path, logs: Path) -> Path:
    """``podman save`` as an OCI archive (``podman load -i`` / ``skopeo copy oci-archive:...`` read it)."""
    dest.mkdir(parents=True, exist_ok=True)
    target = dest / f"{image.name}-{image.reference.rsplit(':', 1)[1]}.oci.tar"
    argv = Podman.of_cache().argv("save", "--format", "oci-archive", "-o", str(target), image.reference)
    run_step(f"save {image.name}", argv, logs / f"save-{image.name}.log", topic=TOPIC)
    return target
