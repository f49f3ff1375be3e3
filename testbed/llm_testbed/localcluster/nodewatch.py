"""The phantom-failure guard: every node that goes NotReady without a test having failed it.

A node a test kills carries the dead-node mark (``marks.NODE_NOT_READY_LABEL``) before its Ready
condition changes (:func:`chaos.node_not_ready`). A node whose Ready condition leaves ``True`` without
the mark was failed by the test bed itself (a stalled kwok Lease, an overloaded control plane): no test
can pass on such a bed, and one that asked for a loss could not tell its own from the phantom. The guard
watches the nodes (one ``kubectl get nodes --watch`` stream, re-opened when it ends) and records each such
transition; the test fixtures fail the test it happened in with a message of its own.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Any

from llm_testbed.localcluster import marks
from llm_testbed.localcluster.kubectl import Kubectl

REOPEN_WAIT_S = 1.0
"""After the watch stream ends (apiserver restarted, server-side timeout): wait this long, then re-list."""


@dataclass(frozen=True)
class Phantom:
    """One node that left Ready with no test having failed it."""

    node: str
    at: float
    status: str
    reason: str
    message: str

    def describe(self) -> str:
        when = time.strftime("%H:%M:%S", time.localtime(self.at))
        return (
            f"node {self.node} went Ready={self.status} at {when} ({self.reason}: {self.message}) "
            "although no test failed it"
        )


def ready_status(node: dict[str, Any]) -> tuple[str, str, str]:
    """(status, reason, message) of the node's Ready condition; status "" when it has none yet."""
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return str(cond.get("status", "")), str(cond.get("reason", "")), str(cond.get("message", ""))
    return "", "", ""


def phantom(before: str | None, node: dict[str, Any], at: float) -> Phantom | None:
    """The transition from Ready status ``before`` to ``node``'s, if it is a phantom failure: the node
    was Ready, is not any more, and carries no dead-node mark. A node that never was Ready (just
    created) or that a test killed is no phantom, nor is one coming back."""
    meta = node.get("metadata") or {}
    status, reason, message = ready_status(node)
    if before != "True" or status in ("True", ""):
        return None
    if marks.NODE_NOT_READY_LABEL in (meta.get("labels") or {}):
        return None
    return Phantom(str(meta.get("name", "")), at, status, reason, message)


class NodeGuard:
    """Watches one cluster's nodes in a background thread; :meth:`take` hands over what it recorded."""

    def __init__(self, kube: Kubectl) -> None:
        self.kube = kube
        self._ready: dict[str, str] = {}
        self._found: list[Phantom] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._proc: subprocess.Popen[bytes] | None = None
        self._thread = threading.Thread(target=self._run, name="node-guard", daemon=True)

    def start(self) -> NodeGuard:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
        self._thread.join(timeout=10)

    def take(self) -> list[Phantom]:
        """The phantom failures recorded since the last call."""
        with self._lock:
            found, self._found = self._found, []
        return found

    def observe(self, kind: str, node: dict[str, Any], at: float) -> None:
        """One watch event (``ADDED``/``MODIFIED``/``DELETED``) of one node."""
        name = str((node.get("metadata") or {}).get("name", ""))
        if kind == "DELETED":
            self._ready.pop(name, None)
            return
        found = phantom(self._ready.get(name), node, at)
        self._ready[name] = ready_status(node)[0]
        if found is not None:
            with self._lock:
                self._found.append(found)

    def _run(self) -> None:
        argv = self.kube.argv("get", "nodes", "--watch", "--output-watch-events", "-o", "json")
        while not self._stop.is_set():
            with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) as proc:
                self._proc = proc
                assert proc.stdout is not None
                self._read(proc.stdout)
            self._stop.wait(REOPEN_WAIT_S)

    def _read(self, stream: Any) -> None:
        """Decode the stream of pretty-printed JSON events as they come."""
        decoder = json.JSONDecoder()
        buffer = ""
        while True:
            chunk = stream.read1(65536) if hasattr(stream, "read1") else stream.read(65536)
            if not chunk:
                return
            buffer += chunk.decode(errors="replace")
            while True:
                buffer = buffer.lstrip()
                if not buffer:
                    break
                try:
                    event, end = decoder.raw_decode(buffer)
                except json.JSONDecodeError:
                    break  # incomplete: wait for more
                buffer = buffer[end:]
                if isinstance(event, dict) and isinstance(event.get("object"), dict):
                    self.observe(str(event.get("type", "")), event["object"], time.time())
