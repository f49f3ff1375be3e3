"""Steps and rule: the restart budget (failurePolicy.maxRestarts).

:func:`spend_restarts` is the one place a restart is counted against the budget and the one place the
job fails for exceeding it (``MaxRestartsExceeded``); every step that restarts workers goes through it.
"""

from __future__ import annotations

from llm_operator.steps.state import PassState

EXCEEDED = "MaxRestartsExceeded"


def spend_restarts(s: PassState, count: int = 1, refused: str | None = None) -> bool:
    """Spend ``count`` restarts of failurePolicy.maxRestarts: True when the budget holds them.

    Past the budget the job fails (``MaxRestartsExceeded``) and the answer is False. ``refused``: the
    restarts are asked for before any worker is touched (workers lost, a hang), and when refused they
    are not counted and the job's message is ``refused``. Without it they have happened already (a
    resize decided this pass, programs restarted inside their pods): they count, and the message says
    which restart went past the budget."""
    limit = s.job.spec.failurePolicy.maxRestarts
    if s.restarts + count <= limit:
        s.restarts += count
        return True
    if refused is not None:
        s.finish("Failed", EXCEEDED, refused)
        return False
    s.restarts += count
    s.finish("Failed", EXCEEDED, f"restart {s.restarts} exceeds maxRestarts {limit}")
    return False


def count_restart(s: PassState) -> None:
    """A resize restarts the job (new attempt), unless replacing workers spent this pass's restart
    already (``steps.failures.replace_lost``); past maxRestarts the job fails and only the force-deletion
    of stuck pods goes ahead."""
    if not s.live or s.out.resize is None or s.replacing:
        return
    if not spend_restarts(s):
        s.out.delete = [d for d in s.out.delete if d.why.unconditional]


def count_process_restarts(s: PassState) -> None:
    """Programs the runtime's supervisor restarted inside their pods (recovery layer 2) count as restarts:
    an Event per new count, and past maxRestarts the job fails. The workers' metrics carry the job's
    count (every member agrees on it at each step); a count below the recorded one (the job resumed from
    an older checkpoint) changes nothing."""
    latest = s.progress.latest if s.progress is not None else None
    seen = latest.job_process_restarts if latest is not None else None
    if not s.live or seen is None or seen <= s.process_restarts:
        return
    new, s.process_restarts = seen - s.process_restarts, seen
    spend_restarts(s, new)
    s.out.events.append(
        (
            "Warning",
            "ProcessRestarted",
            f"{new} training program(s) restarted inside their pods (recovery layer 2; "
            f"{seen} so far, restart {s.restarts} of maxRestarts {s.job.spec.failurePolicy.maxRestarts})",
        )
    )
