"""The versioned runtime/operator contract (``llm_elastic.contract``) and the operator's skew policy.

* a change of any name or value of the contract without a new version fails here;
* what the runtime serves is what the operator reads (a real exporter, the operator's parser);
* every ``LLMJOB_*`` name the operator puts on a worker is one of the contract's;
* a runtime outside the operator's range is refused: condition ``RuntimeUnsupported``, an Event, Failed.
"""

from __future__ import annotations

import urllib.request
from typing import Any

import pytest
from llm_elastic import contract
from llm_elastic.metrics import Exporter
from llm_operator.builders.worker import worker_pod
from llm_operator.control.scrape import parse_sample
from llm_operator.policy.progress import Progress
from llm_operator.policy.skew import CONDITION, OLDEST_CONTRACT, SUPPORTED, runtime_problem
from llm_operator.reconcile import plan
from llm_testbed.local_etcd import free_port

from .jobs import job
from .views import NOW, node, pod

NAN_RULE = {"name": "nan", "loss": "nonFinite", "action": "skipStep"}
LIVE = {"recovery": "inProcess"}


def test_the_contract_changes_only_with_a_new_version() -> None:
    known = contract.FINGERPRINTS
    assert max(known) == contract.CONTRACT_VERSION, "FINGERPRINTS needs the entry of CONTRACT_VERSION"
    assert len(set(known.values())) == len(known), "two versions with one fingerprint: a version was edited"
    assert contract.fingerprint() == known[contract.CONTRACT_VERSION], (
        "a name or value of llm_elastic.contract changed: that is a new contract version. Raise "
        f"CONTRACT_VERSION, add FINGERPRINTS[{contract.CONTRACT_VERSION + 1}] = {contract.fingerprint()!r}, "
        "and say in docs/operations.md ('Version skew') what changed and whether the operator still serves "
        "the older runtimes (llm_operator.policy.skew)"
    )


def test_the_fingerprint_sees_a_changed_value(monkeypatch: pytest.MonkeyPatch) -> None:
    before = contract.fingerprint()
    monkeypatch.setattr(contract, "EXIT_NODE_UNHEALTHY", 77)
    assert contract.fingerprint() != before


def test_the_operator_serves_the_previous_release_and_its_own() -> None:
    assert OLDEST_CONTRACT == contract.UNANNOUNCED_VERSION == 1 and contract.CONTRACT_VERSION in SUPPORTED


def test_what_the_runtime_serves_is_what_the_operator_reads() -> None:
    port = free_port()
    exporter = Exporter(port, {"job": "llama"})
    assert exporter.port == port
    exporter.update(step=7, last_step_timestamp_seconds=NOW, world_size=4)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    served = {line.split("{")[0] for line in text.splitlines() if line.startswith(contract.METRIC_PREFIX)}
    assert {contract.METRIC_PREFIX + g for g in contract.SCRAPED_GAUGES} <= served
    sample = parse_sample(text)
    assert sample is not None and (sample.step, sample.world_size) == (7, 4)
    assert sample.contract_version == contract.CONTRACT_VERSION


def test_a_runtime_without_the_gauge_speaks_the_first_contract() -> None:
    sample = parse_sample("llm_trainer_step 3\nllm_trainer_last_step_timestamp_seconds 5\n")
    assert sample is not None and sample.contract_version == contract.UNANNOUNCED_VERSION


@pytest.mark.parametrize("spec", [{}, {"failurePolicy": LIVE, "monitoring": {"rules": [NAN_RULE]}}])
def test_every_llmjob_name_on_a_worker_is_the_contracts(spec: dict[str, Any]) -> None:
    names = {v for k, v in vars(contract).items() if k.endswith("_ENV") and isinstance(v, str)}
    rendered = worker_pod(job(checkpointDir="/fsx/ckpt", **spec), 0, 0)
    env = {e["name"] for c in rendered["spec"]["containers"] for e in c.get("env") or []}
    assert {n for n in env if n.startswith("LLMJOB_")} <= names


@pytest.mark.parametrize(
    ("spoken", "loss_rules", "problem"),
    [
        ({1}, False, None),  # release 0.1.0's runtime
        ({2}, True, None),
        ({1, 2}, False, None),  # a rolling image change
        ({3}, False, "contract 3; this operator serves contracts 1-2: upgrade the operator first"),
        ({0, 2}, False, "contract 0; this operator serves contracts 1-2: rebuild the training image"),
        ({1}, True, "loss rules, which runtimes of contract 2 and later evaluate; workers run contract 1"),
        (set(), True, None),  # nobody answered: nothing known
    ],
)
def test_runtime_problem(spoken: set[int], loss_rules: bool, problem: str | None) -> None:
    found = runtime_problem(spoken, loss_rules, range(1, 3))
    assert (found is None) == (problem is None), found
    assert problem is None or (found is not None and problem in found), found


def test_a_job_on_an_unserved_runtime_fails_with_the_condition_and_one_event() -> None:
    nodes = {f"node-{i}": node(f"node-{i}") for i in range(4)}
    pods = [pod(i) for i in range(4)]
    status = {
        "phase": "Running",
        "targetReplicas": 4,
        "desiredReplicas": 4,
        "startTime": "2026-01-01T00:00:00Z",
    }
    newer = contract.CONTRACT_VERSION + 1
    progress = Progress(5, NOW - 1, contracts=frozenset({newer}))
    first = plan(job(status=status), pods, nodes, pods, NOW, progress)
    assert first.status["phase"] == "Failed", first.status
    cond = next(c for c in first.status["conditions"] if c["type"] == CONDITION)
    assert cond["status"] == "True" and f"contract {newer}" in cond["message"]
    assert [e for e in first.events if e[1] == CONDITION] == [("Warning", CONDITION, cond["message"])]
    assert sorted(d.pod.index for d in first.delete) == [0, 1, 2, 3], "every worker stops"
    again = plan(job(status=first.status), pods, nodes, pods, NOW + 1, progress)
    assert not [e for e in again.events if e[1] == CONDITION], "one Event, not one per pass"
    assert any(c["type"] == CONDITION and c["status"] == "True" for c in again.status["conditions"])
    served = Progress(5, NOW - 1, contracts=frozenset({OLDEST_CONTRACT}))
    assert plan(job(status=status), pods, nodes, pods, NOW, served).status["phase"] == "Running"
