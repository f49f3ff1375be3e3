"""What a fired loss rule (:mod:`llm_elastic.loss_rules`) does at the step boundary: it is reported on every
member; ``rollback`` loads the newest in-memory snapshot; ``restartJob`` and ``failJob`` end the program with
:data:`~llm_elastic.errors.EXIT_RULE_FIRED` and the termination message (a :class:`~llm_elastic.leave.Leave`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from llm_elastic.errors import EXIT_RULE_FIRED
from llm_elastic.health import write_termination_message
from llm_elastic.leave import Leave
from llm_elastic.loss_rules import ROLLBACK, Firing, LossGuard, LossRule
from llm_elastic.persistence import Persistence
from llm_elastic.position import Position
from llm_elastic.reporting import Reporter

log = logging.getLogger("llm_elastic")


class LossActions:
    """The loss rules of one process: the streak (:class:`~llm_elastic.loss_rules.LossGuard`) and the acts."""

    def __init__(
        self,
        rules: Sequence[LossRule],
        persistence: Persistence,
        reporter: Reporter,
        env: Mapping[str, str] | None,
    ) -> None:
        self.guard = LossGuard(rules)
        self.persistence = persistence
        self.reporter = reporter
        self.env = env

    def judge(self, nonfinite: bool, step: int) -> Firing | None:
        """A commit's verdict: the rule that fires (reported here), or None."""
        firing = self.guard.judge(nonfinite, step)
        if firing is not None:
            self.reporter.rule_fired(firing)
        return firing

    def reset(self) -> None:
        """A streak of broken steps counts within one generation."""
        self.guard.reset()

    def act(self, firing: Firing, rank: int, position: Position) -> Position | None:
        """At the boundary of a step the rule dropped (collective): the position rolled back to from
        ``position``, or None (no rollback, or no snapshot serves every member); leaves when the rule ends
        the program."""
        if firing.action == ROLLBACK:
            loaded = self.persistence.rollback(rank)
            if loaded is None:
                return None
            self.guard.reset()
            self.reporter.event("rolled-back", step=firing.step, to=loaded.progress.step, rule=firing.rule)
            return position.loaded(loaded.progress, loaded.source, loaded.peers).resumed()
        if firing.ends:
            line = firing.termination_line()
            write_termination_message(line, self.env)
            log.error("%s: ending the program (exit %d)", line, EXIT_RULE_FIRED)
            raise Leave(EXIT_RULE_FIRED)
        return None
