"""Deletion reasons: every lost worker's signal is one, and the flags other parts read from them."""

from __future__ import annotations

import pytest
from llm_operator.policy import health
from llm_operator.policy.deletion import DeletionReason
from llm_operator.reconcile import Deletion

from .views import pod

GRACEFUL = {health.NODE_TERMINATING, health.NODE_CORDONED, health.RULE_FIRED}


@pytest.mark.parametrize("signal", health.SIGNALS)
def test_a_lost_workers_signal_is_its_deletion_reason(signal: str) -> None:
    reason = DeletionReason(signal)
    assert f"{reason}" == signal
    assert reason.evicts is (signal not in GRACEFUL), "a dead or gone process cannot leave by itself"


@pytest.mark.parametrize(
    ("reason", "evicts", "stall", "unconditional"),
    [
        (DeletionReason.STALLED, True, True, False),
        (DeletionReason.STUCK_TERMINATING, True, False, True),
        (DeletionReason.SCALED_DOWN, False, False, False),
        (DeletionReason.SUSPENDED, False, False, False),
        (DeletionReason.NOT_ADMITTED, False, False, False),
        (DeletionReason.FAILED, False, False, False),
        (DeletionReason.TTL_EXPIRED, False, False, False),
        (DeletionReason.AVOIDED_NODE_USABLE, False, False, False),
    ],
)
def test_the_flags_of_the_operators_own_reasons(
    reason: DeletionReason, evicts: bool, stall: bool, unconditional: bool
) -> None:
    assert (reason.evicts, reason.stall, reason.unconditional) == (evicts, stall, unconditional)


def test_the_event_word_is_kueues_own_reason_for_a_job_it_holds_back() -> None:
    held = Deletion(pod(0), False, DeletionReason.NOT_ADMITTED, said="Preempted")
    assert (held.reason, held.why.evicts) == ("Preempted", False)
    assert Deletion(pod(0), True, DeletionReason.STUCK_TERMINATING).reason == "ForceDeleteStuckTerminating"
