"""The loss rule's parts alone: ``$LLMJOB_LOSS_RULES`` read once into the contract and the config, which rule
fires at which break, the commit's non-finite flag (one all-reduce, exact with ``mean=False`` too), and the
audit of a step log with skipped steps and a rollback."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from llm_elastic import ElasticConfig, audit, read_contract
from llm_elastic.commit import FLAGS, CommitWire, Signals
from llm_elastic.loss_rules import LossGuard, LossRule, choose, parse_loss_rules
from llm_operator.api.validate import validate
from llm_operator.builders.worker import rules_env
from llm_operator.policy.rules import parse_firing
from torch.profiler import ProfilerActivity, profile

from .jobs import manifest

SKIP_THEN_ROLLBACK = (LossRule("nan", "skipStep"), LossRule("nan-again", "rollback", after=3))


def test_rules_parse_with_after_defaulting_to_1() -> None:
    raw = '[{"name": "nan", "action": "skipStep"}, {"name": "nan-again", "action": "rollback", "after": 3}]'
    assert parse_loss_rules(raw) == SKIP_THEN_ROLLBACK
    contract = read_contract({"LLMJOB_LOSS_RULES": raw})
    assert contract.loss_rules == SKIP_THEN_ROLLBACK
    assert ElasticConfig(total_steps=1).resolved(contract).loss_rules == SKIP_THEN_ROLLBACK
    assert read_contract({}).loss_rules == ()


def test_the_operators_env_reads_back_and_its_parser_reads_our_termination_line() -> None:
    """Both ends of the contract: what the operator renders, what it reads of a worker a rule ended."""
    rules = [
        {"name": "nan", "loss": "nonFinite", "action": "skipStep"},
        {"name": "nan-again", "loss": "nonFinite", "action": "rollback", "after": 3},
    ]
    result = validate(manifest(monitoring={"rules": rules}, failurePolicy={"recovery": "inProcess"}))
    assert result.job is not None, result.problems
    env = {e["name"]: e["value"] for e in rules_env(result.job)}
    assert read_contract(env).loss_rules == SKIP_THEN_ROLLBACK
    firing = LossGuard([LossRule("stop", "failJob", 2)])
    firing.judge(True, 4)
    fired = firing.judge(True, 5)
    assert fired is not None and fired.ends
    seen = parse_firing(fired.termination_line())
    assert seen is not None and (seen.rule, seen.action) == ("stop", "failJob") and "step 5" in seen.detail


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ("[{", "not JSON"),
        ('{"name": "x"}', "must be a JSON list of rules, got dict"),
        ('[{"name": "x", "action": "explode"}]', "rule 0 (x): action must be one of event, skipStep"),
        ('[{"name": "x", "action": "event", "after": 0}]', "after must be an integer of at least 1, got 0"),
        ('[{"action": "event"}]', "rule 0: name must be a non-empty string"),
        ('[{"name": "x", "action": "event", "when": 1}]', "rule 0 has unknown keys ['when']"),
        ('[{"name": "x", "action": "event"}, {"name": "x", "action": "event"}]', "name 'x' is used twice"),
    ],
)
def test_bad_rules_are_one_line_naming_the_variable_and_exit_2(
    raw: str, reason: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        read_contract({"LLMJOB_LOSS_RULES": raw})
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("llm_elastic: error: $LLMJOB_LOSS_RULES: ") and reason in err, err
    assert len(err.strip().splitlines()) == 1


def test_a_rollback_rule_needs_snapshots() -> None:
    config = ElasticConfig(total_steps=1, loss_rules=SKIP_THEN_ROLLBACK)
    assert [name for name, _ in config.problems()] == ["loss_rules"]
    config.snapshot_every = 5
    assert config.problems() == []


def test_the_highest_after_reached_fires_and_the_streak_restarts() -> None:
    assert [choose(SKIP_THEN_ROLLBACK, n) for n in (0, 1, 2, 3, 4)] == [
        None,
        SKIP_THEN_ROLLBACK[0],
        SKIP_THEN_ROLLBACK[0],
        SKIP_THEN_ROLLBACK[1],
        SKIP_THEN_ROLLBACK[1],
    ]
    tie = (LossRule("first", "event", 2), LossRule("second", "skipStep", 2))
    assert choose(tie, 2) == tie[0]  # a tie: the first listed
    guard = LossGuard(SKIP_THEN_ROLLBACK)
    breaks = [True, True, False, True, True, True]
    fired = [guard.judge(broken, step) for step, broken in enumerate(breaks, start=1)]
    actions = [f.action if f else None for f in fired]
    assert actions == ["skipStep", "skipStep", None, "skipStep", "skipStep", "rollback"]
    assert fired[5] is not None and (fired[5].step, fired[5].streak, fired[5].drops) == (6, 3, True)
    guard.reset()
    assert guard.judge(True, 7) is not None and guard.streak == 1
    assert LossGuard([LossRule("only-third", "event", 3)]).judge(True, 1) is None  # none reached: applied


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), 2.5])
@pytest.mark.parametrize("mean", [True, False])
def test_the_commit_counts_non_finite_values_in_its_one_all_reduce(
    one_rank: None, value: float, mean: bool
) -> None:
    wire = CommitWire(torch.device("cpu"))
    signals = Signals(False, False, False, True, 0.1, 0)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        reduced = wire.reduce(torch.tensor(value), signals, 0, 1)
    collectives = [e.name for e in prof.events() if e.name.startswith("c10d::")]
    assert collectives == ["c10d::allreduce_"]  # the flag rides the commit's one collective
    assert reduced.numel() == 1 + FLAGS + 2
    verdict = CommitWire.read(reduced.tolist(), signals, 1, mean)
    assert verdict.nonfinite == (value != 2.5)


def _record(step: int, **extra: Any) -> dict[str, Any]:
    batch = 4
    fields = {"sample_start": (step - 1) * batch, "sample_end": step * batch}
    return {"step": step, "global_batch": batch, "world_size": 2, "time": float(step), "restart": 0,
            "resumed_from": 0, **fields, **extra}  # fmt: skip


def test_the_audit_lists_skipped_steps_and_counts_a_rollback_as_replayed_steps() -> None:
    records = [_record(s) for s in (1, 2, 3, 4)]
    records += [_record(5, skipped=True), _record(6, skipped=True)]  # the 6th rolled back to 4
    records += [_record(s, resumed_from=4) for s in (5, 6, 7)]
    found = audit(records)
    assert found.ok, found.problems
    assert found.skipped == [5, 6] and found.steps == 7 and found.replayed == 2
    assert "2 step(s) skipped by a loss rule" in found.summary()
    wrong = records[:6] + [_record(s, resumed_from=4) for s in (6, 7)]  # says 4, trains 6 first
    assert not audit(wrong).ok
