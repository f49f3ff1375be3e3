"""A real Prometheus server for the local cluster's tests, and a small client of its HTTP API.

The server is Debian's ``prometheus`` package (installed by :func:`llm_testbed.promtool.ensure`, like
promtool). :class:`PrometheusServer` writes a config (global intervals, the scrape jobs of
:mod:`llm_testbed.monitors`, one rule file), starts ``prometheus`` on a free loopback port with its data in
a folder of its own, and answers queries through ``/api/v1`` (``query``, ``query_range``, ``alerts``,
label values). Its log is ``<folder>/prometheus.log``.
"""

from __future__ import annotations

import json
import subprocess
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from llm_testbed import monitors, promtool
from llm_testbed.local_etcd import free_port
from llm_testbed.localcluster.errors import LocalClusterError
from llm_testbed.localcluster.kubectl import Kubectl
from llm_testbed.localcluster.progress import say
from llm_testbed.localcluster.waiting import poll


class PrometheusError(LocalClusterError):
    """Prometheus did not start, or its API answered with an error."""


class PrometheusServer:
    """``prometheus`` as a child process; use as a context manager (stopped and its data kept on exit)."""

    def __init__(
        self,
        folder: Path,
        scrape_configs: list[dict[str, Any]],
        rule_groups: list[dict[str, Any]],
        *,
        interval: str = "1s",
    ) -> None:
        self.folder = folder
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.config = {
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "rule_files": ["rules.yaml"],
            "scrape_configs": scrape_configs,
        }
        self.rules = {"groups": rule_groups}

    @property
    def log(self) -> Path:
        return self.folder / "prometheus.log"

    def start(self, timeout: float = 60.0) -> None:
        """Write the config and rule file, check them with promtool, start and wait for /-/ready."""
        tool = promtool.ensure()
        binary = tool.parent / "prometheus"
        self.folder.mkdir(parents=True, exist_ok=True)
        config = self.folder / "prometheus.yml"
        (self.folder / "rules.yaml").write_text(yaml.safe_dump(self.rules, sort_keys=False))
        config.write_text(yaml.safe_dump(self.config, sort_keys=False))
        check = subprocess.run(
            [str(tool), "check", "config", str(config)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if check.returncode != 0:
            raise PrometheusError(f"promtool check config {config} failed:\n{check.stdout}{check.stderr}")
        argv = [
            str(binary),
            f"--config.file={config}",
            f"--storage.tsdb.path={self.folder / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
        ]
        say("prometheus", f"starting on {self.url} (log: {self.log})")
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        poll(self._ready, timeout=timeout, what=f"Prometheus ready on {self.url}", interval=0.2)

    def _ready(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            tail = self.log.read_text(errors="replace")[-2000:]
            raise PrometheusError(f"prometheus exited {self.proc.returncode}:\n{tail}")
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as rsp:  # noqa: S310 (http on loopback)
                return bool(rsp.status == 200)
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    def __enter__(self) -> PrometheusServer:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def api(self, path: str, **params: str) -> Any:
        """The ``data`` of a GET /api/v1/<path>; PrometheusError when the API reports an error."""
        query = urllib.parse.urlencode(params, doseq=True)
        url = f"{self.url}/api/v1/{path}" + (f"?{query}" if query else "")
        try:
            with urllib.request.urlopen(url, timeout=10) as rsp:  # noqa: S310 (http on loopback)
                body = json.loads(rsp.read())
        except urllib.error.HTTPError as exc:
            body = json.loads(exc.read() or b"{}")
        if body.get("status") != "success":
            raise PrometheusError(f"GET {url}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector of ``expr`` now."""
        result: list[dict[str, Any]] = self.api("query", query=expr)["result"]
        return result

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        """The range result of ``expr`` (one entry per series, with its ``values``)."""
        data = self.api("query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step=f"{step:g}")
        result: list[dict[str, Any]] = data["result"]
        return result

    def label_values(self, label: str, match: str, start: float) -> list[str]:
        values: list[str] = self.api(f"label/{label}/values", **{"match[]": match, "start": f"{start:.3f}"})
        return values

    def alerts(self, name: str) -> list[dict[str, Any]]:
        """The active (pending or firing) alerts called ``name``."""
        return [a for a in self.api("alerts")["alerts"] if a["labels"].get("alertname") == name]

    def targets(self) -> list[dict[str, Any]]:
        active: list[dict[str, Any]] = self.api("targets", state="active")["activeTargets"]
        return active


class PodTargets:
    """The test bed's stand-in for Prometheus's pod discovery (Debian's build has none): one
    ``kubectl get pods --watch`` per namespace keeps the pods of ``namespaces``, and every change rewrites
    ``path`` (file service discovery, replaced atomically, which Prometheus notices at once) with
    :func:`llm_testbed.monitors.pod_targets`. Use as a context manager."""

    def __init__(self, kube: Kubectl, namespaces: Sequence[str], path: Path) -> None:
        self.kube, self.path = kube, path
        self.namespaces = list(namespaces)
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._procs: list[subprocess.Popen[str]] = []
        self._threads: list[threading.Thread] = []

    def _write(self) -> None:
        with self._lock:
            text = json.dumps(monitors.pod_targets(list(self.pods.values())), sort_keys=True, indent=1)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(text)
            tmp.replace(self.path)

    def _follow(self, proc: subprocess.Popen[str]) -> None:
        """Read the watch's stream of JSON objects (``{"type": ..., "object": pod}``) until it ends."""
        assert proc.stdout is not None
        decoder, buffer = json.JSONDecoder(), ""
        for line in proc.stdout:
            buffer += line
            while True:
                buffer = buffer.lstrip()
                try:
                    event, end = decoder.raw_decode(buffer)
                except ValueError:  # an object still arriving
                    break
                buffer = buffer[end:]
                pod = event["object"]
                key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
                with self._lock:
                    if event["type"] == "DELETED":
                        self.pods.pop(key, None)
                    else:
                        self.pods[key] = pod
                self._write()

    def __enter__(self) -> PodTargets:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._write()
        for ns in self.namespaces:
            argv = self.kube.argv("get", "pods", "-n", ns, "--watch", "--output-watch-events", "-o", "json")
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            thread = threading.Thread(
                target=self._follow, args=(proc,), name=f"pod-targets-{ns}", daemon=True
            )
            thread.start()
            self._procs.append(proc)
            self._threads.append(thread)
        return self

    def __exit__(self, *_: object) -> None:
        for proc in self._procs:
            proc.terminate()
            proc.wait(timeout=10)
        for thread in self._threads:
            thread.join(timeout=10)
