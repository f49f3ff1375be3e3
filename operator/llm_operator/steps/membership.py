"""Step: who trains (``status.members``) and a running worker left outside the generation (inProcess)."""

from __future__ import annotations

from llm_operator.policy.membership import OUTSIDE_BOUND_SECONDS, left_out, members_from_world_size
from llm_operator.policy.status import condition
from llm_operator.steps.state import PassState

CONDITION = "Members"


def report_members(s: PassState) -> None:
    """``status.members`` from what the workers report; in process, a ready worker outside a generation
    short of the target size for ``OUTSIDE_BOUND_SECONDS`` turns the ``Members`` condition False with a
    Warning Event ``NotAMember`` (once per stretch), and the pass looks again when the next one is due."""
    progress = s.progress
    if progress is None:
        return
    live = progress.live
    if live is not None:
        s.members = len(live.pods)
    elif progress.latest is not None and progress.latest.world_size:
        s.members = members_from_world_size(progress.latest.world_size, s.job.nproc_per_node)
    if live is None or not s.live:
        return
    outside = left_out(live, s.target, s.now)
    if not outside:
        s.extra_conditions.append(
            condition(
                CONDITION,
                True,
                "AllMembers",
                f"every running worker trains ({len(live.pods)} members)",
                s.job.metadata.generation,
            )
        )
        pending = [since + OUTSIDE_BOUND_SECONDS for since in live.outside_since.values()]
        if pending and len(live.pods) < s.target:
            s.out.wake_at(min(pending))
        return
    names = ", ".join(f"{pod} ({seconds:.0f}s)" for pod, seconds in outside)
    message = (
        f"running but not in the training generation ({len(live.pods)} of {s.target} workers train): "
        f"{names}; the members should have taken them in at a step boundary"
    )
    if s.had_condition(CONDITION) != "False":
        s.out.events.append(("Warning", "NotAMember", message))
    s.extra_conditions.append(condition(CONDITION, False, "NotAMember", message, s.job.metadata.generation))
