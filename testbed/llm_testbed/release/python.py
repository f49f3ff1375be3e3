"""Wheels and sdists of the project and of the runtime library, built offline from clean copies.

Each package is copied (its ``pyproject.toml`` and the folders it builds from, no caches) into a staging
folder, its sdist is built there through the setuptools build backend of this environment (no build
isolation: nothing is downloaded), and its wheel is built from the unpacked sdist, as ``python -m build``
does, so a file the sdist lacks fails the release instead of shipping a broken sdist.
"""

from __future__ import annotations

import os
import shutil
import sys
import tarfile
import tomllib
import zipfile
from dataclasses import dataclass
from email.parser import Parser
from pathlib import Path

from llm_testbed.images.steps import run_step
from llm_testbed.release.errors import ReleaseError
from llm_testbed.release.untar import extract_all

TOPIC = "release"
LICENSE = "LICENSE"
_BUILD = (
    "import sys\n"
    "from setuptools import build_meta as backend\n"
    "kind, out = sys.argv[1], sys.argv[2]\n"
    "print(backend.build_sdist(out) if kind == 'sdist' else backend.build_wheel(out))\n"
)
_SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build", "dist")


@dataclass(frozen=True)
class PythonPackage:
    """One distribution the release ships."""

    name: str
    source: str
    """Folder of its pyproject.toml, relative to the repository root."""
    sbom_extras: tuple[str, ...]
    """Extras whose dependencies its SBOM lists beside the core ones."""
    about: str


PROJECT = PythonPackage(
    name="elastic-llm-operator",
    source=".",
    sbom_extras=("operator", "trainer"),
    about=(
        "the operator, `llmjob`, the runtime library and the reference trainer (llm_trainer): "
        "pip install 'elastic_llm_operator-<v>-py3-none-any.whl[operator]' for the operator, [trainer] "
        "for the trainer (torch); the SBOM lists both extras"
    ),
)
RUNTIME = PythonPackage(
    name="llm-elastic",
    source="runtime",
    sbom_extras=(),
    about="the runtime library (llm_elastic) alone, for your own training image; the same code "
    "elastic-llm-operator carries: install one of the two",
)
PACKAGES = (PROJECT, RUNTIME)


@dataclass(frozen=True)
class Built:
    package: PythonPackage
    sdist: Path
    wheel: Path
    pyproject: Path
    """The staged pyproject.toml (the SBOM's root component)."""

    def requires(self) -> list[str]:
        """The wheel's ``Requires-Dist`` lines, markers and extras included."""
        with zipfile.ZipFile(self.wheel) as wheel:
            (metadata,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
            text = wheel.read(metadata).decode()
        return Parser().parsestr(text).get_all("Requires-Dist") or []


def _stage(root: Path, package: PythonPackage, target: Path) -> Path:
    source = root / package.source
    with (source / "pyproject.toml").open("rb") as handle:
        pyproject = tomllib.load(handle)
    where = pyproject.get("tool", {}).get("setuptools", {}).get("packages", {}).get("find", {})
    folders = list(where.get("where", ["."]))
    target.mkdir(parents=True)
    shutil.copy2(source / "pyproject.toml", target / "pyproject.toml")
    readme = pyproject.get("project", {}).get("readme")
    if isinstance(readme, str):
        shutil.copy2(source / readme, target / readme)
    shutil.copy2(root / LICENSE, target / LICENSE)
    for folder in folders:
        if folder == ".":
            for child in source.iterdir():
                if child.is_dir() and (child / "__init__.py").is_file():
                    shutil.copytree(child, target / child.name, ignore=_SKIP)
        else:
            shutil.copytree(source / folder, target / folder, ignore=_SKIP)
    return target


def _backend(kind: str, cwd: Path, out: Path, log: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run_step(
        f"{kind} {cwd.name}",
        [sys.executable, "-c", _BUILD, kind, str(out)],
        log,
        env=env,
        cwd=cwd,
        topic=TOPIC,
    )


def _one(directory: Path, pattern: str, what: str) -> Path:
    found = sorted(directory.glob(pattern))
    if len(found) != 1:
        raise ReleaseError(f"{what}: expected one {pattern} in {directory}, found {[p.name for p in found]}")
    return found[0]


def build(root: Path, package: PythonPackage, version: str, dest: Path, work: Path, logs: Path) -> Built:
    """The package's sdist, then its wheel from that sdist, both into ``dest``."""
    staged = _stage(root, package, work / "src" / package.name)
    out = work / "out" / package.name
    out.mkdir(parents=True)
    _backend("sdist", staged, out, logs / f"sdist-{package.name}.log")
    sdist = _one(out, f"*-{version}.tar.gz", f"sdist of {package.name} {version}")
    unpacked = work / "sdist" / package.name
    unpacked.mkdir(parents=True)
    with tarfile.open(sdist) as archive:
        extract_all(archive, unpacked)
    (top,) = list(unpacked.iterdir())
    _backend("wheel", top, out, logs / f"wheel-{package.name}.log")
    wheel = _one(out, f"*-{version}-*.whl", f"wheel of {package.name} {version}")
    dest.mkdir(parents=True, exist_ok=True)
    shipped = []
    for artifact in (sdist, wheel):
        shipped.append(dest / artifact.name)
        shutil.copy2(artifact, shipped[-1])
    return Built(package, shipped[0], shipped[1], top / "pyproject.toml")
