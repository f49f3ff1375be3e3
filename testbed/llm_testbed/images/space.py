"""Disk room for an image build: older images of the same repository go first, and a full disk is named.

A trainer build needs several times its wheelhouse on the disk that holds podman's storage: the wheels
are unpacked into the build container (about twice their size), and committing the container writes that
layer again. A machine that keeps building new keys (a developer's, CI's) would otherwise fill its disk
with old images; the builder keeps ``KEEP_BUILT`` of each repository, and fewer when the disk is short.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path

from llm_testbed.images.errors import ImageError
from llm_testbed.images.podman import Podman, images_root
from llm_testbed.images.recipe import KEEP_BUILT
from llm_testbed.images.steps import report

ROOM_PER_WHEEL_BYTE = 7
"""Bytes of free disk a build wants per byte of wheels: unpacked in the container, then the committed
layer written and stored (the trainer's 2.9 GiB of wheels make a 5.6 GiB image; free space fell by about
22 GiB at the peak of its build)."""
ROOM_SPARE = 2 * 2**30
_FULL = "no space left on device"


def wanted(wheels: Iterable[Path]) -> int:
    """The free bytes a build of an image with these wheels wants."""
    return ROOM_PER_WHEEL_BYTE * sum(w.stat().st_size for w in wheels) + ROOM_SPARE


def free() -> int:
    """Free bytes on the disk that holds (or will hold) the image store."""
    folder = images_root()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return shutil.disk_usage(folder).free


def _gib(size: int) -> str:
    return f"{size / 2**30:.1f} GiB"


def make_room(podman: Podman, repository: str, need: int) -> None:
    """Before building a new image of ``repository``: leave room for it beside ``KEEP_BUILT - 1`` older
    ones, or none when the disk is short; say so when even that leaves less than ``need``."""
    podman.keep_newest(repository, KEEP_BUILT - 1)
    if free() >= need:
        return
    report(f"{repository}: {_gib(free())} free, the build wants about {_gib(need)}: removing older images")
    podman.keep_newest(repository, 0)
    if free() < need:
        report(
            f"{repository}: only {_gib(free())} free under {images_root()} "
            f"(the build wants about {_gib(need)}); it may run out of space"
        )


def explain(error: ImageError) -> ImageError:
    """``error``, with what to do when the build ran out of disk."""
    if _FULL not in str(error):
        return error
    return ImageError(
        f"{error}\nThe disk under {images_root()} is full ({_gib(free())} free now). Free some space, or set "
        "LLMJOB_CACHE_DIR to a folder on a larger disk (the images, wheelhouses and tools live there)."
    )
