"""The previous release, as CHANGELOG.md names it: its version and the commit it was cut from, and that
commit's files out of git history (``git archive``), for the upgrade test to install.

CHANGELOG.md's rule: each released section (``## [X.Y.Z] - date``) names its commit in its first
paragraph (``Commit `abc1234` ``). The newest released section is the previous release of the work tree.
A clone without that commit (shallow, or a source archive) cannot test the upgrade: the error says so
and how to get the history.
"""

from __future__ import annotations

import io
import re
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

from llm_testbed.release.errors import ReleaseError
from llm_testbed.release.untar import extract_all

CHANGELOG = "CHANGELOG.md"
_SECTION = re.compile(r"^## \[(?P<version>\d+\.\d+\.\d+[^\]]*)\]", re.MULTILINE)
_COMMIT = re.compile(r"Commit `(?P<commit>[0-9a-f]{7,40})`")


@dataclass(frozen=True)
class Release:
    version: str
    commit: str


def previous_release(changelog_text: str, where: str = CHANGELOG) -> Release:
    """The newest released section of the changelog and the commit it names (pure)."""
    found = _SECTION.search(changelog_text)
    if found is None:
        raise ReleaseError(f"{where}: no released section (## [X.Y.Z] - date): nothing to upgrade from")
    end = _SECTION.search(changelog_text, found.end())
    body = changelog_text[found.end() : end.start() if end else len(changelog_text)]
    commit = _COMMIT.search(body)
    if commit is None:
        raise ReleaseError(
            f"{where}: section [{found['version']}] names no commit (Commit `<hash>`): no upgrade path"
        )
    return Release(found["version"], commit["commit"])


def _git(root: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, check=False)


def export_tree(root: Path, commit: str, paths: list[str], dest: Path) -> Path:
    """``paths`` of ``commit`` extracted under ``dest`` (``git archive``); a clear error without history."""
    if _git(root, "cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
        shallow = _git(root, "rev-parse", "--is-shallow-repository").stdout.decode().strip() == "true"
        why = "this clone is shallow" if shallow else "it is not in this repository's history"
        raise ReleaseError(
            f"commit {commit} of the previous release ({CHANGELOG}) is missing: {why}; "
            "fetch the full history (git fetch --unshallow) to test the upgrade"
        )
    archive = _git(root, "archive", "--format=tar", commit, *paths)
    if archive.returncode != 0:
        raise ReleaseError(
            f"git archive {commit} {' '.join(paths)} failed: {archive.stderr.decode().strip()}"
        )
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        extract_all(tar, dest)
    return dest
