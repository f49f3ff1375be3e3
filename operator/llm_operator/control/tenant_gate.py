"""The tenant rules (``llm_operator.policy.tenancy``) applied to the spec the operator is about to run.

A job made while the chart's policy was off, or whose runtime (a ClusterLLMTrainingRuntime labelled
privileged, a namespaced one made before the policy) sets a field the rules refuse, gets no workers and no
support objects: the pass refuses every worker it would create, so the job's condition ``WorkersRefused``
and one Warning Event quote the rule (``llm_operator.control.apply``). Nothing is half made.

The namespace's labels are read only when a rule the label lifts is broken, and then at most once every
``LABELS_TTL_S``: a job that breaks no rule costs no API call.
"""

from __future__ import annotations

import time
from collections.abc import Hashable

from llm_operator.api.models import LLMTrainingJob
from llm_operator.kube import Kube
from llm_operator.policy.tenancy import (
    LABELLED,
    TenantPolicy,
    Violation,
    is_privileged,
    refusal,
    violations,
)

LABELS_TTL_S = 10.0
"""How long a namespace's labels are trusted: the platform team's label takes effect within this long."""


class TenantGate:
    """One job's check against the tenant rules (None: the operator applies none)."""

    def __init__(self, kube: Kube, policy: TenantPolicy | None, namespace: str) -> None:
        self.kube = kube
        self.policy = policy
        self.namespace = namespace
        self.read_at: float | None = None
        self.privileged = False
        self.judged: tuple[Hashable, list[Violation], list[Violation]] | None = None
        """(what the spec depends on, its violations without the label, with it): a pass of an unchanged
        spec judges nothing again."""

    async def _namespace_privileged(self) -> bool:
        now = time.monotonic()
        if self.read_at is None or now - self.read_at >= LABELS_TTL_S:
            self.privileged = is_privileged(await self.kube.namespace_labels(self.namespace))
            self.read_at = now
        return self.privileged

    async def refusal(self, job: LLMTrainingJob, version: Hashable = None) -> str | None:
        """Why the job's (merged) spec may not run here, naming every field and rule; None: it may.
        ``version``: what the merged spec depends on besides the generation (its runtime's copy)."""
        if self.policy is None:
            return None
        key = (job.metadata.generation, version)
        if self.judged is None or self.judged[0] != key:
            spec = job.spec.model_dump(by_alias=True, exclude_none=True, mode="json")
            plain = violations(spec, self.policy, privileged=False)
            lifted = violations(spec, self.policy, privileged=True) if plain else []
            self.judged = (key, plain, lifted)
        _, found, lifted = self.judged
        if any(v.rule in LABELLED for v in found) and await self._namespace_privileged():
            found = lifted
        if not found:
            return None
        source = job.spec.runtimeRef
        where = f" (the job's spec over {source.kind} {source.name})" if source is not None else ""
        return refusal(found) + where
