"""status.progress and goodput: the pure computation (policy.goodput), the pass step that folds it in at a
bounded rate (steps.progress.report_progress), and a simulated run checked against its own step log."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from llm_operator.observe import format_time, parse_time
from llm_operator.policy.goodput import (
    KeptWork,
    fold,
    format_duration,
    kept_work,
    step_log_goodput,
)
from llm_operator.policy.progress import Progress, Sample
from llm_operator.reconcile import plan

from .jobs import job
from .views import NOW, node, pod

EVERY = 30.0
NODES = {f"node-{i}": node(f"node-{i}") for i in range(4)}


def timed(step: int, total: float, count: int, **kw: Any) -> Sample:
    return Sample(step, NOW, step_time_sum=total, step_time_count=count, **kw)


@pytest.mark.parametrize(
    ("case", "previous", "sample", "expected"),
    [
        # previous: (step, highWaterStep, stepTimeSum, stepTimeCount) at the last update
        ("same process steps on", (10, 10, 5.0, 10), timed(20, 10.0, 20), KeptWork(10, 5.0, 0.5)),
        (
            "nothing new (the same sample again)",
            (20, 20, 10.0, 20),
            timed(20, 10.0, 20),
            KeptWork(0, 0.0, None),
        ),
        (
            "counters reset: restarted from checkpoint 8 after step 12, now past it",
            (12, 12, 6.0, 12),
            timed(14, 3.6, 6),
            KeptWork(2, 1.2, 0.6),
        ),
        (
            "replaying below the high-water mark counts nothing",
            (12, 12, 6.0, 12),
            timed(11, 1.8, 3),
            KeptWork(0, 0.0, 0.6),
        ),
        (
            "restarted and counters already above the old ones (step and count moved apart)",
            (20, 20, 2.5, 5),
            timed(30, 7.0, 14),
            KeptWork(10, 5.0, 0.5),
        ),
        (
            "another worker answered (joined later: its own counters)",
            (20, 20, 10.0, 20),
            timed(22, 6.0, 12),
            KeptWork(2, 1.0, 0.5),
        ),
        (
            "first look at a run resumed from another run's checkpoint: only its own steps",
            (0, 0, None, None),
            timed(1010, 5.0, 10),
            KeptWork(10, 5.0, 0.5),
        ),
        (
            "graceful stop at 24 after a look at 20, resumed from 24: steps 21-24 are kept work too",
            (20, 20, 10.0, 20),
            timed(30, 3.0, 6),
            KeptWork(10, 5.0, 0.5),
        ),
        (
            "resumed past the high-water mark, no step yet: valued at the previous step time",
            (20, 20, 10.0, 20),
            timed(24, 0.0, 0),
            KeptWork(4, 2.0, None),
        ),
        (
            "a program without step-time counters: steps, no seconds",
            (10, 10, None, None),
            Sample(15, NOW),
            KeptWork(5, 0.0, None),
        ),
    ],
)
def test_kept_work(
    case: str, previous: tuple[int, int, float | None, int | None], sample: Sample, expected: KeptWork
) -> None:
    got = kept_work(*previous, sample, 0.5)
    assert got.steps == expected.steps, case
    assert got.seconds == pytest.approx(expected.seconds), case
    assert got.step_time == pytest.approx(expected.step_time), case


def test_steps_of_the_process_before_a_restart_are_worth_its_step_time() -> None:
    """Grow-back: the world-1 process (0.07 s/step) did steps 81-120 after the last look and stopped with a
    checkpoint; the world-2 process (0.12 s/step) resumed at 120 and is at 179 (59 steps)."""
    work = kept_work(80, 80, 5.0, 70, timed(179, 59 * 0.12, 59), 0.07)
    assert work.steps == 99 and work.step_time == pytest.approx(0.12)
    assert work.seconds == pytest.approx(40 * 0.07 + 59 * 0.12)


def test_a_look_before_the_first_step_makes_every_later_step_this_jobs() -> None:
    """Seen before its first step, then lost and resumed from checkpoint 10 before the next look: steps 1-10
    of the first process count too (the first look alone could not tell them from another run's)."""
    p = fold(None, timed(0, 0.0, 0), NOW, start_time=NOW - 5, counting=True)
    assert p is not None and p["step"] == 0 and "goodput" not in p, "seen, nothing to say yet"
    p = fold(p, timed(49, 3.9, 39), NOW + 30, start_time=NOW - 5, counting=True)
    assert p is not None and p["productiveSeconds"] == pytest.approx(4.9) and p["highWaterStep"] == 49


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (45.4, "45s"), (250, "4m10s"), (3600, "1h"), (3780, "1h3m"), (3 * 86400 + 7200 + 5, "3d2h")],
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


