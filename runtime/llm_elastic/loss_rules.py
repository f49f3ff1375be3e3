"""The loss rule (``loss: nonFinite``): what the members do when a step's loss is not finite on any member.

The operator hands a job's loss rules to every worker as ``$LLMJOB_LOSS_RULES``, a JSON list of
``{"name": str, "action": str, "after": int}`` (``after`` defaults to 1). Every member learns in the same
commit whether any member had a non-finite loss (:class:`~llm_elastic.commit.Verdict`), so every member
counts the same streak of consecutive broken steps and picks the same rule:

* the rules *reached* are those whose ``after`` is at most the streak;
* the one with the highest ``after`` fires (a tie: the first listed); at most one rule fires per step.

``skipStep`` plus ``rollback`` with a higher ``after`` escalates: skip the first breaks, roll back at the
N-th. The streak restarts at 0 after a finite step, after a rollback, and in every new generation.

Actions: ``event`` records only (the step is applied); ``skipStep`` drops the step on every member (no
update, the step index and its samples move on, counted as skipped); ``rollback`` drops it and loads the
newest in-memory snapshot; ``restartJob`` and ``failJob`` drop it and end every member's program with
:data:`~llm_elastic.errors.EXIT_RULE_FIRED` (79) and the termination message :meth:`Firing.termination_line`,
the operator's contract for a rule that ends a worker (docs/CONTRACTS.md). Pure and torch-free (a program's
CLI and the contract read it).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

EVENT = "event"
SKIP_STEP = "skipStep"
ROLLBACK = "rollback"
RESTART_JOB = "restartJob"
FAIL_JOB = "failJob"
ACTIONS = (EVENT, SKIP_STEP, ROLLBACK, RESTART_JOB, FAIL_JOB)

DROPPING = frozenset({SKIP_STEP, ROLLBACK, RESTART_JOB, FAIL_JOB})
"""Actions under which no member applies the broken step."""

ENDING = frozenset({RESTART_JOB, FAIL_JOB})
"""Actions that end every member's program (exit 79 with a termination message)."""


@dataclass(frozen=True)
class LossRule:
    """One loss rule: on the ``after``-th consecutive step with a non-finite loss, take ``action``."""

    name: str
    action: str
    after: int = 1


def parse_loss_rules(raw: str) -> tuple[LossRule, ...]:
    """The rules in ``raw`` (the JSON of ``$LLMJOB_LOSS_RULES``); ``ValueError`` with one line saying what is
    wrong (the caller names the variable)."""
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise ValueError(f"not JSON ({exc})") from None
    if not isinstance(data, list):
        raise ValueError(f"must be a JSON list of rules, got {type(data).__name__}")
    rules: list[LossRule] = []
    for index, item in enumerate(data):
        where = f"rule {index}"
        if not isinstance(item, dict):
            raise ValueError(f"{where} must be an object, got {type(item).__name__}")
        unknown = sorted(set(item) - {"name", "action", "after"})
        if unknown:
            raise ValueError(f"{where} has unknown keys {unknown}")
        name, action, after = item.get("name"), item.get("action"), item.get("after", 1)
        if not isinstance(name, str) or not name:
            raise ValueError(f"{where}: name must be a non-empty string")
        if action not in ACTIONS:
            raise ValueError(f"{where} ({name}): action must be one of {', '.join(ACTIONS)}, got {action!r}")
        if isinstance(after, bool) or not isinstance(after, int) or after < 1:
            raise ValueError(f"{where} ({name}): after must be an integer of at least 1, got {after!r}")
        if any(r.name == name for r in rules):
            raise ValueError(f"{where}: name {name!r} is used twice")
        rules.append(LossRule(name, action, after))
    return tuple(rules)


def choose(rules: Sequence[LossRule], streak: int) -> LossRule | None:
    """The rule that fires at the ``streak``-th consecutive break (see the module doc), or None."""
    best: LossRule | None = None
    for rule in rules:
        if rule.after <= streak and (best is None or rule.after > best.after):
            best = rule
    return best


@dataclass(frozen=True)
class Firing:
    """A rule that fired at a step (1-based ``step``: the step whose loss broke it)."""

    rule: str
    action: str
    step: int
    streak: int

    @property
    def drops(self) -> bool:
        """No member applies the step."""
        return self.action in DROPPING

    @property
    def ends(self) -> bool:
        """Every member's program ends (``restartJob``, ``failJob``)."""
        return self.action in ENDING

    @property
    def detail(self) -> str:
        """What broke the rule, in words (the ``rule-fired`` line and the termination message)."""
        return f"non-finite loss at step {self.step} ({self.streak} in a row)"

    def termination_line(self) -> str:
        """The termination message of a worker this firing ends: ``rule-fired: <rule> <action>: <detail>``."""
        return f"rule-fired: {self.rule} {self.action}: {self.detail}"


class LossGuard:
    """Counts consecutive broken steps and says which rule fires (the same on every member: it only reads
    what the members agreed in the commit)."""

    def __init__(self, rules: Sequence[LossRule]) -> None:
        self.rules = tuple(rules)
        self.streak = 0

    def judge(self, nonfinite: bool, step: int) -> Firing | None:
        """After the commit of step ``step`` (1-based); ``nonfinite``: some member's value was not finite."""
        if not nonfinite:
            self.streak = 0
            return None
        self.streak += 1
        rule = choose(self.rules, self.streak)
        if rule is None:
            return None
        return Firing(rule.name, rule.action, step, self.streak)

    def reset(self) -> None:
        """A rollback or a new generation: the next break counts as the first."""
        self.streak = 0
