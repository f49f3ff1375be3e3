"""Files the runner keeps per cluster (paths only, plus two small writers).

``<state>/`` (the cluster's ``podrunner/`` folder, removed by ``llmjob cluster down``)::

    runner.pid, runner.log, ready   the runner daemon
    logs/<ns>/<pod>/<container>.log stdout+stderr of each container (restarts append)
    pods/<uid>/                     hosts file, launch plans, emptyDir volumes
    volumes/pv/<pv-name>/           PersistentVolumes (shared by every pod that mounts the claim)
    site/sitecustomize.py           binds to 0.0.0.0 in Python processes go to the pod IP
"""

from __future__ import annotations

import os
from pathlib import Path

SHM_ROOT = Path("/dev/shm/llmjob-podrunner")

SITECUSTOMIZE = '''"""Written by the llmjob local pod runner: a wildcard bind in a pod binds its pod IP."""
import os
import socket

_POD_IP = os.environ.get("LLMJOB_PODRUNNER_POD_IP")
if _POD_IP:
    _bind = socket.socket.bind

    def _pod_bind(self, address):
        if self.family == socket.AF_INET and isinstance(address, tuple) and address[0] in ("", "0.0.0.0"):
            address = (_POD_IP, *address[1:])
        return _bind(self, address)

    socket.socket.bind = _pod_bind
'''


def log_path(state_dir: Path, namespace: str, pod: str, container: str) -> Path:
    """Where the output of ``container`` of pod ``namespace/pod`` goes."""
    return state_dir / "logs" / namespace / pod / f"{container}.log"


def shm_dir(cluster: str) -> Path:
    return SHM_ROOT / cluster


def write_in_place(path: Path, text: str) -> bool:
    """Rewrite ``path`` without replacing its inode (it is bind-mounted) or ever leaving it empty.

    Shorter content is padded with spaces (blank to a hosts-file reader). Returns False if unchanged.
    """
    data = text.encode()
    try:
        old = path.read_bytes()
    except FileNotFoundError:
        old = None
    if old is not None and old.rstrip() == data.rstrip():
        return False
    if old is not None and len(old) > len(data):
        data = data + b" " * (len(old) - len(data) - 1) + b"\n"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, data, 0)
    finally:
        os.close(fd)
    return True