def test_no_metrics_leaves_progress_empty() -> None:
    assert fold(None, None, NOW, start_time=NOW - 100, counting=True) is None


def test_first_fold_counts_wall_time_from_the_start() -> None:
    sample = timed(50, 40.0, 50, total_steps=1000, loss=2.5, tokens_per_second=1024.0, last_saved_step=40,
                   last_saved_timestamp=NOW - 8)  # fmt: skip
    p = fold(None, sample, NOW, start_time=NOW - 100, counting=True)
    assert p is not None
    assert (p["step"], p["highWaterStep"], p["productiveSeconds"], p["wallSeconds"]) == (50, 50, 40.0, 100.0)
    assert (p["goodput"], p["goodputLastHour"], p["stepTimeSeconds"]) == (0.4, 0.4, 0.8)
    assert (p["totalSteps"], p["loss"], p["tokensPerSecond"], p["lastSavedStep"]) == (1000, 2.5, 1024.0, 40)
    assert parse_time(p["lastSavedTime"]) == NOW - 8
    assert p["eta"] == "12m40s" and parse_time(p["estimatedCompletionTime"]) == NOW + 760  # 950 x 0.8 s
    assert parse_time(p["updateTime"]) == NOW


def test_later_folds_accumulate_and_replays_cost_wall_time() -> None:
    p = fold(None, timed(50, 25.0, 50), NOW, start_time=NOW - 50, counting=True)
    p = fold(p, timed(80, 40.0, 80), NOW + 30, start_time=NOW - 50, counting=True)  # 30 steps in 30 s
    assert p is not None and (p["productiveSeconds"], p["wallSeconds"]) == (40.0, 80.0)
    # Lost at step 85, restarted from checkpoint 70: 20 steps done since, 15 of them replays.
    p = fold(p, timed(90, 10.0, 20), NOW + 90, start_time=NOW - 50, counting=True)
    assert p is not None and (p["step"], p["highWaterStep"]) == (90, 90)
    assert (p["productiveSeconds"], p["wallSeconds"], p["goodput"]) == (45.0, 140.0, round(45 / 140, 4))
    assert "totalSteps" not in p and "eta" not in p, "no total, no ETA"


def test_wall_time_stops_while_not_counting_and_nothing_is_new() -> None:
    p = fold(None, timed(10, 5.0, 10), NOW, start_time=NOW - 10, counting=True)
    q = fold(p, None, NOW + 600, start_time=NOW - 10, counting=False)
    assert q is not None and (q["wallSeconds"], q["productiveSeconds"], q["step"]) == (10.0, 5.0, 10)
    r = fold(q, None, NOW + 630, start_time=NOW - 10, counting=True)
    assert r is not None and r["wallSeconds"] == 40.0 and r["goodput"] == 0.125, "no sample: only wall time"


def test_last_hour_window_is_bounded() -> None:
    p = fold(None, timed(1, 0.5, 1), NOW, start_time=NOW - 1, counting=True)
    step, total = 1, 0.5
    for minute in range(1, 200):  # 200 minutes of half-productive training
        step += 60
        total += 30.0
        p = fold(p, timed(step, total, step), NOW + 60 * minute, start_time=NOW - 1, counting=True)
    assert p is not None
    assert len(p["window"]) <= 12, "buckets of 5 minutes within the last hour"
    assert sum(b["wallSeconds"] for b in p["window"]) <= 3600
    assert p["goodputLastHour"] == 0.5 and abs(p["goodput"] - 0.5) < 0.01
    # An hour with no kept step at all: the last hour shows it, the life average much less.
    for minute in range(200, 270):
        p = fold(p, None, NOW + 60 * minute, start_time=NOW - 1, counting=True)
    assert p is not None and p["goodputLastHour"] == 0.0 and 0.3 < p["goodput"] < 0.5


def test_counters_served_but_never_set_give_no_goodput() -> None:
    """The live driver's exporter serves the step-time gauges at 0: step and loss, but no goodput of 0."""
    p = fold(None, timed(5, 0.0, 0, loss=3.0), NOW, start_time=NOW - 10, counting=True)
    p = fold(p, timed(15, 0.0, 0, loss=2.9), NOW + 30, start_time=NOW - 10, counting=True)
    assert p is not None and (p["step"], p["loss"]) == (15, 2.9) and "goodput" not in p


