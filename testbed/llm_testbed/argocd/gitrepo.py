"""The git repository Argo CD syncs from: a local repository on this machine, read through a file URL.

Argo CD's repo server clones any URL git itself can (its git client runs the ``git`` command), so a
``file://`` URL needs no git server at all. A test writes files, commits, and asks Argo CD to look again.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from llm_testbed.argocd.manifests import ArgoCDError

AUTHOR = ["-c", "user.name=llmjob test bed", "-c", "user.email=testbed@elasticllm.dev"]


class GitRepo:
    """A work-tree repository at ``path`` on branch ``main``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @property
    def url(self) -> str:
        return self.path.resolve().as_uri()

    def _git(self, *args: str) -> str:
        result = subprocess.run(["git", *AUTHOR, *args], cwd=self.path, capture_output=True, text=True,
                                check=False, timeout=60)  # fmt: skip
        if result.returncode != 0:
            raise ArgoCDError(f"git {' '.join(args)} in {self.path} failed: {result.stderr.strip()}")
        return result.stdout.strip()

    def init(self) -> GitRepo:
        self.path.mkdir(parents=True, exist_ok=True)
        if not (self.path / ".git").is_dir():
            self._git("init", "--quiet", "--initial-branch=main")
        return self

    def write(self, relative: str, text: str) -> None:
        target = self.path / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)

    def copy_tree(self, source: Path, relative: str) -> None:
        """``source`` (a folder) as ``relative`` in the work tree, replacing what was there."""
        target = self.path / relative
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(source, target)

    def remove(self, relative: str) -> None:
        self._git("rm", "-r", "--quiet", relative)

    def commit(self, message: str) -> str:
        """Commit everything in the work tree; the new commit's SHA."""
        self._git("add", "--all")
        self._git("commit", "--quiet", "--allow-empty", "-m", message)
        return self._git("rev-parse", "HEAD")
