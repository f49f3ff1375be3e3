"""Step: warn (condition CheckpointNotShared, one Warning Event) when checkpoints cannot resume elsewhere."""

from __future__ import annotations

from llm_operator.policy.status import condition
from llm_operator.policy.storage import CONDITION, REASON, checkpoint_warning
from llm_operator.steps.state import PassState


def checkpoint_sharing(s: PassState) -> None:
    """Condition True with the warning while it applies (Event on the transition); False once fixed."""
    warning = checkpoint_warning(s.job)
    before = s.had_condition(CONDITION)
    generation = s.job.metadata.generation
    if warning is not None:
        s.extra_conditions.append(condition(CONDITION, True, REASON, warning, generation))
        if before != "True":
            s.out.events.append(("Warning", REASON, warning))
    elif before is not None:
        s.extra_conditions.append(condition(CONDITION, False, "CheckpointShared", "", generation))
