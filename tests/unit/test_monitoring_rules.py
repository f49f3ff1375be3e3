"""Monitoring rules (spec.monitoring.rules): API validation, runtime merge, worker env and launcher, the
log-rule evaluator, the supervisor on real processes, and the operator's handling of a firing."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from llm_elastic.logrules import LogRules, RuleError, compile_pattern, parse
from llm_operator.api.validate import validate
from llm_operator.builders.worker import launcher, rules_env
from llm_operator.control.scrape import ProgressTracker, parse_sample
from llm_operator.observe import format_time
from llm_operator.policy.health import RULE_FIRED, assess
from llm_operator.policy.nodehealth import parse_failure
from llm_operator.policy.rules import parse_firing
from llm_operator.reconcile import plan

from .jobs import job, manifest
from .views import NOW, node, pod

STEPS = {
    "name": "steps-flowing",
    "logPattern": r"step (\d+) loss",
    "expectedStartCutOffSeconds": 600,
    "expectedRecurringSeconds": 300,
    "action": "restartWorker",
}
THROUGHPUT = {
    "name": "throughput",
    "logPattern": r"tokens/s (\d+(\.\d+)?)",
    "metricThreshold": 1000,
    "operator": "lt",
    "dataPoints": 20,
    "action": "replaceNode",
}
NAN = {"name": "nan", "loss": "nonFinite", "action": "skipStep"}
LIVE = {"recovery": "inProcess"}


def _rules(*rules: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return manifest(monitoring={"rules": list(rules)}, **spec)


# -- API ------------------------------------------------------------------------------------------------


def test_the_issue_example_is_valid_and_renders_both_envs() -> None:
    result = validate(_rules(STEPS, THROUGHPUT, NAN, failurePolicy=LIVE))
    assert result.problems == [] and result.job is not None
    env = {e["name"]: e["value"] for e in rules_env(result.job)}
    assert json.loads(env["LLMJOB_LOSS_RULES"]) == [{"action": "skipStep", "after": 1, "name": "nan"}]
    log = json.loads(env["LLMJOB_LOG_RULES"])
    assert [r["name"] for r in log] == ["steps-flowing", "throughput"]
    assert log[1]["metricThreshold"] == 1000 and log[1]["dataPoints"] == 20 and log[0]["after"] == 1


INVALID: list[tuple[str, dict[str, Any], str]] = [
    (
        "not RE2 (look-ahead)",
        _rules({**STEPS, "logPattern": "step (?=1)"}),
        "spec.monitoring.rules[0].logPattern: Value error, not a valid RE2 pattern",
    ),
    (
        "threshold without a group",
        _rules({**THROUGHPUT, "logPattern": r"tokens/s (?:\d+)"}),
        "metricThreshold needs a capture group",
    ),
    (
        "unknown action",
        _rules({**STEPS, "action": "reboot"}),
        "spec.monitoring.rules[0].action: Input should be",
    ),
    ("unknown operator", _rules({**THROUGHPUT, "operator": "eq"}), "spec.monitoring.rules[0].operator"),
    (
        "loss action on a log rule",
        _rules({**STEPS, "action": "skipStep"}),
        "rules[steps-flowing].action: skipStep",
    ),
    (
        "log action on a loss rule",
        _rules({**NAN, "action": "replaceNode"}, failurePolicy=LIVE),
        "rules[nan].action",
    ),
    ("both kinds", _rules({**STEPS, "loss": "nonFinite"}, failurePolicy=LIVE), "exactly one"),
    ("threshold without operator", _rules({**THROUGHPUT, "operator": None}), "go together"),
    ("dataPoints alone", _rules({**STEPS, "dataPoints": 3}), "only a rule with metricThreshold"),
    ("loss rule under torchrun", _rules(NAN), "a loss rule needs spec.failurePolicy.recovery inProcess"),
]


@pytest.mark.parametrize(("case", "doc", "expected"), INVALID, ids=[c[0] for c in INVALID])
def test_invalid_rules_name_the_field(case: str, doc: dict[str, Any], expected: str) -> None:
    for rule in doc["spec"]["monitoring"]["rules"]:
        for key in [k for k, v in rule.items() if v is None]:
            del rule[key]
    result = validate(doc)
    assert result.job is None, case
    assert any(expected in line for line in result.problems), result.problems


def test_runtime_rules_merge_by_name_job_last() -> None:
    runtime = {
        "kind": "ClusterLLMTrainingRuntime",
        "metadata": {"name": "p5"},
        "spec": {"monitoring": {"rules": [STEPS, {**THROUGHPUT, "metricThreshold": 500}]}},
    }
    doc = manifest(runtimeRef={"kind": "ClusterLLMTrainingRuntime", "name": "p5"})
    doc["spec"]["monitoring"] = {"rules": [{**THROUGHPUT, "metricThreshold": 2000, "action": "event"}]}
    result = validate(doc, runtime)
    assert result.job is not None and result.job.spec.monitoring is not None, result.problems
    rules = {r.name: r for r in result.job.spec.monitoring.rules}
    assert list(rules) == ["steps-flowing", "throughput"]
    assert rules["throughput"].metricThreshold == 2000 and rules["throughput"].action == "event"


def test_launcher_wraps_the_program_in_the_supervisor_only_with_log_rules() -> None:
    assert launcher(job()) == ["torchrun", "--no-python"]
    restart = launcher(job(monitoring={"rules": [STEPS]}))
    assert restart[:3] == ["python", "-m", "llm_elastic.supervise"]
    assert "--rules-env=LLMJOB_LOG_RULES" in restart and "--max-restarts=0" in restart
    assert restart[-3:] == ["--", "torchrun", "--no-python"]
    live = launcher(job(monitoring={"rules": [STEPS]}, failurePolicy=LIVE, gpusPerNode=1))
    assert "--rules-env=LLMJOB_LOG_RULES" in live and live[-1] == "--" and "--max-restarts=20" in live
    # A loss rule alone needs no supervisor reading the output.
    loss_only = launcher(job(monitoring={"rules": [NAN]}, failurePolicy=LIVE, gpusPerNode=1))
    assert not any(a.startswith("--rules-env") for a in loss_only)


# -- the evaluator -------------------------------------------------------------------------------------


def _log(*rules: dict[str, Any]) -> LogRules:
    evaluator = LogRules(parse(json.dumps(list(rules))))
    evaluator.start(0.0)
    return evaluator


def test_start_cut_off_then_recurring() -> None:
    rules = _log({**STEPS, "expectedStartCutOffSeconds": 10, "expectedRecurringSeconds": 3})
    assert rules.tick(9.9) == [] and rules.next_due() == 10
    (first,) = rules.tick(10.0)
    assert first.action == "restartWorker" and "within 10 s of the start" in first.detail
    assert rules.tick(100.0) == []  # the start cut-off breaks once per start
    rules.start(200.0)
    assert rules.line(b"step 1 loss 2.0", 201.0) == [] and rules.next_due() == 204.0
    assert rules.tick(203.9) == []
    (late,) = rules.tick(204.0)
    assert "for 3.0 s" in late.detail
    assert rules.next_due() == 207.0  # each further interval without a line is another break


def test_after_counts_consecutive_breaks_and_a_match_resets_it() -> None:
    rules = _log({**STEPS, "expectedStartCutOffSeconds": None, "expectedRecurringSeconds": 2, "after": 2})
    assert rules.tick(2.0) == []  # first break
    rules.line(b"step 1 loss 1", 2.5)  # resets the count
    assert rules.tick(4.5) == []
    assert [f.rule for f in rules.tick(6.5)] == ["steps-flowing"]


def test_threshold_over_the_last_data_points() -> None:
    rules = _log({**THROUGHPUT, "dataPoints": 3})
    assert rules.line(b"tokens/s 999.5", 1) == [] and rules.line(b"tokens/s 10", 2) == []
    assert rules.line(b"tokens/s 1500", 3) == []  # a good value starts the window again
    assert rules.line(b"tokens/s 1", 4) == [] and rules.line(b"tokens/s 2", 5) == []
    (firing,) = rules.line(b"xx tokens/s 3 yy", 6)
    assert firing.action == "replaceNode" and "lt 1000" in firing.detail
    assert rules.line(b"tokens/s 4", 7) == []  # the next firing needs dataPoints new numbers


def test_a_pattern_alone_fires_on_each_match() -> None:
    rules = _log({"name": "xid", "logPattern": "NCCL error|Xid", "action": "replaceNode", "after": 1})
    assert rules.line(b"all good", 1) == []
    assert [f.rule for f in rules.line(b"NCCL error: unhandled system error", 2)] == ["xid"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[1", "not JSON"),
        ('[{"name": "a", "logPattern": "(?=x)", "action": "event"}]', "not valid RE2"),
        ('[{"name": "a", "logPattern": "x", "action": "skipStep"}]', "action 'skipStep'"),
    ],
)
def test_bad_rules_json_is_one_line(text: str, expected: str) -> None:
    with pytest.raises(RuleError, match=expected.replace("(", r"\(").replace("[", r"\[")):
        parse(text)


# -- the supervisor, on real processes -------------------------------------------------------------------

PROGRAM = """
import os, sys, time
restarts = int(os.environ.get("LLMJOB_PROCESS_RESTARTS", "0"))
sys.stdout.buffer.write(b"step 1 loss 2.0 \\xff raw\\n")
sys.stdout.flush()
print("to stderr", file=sys.stderr, flush=True)
if restarts == 0:
    time.sleep(60)  # hangs: the recurring rule restarts it
