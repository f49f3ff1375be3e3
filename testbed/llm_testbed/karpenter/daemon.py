"""Karpenter (its kwok cloud provider) as a background process of one local cluster.

Everything lives in ``<cluster folder>/karpenter/``: the instance-type catalog it reads, its log, its
PID and ports. It talks to kube-apiserver with the cluster's admin kubeconfig; leader election is off
(one replica), and it has no webhooks to serve (Karpenter v1 validates with CEL rules in its CRDs). Its
metrics and health endpoints take free ports of the test bed's range; Karpenter binds them on every
interface (``:PORT``: it has no bind-address option), and nothing here reaches beyond the machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from llm_testbed.karpenter import catalog
from llm_testbed.karpenter.manifests import KarpenterError
from llm_testbed.localcluster import daemons, ports, tools

TOOL = "karpenter"
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0
PORT_NAMES = ("metrics", "health")


@dataclass(frozen=True)
class ProcessSettings:
    """Karpenter's own options (environment variables of ``sigs.k8s.io/karpenter/pkg/operator/options``)."""

    feature_gates: Mapping[str, bool] = field(default_factory=lambda: {"NodeRepair": False})
    log_level: str = "info"  # debug | info | error
    batch_idle_duration: str = "1s"  # upstream defaults: a launch waits for 1 s without new pods ...
    batch_max_duration: str = "10s"  # ... and at most 10 s


def state_dir(cluster_dir: Path) -> Path:
    return cluster_dir / "karpenter"


def catalog_path(folder: Path) -> Path:
    return folder / "instance-types.json"


def log_path(folder: Path) -> Path:
    return folder / "karpenter.log"


def environment(
    kubeconfig: Path, folder: Path, port_of: Mapping[str, int], settings: ProcessSettings
) -> dict[str, str]:
    """The process's environment: ours (PATH, HOME...) plus Karpenter's options (pure)."""
    gates = ",".join(f"{name}={str(on).lower()}" for name, on in sorted(settings.feature_gates.items()))
    return {
        **os.environ,
        "KUBECONFIG": str(kubeconfig),
        "INSTANCE_TYPES_FILE_PATH": str(catalog_path(folder)),
        "DISABLE_LEADER_ELECTION": "true",
        "METRICS_PORT": str(port_of["metrics"]),
        "HEALTH_PROBE_PORT": str(port_of["health"]),
        "FEATURE_GATES": gates,
        "LOG_LEVEL": settings.log_level,
        "BATCH_IDLE_DURATION": settings.batch_idle_duration,
        "BATCH_MAX_DURATION": settings.batch_max_duration,
    }


def _read_json(path: Path) -> dict[str, int]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): int(v) for k, v in data.items()} if isinstance(data, dict) else {}


def pid(folder: Path) -> int | None:
    return _read_json(folder / "process.json").get("pid")


def ports_of(folder: Path) -> dict[str, int]:
    return {k: v for k, v in _read_json(folder / "process.json").items() if k in PORT_NAMES}


def alive(folder: Path) -> bool:
    """Karpenter runs for this folder (the PID is a live process of the karpenter binary, not reused)."""
    p = pid(folder)
    if p is None:
        return False
    try:
        cmdline = Path(f"/proc/{p}/cmdline").read_bytes()
        state = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z" and cmdline.split(b"\0")[0].endswith(b"/" + TOOL.encode())


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def log_tail(folder: Path, lines: int = 15) -> str:
    try:
        return "\n".join(log_path(folder).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def start(kubeconfig: Path, folder: Path, settings: ProcessSettings | None = None) -> int:
    """Start Karpenter unless it runs; return its PID once its readiness probe passes.

    Its CRDs must be installed first (its readiness probe checks that NodePool and NodeClaim exist).
    """
    if alive(folder):
        running = pid(folder)
        assert running is not None
        return running
    binary = tools.ensure([TOOL])[TOOL]
    folder.mkdir(parents=True, exist_ok=True)
    catalog_path(folder).write_text(json.dumps(catalog.instance_types(), indent=1) + "\n")
    chosen = ports.pick(PORT_NAMES, taken=set())
    env = environment(kubeconfig, folder, chosen, settings or ProcessSettings())
    with log_path(folder).open("ab") as log:
        proc = subprocess.Popen(
            [str(binary)], env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
        )
    (folder / "process.json").write_text(json.dumps({"pid": proc.pid, **chosen}) + "\n")
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not _ready(chosen["health"]):
        if proc.poll() is not None:
            raise KarpenterError(
                f"karpenter exited with code {proc.returncode} at start; log {log_path(folder)}:\n"
                f"{log_tail(folder)}"
            )
        if time.monotonic() > deadline:
            proc.kill()
            raise KarpenterError(
                f"karpenter was not ready within {READY_TIMEOUT_S:g}s; log {log_path(folder)}:\n"
                f"{log_tail(folder)}"
            )
        time.sleep(0.2)
    return proc.pid


def stop(folder: Path) -> bool:
    """SIGTERM Karpenter, SIGKILL it if it has not ended in time; ``False`` when it was not running."""
    p = pid(folder)
    if p is None or not alive(folder):
        return False
    daemons.terminate(p, lambda: alive(folder), STOP_TIMEOUT_S)
    return True
