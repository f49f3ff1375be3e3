"""Where the local control plane keeps its cache and finds the repository's files."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """Per-machine cache (``$LLMJOB_CACHE_DIR`` or ``$XDG_CACHE_HOME/elastic-llm-operator``)."""
    explicit = os.environ.get("LLMJOB_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "elastic-llm-operator"


def repo_root() -> Path:
    """The checkout that holds ``deploy/local/tools`` (the wrapper modules are not in the wheel)."""
    explicit = os.environ.get("LLMJOB_REPO_ROOT")
    candidates = [Path(explicit)] if explicit else []
    candidates += [Path(__file__).resolve().parents[3], Path.cwd(), *Path.cwd().parents]
    for candidate in candidates:
        if (candidate / "deploy" / "local" / "tools").is_dir():
            return candidate
    raise FileNotFoundError(
        "cannot find deploy/local/tools: run from a checkout of elastic-llm-operator or set LLMJOB_REPO_ROOT"
    )


def crds_dir() -> Path | None:
    """The checkout's ``crds/`` folder (``$LLMJOB_CRDS_DIR`` wins); ``None`` outside a checkout."""
    explicit = os.environ.get("LLMJOB_CRDS_DIR")
    if explicit:
        return Path(explicit)
    try:
        return repo_root() / "crds"
    except FileNotFoundError:
        return None
