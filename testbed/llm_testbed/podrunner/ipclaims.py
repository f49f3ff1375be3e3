"""Which pod IPs this machine's pod runners hold: one lock file per address, held while a pod has it.

Every runner hands out addresses of 127.1.0.0/16 (:mod:`network`), starting in a /24 picked by its
cluster's name. Two runners alive at once (one test session's process and Karpenter clusters, or two test
workers' clusters) can still reach each other's addresses: the starting /24s come from a hash, and a runner
that starts many pods walks on into the next /24. A pod given an address another runner's pod holds cannot
bind its ports there. So each runner also claims each address machine-wide before it hands it out: an
exclusive ``flock`` on ``<dir>/<ip>``. The kernel drops the lock when the runner closes it or dies, so a
killed runner leaves no claim behind.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from pathlib import Path

CLAIMS_DIR = Path(tempfile.gettempdir()) / "llmjob-pod-ips"
"""Machine-wide: every runner on this machine claims its pods' addresses here."""


class FileClaims:
    """Claims addresses for one runner (``take``/``release``); every claim ends with the process."""

    def __init__(self, folder: Path = CLAIMS_DIR) -> None:
        self.folder = folder
        self._held: dict[str, int] = {}

    def take(self, ip: str) -> bool:
        """Claim ``ip``; False when another holder (another runner, or another ``FileClaims``) has it."""
        if ip in self._held:
            return False
        if not self.folder.is_dir():
            self.folder.mkdir(parents=True, exist_ok=True)
            self.folder.chmod(0o1777)  # runners of any user claim here; each owns only its own files
        fd = os.open(self.folder / ip, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._held[ip] = fd
        return True

    def release(self, ip: str) -> None:
        fd = self._held.pop(ip, None)
        if fd is not None:
            os.close(fd)
