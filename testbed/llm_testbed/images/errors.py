"""The error of the image builder: its message names the step that failed, the reason and the log."""

from __future__ import annotations

from llm_testbed.localcluster.errors import LocalClusterError


class ImageError(LocalClusterError):
    """A host command, the base, a wheelhouse or an image was not made; the message says which and why."""
