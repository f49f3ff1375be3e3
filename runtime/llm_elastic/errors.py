"""Typed failures: a peer that is gone and a process that is broken take different recovery layers.

* :class:`PeerLost` -- the membership changed under a step (a peer died, was evicted, or left): the step is
  discarded and the survivors re-form in process. It never leaves :meth:`llm_elastic.Elastic.steps`.
* :class:`LocalFailure` -- this process cannot go on (out of memory, a bug in the training code, a broken
  device): it leaves the membership at once so the others re-form without it, and exits with
  :data:`EXIT_LOCAL_FAILURE`; the pod's supervisor restarts it (layer 2), which joins as a new member.
* :class:`RecoveryExhausted` -- in-process recovery kept failing without completing a step; the process
  hands over to the next layer the same way.
* :class:`ContractError` -- the program runs in a mode it was not written for, or without the environment
  the mode needs: one line on stderr, exit code 2, nothing started.
"""

from __future__ import annotations

import sys
from typing import NoReturn

EXIT_USAGE = 2
EXIT_EVICTED = 3
"""The operator removed this member from the job (its pod is being replaced)."""
EXIT_NO_GENERATION = 4
"""No generation formed within the form timeout."""
EXIT_STATE_LOST = 5
"""Every holder of the state is gone and no checkpoint exists: only a job restart can help."""
EXIT_PEER_STOPPED = 75
"""Restart mode: another rank was asked to stop; the agent re-rendezvouses without it."""
EXIT_LOCAL_FAILURE = 76
"""This process failed on its own (not a lost peer): the supervisor restarts it inside the pod."""
EXIT_RECOVERY_EXHAUSTED = 77
"""In-process recovery failed ``max_reforms`` times in a row without a completed step."""
EXIT_RULE_FIRED = 79
"""A monitoring rule ended this worker for ``restartJob`` or ``failJob``: the termination message says which
(``rule-fired: <rule> <action>: <detail>``, docs/CONTRACTS.md); the operator restarts every worker or fails
the job."""


class ElasticError(Exception):
    """Base of the library's failures."""


class PeerLost(ElasticError):
    """The membership changed under a step; the step is discarded and the survivors re-form."""


class LocalFailure(ElasticError):
    """This process failed on its own (the cause is chained); it leaves the job and exits for a restart."""


class RecoveryExhausted(LocalFailure):
    """In-process recovery failed too many times in a row without completing a step."""


class StateLost(ElasticError):
    """Every member is new although the job had trained, and no checkpoint exists."""


class Evicted(ElasticError):
    """This member's key was deleted (by the operator, or its lease expired): it must leave."""


class RunFinished(ElasticError):
    """The run is done; a late joiner has nothing to join."""


class StepDropped(ElasticError):
    """The members agreed in the commit not to apply this step (a loss rule fired): raised by
    ``step.commit()`` so that the code after it in ``with step:`` does not run; ``with step`` swallows it."""


class UsageError(ElasticError):
    """The training loop used the API wrongly (for example it never committed a step)."""


class ContractError(SystemExit):
    """Wrong mode or missing environment: already reported on stderr; exits with code 2."""

    def __init__(self, message: str) -> None:
        super().__init__(EXIT_USAGE)
        self.message = message

    def __str__(self) -> str:
        return self.message


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message, or its type's name when it has none (for one-line logs)."""
    text = str(exc)
    return text.splitlines()[0] if text else type(exc).__name__


def contract_error(message: str) -> NoReturn:
    """Report ``message`` as one line on stderr and exit 2 (no traceback)."""
    print(f"llm_elastic: error: {message}", file=sys.stderr, flush=True)
    raise ContractError(message)