def test_finished_job_has_no_eta() -> None:
    p = fold(
        None, timed(100, 50.0, 100, total_steps=100), NOW, start_time=NOW - 60, counting=True, finished=True
    )
    assert p is not None and "eta" not in p and p["goodput"] == round(50 / 60, 4)


def test_step_log_goodput_counts_each_step_once() -> None:
    records = [{"time": NOW + s, "step": s, "step_time": 1.0} for s in range(1, 11)]
    records += [{"time": NOW + 30 + s, "step": s, "step_time": 1.0} for s in range(8, 16)]  # replay 8-10
    g = step_log_goodput(records, NOW, NOW + 50)
    assert (g.steps, g.replayed, g.productive, g.wall) == (15, 3, 15.0, 50.0) and g.goodput == 0.3
    assert step_log_goodput(records, NOW, NOW + 50, up_to_step=12).steps == 12


# -- the pass: folded in at a bounded rate ---------------------------------------------------------------


def _running(**kw: Any) -> dict[str, Any]:
    base = {
        "phase": "Running",
        "targetReplicas": 4,
        "desiredReplicas": 4,
        "startTime": format_time(NOW - 100),
    }
    return {**base, **kw}


def _pass(status: dict[str, Any], now: float, progress: Progress | None, **spec: Any) -> dict[str, Any]:
    pods = [pod(i) for i in range(4)]
    out: dict[str, Any] = plan(job(status=status, **spec), pods, NODES, pods, now, progress).status
    return out


def seen(sample: Sample | None, at: float, every: float = EVERY) -> Progress:
    return Progress(sample.step if sample else None, at, sample, at if sample else None, every)


def test_pass_without_probes_or_metrics_has_no_progress() -> None:
    assert "progress" not in _pass(_running(), NOW, None)
    assert "progress" not in _pass(_running(), NOW, seen(None, NOW)), "a program serving no metrics"
    assert "progress" not in _pass(_running(), NOW, seen(timed(5, 2.0, 5), NOW, every=0)), "turned off"


def test_pass_without_probes_keeps_the_last_progress() -> None:
    first = _pass(_running(), NOW, seen(timed(5, 2.0, 5), NOW - 1))
    assert _pass(first, NOW + 60, None)["progress"] == first["progress"]
    assert _pass(first, NOW + 60, seen(timed(9, 3.0, 9), NOW + 59, every=0))["progress"] == first["progress"]


def test_pass_folds_at_most_once_per_interval() -> None:
    first = _pass(_running(), NOW, seen(timed(5, 2.0, 5), NOW - 1))
    assert first["progress"]["step"] == 5 and first["progress"]["wallSeconds"] == 100.0
    later = plan(
        job(status=first), [pod(i) for i in range(4)], NODES, [], NOW + 10, seen(timed(20, 8.0, 20), NOW + 9)
    )
    assert later.status["progress"] == first["progress"], "within the interval: unchanged (no write)"
    assert later.requeue_at is not None and later.requeue_at <= NOW + EVERY
    due = _pass(first, NOW + EVERY, seen(timed(40, 16.0, 40), NOW + 29))
    assert (due["progress"]["step"], due["progress"]["productiveSeconds"]) == (40, 16.0)


def test_pass_freezes_progress_while_suspended_and_on_finish() -> None:
    running = _pass(_running(), NOW, seen(timed(5, 2.0, 5), NOW - 1))
    suspended = _pass(running, NOW + 1, seen(timed(6, 2.4, 6), NOW + 0.5), suspend=True)
    assert suspended["phase"] == "Suspended" and suspended["progress"]["step"] == 6, "folded at the change"
    later = _pass(suspended, NOW + 900, seen(timed(6, 2.4, 6), NOW + 0.5), suspend=True)
    assert later["progress"] == suspended["progress"], "no wall time, no write while suspended"
    resumed = _pass(later, NOW + 1000, seen(None, NOW + 999))
    assert resumed["progress"]["wallSeconds"] == suspended["progress"]["wallSeconds"], (
        "suspended time not counted"
    )


