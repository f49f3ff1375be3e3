"""Steps: hang detection (failurePolicy.progressTimeoutSeconds): restart workers that stopped stepping;
and ``status.progress`` (training progress and goodput, ``llm_operator.policy.goodput``)."""

from __future__ import annotations

from llm_operator.observe import parse_time
from llm_operator.policy import goodput
from llm_operator.policy.deletion import DeletionReason
from llm_operator.policy.progress import assess_progress
from llm_operator.policy.status import condition
from llm_operator.steps.restarts import spend_restarts
from llm_operator.steps.state import TERMINAL, Deletion, PassState

CONDITION = STALLED = DeletionReason.STALLED.value


def detect_stall(s: PassState) -> None:
    """When every worker runs and nothing else changes this pass, a job with no completed step for
    progressTimeoutSeconds (progressStartupSeconds after a start) restarts all its workers."""
    policy, generation = s.job.spec.failurePolicy, s.job.metadata.generation
    before = s.had_condition(CONDITION)
    if policy.progressTimeoutSeconds <= 0:
        return  # off: the condition (if any) is dropped
    active = s.active
    steady = (
        s.live
        and active
        and all(h.state == "healthy" and p.phase == "Running" for p, h in active)
        and not (s.replacing or s.out.delete or s.out.create or s.out.resize)
    )
    if not steady:
        if before is not None:  # keep what was said until the workers run again
            old = next(c for c in s.job.status.conditions if c.type == CONDITION)
            s.extra_conditions.append(
                condition(CONDITION, old.status == "True", old.reason, old.message, generation)
            )
        return
    started = max((p.started or p.created) for p, _ in active)
    verdict = assess_progress(
        s.progress, started, s.now, policy.progressTimeoutSeconds, policy.progressStartupSeconds
    )
    if not verdict.stalled:
        s.out.wake_at(verdict.deadline)
        if before is not None:
            s.extra_conditions.append(
                condition(CONDITION, False, "Progressing", "training steps complete", generation)
            )
        return
    s.extra_conditions.append(condition(CONDITION, True, STALLED, verdict.message, generation))
    done = f"{verdict.message}; {s.restarts} restarts done (maxRestarts {policy.maxRestarts})"
    if not spend_restarts(s, refused=done):
        return
    s.replacing = True
    s.out.delete += [Deletion(p, False, DeletionReason.STALLED) for p, _ in active]
    s.reason, s.message = STALLED, f"restarting all workers: {verdict.message}"
    s.out.events.append(("Warning", STALLED, s.message))


def report_progress(s: PassState) -> None:
    """``status.progress`` (after the status step): the newest metrics sample folded in at most once per
    ``report_every`` seconds, and when the job starts or stops counting wall time (suspended, queued,
    finished: a pass that writes the status anyway); in between the previous record is kept as is, so
    progress alone never causes more than one status write per job per interval."""
    progress, record, old = s.progress, s.out.status, s.job.status
    previous = old.progress.model_dump(exclude_none=True) if old.progress is not None else None
    if not record:
        return
    if progress is None or progress.report_every <= 0:
        if previous is not None:
            record["progress"] = previous  # not probed (or turned off): keep what was said
        return
    phase = record["phase"]
    before = goodput.counts_wall_time(old.phase, old.startTime is not None)
    after = goodput.counts_wall_time(phase, record.get("startTime") is not None)
    last = parse_time(previous.get("updateTime")) if previous is not None else None
    fresh = progress.latest is not None and (last is None or (progress.latest_at or 0.0) > last)
    if previous is None:
        if not (after and fresh):
            return
    elif before == after:
        due = goodput.due(previous, s.now, progress.report_every)
        if not before or (due is not None and s.now < due):
            record["progress"] = previous
            if before and due is not None:
                s.out.wake_at(due)
            return
    updated = goodput.fold(
        previous,
        progress.latest if fresh else None,
        s.now,
        start_time=parse_time(record.get("startTime")),
        counting=before,
        finished=phase in TERMINAL,
    )
    if updated is None:
        return
    record["progress"] = updated
    if after:
        s.out.wake_at(s.now + progress.report_every)
