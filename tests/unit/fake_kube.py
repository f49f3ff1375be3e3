"""An in-memory stand-in for ``llm_operator.kube.Kube`` that records every call, and a recorder of kopf
Events, for unit tests of the controller's parts."""

from __future__ import annotations

from typing import Any

import kopf
import pytest
from llm_operator.kube import KubeError


class FakeKube:
    """Answers as a healthy apiserver would; ``fail`` names methods that raise ``KubeError``."""

    def __init__(self, runtimes: dict[tuple[str, str], dict[str, Any]] | None = None) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.runtimes = runtimes or {}
        self.uids: set[str] = set()
        self.ips: list[str] = []
        self.fail: set[str] = set()
        self.taken: dict[str, str | None] = {}
        """Pod names whose creation answers 409, and the uid a read of each gives (None: gone)."""

    def _call(self, method: str, *args: Any) -> None:
        self.calls.append((method, args))
        if method in self.fail:
            raise KubeError(500, f"{method} failed")

    def called(self, method: str) -> list[Any]:
        return [args for name, args in self.calls if name == method]

    async def create(self, obj: dict[str, Any]) -> bool:
        self._call("create", obj)
        return True

    async def create_pod(self, pod: dict[str, Any]) -> str | None:
        """The pod's uid: ``uid-<name>``; None (409) for a name in ``taken``. Recorded as a ``create``."""
        self._call("create", pod)
        name = pod["metadata"]["name"]
        return None if name in self.taken else f"uid-{name}"

    async def pod_uid(self, namespace: str, name: str) -> str | None:
        self._call("pod_uid", namespace, name)
        return self.taken.get(name)

    async def delete_pod(self, namespace: str, name: str, uid: str, force: bool) -> str:
        """A forced deletion leaves no object (the real answer when the pod has no finalizer)."""
        self._call("delete_pod", namespace, name, uid, force)
        return "gone" if force else "terminating"

    async def running_pods(self, namespace: str, selector: dict[str, str]) -> list[tuple[str, str]]:
        self._call("running_pods", namespace, selector)
        return [(f"uid-{ip}", ip) for ip in self.ips]

    async def failed_scheduling(self, namespace: str) -> list[Any]:
        self._call("failed_scheduling", namespace)
        return []

    async def pod_uids(self, namespace: str, selector: dict[str, str]) -> set[str]:
        self._call("pod_uids", namespace, selector)
        return self.uids

    async def get_runtime(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        self._call("get_runtime", kind, namespace, name)
        return self.runtimes.get((kind, name))

    async def mark_node(self, name: str, key: str, value: str) -> bool:
        self._call("mark_node", name, key, value)
        return True

    async def unmark_node(self, name: str, key: str, value: str) -> bool:
        self._call("unmark_node", name, key, value)
        return True

    async def patch_job_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self._call("patch_job_status", namespace, name, status)


class Events(list[tuple[str, str, str]]):
    """(type, reason, message) of every ``kopf.event`` call."""

    def reasons(self) -> list[str]:
        return [reason for _, reason, _ in self]


def record_events(monkeypatch: pytest.MonkeyPatch) -> Events:
    events = Events()

    def event(obj: Any, *, type: str, reason: str, message: str = "") -> None:
        events.append((type, reason, message))

    monkeypatch.setattr(kopf, "event", event)
    return events
