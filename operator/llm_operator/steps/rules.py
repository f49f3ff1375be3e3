"""Step: monitoring rules that ended a worker (its termination message, ``policy.rules``).

Every new firing gives a Warning Event ``RuleFired`` naming the rule and the action, a count in
``llmjob_rule_fired_total{rule,action}`` and status.lastRuleFired / status.rulesFired (so a firing is counted
once, across passes and operator restarts: only firings newer than status.lastRuleFired are new). The
action: replaceNode is a node health failure (exit 78, ``steps.nodehealth``); restartJob restarts every
worker (the one that fired is replaced by ``steps.failures.replace_lost``, the others are deleted with it:
one restart); failJob fails the job.

Loss rules fire in the runtime's step commit, in every member at once; the workers count them in
``llm_trainer_rule_fired_total{rule,action}``, which the progress probe reads. ``count_worker_rules`` turns
a rise of those counts (against status.workerRules) into the same Event, metric and status fields, except
for restartJob and failJob, which end every member with the same termination message: those count once,
from the messages.
"""

from __future__ import annotations

from llm_operator.observe import format_time
from llm_operator.policy.deletion import DeletionReason
from llm_operator.policy.exits import HEALTH_EXIT_CODE
from llm_operator.policy.health import RULE_FIRED
from llm_operator.policy.rules import RULE_EXIT_CODE, RuleFiring, parse_firing
from llm_operator.steps.state import Deletion, PassState


def record_rule_firings(s: PassState) -> None:
    """Record the rules that ended workers since the last recorded firing, and take their actions."""
    last = s.last_rule_fired or {}
    mark = (str(last.get("time") or ""), str(last.get("worker") or ""))
    new: list[tuple[str, str, RuleFiring]] = []
    for pod, _ in s.verdicts:
        if not pod.terminal or pod.exit_code not in (HEALTH_EXIT_CODE, RULE_EXIT_CODE):
            continue
        firing = parse_firing(pod.message)
        when = format_time(pod.finished or s.now)
        if firing is not None and (when, pod.name) > mark:
            new.append((when, pod.name, firing))
    for when, worker, firing in _one_per_firing(sorted(new, key=lambda item: (item[0], item[1]))):
        s.rules_fired += 1
        s.last_rule_fired = {
            "rule": firing.rule,
            "action": firing.action,
            "worker": worker,
            "detail": firing.detail,
            "time": when,
        }
        s.out.rules_fired.append((firing.rule, firing.action))
        message = f"rule {firing.rule} fired on worker {worker}: {firing.action} ({firing.detail})"
        s.out.events.append(("Warning", RULE_FIRED, message))
        if s.terminal_phase is not None:
            continue
        if firing.action == "failJob":
            s.finish("Failed", RULE_FIRED, message)
        elif firing.action == "restartJob" and s.live:
            leaving = {d.pod.uid for d in s.out.delete}
            s.out.delete += [
                Deletion(p, False, DeletionReason.RULE_FIRED) for p, _ in s.active if p.uid not in leaving
            ]


def _one_per_firing(new: list[tuple[str, str, RuleFiring]]) -> list[tuple[str, str, RuleFiring]]:
    """One entry per firing: a loss rule ends every member in the same step, and each writes the same
    termination message; the first worker of the pass stands for the rest (same rule, action, detail)."""
    seen: set[tuple[str, str, str]] = set()
    out = []
    for when, worker, firing in new:
        key = (firing.rule, firing.action, firing.detail)
        if key not in seen:
            seen.add(key)
            out.append((when, worker, firing))
    return out


ENDING = frozenset({"restartJob", "failJob"})
"""Actions that end the worker: their firing comes with its termination message (``record_rule_firings``),
so the workers' counters of them only move the recorded base."""


def count_worker_rules(s: PassState) -> None:
    """Firings the workers' metrics report (the runtime's loss rules) since the counts in status.workerRules.
    A count below the recorded one (the probed process started after some firings) is taken as the new
    base without an Event."""
    latest = s.progress.latest if s.progress is not None else None
    if latest is None:
        return
    recorded = {(str(r.get("rule")), str(r.get("action"))): int(r.get("count") or 0) for r in s.worker_rules}
    seen = {(rule, action): count for rule, action, count in latest.rules_fired}
    for (rule, action), count in sorted(seen.items()):
        new = count - recorded.get((rule, action), 0)
        if new <= 0 or action in ENDING:
            continue
        s.rules_fired += new
        s.out.rules_fired += [(rule, action)] * new
        detail = "reported by the workers (llm_trainer_rule_fired_total)"
        s.last_rule_fired = {"rule": rule, "action": action, "worker": "", "detail": detail,
                             "time": format_time(s.now)}  # fmt: skip
        times = "" if new == 1 else f" {new} times"
        s.out.events.append(("Warning", RULE_FIRED, f"rule {rule} fired{times} in the workers: {action}"))
    s.worker_rules = [{"rule": r, "action": a, "count": c} for (r, a), c in sorted(seen.items())]
