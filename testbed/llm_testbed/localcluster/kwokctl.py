"""Running kwokctl for one cluster: environment, arguments, readable progress, one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path

from llm_testbed.localcluster import paths
from llm_testbed.localcluster.errors import LocalClusterError
from llm_testbed.localcluster.progress import say

CREATE_TIMEOUT_S = 180.0  # kwokctl create, including its own wait for the apiserver
DELETE_TIMEOUT_S = 120.0


def workdir() -> Path:
    """``KWOK_WORKDIR`` of every cluster we start: kwokctl keeps ``clusters/<name>/`` there."""
    return paths.cache_root() / "kwok"


class Kwokctl:
    """kwokctl bound to one cluster name, our binaries (``tools``: name -> path) and a ``KWOK_WORKDIR``
    (``root``; default :func:`workdir` now)."""

    def __init__(self, name: str, tools: dict[str, Path], root: Path | None = None) -> None:
        self.name = name
        self.tools = tools
        self.root = root if root is not None else workdir()

    @property
    def log_path(self) -> Path:
        return self.root / "configs" / f"{self.name}.kwokctl.log"

    def env(self) -> dict[str, str]:
        kubectl = self.tools["kubectl"]
        return {
            **os.environ,
            "KWOK_WORKDIR": str(self.root),
            "KWOK_RUNTIME": "binary",
            "KWOK_KUBECTL_BINARY": str(kubectl),
            # kwokctl runs the first `kubectl` on PATH: make it ours, not a system one of another version
            "PATH": os.pathsep.join([str(kubectl.parent), os.environ.get("PATH", "")]),
        }

    def create(self, config: Path) -> None:
        """Create the cluster, or resume it when it exists but is stopped (kwokctl decides)."""
        t = self.tools
        self.run(
            "create", "cluster",
            "--runtime", "binary",
            "--config", str(config),
            "--kubeconfig", "",  # never touch ~/.kube/config: the kubeconfig stays in our work dir
            "--kube-apiserver-binary", str(t["kube-apiserver"]),
            "--kube-controller-manager-binary", str(t["kube-controller-manager"]),
            "--kube-scheduler-binary", str(t["kube-scheduler"]),
            "--kwok-controller-binary", str(t["kwok"]),
            "--etcd-binary", str(t["etcd"]),
            "--timeout", f"{int(CREATE_TIMEOUT_S)}s",
            timeout=CREATE_TIMEOUT_S + 30,
        )  # fmt: skip

    def delete(self) -> None:
        self.run("delete", "cluster", timeout=DELETE_TIMEOUT_S)

    def run(self, *args: str, timeout: float) -> None:
        """Run kwokctl, echoing its log lines as progress and keeping them in :attr:`log_path`."""
        argv = [str(self.tools["kwokctl"]), "--name", self.name, *args]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        lines: list[str] = []
        with self.log_path.open("w") as log:
            proc = subprocess.Popen(
                argv, env=self.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
            watchdog = threading.Timer(timeout, proc.kill)
            watchdog.start()
            try:
                assert proc.stdout is not None
                for line in proc.stdout:
                    log.write(line)
                    lines.append(readable(line))
                    say("cluster", f"kwokctl: {lines[-1]}")
                code = proc.wait()
            finally:
                watchdog.cancel()
        if code != 0:
            last = (
                f"killed after {timeout:.0f}s"
                if code < 0
                else next((line for line in reversed(lines) if line.strip()), "(no output)")
            )
            raise LocalClusterError(
                f"kwokctl {' '.join(args[:2])} for cluster {self.name} failed (exit {code}): {last} "
                f"(full output in {self.log_path})"
            )


def readable(line: str) -> str:
    """kwokctl logs JSON lines; keep what a person reads: level, message, elapsed time, error."""
    try:
        record = json.loads(line)
    except ValueError:
        return line.rstrip()
    if not isinstance(record, dict) or "msg" not in record:
        return line.rstrip()
    text = str(record["msg"])
    elapsed = record.get("elapsed")
    if isinstance(elapsed, dict) and "human" in elapsed:
        text += f" ({elapsed['human']})"
    if "err" in record:
        text += f": {record['err']}"
    level = record.get("level", "INFO")
    return text if level == "INFO" else f"{level}: {text}"
