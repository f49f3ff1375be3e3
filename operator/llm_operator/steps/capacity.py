"""Step: a Pending worker whose shape no node pool can ever make (``policy.unschedulable``)."""

from __future__ import annotations

from llm_operator.policy.status import condition
from llm_operator.policy.unschedulable import never_fits
from llm_operator.steps.state import PassState

CONDITION = "Unschedulable"


def report_unschedulable(s: PassState) -> None:
    """Karpenter said that no NodePool can launch a node for a Pending worker: the condition
    ``Unschedulable`` (True, reason ``NoNodePoolFits``, Karpenter's words) and one Warning Event per
    stretch. It turns False once no Pending worker has such a verdict (a NodePool or the job changed)."""
    scheduling = s.progress.scheduling if s.progress is not None else ()
    pending = {p.name for p, h in s.active if h.state == "pending"}
    hopeless = [e for e in scheduling if e.pod in pending and never_fits(e)]
    before, generation = s.had_condition(CONDITION), s.job.metadata.generation
    if not s.live or not hopeless:
        if before == "True":
            s.extra_conditions.append(
                condition(
                    CONDITION,
                    False,
                    "NodePoolFits",
                    "every Pending worker can get a node",
                    s.job.metadata.generation,
                )
            )
        return
    first = hopeless[0]
    names = ", ".join(e.pod for e in hopeless)
    message = f"no NodePool can launch a node for {names}: Karpenter says: {first.message[:600]}"
    s.extra_conditions.append(condition(CONDITION, True, "NoNodePoolFits", message, generation))
    if before != "True":
        s.out.events.append(("Warning", "NoNodePoolFits", message))
