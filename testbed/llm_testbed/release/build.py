"""The release, step by step: the folder, then each artifact, its SBOM, the checksums and the summary."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from llm_testbed.images.steps import report
from llm_testbed.release import chart, container_images, python, sbom
from llm_testbed.release.folder import ReleaseFolder
from llm_testbed.version import project_version

TOPIC = "release"


def revision(root: Path) -> str:
    """The commit the tree is at (``-dirty`` with uncommitted changes), or why there is none."""
    head = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, check=False
    )
    if head.returncode != 0:
        return "unknown (not a git checkout)"
    dirty = subprocess.run(
        ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return head.stdout.strip() + ("-dirty" if dirty else "")


def _say(message: str) -> None:
    report(message, TOPIC)


def _packages(root: Path, version: str, out: Path, work: Path, logs: Path, validate: bool) -> list[str]:
    notes = []
    for package in python.PACKAGES:
        built = python.build(root, package, version, out / "python", work, logs)
        _say(f"python {package.name}: {built.sdist.name}, {built.wheel.name}")
        deps = sbom.closure(built.requires(), package.sbom_extras)
        env = sbom.environment(
            work / "sbom-env" / package.name, deps.values(), logs / f"venv-{package.name}.log"
        )
        target = out / "sbom" / f"{package.name}-{version}.python.cdx.json"
        target.parent.mkdir(parents=True, exist_ok=True)
        log = logs / f"sbom-{package.name}.log"
        bom = sbom.generate(env, target, log, pyproject=built.pyproject, validate=validate)
        _say(f"sbom {target.name}: {len(bom.get('components', []))} components")
        notes.append(f"python/{built.wheel.name}, python/{built.sdist.name}: {package.about}")
    return notes


def _images(version: str, out: Path, work: Path, logs: Path, save: bool, validate: bool) -> list[str]:
    notes = []
    for image in container_images.tag(version):
        env = sbom.environment(
            work / "sbom-env" / f"image-{image.name}",
            container_images.distributions(image),
            logs / f"venv-image-{image.name}.log",
        )
        target = out / "sbom" / f"{image.name}-image-{version}.cdx.json"
        bom = sbom.generate(env, target, logs / f"sbom-image-{image.name}.log", validate=validate)
        root_component = {
            "type": "container",
            "bom-ref": "root-component",
            "name": image.reference.rsplit(":", 1)[0],
            "version": version,
            "properties": [
                {"name": "elasticllm.dev:image-id", "value": image.image_id},
                {"name": "elasticllm.dev:local-build-leaves-out", "value": image.left_out},
            ],
        }
        sbom.set_root(target, bom, root_component)
        _say(f"sbom {target.name}: {len(bom.get('components', []))} Python distributions")
        archive = ""
        if save:
            archive = f", saved as images/{container_images.save(image, out / 'images', logs).name}"
        notes.append(
            f"{image.reference} (id {image.image_id[:12]}, {image.size / 2**20:.0f} MiB, in the image"
            f" builder's podman storage{archive}); the local build leaves out {image.left_out}"
        )
    return notes


def make_release(
    root: Path, out_root: Path, *, save_images: bool = False, validate_sboms: bool = True
) -> Path:
    """Build every artifact into ``out_root/<version>/``; its path."""
    started = time.monotonic()
    version = project_version(root)
    folder = ReleaseFolder(out_root, version)
    out = folder.start()
    work = folder.logs / "work"
    shutil.rmtree(work, ignore_errors=True)
    commit = revision(root)
    _say(f"elastic-llm-operator {version} at {commit} into {folder.final} (logs: {folder.logs})")

    packaged = chart.package_chart(root, version, out / "chart", folder.logs)
    _say(f"chart: {packaged.name}")
    bundle = chart.write_crd_bundle(root, version, out)
    _say(f"crds: {bundle.name}")
    notes = [
        f"chart/{packaged.name}: the Helm chart (version and appVersion {version}; CRDs in its crds/)",
        f"{bundle.name}: every CRD, for kubectl apply --server-side (upgrades, GitOps)",
    ]
    notes += _packages(root, version, out, work, folder.logs, validate_sboms)
    notes += _images(version, out, work, folder.logs, save_images, validate_sboms)
    notes.append("sbom/: CycloneDX 1.6 JSON per package and per image (Python distributions; no OS packages)")
    (out / "RELEASE.txt").write_text(
        f"elastic-llm-operator {version}\ncommit: {commit}\n\n" + "".join(f"- {n}\n" for n in notes)
    )
    shutil.rmtree(work, ignore_errors=True)
    final = folder.finish()
    _say(f"release {version} ready in {time.monotonic() - started:.0f}s: {final}")
    return final