@dataclass
class SimulatedRun:
    """A synchronous job on the operator's clock: steps of ``step_time`` s, a checkpoint every 10 steps, a
    node lost at ``lose_at`` (the trainer restarts from the last checkpoint after ``pause`` s)."""

    start: float
    step_time: float = 0.5
    lose_at: float = 204.0
    pause: float = 40.0
    records: list[dict[str, Any]] = field(default_factory=list)
    step: int = 0
    count: int = 0
    total: float = 0.0
    clock: float = 0.0
    lost: bool = False

    def advance(self, until: float) -> None:
        while self.clock + self.step_time <= until:
            if not self.lost and self.clock >= self.lose_at:
                self.lost = True
                self.clock += self.pause
                self.step = self.step // 10 * 10  # newest checkpoint
                self.count, self.total = 0, 0.0  # a new process: counters reset
                continue
            self.clock += self.step_time
            self.step += 1
            self.count += 1
            self.total += self.step_time
            self.records.append(
                {"time": self.start + self.clock, "step": self.step, "step_time": self.step_time}
            )

    def sample(self) -> Sample | None:
        if self.count == 0:
            return None
        return Sample(
            self.step, self.start + self.clock, step_time_sum=self.total, step_time_count=self.count
        )


def test_simulated_node_loss_bounded_writes_and_goodput_matches_the_step_log() -> None:
    """A pass every second (events) and a probe every 15 s for 10 minutes: progress changes the status at
    most once per 30 s, and its goodput agrees with the one computed from the step log."""
    start = NOW
    run = SimulatedRun(start=start + 20)  # the first step 20 s after the job started (start-up)
    status = _running(startTime=format_time(start))
    writes, sample, sampled_at = 0, None, 0.0
    for second in range(1, 601):
        now = start + second
        run.advance(second - 20)
        if second % 15 == 0:
            sample, sampled_at = run.sample() or sample, now
        new = _pass(status, now, seen(sample, sampled_at))
        writes += new != status
        status = new
    assert writes <= 600 / EVERY + 1, f"{writes} status writes in 600 s"
    p = status["progress"]
    log = step_log_goodput(
        run.records, start, parse_time(p["updateTime"]) or 0.0, up_to_step=p["highWaterStep"]
    )
    assert log.replayed > 0 and p["goodput"] < 0.95
    assert abs(p["goodput"] - log.goodput) < 0.02, (p["goodput"], log)


# -- settings and the operator's gauges ----------------------------------------------------------------------


def test_progress_interval_setting() -> None:
    from llm_operator.settings import Settings

    assert Settings.from_env({}).progress_seconds == 30.0
    assert Settings.from_env({"LLMJOB_PROGRESS_SECONDS": "10"}).progress_seconds == 10.0
    assert Settings.from_env({"LLMJOB_PROGRESS_SECONDS": "0"}).progress_seconds == 0.0
    for bad in ("-1", "soon", "nan"):
        with pytest.raises(ValueError, match="LLMJOB_PROGRESS_SECONDS"):
            Settings.from_env({"LLMJOB_PROGRESS_SECONDS": bad})


def test_job_gauges_follow_status_progress() -> None:
    from llm_operator import metrics
    from prometheus_client import REGISTRY

    def value(name: str, **labels: str) -> float | None:
        return REGISTRY.get_sample_value(name, {"namespace": "ml", "llmjob": "gauged", **labels})

    progress = {"step": 120, "goodput": 0.97, "goodputLastHour": 0.9, "tokensPerSecond": 5000.0}
    metrics.observe_progress(
        "ml", "gauged", {**progress, "estimatedCompletionTime": format_time(NOW + 60)}, NOW
    )
    assert value("llmjob_job_step") == 120 and value("llmjob_job_goodput", window="life") == 0.97
    assert value("llmjob_job_goodput", window="hour") == 0.9 and value("llmjob_job_eta_seconds") == 60
    metrics.observe_progress("ml", "gauged", {"step": 130}, NOW)
    assert value("llmjob_job_step") == 130 and value("llmjob_job_goodput", window="life") is None
    metrics.forget_job("ml", "gauged")
    assert value("llmjob_job_step") is None, "a deleted job's series go"


def test_the_phase_gauge_has_one_series_per_job() -> None:
    from llm_operator import metrics
    from prometheus_client import REGISTRY

    def phase(name: str) -> float | None:
        return REGISTRY.get_sample_value(
            "llmjob_job_phase", {"namespace": "ml", "llmjob": "phased", "phase": name}
        )

    metrics.observe_job("ml", "phased", "Running", {"desired": 4, "target": 4, "ready": 4})
    assert phase("Running") == 1
    metrics.observe_job("ml", "phased", "Succeeded", {"desired": 4, "target": 4, "ready": 0})
    assert phase("Succeeded") == 1 and phase("Running") is None, "the old phase's series goes"
    metrics.forget_job("ml", "phased")
    assert phase("Succeeded") is None
