"""Step: a job whose workers run a runtime this operator does not serve fails with ``RuntimeUnsupported``
(condition and Warning Event) before it trains on wrong (``policy.skew``)."""

from __future__ import annotations

from llm_operator.policy.skew import CONDITION, runtime_problem
from llm_operator.policy.status import condition
from llm_operator.steps.state import PassState


def refuse_unsupported_runtime(s: PassState) -> None:
    """Fail the job (its workers stop) while the probes report an unserved contract; the condition stays on
    the failed job."""
    if s.terminal_phase is not None:
        kept = next((c for c in s.job.status.conditions if c.type == CONDITION and c.status == "True"), None)
        if kept is not None:
            s.extra_conditions.append(
                condition(CONDITION, True, CONDITION, kept.message, kept.observedGeneration)
            )
        return
    if s.progress is None or not s.progress.contracts:
        return
    monitoring = s.job.spec.monitoring
    loss_rules = monitoring is not None and any(r.loss is not None for r in monitoring.rules)
    problem = runtime_problem(s.progress.contracts, loss_rules)
    if problem is None:
        return
    s.finish("Failed", CONDITION, problem)
    s.extra_conditions.append(condition(CONDITION, True, CONDITION, problem, s.job.metadata.generation))
    if s.had_condition(CONDITION) != "True":
        s.out.events.append(("Warning", CONDITION, problem))
