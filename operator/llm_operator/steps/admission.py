"""Steps: Kueue admission (jobs labelled ``kueue.x-k8s.io/queue-name``, see docs/kueue.md).

Until Kueue admits the job's Workload, no worker runs: the job is stopped like a suspended one and its phase
is ``Queued``. Once admitted it runs at most the admitted count (``PassState.desired``). Kueue's verdict is
also a condition (``Admitted``) with an Event whenever it changes.
"""

from __future__ import annotations

from llm_operator.policy.admission import condition
from llm_operator.policy.deletion import DeletionReason
from llm_operator.steps.state import Deletion, PassState


def hold_until_admitted(s: PassState) -> None:
    """Not admitted (queued, evicted or preempted): stop every worker gracefully, size 0."""
    if not s.gated or s.admission is None or s.job.spec.suspend or s.terminal_phase is not None:
        return
    s.out.delete += [
        Deletion(p, False, DeletionReason.NOT_ADMITTED, said=s.admission.reason) for p, _ in s.active + s.lost
    ]
    s.target, s.reason, s.message = 0, s.admission.reason, s.admission.message


def admission_verdict(s: PassState) -> None:
    """Kueue's verdict as the ``Admitted`` condition, and an Event when its status or reason changes."""
    if s.admission is None:
        return
    verdict = condition(s.admission, s.job.metadata.generation)
    s.extra_conditions.append(verdict)
    before = next((c for c in s.job.status.conditions if c.type == verdict["type"]), None)
    if before is None or (before.status, before.reason) != (verdict["status"], verdict["reason"]):
        level = "Warning" if verdict["reason"] in ("Preempted", "Evicted") else "Normal"
        s.out.events.append((level, verdict["reason"], verdict["message"]))
