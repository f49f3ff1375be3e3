"""CycloneDX SBOMs (JSON) made by ``cyclonedx-py environment``, for packages and images alike.

``cyclonedx-py environment <python>`` reads the metadata of every distribution on that interpreter's
``sys.path``. Both kinds of SBOM hand it a throw-away virtual environment that holds exactly the
distributions to describe, as ``<name>-<version>.dist-info/METADATA`` files (the core metadata: name,
version, summary, licence, project URLs, ``Requires-Dist``, from which it also draws the dependency graph):

- a package: its pinned dependency closure (its own ``Requires-Dist`` with the listed extras, followed
  through the installed distributions of this environment, the versions the test suite ran), with the
  package itself as the root component (``--pyproject``);
- an image: every distribution its own Python sees (``importlib.metadata`` run in a container of the
  image, first on ``sys.path`` wins), with the image as the root component.

Python packages only: the Debian/Ubuntu packages of an image are not listed (docs/decisions.md).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
from collections.abc import Iterable, Mapping
from email.parser import Parser
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from llm_testbed.images.steps import run_step
from llm_testbed.release.errors import ReleaseError

TOPIC = "release"
SPEC_VERSION = "1.6"
_BOOT = (
    "import runpy, sys\n"
    "sys.path.insert(0, sys.argv.pop(1))\n"
    "sys.argv[0] = 'cyclonedx-py'\n"
    "runpy.run_module('cyclonedx_py', run_name='__main__', alter_sys=True)\n"
)


def closure(requires: Iterable[str], extras: Iterable[str]) -> dict[str, str]:
    """METADATA text of every installed distribution the requirements reach, by canonical name.

    ReleaseError when one is not installed here (the environment is the one the tests ran: make setup).
    """
    found: dict[str, str] = {}
    done: set[tuple[str, frozenset[str]]] = set()
    todo = [(text, frozenset(extras)) for text in requires]
    while todo:
        text, active = todo.pop()
        req = Requirement(text)
        if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in ("", *active)):
            continue
        key = canonicalize_name(req.name)
        wanted = frozenset(req.extras)
        if (key, wanted) in done:
            continue
        done.add((key, wanted))
        try:
            dist = distribution(req.name)
        except PackageNotFoundError:
            raise ReleaseError(
                f"SBOM: {req.name} (required as {text!r}) is not installed in {sys.prefix}: run make setup"
            ) from None
        found.setdefault(key, dist.read_text("METADATA") or dist.read_text("PKG-INFO") or "")
        todo += [(sub, wanted) for sub in dist.requires or []]
    return found


def _site_packages(env: Path) -> Path:
    return env / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


def environment(where: Path, metadata: Iterable[str], log: Path) -> Path:
    """A virtual environment without pip whose site-packages holds one dist-info per METADATA text."""
    run_step(
        f"sbom environment {where.name}",
        [sys.executable, "-m", "venv", "--without-pip", str(where)],
        log,
        topic=TOPIC,
    )
    site = _site_packages(where)
    for text in metadata:
        meta = Parser().parsestr(text)
        name, version = meta.get("Name"), meta.get("Version")
        if not name or not version:
            raise ReleaseError(f"SBOM: a distribution's METADATA has no Name or Version: {text[:80]!r}")
        folder = site / f"{re.sub(r'[-_.]+', '_', name).lower()}-{version}.dist-info"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "METADATA").write_text(text)
    return where


def _cyclonedx_location() -> str:
    spec = importlib.util.find_spec("cyclonedx_py")
    if spec is None or not spec.submodule_search_locations:
        raise ReleaseError("cyclonedx-py is not installed here: it comes with the dev extra (make setup)")
    return str(Path(next(iter(spec.submodule_search_locations))).parent)


def generate(
    env: Path, out: Path, log: Path, pyproject: Path | None = None, *, validate: bool = True
) -> dict[str, Any]:
    """``cyclonedx-py environment`` over ``env`` into ``out``; the SBOM as parsed JSON.

    It runs with this interpreter and no ``PYTHONPATH``, so the environment's interpreter, which
    cyclonedx-py asks for its ``sys.path``, sees only its own site-packages. ``validate``: cyclonedx-py
    checks its output against the CycloneDX JSON schema (about 8 s of CPU per SBOM on the 2-core VM).
    """
    argv = [sys.executable, "-c", _BOOT, _cyclonedx_location(), "environment"]
    argv += ["--sv", SPEC_VERSION, "--output-format", "JSON", "--output-reproducible", "-o", str(out)]
    argv.append("--validate" if validate else "--no-validate")
    if pyproject is not None:
        argv += ["--pyproject", str(pyproject), "--mc-type", "library"]
    argv.append(str(env))
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run_step(f"sbom {out.name}", argv, log, env=clean, topic=TOPIC)
    bom: dict[str, Any] = json.loads(out.read_text())
    return bom


def set_root(out: Path, bom: dict[str, Any], component: Mapping[str, Any]) -> None:
    """Name what the SBOM describes (an image: ``type: container``) and write it back."""
    bom.setdefault("metadata", {})["component"] = dict(component)
    out.write_text(json.dumps(bom, indent=2) + "\n")


def component_names(bom: Mapping[str, Any]) -> set[str]:
    return {canonicalize_name(str(c.get("name", ""))) for c in bom.get("components", [])}
