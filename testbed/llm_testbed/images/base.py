"""The local base image: Debian from Debian's own packages (mmdebstrap), imported into podman's storage.

Where no registry is reachable, ``FROM python:3.12-slim`` or ``FROM nvidia/cuda`` cannot be pulled.
mmdebstrap makes a ``minbase`` Debian with the packages the Dockerfiles' steps call (Python, pip, venv,
useradd, libhwloc) from the Debian archive, which the host's apt reaches; ``podman import`` makes it a
local image, ``localhost/elastic-llm-operator/base:<key>``. Like ``python:*-slim`` its Python lets pip
install into it (Debian's ``EXTERNALLY-MANAGED`` marker is removed: the image is the Python environment).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from llm_testbed.images.errors import ImageError
from llm_testbed.images.keys import content_key, text_part
from llm_testbed.images.podman import Podman, images_root, ulimit_flags
from llm_testbed.images.recipe import KEEP_BUILT, REPOSITORY, DebianBase
from llm_testbed.images.steps import report, run_step

BASE_REPOSITORY = f"{REPOSITORY}/base"
_EXCLUDED_PATHS = ("/usr/share/doc/*", "/usr/share/man/*", "/usr/share/info/*")
_CHANGES = (
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV LANG=C.UTF-8",
    'CMD ["/bin/bash"]',
)


def mmdebstrap_argv(base: DebianBase, tarball: Path) -> list[str]:
    """The mmdebstrap command that writes the base's root file system to ``tarball``."""
    argv = ["mmdebstrap", "--variant=minbase", "--include=" + ",".join(base.packages)]
    argv += [f"--dpkgopt=path-exclude={path}" for path in _EXCLUDED_PATHS]
    argv += ["--dpkgopt=path-include=/usr/share/doc/*/copyright"]
    # mmdebstrap runs a hook as a shell command with the new root as $1 (its interface, not ours).
    argv += ['--customize-hook=rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED']
    return [*argv, base.suite, str(tarball)]


def import_argv(podman: Podman, base: DebianBase, tarball: Path, reference: str) -> list[str]:
    changes = [flag for change in _CHANGES for flag in ("--change", change)]
    message = f"Debian {base.suite} minbase + {' '.join(base.packages)} (mmdebstrap)"
    return podman.argv("import", *changes, "--message", message, str(tarball), reference)


def base_key(base: DebianBase) -> str:
    """Hash of the recipe: the mmdebstrap command, the image changes, the architecture."""
    return content_key(
        [
            text_part("mmdebstrap", "\0".join(mmdebstrap_argv(base, Path("base.tar")))),
            text_part("changes", "\0".join(_CHANGES)),
            text_part("arch", base.arch),
        ]
    )


def reference(base: DebianBase) -> str:
    return f"{BASE_REPOSITORY}:{base_key(base)}"


def _python_version(podman: Podman, ref: str) -> str:
    argv = podman.argv("run", "--rm", "--network", "none", *ulimit_flags(), ref)
    argv += ["python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"]
    result = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=300)
    if result.returncode != 0:
        raise ImageError(f"podman cannot run the base image {ref}: {result.stderr.strip()[-2000:]}")
    return result.stdout.strip()


def ensure(podman: Podman, base: DebianBase) -> str:
    """The base image's reference, built and imported unless podman's storage already has it."""
    ref = reference(base)
    if podman.image_exists(ref):
        return ref
    work = images_root() / "base"
    work.mkdir(parents=True, exist_ok=True)
    tarball = work / f"{base_key(base)}.tar"
    logs = images_root() / "logs"
    report(f"base: Debian {base.suite} minbase with {', '.join(base.packages)} from Debian's packages")
    try:
        run_step(
            "base: mmdebstrap",
            mmdebstrap_argv(base, tarball),
            logs / "base-mmdebstrap.log",
            progress=lambda line: line[3:] if line.startswith("I: ") else None,
        )
        run_step("base: podman import", import_argv(podman, base, tarball, ref), logs / "base-import.log")
    finally:
        tarball.unlink(missing_ok=True)
    try:
        found = _python_version(podman, ref)
    except ImageError:
        podman.remove(ref)  # a base that was never checked is not kept
        raise
    if found != base.python:
        podman.remove(ref)
        raise ImageError(
            f"the {base.suite} base has Python {found}, the recipe says {base.python}: "
            "update BASE in llm_testbed/images/recipe.py (the wheelhouse is downloaded for that version)"
        )
    podman.keep_newest(BASE_REPOSITORY, KEEP_BUILT)
    return ref
