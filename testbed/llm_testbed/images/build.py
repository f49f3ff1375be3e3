"""``make images``: both images from ``images/*/Dockerfile`` with podman, cached per machine by content.

An image's key hashes everything that goes into it: its Dockerfile and ignore file, every file of the
build context the ignore file lets through, its wheelhouse's key (requirements, constraints, target
Python), the base's key and the build arguments. The image is tagged
``localhost/elastic-llm-operator/<name>:<key>`` in podman's storage under the cache root; when that tag
exists nothing is built. Builds hold a file lock, so concurrent callers wait instead of racing. The build
itself runs with ``--network none`` and ``--pull never``: everything it installs comes from the staged
context (the project's files and the wheelhouse) and the local base.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from llm_testbed.images import base as debian
from llm_testbed.images import host, space, wheelhouse
from llm_testbed.images.dockerignore import context_files
from llm_testbed.images.errors import ImageError
from llm_testbed.images.keys import content_key, file_parts, text_part
from llm_testbed.images.podman import Podman, images_root, ulimit_flags
from llm_testbed.images.recipe import (
    BASE,
    KEEP_BUILT,
    RECIPES,
    WHEELHOUSE_DIR,
    DebianBase,
    ImageRecipe,
    local_build_args,
)
from llm_testbed.images.steps import report, run_step
from llm_testbed.localcluster.filelock import locked
from llm_testbed.localcluster.paths import repo_root
from llm_testbed.version import project_version

BUILD_FLAGS = ("--format=docker", "--layers=false", "--network=none", "--pull=never")
"""Flags of every build: Docker's image format (it keeps SHELL), no network, no pulls, and no layer cache:
podman 4.3's buildah reuses a cached ``RUN --mount=type=bind`` layer when the stage or folder it mounts has
changed (buildah issues 4522, 5400, 6609), which would ship old code under a new key. The content key is
the cache; every build it asks for is complete."""
_STEP = re.compile(r"^(?:\[\d+/\d+\] )?STEP \d+/\d+: .*")


@dataclass(frozen=True)
class ImagePlan:
    """What building one image means: its key and name, arguments, context files and wheelhouse key."""

    recipe: ImageRecipe
    key: str
    reference: str
    build_args: dict[str, str]
    files: list[str]
    wheelhouse_key: str


def plan(root: Path, recipe: ImageRecipe, base: DebianBase = BASE) -> ImagePlan:
    """The image's content key and local build arguments (reads files, runs nothing)."""
    ignore = root / recipe.ignore_file
    files = [f for f in context_files(root, ignore) if not f.startswith(WHEELHOUSE_DIR + "/")]
    _, wheels_key = wheelhouse.plan(root, recipe, base)
    args = local_build_args(recipe, debian.reference(base), project_version(root))
    parts = [
        text_part("build-flags", " ".join(BUILD_FLAGS)),
        *file_parts(root, [recipe.dockerfile, recipe.ignore_file]),
        *file_parts(root, files),
        text_part("wheelhouse", wheels_key),
        text_part("build-args", json.dumps(args, sort_keys=True)),
    ]
    key = content_key(parts)
    return ImagePlan(recipe, key, recipe.reference(key), args, files, wheels_key)


def build_argv(podman: Podman, image: ImagePlan, context: Path) -> list[str]:
    args = [
        flag
        for name, value in sorted(image.build_args.items())
        for flag in ("--build-arg", f"{name}={value}")
    ]
    return podman.argv(
        "build",
        *BUILD_FLAGS,
        *ulimit_flags(),
        "--file",
        str(context / image.recipe.dockerfile),
        "--tag",
        image.reference,
        *args,
        str(context),
    )


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def stage_context(root: Path, image: ImagePlan, wheels: wheelhouse.Wheelhouse) -> Path:
    """A build context as Docker would send it (the ignore file's selection), plus the wheelhouse.

    The project's files are copied (an edit during the build cannot reach the image under the old key);
    the wheels, which nothing edits, are hard links to the wheelhouse where the file system allows.
    """
    context = images_root() / "context" / image.recipe.name
    shutil.rmtree(context, ignore_errors=True)
    for rel in [*image.files, image.recipe.dockerfile, image.recipe.ignore_file]:
        (context / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, context / rel)
    (context / WHEELHOUSE_DIR).mkdir(parents=True)
    for wheel in wheels.wheels():
        _link_or_copy(wheel, context / WHEELHOUSE_DIR / wheel.name)
    return context


def _podman_step(line: str) -> str | None:
    return line[:110] if _STEP.match(line) else None


def _build(root: Path, podman: Podman, image: ImagePlan) -> None:
    name = image.recipe.name
    report(f"{name}: the local build leaves out {image.recipe.left_out}")
    wheels = wheelhouse.ensure(root, image.recipe, BASE)
    assert wheels.key == image.wheelhouse_key, "the wheelhouse is the one the key was computed for"
    space.make_room(podman, image.recipe.repository, space.wanted(wheels.wheels()))
    context = stage_context(root, image, wheels)
    log = images_root() / "logs" / f"build-{name}.log"
    try:
        elapsed = run_step(f"{name} image", build_argv(podman, image, context), log, progress=_podman_step)
    except ImageError as exc:
        raise space.explain(exc) from None
    finally:
        shutil.rmtree(context, ignore_errors=True)
    podman.keep_newest(image.recipe.repository, KEEP_BUILT)
    size = podman.size(image.reference) / 2**20
    report(f"{name}: built {image.reference} in {elapsed:.0f}s ({size:.0f} MiB)")


def ensure(names: Iterable[str] = tuple(RECIPES)) -> dict[str, str]:
    """Each named image's reference, building what podman's storage does not have yet."""
    started = time.monotonic()
    root = repo_root()
    images = [plan(root, RECIPES[name], BASE) for name in names]
    refs = {image.recipe.name: image.reference for image in images}
    if shutil.which("podman") is not None and _all_present(Podman.of_cache(), images):
        listed = ", ".join(refs.values())
        report(f"up to date, nothing to build: {listed} ({time.monotonic() - started:.1f}s)")
        return refs
    lock = images_root() / ".build.lock"
    with locked(lock, lambda: report(f"another process is building images ({lock}); waiting for it")):
        host.ensure_commands()
        podman = Podman.of_cache()
        todo = [image for image in images if not podman.image_exists(image.reference)]
        if todo:
            debian.ensure(podman, BASE)
        for image in todo:
            _build(root, podman, image)
    report(f"images ready in {time.monotonic() - started:.0f}s: {', '.join(refs.values())}")
    return refs


def _all_present(podman: Podman, images: list[ImagePlan]) -> bool:
    return all(podman.image_exists(image.reference) for image in images)
