"""Step: a finished job (Succeeded/Failed) deletes its running workers, and the rest after the TTL."""

from __future__ import annotations

from llm_operator.observe import format_time, parse_time
from llm_operator.policy.deletion import DeletionReason
from llm_operator.steps.state import Deletion, PassState


def finish(s: PassState) -> None:
    """Stamp completionTime, stop running workers, delete exited ones once ttlSecondsAfterFinished ran out."""
    phase = s.terminal_phase
    if phase is None:
        return
    s.completion = s.completion or format_time(s.now)
    finished = [Deletion(p, False, DeletionReason(phase)) for p, _ in s.active + s.lost]
    ttl = s.job.spec.ttlSecondsAfterFinished
    if ttl is not None:
        due = (parse_time(s.completion) or s.now) + ttl
        if s.now >= due:
            finished += [Deletion(p, False, DeletionReason.TTL_EXPIRED) for p in s.succeeded + s.fatal]
        else:
            s.out.wake_at(due)
    known = {d.pod.uid for d in s.out.delete}
    s.out.delete += [d for d in finished if d.pod.uid not in known]
    s.out.create = []
