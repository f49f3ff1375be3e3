"""The operator applies the tenant rules to the spec it runs (control.tenant_gate): the shared table through
its path, the namespace label read only when it matters, and a refused job made nowhere (no worker
created, each refused, condition WorkersRefused saying the operator refused them)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from llm_operator.api.models import LLMTrainingJob
from llm_operator.control.apply import PlanApplier, with_refusals
from llm_operator.control.expectations import Expectations
from llm_operator.control.kueue_sync import KueueSync
from llm_operator.control.live_evict import LiveEvictor
from llm_operator.control.node_marking import NodeMarker
from llm_operator.control.tenant_gate import TenantGate
from llm_operator.policy.brake import BrakeLimits
from llm_operator.policy.tenancy import PRIVILEGED_LABEL, TenantPolicy, Violation
from llm_operator.reconcile import Plan
from llm_operator.settings import Settings
from support.tenant_cases import CASES, POLICY, Case

from .fake_kube import FakeKube
from .jobs import job

LOG = logging.getLogger("test")
BODY: Any = {}
HOST = {"podTemplate": {"spec": {"volumes": [{"name": "host", "hostPath": {"path": "/"}}]}}}


class LabelledKube(FakeKube):
    def __init__(self, privileged: bool) -> None:
        super().__init__()
        self.labels = {PRIVILEGED_LABEL: "true"} if privileged else {"team": "a"}

    async def namespace_labels(self, name: str) -> dict[str, str]:
        self._call("namespace_labels", name)
        return self.labels


def _job(spec: dict[str, Any]) -> LLMTrainingJob:
    meta = {"name": "llama", "namespace": "ml", "uid": "u", "generation": 1}
    return LLMTrainingJob.model_validate(
        {"apiVersion": "elasticllm.dev/v1alpha1", "kind": "LLMTrainingJob", "metadata": meta, "spec": spec}
    )


JOBS = [c for c in CASES if c.kind == "LLMTrainingJob"]


@pytest.mark.parametrize("case", JOBS, ids=[c.name for c in JOBS])
def test_the_shared_table_through_the_operators_path(case: Case) -> None:
    gate: Any = TenantGate(LabelledKube(case.privileged), POLICY, "ml")  # type: ignore[arg-type]
    got = asyncio.run(gate.refusal(_job(case.spec)))
    if case.refused is None:
        assert got is None
    else:
        field, rule = case.refused
        allowed = (
            POLICY.allowed_service_accounts
            if rule == "service-account"
            else tuple(p[:-1] for p in POLICY.registry_prefixes)
        )
        assert got == "tenant policy: " + Violation(field, rule, allowed).message


def test_the_namespace_is_read_only_when_its_label_matters_and_then_cached() -> None:
    kube = LabelledKube(privileged=True)
    gate = TenantGate(kube, POLICY, "ml")  # type: ignore[arg-type]
    assert asyncio.run(gate.refusal(job(image="public.ecr.aws/t:1"))) is None
    assert kube.calls == [], "a job that breaks no rule costs no API call"
    for _ in range(3):
        assert asyncio.run(gate.refusal(job(image="public.ecr.aws/t:1", **HOST), "with a hostPath")) is None
    assert kube.called("namespace_labels") == [("ml",)], "read once within LABELS_TTL_S"
    assert asyncio.run(TenantGate(kube, None, "ml").refusal(job(**HOST))) is None  # type: ignore[arg-type]


def test_a_refused_job_gets_no_worker_and_the_condition_says_the_operator_refused() -> None:
    kube = LabelledKube(privileged=False)
    k: Any = kube
    gate = TenantGate(k, POLICY, "ml")
    the_job = job(image="public.ecr.aws/t:1", runtimeRef={"name": "shared"}, **HOST)
    refusal = asyncio.run(gate.refusal(the_job))
    assert refusal is not None and refusal.endswith("(the job's spec over LLMTrainingRuntime shared)")
    parts = PlanApplier(
        k, "ml", "llama", Expectations(), KueueSync(k, False), NodeMarker(k, False), LiveEvictor(k, "ml")
    )
    applied = asyncio.run(parts.pods(the_job, Plan(create=[0, 1], attempt=0), BODY, LOG, None, refusal))
    assert kube.called("create") == [] and applied.created == []
    assert [r.pod for r in applied.refused] == ["llama-worker-0", "llama-worker-1"]
    status = with_refusals({"replicas": 2}, {}, applied, 1)
    (cond,) = status["conditions"]
    assert cond["type"] == "WorkersRefused" and cond["status"] == "True" and status["replicas"] == 0
    assert cond["message"].startswith("the operator refused worker(s) llama-worker-0, llama-worker-1: tenant")
    assert "spec.podTemplate.spec.volumes[host].hostPath" in cond["message"]


def test_settings_read_the_policy_and_the_brake_from_the_chart_env() -> None:
    env = {
        "LLMJOB_TENANT_POLICY": '{"registries":["public.ecr.aws/"],"serviceAccounts":["trainer"]}',
        "LLMJOB_NODE_HEALTH_BRAKE": '{"maxMarkedShare":0.5,"maxReplacementsPerMinute":3}',
    }
    settings = Settings.from_env(env)
    assert settings.tenant_policy == TenantPolicy(("trainer",), ("public.ecr.aws/",))
    assert settings.health_brake == BrakeLimits(0.5, 3)
    assert Settings.from_env({}).tenant_policy is None and Settings.from_env({}).health_brake == BrakeLimits()
    for bad in ('{"maxMarkedShare": 2}', '{"maxReplacementsPerMinute": -1}', "[]"):
        with pytest.raises(ValueError, match="LLMJOB_NODE_HEALTH_BRAKE"):
            Settings.from_env({"LLMJOB_NODE_HEALTH_BRAKE": bad})
    with pytest.raises(ValueError, match="serviceAccounts"):
        Settings.from_env({"LLMJOB_TENANT_POLICY": '{"serviceAccounts": "trainer"}'})


def test_a_spec_is_judged_once_per_generation_and_runtime_copy() -> None:
    gate = TenantGate(LabelledKube(privileged=False), POLICY, "ml")  # type: ignore[arg-type]
    host = job(image="public.ecr.aws/t:1", **HOST)
    assert asyncio.run(gate.refusal(host, ("rt", "1"))) is not None
    fixed = job(image="public.ecr.aws/t:1")  # same generation (3): the spec cannot have changed
    assert asyncio.run(gate.refusal(fixed, ("rt", "1"))) is not None, "judged once, kept"
    assert asyncio.run(gate.refusal(fixed, ("rt", "2"))) is None, "another runtime copy: judged again"
    newer = LLMTrainingJob.model_validate(
        {**fixed.model_dump(by_alias=True), "metadata": {"name": "llama", "generation": 4}}
    )
    assert asyncio.run(gate.refusal(newer, ("rt", "2"))) is None
