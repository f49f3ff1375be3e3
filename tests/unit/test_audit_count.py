"""The benchmark's audit-log counting (llm_testbed.audit): one count per request, by user, reads vs writes."""

from __future__ import annotations

import json
from pathlib import Path

from llm_testbed import audit

OP = "system:serviceaccount:llmjob-system:llmjob-operator"


def entry(verb: str, resource: str, stage: str = "ResponseComplete", user: str = OP, **ref: str) -> str:
    return json.dumps(
        {
            "kind": "Event",
            "stage": stage,
            "verb": verb,
            "user": {"username": user},
            "userAgent": "kopf/1.45.2 extra",
            "objectRef": {"resource": resource, **ref},
        }
    )


def test_policy_audits_only_the_given_users_without_bodies() -> None:
    doc = audit.policy([OP])
    assert doc["rules"] == [{"level": "Metadata", "users": [OP]}, {"level": "None"}]
    assert doc["omitStages"] == ["RequestReceived"]


def test_count_sorts_requests_and_counts_a_watch_once() -> None:
    lines = [
        entry("create", "pods"),
        entry("create", "pods"),
        entry("patch", "llmtrainingjobs", subresource="status"),
        entry("watch", "pods", stage="ResponseStarted"),
        entry("watch", "pods", stage="ResponseComplete"),  # the same watch ending: not a new request
        entry("get", "nodes", stage="ResponseStarted"),  # not a completion: ignored
        entry("list", "nodes"),
        entry("delete", "pods", user="system:kube-scheduler"),  # someone else
        "{not json",
        "",
    ]
    counts = audit.count(lines, OP)
    assert counts.by_request == {
        ("create", "pods"): 2,
        ("patch", "llmtrainingjobs/status"): 1,
        ("watch", "pods"): 1,
        ("list", "nodes"): 1,
    }
    assert (counts.writes, counts.reads) == (3, 2)
    assert counts.agents == {"kopf/1.45.2": 5}
    assert next(iter(counts.table())) == "create pods"
    assert audit.count(lines).writes == 4  # every user


def test_tail_reads_only_whole_lines_after_the_mark(tmp_path: Path) -> None:
    log = tmp_path / "audit.log"
    tail = audit.AuditTail(log)
    tail.mark()
    assert tail.since_mark() == []  # no log yet
    log.write_text(entry("create", "pods") + "\n")
    tail.mark()
    with log.open("a") as f:
        f.write(entry("delete", "pods") + "\n" + entry("create", "events")[:20])  # the last one half-written
    assert audit.count(tail.since_mark(), OP).by_request == {("delete", "pods"): 1}


def test_kwokctl_gets_the_audit_policy_only_when_asked() -> None:
    from llm_testbed.localcluster import kwokconfig

    plain = kwokconfig.kwokctl_configuration(kwokconfig.KwokctlSettings())
    assert "kubeAuditPolicy" not in plain["options"]
    audited = kwokconfig.kwokctl_configuration(kwokconfig.KwokctlSettings(audit_policy="/tmp/policy.yaml"))
    assert audited["options"]["kubeAuditPolicy"] == "/tmp/policy.yaml"


def test_a_reaction_splits_into_decision_delete_gap_and_create() -> None:
    def write(verb: str, name: str, received: str, done: str) -> str:
        doc = json.loads(entry(verb, "pods", name=name))
        doc.update(
            requestReceivedTimestamp=f"2026-11-24T09:00:{received}Z",
            stageTimestamp=f"2026-11-24T09:00:{done}Z",
        )
        return json.dumps(doc)

    lines = [
        write("create", "react-worker-4", "30.000000", "30.010000"),  # an earlier reaction's create
        write("delete", "react-worker-1", "40.200000", "40.250000"),
        write("create", "react-worker-4", "40.260000", "40.300000"),
        write("create", "tp-1-worker-0", "40.100000", "40.200000"),  # another job
    ]
    writes = audit.pod_writes(lines, OP, "react-worker-")
    assert [w[0] for w in writes] == ["create", "delete", "create"]
    signal = audit.parse_time("2026-11-24T09:00:40.000000Z")
    split = audit.split_reaction(signal, writes)
    assert split is not None
    assert {k: round(v * 1000) for k, v in split.items()} == {
        "decide": 200,
        "delete": 50,
        "gap": 10,
        "create": 40,
    }
    assert audit.split_reaction(signal + 1, writes) is None  # no delete after it
