"""Counting one client's API requests from kube-apiserver's audit log (benchmarks, not the operator).

kube-apiserver's ``apiserver_request_total`` has no client label in recent versions; the audit log has the
user and the user agent of every request. :func:`policy` audits only the given users at ``Metadata`` level
(no bodies), so the log stays small while a benchmark runs 1,000 jobs; :class:`AuditTail` reads what the
log gained since a mark and :func:`count` sorts those requests into reads and writes by verb and resource.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
READ_VERBS = frozenset({"get", "list", "watch"})


def policy(users: Iterable[str]) -> dict[str, Any]:
    """An audit policy: one ``Metadata`` entry per request of ``users`` when it completes (a watch when
    its response starts: it may never complete), nothing for anyone else."""
    return {
        "apiVersion": "audit.k8s.io/v1",
        "kind": "Policy",
        "omitStages": ["RequestReceived"],
        "rules": [{"level": "Metadata", "users": sorted(users)}, {"level": "None"}],
    }


def request_key(entry: dict[str, Any]) -> tuple[str, str] | None:
    """(verb, resource[/subresource]) of an audit entry that marks one request, else None.

    A long-running request (watch) has two entries, ``ResponseStarted`` and ``ResponseComplete``: it is
    counted once, when it starts. Everything else is counted at ``ResponseComplete``.
    """
    verb = str(entry.get("verb") or "")
    stage = entry.get("stage")
    if stage != ("ResponseStarted" if verb == "watch" else "ResponseComplete"):
        return None
    ref = entry.get("objectRef") or {}
    resource = str(ref.get("resource") or entry.get("requestURI") or "?")
    if ref.get("subresource"):
        resource += "/" + str(ref["subresource"])
    return verb, resource


@dataclass
class Counts:
    """Requests by (verb, resource), and the clients (user agents) seen."""

    by_request: Counter[tuple[str, str]] = field(default_factory=Counter)
    agents: Counter[str] = field(default_factory=Counter)

    @property
    def writes(self) -> int:
        return sum(n for (verb, _), n in self.by_request.items() if verb in WRITE_VERBS)

    @property
    def reads(self) -> int:
        return sum(n for (verb, _), n in self.by_request.items() if verb in READ_VERBS)

    def table(self) -> dict[str, int]:
        """``"verb resource" -> count``, most frequent first (for JSON output)."""
        return {f"{verb} {resource}": n for (verb, resource), n in self.by_request.most_common()}


def count(lines: Iterable[str | bytes], user: str | None = None) -> Counts:
    """Count the requests in audit log lines (JSON, one event a line), of ``user`` only when given.

    Lines that do not parse (a line cut by a concurrent write) are skipped.
    """
    out = Counts()
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if not isinstance(entry, dict):
            continue
        if user is not None and (entry.get("user") or {}).get("username") != user:
            continue
        key = request_key(entry)
        if key is None:
            continue
        out.by_request[key] += 1
        out.agents[str(entry.get("userAgent") or "?").split(" ")[0]] += 1
    return out


class AuditTail:
    """Reads whole lines the audit log gained after :meth:`mark` (the log is append-only here)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def mark(self) -> None:
        self.offset = self.path.stat().st_size if self.path.exists() else 0

    def since_mark(self) -> list[bytes]:
        if not self.path.exists():
            return []
        with self.path.open("rb") as f:
            f.seek(self.offset)
            data = f.read()
        end = data.rfind(b"\n") + 1  # a half-written last line stays for the next read
        return data[:end].splitlines()


def parse_time(stamp: str) -> float:
    """An audit timestamp (RFC 3339 with microseconds, ``Z``) as epoch seconds."""
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def pod_writes(lines: Iterable[str | bytes], user: str, prefix: str) -> list[tuple[str, str, float, float]]:
    """The ``user``'s completed deletes and creates of pods named ``prefix*``: (verb, name, received,
    completed) in epoch seconds, in the order they were received."""
    out = []
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        ref = entry.get("objectRef") or {}
        if (
            entry.get("stage") != "ResponseComplete"
            or (entry.get("user") or {}).get("username") != user
            or entry.get("verb") not in ("delete", "create")
            or ref.get("resource") != "pods"
            or ref.get("subresource")
            or not str(ref.get("name") or "").startswith(prefix)
        ):
            continue
        received = parse_time(entry["requestReceivedTimestamp"])
        out.append((entry["verb"], ref["name"], received, parse_time(entry["stageTimestamp"])))
    return sorted(out, key=lambda w: w[2])


def split_reaction(signal: float, writes: list[tuple[str, str, float, float]]) -> dict[str, float] | None:
    """Where one reaction's time went: signal (epoch s, when the node event reached the watcher) ->
    the operator's delete arrives at the apiserver (``decide``) -> answered (``delete``) -> its create
    arrives (``gap``) -> answered (``create``). None when the writes after ``signal`` are incomplete."""
    delete = next((w for w in writes if w[0] == "delete" and w[2] >= signal - 0.05), None)
    if delete is None:
        return None
    create = next((w for w in writes if w[0] == "create" and w[2] >= delete[2]), None)
    if create is None:
        return None
    return {
        "decide": delete[2] - signal,
        "delete": delete[3] - delete[2],
        "gap": create[2] - delete[3],
        "create": create[3] - create[2],
    }
