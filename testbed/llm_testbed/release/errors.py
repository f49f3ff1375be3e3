"""The error of ``make release``: its message names the step and the reason."""

from __future__ import annotations

from llm_testbed.localcluster.errors import LocalClusterError


class ReleaseError(LocalClusterError):
    """An artifact of the release was not made; the message says which and why."""
