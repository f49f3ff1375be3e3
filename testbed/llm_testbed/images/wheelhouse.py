"""The wheels an image installs, downloaded on the host so that nothing is downloaded inside the build.

``pip download`` runs on the host, through the host's own pip configuration (index, proxy, certificates),
for the base's Python and platform rather than the host's (``--python-version``, ``--platform``,
``--only-binary=:all:``), with the constraints of ``images/trainer/constraints.txt`` (the single place for
the Python pins). What it gets: the project's core dependencies, those of the image's extras, the packages
its Dockerfile names, and the build backend (so ``pip wheel .`` builds the project offline). One folder per
image and content key in ``<cache>/images/wheelhouse/``, filled once (``--no-cache-dir``: the folder is
the cache).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llm_testbed.images.errors import ImageError
from llm_testbed.images.keys import content_key, text_part
from llm_testbed.images.podman import images_root
from llm_testbed.images.recipe import KEEP_BUILT, DebianBase, ImageRecipe
from llm_testbed.images.steps import report, run_step

CONSTRAINTS = "images/trainer/constraints.txt"
COMPLETE = ".complete"
_BIG_DOWNLOAD = re.compile(r"Downloading (\S+?\.whl) \((\d+(?:\.\d+)?) ([MG])B\)")


@dataclass(frozen=True)
class Wheelhouse:
    """A folder of wheels for one image, and the key it is stored under."""

    path: Path
    key: str

    def wheels(self) -> list[Path]:
        return sorted(self.path.glob("*.whl"))


def requirements(pyproject: dict[str, Any], recipe: ImageRecipe) -> list[str]:
    """What the image's pip steps resolve: core deps, the extras' deps, named packages, the build backend."""
    project = pyproject["project"]
    wanted = list(project.get("dependencies", []))
    for extra in recipe.extras:
        wanted += project["optional-dependencies"][extra]
    wanted += recipe.packages
    wanted += pyproject["build-system"]["requires"]
    return list(dict.fromkeys(wanted))


def platform_tags(base: DebianBase) -> list[str]:
    """Every manylinux tag the base's glibc runs, newest first (pip does not expand ``manylinux_2_X``)."""
    major, minor = (int(p) for p in base.glibc.split("."))
    tags = [f"manylinux_{major}_{m}_{base.arch}" for m in range(minor, 16, -1)]
    return [*tags, f"manylinux2014_{base.arch}", f"manylinux2010_{base.arch}", f"manylinux1_{base.arch}"]


def download_argv(
    python: str, wanted: list[str], constraints: Path, base: DebianBase, dest: Path
) -> list[str]:
    """``pip download`` of ``wanted`` as wheels for ``base``'s CPython, whatever the host's Python is."""
    argv = [python, "-m", "pip", "download", "--dest", str(dest), "--no-cache-dir", "--progress-bar", "off"]
    argv += ["--only-binary=:all:", "--implementation", "cp", "--python-version", base.python]
    argv += ["--abi", "cp" + base.python.replace(".", "")]
    for tag in platform_tags(base):
        argv += ["--platform", tag]
    return [*argv, "--constraint", str(constraints), *wanted]


def wheelhouse_key(wanted: list[str], constraints: bytes, base: DebianBase) -> str:
    return content_key(
        [
            text_part("requirements", "\n".join(wanted)),
            ("constraints", constraints),
            text_part("python", base.python),
            text_part("platforms", " ".join(platform_tags(base))),
        ]
    )


def _check_pip(python: str) -> None:
    probe = subprocess.run([python, "-m", "pip", "--version"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        raise ImageError(
            f"wheelhouse: {python} has no pip (it downloads the wheels): "
            "run `make images PYTHON=<a python3 with pip>` or install python3-pip"
        )


def _big_downloads(line: str) -> str | None:
    match = _BIG_DOWNLOAD.search(line)
    if match is None:
        return None
    size_mb = float(match.group(2)) * (1024 if match.group(3) == "G" else 1)
    return f"downloading {match.group(1)} ({match.group(2)} {match.group(3)}B)" if size_mb >= 50 else None


def plan(root: Path, recipe: ImageRecipe, base: DebianBase) -> tuple[list[str], str]:
    """The requirements of ``recipe``'s wheelhouse and its key (reads pyproject.toml and the constraints)."""
    pyproject = tomllib.loads((root / "pyproject.toml").read_text())
    wanted = requirements(pyproject, recipe)
    return wanted, wheelhouse_key(wanted, (root / CONSTRAINTS).read_bytes(), base)


def ensure(root: Path, recipe: ImageRecipe, base: DebianBase) -> Wheelhouse:
    """The image's wheelhouse, downloaded unless a complete one with the same key is in the cache."""
    wanted, key = plan(root, recipe, base)
    target = images_root() / "wheelhouse" / f"{recipe.name}-{key}"
    if (target / COMPLETE).is_file():
        return Wheelhouse(target, key)
    _check_pip(sys.executable)
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    argv = download_argv(sys.executable, wanted, root / CONSTRAINTS, base, staging)
    log = images_root() / "logs" / f"wheelhouse-{recipe.name}.log"
    report(f"wheelhouse {recipe.name}: {len(wanted)} requirements for CPython {base.python} ({base.arch})")
    run_step(f"wheelhouse {recipe.name}", argv, log, cwd=root, progress=_big_downloads)
    found = sorted(p.name for p in staging.glob("*.whl"))
    if not found:
        raise ImageError(f"wheelhouse {recipe.name}: pip downloaded no wheels (log: {log})")
    size = sum(p.stat().st_size for p in staging.glob("*.whl"))
    (staging / COMPLETE).write_text("\n".join(found) + "\n")
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    report(f"wheelhouse {recipe.name}: {len(found)} wheels, {size / 2**20:.0f} MiB -> {target}")
    _keep_newest(target.parent, recipe.name)
    return Wheelhouse(target, key)


def _keep_newest(folder: Path, name: str) -> None:
    complete = [p for p in folder.glob(f"{name}-*") if (p / COMPLETE).is_file()]
    complete.sort(key=lambda p: (p / COMPLETE).stat().st_mtime, reverse=True)
    for old in complete[KEEP_BUILT:]:
        shutil.rmtree(old, ignore_errors=True)
