"""The one exception type of the local control plane: its message is the whole story, in one line."""

from __future__ import annotations


class LocalClusterError(RuntimeError):
    """Something the local control plane needs is missing or failed; the message names it and why."""