print("step 2 loss 1.0 tokens/s 10", flush=True)
time.sleep(60)
"""


def _supervise(
    tmp_path: Path, rules: list[dict[str, Any]], *flags: str
) -> subprocess.CompletedProcess[bytes]:
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    env = dict(os.environ, LLMJOB_LOG_RULES=json.dumps(rules), LLMJOB_TERMINATION_LOG=str(tmp_path / "term"))
    argv = [sys.executable, "-m", "llm_elastic.supervise", "--rules-env=LLMJOB_LOG_RULES", "--kill-grace=1"]
    return subprocess.run(
        [*argv, *flags, "--", sys.executable, str(script)],
        env=env,
        capture_output=True,
        timeout=60,
        check=False,
    )


def test_supervisor_passes_bytes_through_restarts_on_a_hang_then_replaces_the_node(tmp_path: Path) -> None:
    rules = [
        {
            "name": "steps",
            "logPattern": r"step (\d+) loss",
            "expectedRecurringSeconds": 1,
            "action": "restartWorker",
            "after": 1,
        },
        {
            "name": "tp",
            "logPattern": r"tokens/s (\d+)",
            "metricThreshold": 100,
            "operator": "lt",
            "dataPoints": 1,
            "action": "replaceNode",
            "after": 1,
        },
    ]
    done = _supervise(tmp_path, rules, "--max-restarts=0", "--max-rule-restarts=1")
    assert done.returncode == 78, done.stderr
    assert done.stdout.count(b"step 1 loss 2.0 \xff raw\n") == 2  # every byte, unchanged, both runs
    assert done.stderr.count(b"to stderr\n") == 2
    events = [json.loads(ln) for ln in done.stdout.splitlines() if ln.startswith(b'{"event"')]
    assert [(e["event"], e.get("rule")) for e in events] == [
        ("rule-fired", "steps"),
        ("process-restarted", "steps"),
        ("rule-fired", "tp"),
    ]
    message = (tmp_path / "term").read_text()
    assert message.startswith("rule-fired: tp replaceNode: the last 1 value(s) (10) lt 100")
    assert parse_failure(message).check == "rule"


def test_supervisor_start_cut_off_ends_the_worker_for_a_job_restart(tmp_path: Path) -> None:
    rules = [
        {
            "name": "never",
            "logPattern": "never printed",
            "expectedStartCutOffSeconds": 1,
            "action": "restartJob",
            "after": 1,
        }
    ]
    done = _supervise(tmp_path, rules, "--max-restarts=3")
    assert done.returncode == 79
    firing = parse_firing((tmp_path / "term").read_text())
    assert firing is not None and (firing.rule, firing.action) == ("never", "restartJob")


# -- the operator ---------------------------------------------------------------------------------------

NODES = {f"node-{i}": node(f"node-{i}") for i in range(4)}
RUNNING = {"phase": "Running", "targetReplicas": 3, "desiredReplicas": 3, "startTime": format_time(NOW - 500)}


def _fired(index: int, action: str, code: int = 79) -> Any:
    return pod(
        index,
        phase="Failed",
        exit_code=code,
        finished=NOW - 2,
        message=f"rule-fired: steps {action}: no line matched 'step' for 30.0 s",
    )


def test_fail_job_rule_fails_the_job_once_with_event_status_and_metric() -> None:
    pods = [pod(0), _fired(1, "failJob"), pod(2)]
    assert assess(pods[1], NODES["node-1"], NOW, 30, [79]).signal == RULE_FIRED
    p = plan(job(status=RUNNING), pods, NODES, pods, NOW)
    assert p.status["phase"] == "Failed" and p.status["reason"] == RULE_FIRED
    assert p.rules_fired == [("steps", "failJob")] and p.status["rulesFired"] == 1
    last = p.status["lastRuleFired"]
    assert (last["rule"], last["action"], last["worker"]) == ("steps", "failJob", "llama-worker-1")
    assert any(
        e[1] == RULE_FIRED and "rule steps fired on worker llama-worker-1: failJob" in e[2] for e in p.events
    )
    again = plan(job(status=p.status), pods, NODES, pods, NOW + 1)  # the next pass counts it no more
    assert again.rules_fired == [] and again.status["rulesFired"] == 1


def test_restart_job_rule_restarts_every_worker_as_one_restart() -> None:
    pods = [pod(0), _fired(1, "restartJob"), pod(2)]
    p = plan(job(status=RUNNING), pods, NODES, pods, NOW)
    assert sorted(d.pod.name for d in p.delete) == [f"llama-worker-{i}" for i in range(3)]
    assert p.status["restarts"] == 1 and p.rules_fired == [("steps", "restartJob")]


def test_replace_node_rule_avoids_the_node() -> None:
    pods = [pod(0), _fired(1, "replaceNode", code=78), pod(2)]
    p = plan(job(status=RUNNING), pods, NODES, pods, NOW)
    assert [d.pod.name for d in p.delete] == ["llama-worker-1"] and "node-1" in p.avoid_nodes
    assert p.unhealthy == [("node-1", "rule")] and p.rules_fired == [("steps", "replaceNode")]


@pytest.mark.parametrize(
    ("pattern", "engine"),
    [
        (r"step (\d+) loss", "re"),
        (r"(?i)nccl error|Xid \d+", "re"),
        (r"[[:alpha:]]+ done", "re2"),  # re would read a set of characters
        (r"\pN+", "re2"),
        (r"(?U)a+", "re2"),
    ],
)
def test_a_pattern_re_reads_alike_is_matched_by_re_the_others_by_re2(pattern: str, engine: str) -> None:
    assert type(compile_pattern(pattern)).__module__.split(".")[0] == engine
    rule = _log({"name": "p", "logPattern": pattern, "action": "event", "after": 1})
    assert rule.line(b"nothing here", 1) == [] or engine == "re2"


METRICS = """# TYPE llm_trainer_step gauge
llm_trainer_step 12
# TYPE llm_trainer_rule_fired_total counter
llm_trainer_rule_fired_total{rule="nan",action="skipStep"} 2.0
llm_trainer_rule_fired_total{rule="nan-again",action="rollback"} 1.0
"""


def test_loss_rules_fired_in_the_workers_become_events_once() -> None:
    sample = parse_sample(METRICS)
    assert sample is not None
    assert sample.rules_fired == (("nan", "skipStep", 2), ("nan-again", "rollback", 1))
    tracker = ProgressTracker()
    joiner = dataclasses.replace(sample, rules_fired=(("nan", "skipStep", 1),), timestamp=9.0)
    tracker.record([sample, joiner], NOW)  # the highest count of the round is the job's
    assert tracker.progress().latest is not None
    assert tracker.progress().latest.rules_fired == sample.rules_fired
    pods = [pod(0), pod(1), pod(2)]
    live = {"recovery": "inProcess"}
    p = plan(job(status=RUNNING, failurePolicy=live), pods, NODES, pods, NOW, tracker.progress())
    assert p.rules_fired == [("nan", "skipStep"), ("nan", "skipStep"), ("nan-again", "rollback")]
    assert p.status["rulesFired"] == 3 and p.status["lastRuleFired"]["rule"] == "nan-again"
    assert [e[2] for e in p.events if e[1] == RULE_FIRED] == [
        "rule nan fired 2 times in the workers: skipStep",
        "rule nan-again fired in the workers: rollback",
    ]
    again = plan(job(status=p.status, failurePolicy=live), pods, NODES, pods, NOW + 1, tracker.progress())
    assert again.rules_fired == [] and again.status["rulesFired"] == 3


@pytest.mark.parametrize(("local_rank", "logged"), [("0", True), ("1", False)])
def test_every_pod_logs_the_step_line_a_log_rule_watches(
    local_rank: str, logged: bool, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Global rank 0 alone writes the step log; local rank 0 of every pod logs the progress line, so a rule
    on 'step (\\d+) loss' sees it in every worker's log."""
    import logging

    from llm_elastic.config import ElasticConfig
    from llm_elastic.position import Progress, RestoreFacts
    from llm_elastic.reporting import Reporter
    from llm_elastic.step import Step

    monkeypatch.setenv("LOCAL_RANK", local_rank)
    reporter = Reporter(ElasticConfig(total_steps=5, log_every=1), {"rank": "3"}, 0, 0, None)
    reporter.open(rank=3)
    step = Step(None, 2, None, None)  # type: ignore[arg-type]  # neither the loop nor the mode is read
    step.loss = 1.5
    with caplog.at_level(logging.INFO):
        reporter.step_record(step, Progress(3, 1.5, False), 0.5, 100.0, (2, 0), 0, RestoreFacts(None, ""), {})
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step 3 loss")]
    assert bool(lines) is logged
    pattern = compile_pattern(str(STEPS["logPattern"]))
    assert all(pattern.search(line.encode()) for line in lines)


def test_a_loss_rule_that_ends_every_member_counts_once() -> None:
    """restartJob from a loss rule: every member exits 79 with the same message, and the workers' counters
    report it too; the operator counts one firing."""
    message = "rule-fired: nan restartJob: non-finite loss at step 7"
    pods = [pod(i, phase="Failed", exit_code=79, finished=NOW - 2, message=message) for i in range(3)]
    counted = 'llm_trainer_rule_fired_total{rule="nan",action="restartJob"} 1.0'
    sample = parse_sample(f"llm_trainer_step 7\n{counted}\n")
    assert sample is not None
    tracker = ProgressTracker()
    tracker.record([sample], NOW)
    live = {"recovery": "inProcess"}
    p = plan(job(status=RUNNING, failurePolicy=live), pods, NODES, pods, NOW, tracker.progress())
    assert p.rules_fired == [("nan", "restartJob")] and p.status["rulesFired"] == 1
    assert len([e for e in p.events if e[1] == RULE_FIRED and e[2].startswith("rule nan fired")]) == 1
