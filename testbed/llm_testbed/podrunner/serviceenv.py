"""The environment the runner gives process-mode containers, and the API server's address for every pod."""

from __future__ import annotations

import os
import sys
import urllib.parse
from pathlib import Path


def base_env() -> dict[str, str]:
    """What every container starts with (its own ``env`` comes on top)."""
    venv_bin = str(Path(sys.executable).parent)
    env = {"PATH": f"{venv_bin}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
    for name in ("HOME", "LANG", "LC_ALL", "TZ", "TMPDIR"):
        if name in os.environ:
            env[name] = os.environ[name]
    return env


def api_service_env(server: str) -> dict[str, str]:
    """``KUBERNETES_SERVICE_HOST``/``_PORT`` as a kubelet sets them, pointing at the apiserver itself
    (the ``kubernetes`` Service's ClusterIP is not routed here): in-cluster clients work in a pod."""
    url = urllib.parse.urlsplit(server)
    port = str(url.port or 443)
    host = url.hostname or ""
    return {"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": port,
            "KUBERNETES_SERVICE_PORT_HTTPS": port}  # fmt: skip
