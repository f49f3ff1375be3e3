"""What the local build makes, as data: the Debian base, the two images and the build arguments of each.

Pure: nothing here runs a command. The production bases stay the Dockerfiles' defaults; the local build
only sets build arguments (``PYTHON_IMAGE``, ``TRAINER_SYSTEM``, ``WHEELHOUSE``) that the Dockerfiles
declare for this purpose, so users' ``docker build`` and ``make images`` read the same files.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass

REPOSITORY = "localhost/elastic-llm-operator"
"""Local image names: ``localhost/elastic-llm-operator/{base,operator,trainer}:<content key>``."""

KEEP_BUILT = 2
"""Of each cached thing (base, wheelhouse, image) the newest two stay: two checkouts on one machine (a branch
and main) do not rebuild in turns, and older ones do not pile up (a trainer wheelhouse is GBs)."""

WHEELHOUSE_DIR = "images/wheelhouse"
"""Where the wheels lie in the build context: with the build argument ``WHEELHOUSE=1`` the Dockerfiles'
pip steps read only this folder (``--no-index``); without it they use the package index, as before."""


@dataclass(frozen=True)
class DebianBase:
    """The local stand-in for ``python:3.12-slim`` and the trainer's system stage, made by mmdebstrap."""

    suite: str
    python: str
    """The suite's ``python3`` (major.minor): the wheelhouse is downloaded for it."""
    glibc: str
    """The suite's glibc (major.minor): the newest manylinux tag the wheelhouse accepts."""
    packages: tuple[str, ...]
    """Debian packages beyond ``minbase``: what the Dockerfiles' RUN steps call (python, pip, venv, useradd)
    and the trainer's one runtime library beyond Python (libhwloc, as the production system stage has)."""

    @property
    def arch(self) -> str:
        """The machine's architecture as wheel tags write it (mmdebstrap builds the native one)."""
        return platform.machine()


BASE = DebianBase(
    suite="bookworm",
    python="3.11",
    glibc="2.36",
    packages=(
        "python3",
        "python3-pip",
        "python3-venv",
        "python-is-python3",
        "passwd",
        "libhwloc15",
        "ca-certificates",
    ),
)


@dataclass(frozen=True)
class ImageRecipe:
    """One image of ``images/``: its Dockerfile, the Python packages its wheelhouse needs, the local args."""

    name: str
    dockerfile: str
    """Repository-relative; its ``Dockerfile.dockerignore`` beside it selects the build context."""
    extras: tuple[str, ...]
    """The project's extras whose dependencies (with the core ones) go into the wheelhouse."""
    packages: tuple[str, ...]
    """Packages the Dockerfile installs by name, beyond the project (their pins: constraints.txt)."""
    base_args: tuple[str, ...]
    """Build arguments that name a base image: the local build points each at the Debian base."""
    left_out: str
    """What the local build does not build, in words (printed by the build, written in the docs)."""

    @property
    def ignore_file(self) -> str:
        return self.dockerfile + ".dockerignore"

    @property
    def repository(self) -> str:
        return f"{REPOSITORY}/{self.name}"

    def reference(self, key: str) -> str:
        return f"{self.repository}:{key}"


OPERATOR = ImageRecipe(
    name="operator",
    dockerfile="images/operator/Dockerfile",
    extras=("operator",),
    packages=(),
    base_args=("PYTHON_IMAGE",),
    left_out="nothing but the base: Debian bookworm's Python 3.11 instead of python:3.12-slim-bookworm",
)

TRAINER = ImageRecipe(
    name="trainer",
    dockerfile="images/trainer/Dockerfile",
    extras=("trainer",),
    packages=("torch", "nvidia-nccl-cu13"),
    base_args=("PYTHON_IMAGE", "TRAINER_SYSTEM"),
    left_out=(
        "the stages efa (the nvidia/cuda base image and the EFA installer: libfabric and rdma-core under"
        " /opt/amazon/efa), ofi-build (the aws-ofi-nccl plugin, /opt/aws-ofi-nccl) and system (Ubuntu's"
        " python3 and libhwloc15 over them); the Debian base stands in for all three, so the image has"
        " PyTorch's own CUDA libraries and NCCL but no EFA and no NCCL network plugin"
    ),
)

RECIPES: dict[str, ImageRecipe] = {r.name: r for r in (OPERATOR, TRAINER)}


def local_build_args(recipe: ImageRecipe, base_ref: str, version: str) -> dict[str, str]:
    """The build arguments of the local build: bases from ``base_ref``, packages from the wheelhouse only,
    and the project's ``version`` for the OCI labels (the image key covers it, like every argument)."""
    args = dict.fromkeys(recipe.base_args, base_ref)
    args["WHEELHOUSE"] = "1"
    args["VERSION"] = version
    return args
