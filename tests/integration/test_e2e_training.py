"""The whole chain for real: the operator (as users start it) makes pods, the pod runner runs them as
processes, torchrun rendezvous through the operator's rendezvous pod, and the trainer trains.

Each test checks training itself: the job's ``metrics.jsonl`` on the shared volume must show the world
sizes the story implies, and ``llm_elastic.accounting.audit`` must find no sample skipped and none repeated
beyond a replay after a checkpoint. The cluster is ``process_cluster`` (2 fake p5.48xlarge nodes + 1 CPU
node); a job of 8 fake GPUs per worker puts one worker on each p5 node, so losing a node shrinks it.
"""

from __future__ import annotations

import itertools
import shutil
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from llm_elastic.accounting import Audit, audit
from llm_operator.observe import parse_time
from llm_operator.policy.goodput import step_log_goodput
from llm_testbed import training
from llm_testbed.localcluster import chaos
from llm_testbed.localcluster.cluster import LocalCluster
from support.wait import wait_for

from .conftest import PeeredOperatorProcess
from .e2e_support import EVERY, JOB, MAX_REPLAY, PROGRESS_SECONDS, SMOKE_STEPS, StatusWatch, Training

pytestmark = [pytest.mark.cluster, pytest.mark.trainer, pytest.mark.timeout(600)]


def _lost_node_story(
    t: Training,
    lose: Callable[[str], None],
    restore: Callable[[str], None],
    before_loss: Callable[[], object] | None = None,
) -> Audit:
    """Run at 2, lose worker-1's node, the survivor resumes at 1, the node returns, grow back to 2."""
    t.wait_steps("a checkpoint and 3 more steps at world size 2", world=2, count=EVERY + 3)
    if before_loss is not None:
        before_loss()
    survivor = t.worker_on(0)
    victim = t.worker_on(1)
    node = victim["spec"]["nodeName"]
    lose(node)
    lost_at = t.records()[-1]["time"]
    t.wait_steps("the survivor to resume at world size 1", world=1, count=3, after=lost_at)
    assert t.worker_on(0)["metadata"]["uid"] == survivor["metadata"]["uid"], "the survivor's pod stays"
    restore(node)
    back_at = t.records()[-1]["time"]
    t.wait_steps("grow back to world size 2", world=2, count=3, after=back_at)
    result = t.audit()
    sizes = [(i.world_before, i.world_after) for i in result.interruptions]
    assert (2, 1) in sizes and (1, 2) in sizes, sizes
    bounded = all(i.replayed <= MAX_REPLAY and i.resumed_from > 0 for i in result.interruptions)
    assert bounded, result.interruptions
    print(result.summary())
    return result


def test_node_not_ready_survivor_resumes_and_grows_back_etcd(train: Training) -> None:
    """NotReady (grace 0): the lost worker's processes die with the node, the survivor resumes, grow back.
    status.progress follows the training (issue 22): its goodput drops below 1 with the loss and agrees
    with the goodput of the step log, and progress writes stay one per LLMJOB_PROGRESS_SECONDS."""
    watch = StatusWatch(train)
    try:
        train.apply(training.training_job(JOB, train.ns, minimum=1, maximum=2, steps=5000, backend="etcd-v3"))
        kube = train.cluster.kube
        _lost_node_story(
            train,
            lambda node: chaos.node_not_ready(node, kube=kube, wait=False),
            lambda node: chaos.node_ready(node, kube=kube),
            lambda: wait_for(
                lambda: (train.status().get("progress") or {}).get("step", 0) > 0,
                4 * PROGRESS_SECONDS,
                "status.progress during training at world size 2",
                interval=0.5,
            ),
        )
        _check_progress(train, watch)
    finally:
        watch.stop()


def _progresses(watch: StatusWatch) -> list[dict[str, Any]]:
    return [q for v in watch.versions() if (q := (v.get("status") or {}).get("progress"))]


def _unseen_seconds(
    records: list[dict[str, Any]], start: float, end: float, progresses: list[dict[str, Any]]
) -> float:
    """Step-log seconds of the steps a process completed after the operator's last look and before it
    stopped: the next look finds a new process (its step-time counters restarted) that resumed at
    ``step - stepTimeCount``, so the steps from the high-water mark up to there were never seen. The status
    values them at the old process's mean step time (an estimate, decision G1); every other kept step it
    counts at its own time, so the two figures differ by at most these steps' time."""
    unseen: set[int] = set()
    for a, b in itertools.pairwise(progresses):
        before, counts = a.get("stepTimeCount"), b.get("stepTimeCount")
        if before is None or counts is None:
            continue
        same_process = counts >= before and counts - before == b["step"] - a["step"]
        if not same_process:
            unseen |= set(range(a["highWaterStep"] + 1, b["step"] - counts + 1))
    first_runs = step_log_goodput([r for r in records if r["step"] in unseen], start, end)
    return first_runs.productive


def _check_progress(t: Training, watch: StatusWatch) -> None:
    """Progress during training, goodput < 1 after the loss, productive time within 2% of the wall time of the
    step log's (plus the steps no update could see, which the status estimates), and the status writes that
    changed only progress at least PROGRESS_SECONDS apart."""
    records = t.records()
    lost_step = max(r["step"] for r in records if r["restart"] == 0)
    last = records[-1]

    def updated() -> dict[str, Any] | None:
        s = t.status()
        p = s.get("progress") or {}
        fresh = (
            p.get("highWaterStep", 0) >= last["step"]
            and (parse_time(p.get("updateTime")) or 0) > last["time"]
        )
        return s if fresh else None

    status = wait_for(updated, 4 * PROGRESS_SECONDS, "a progress update after the grow-back", interval=0.5)
    p = status["progress"]
    start, end = parse_time(status["startTime"]), parse_time(p["updateTime"])
    assert start is not None and end is not None
    log = step_log_goodput(t.records(), start, end, up_to_step=p["highWaterStep"])
    print(
        f"goodput: status {p['goodput']:.4f} (productive {p['productiveSeconds']:.1f}s / wall"
        f" {p['wallSeconds']:.1f}s, last hour {p.get('goodputLastHour')}), step log {log.goodput:.4f}"
        f" (productive {log.productive:.1f}s / wall {log.wall:.1f}s, {log.steps} steps,"
        f" {log.replayed} replayed)"
    )
    by_time = {q["updateTime"]: q for q in [*_progresses(watch), p]}
    updates = [by_time[k] for k in sorted(by_time)]  # one per progress update, in order
    history = []
    for q in updates:
        kept = step_log_goodput(t.records(), start, end, up_to_step=q["highWaterStep"]).productive
        history.append((q["updateTime"], q["step"], q["highWaterStep"], q.get("stepTimeCount"),
                        q["productiveSeconds"], round(kept, 3), q["wallSeconds"]))  # fmt: skip
    print("updateTime, step, highWaterStep, count, productive (status), productive (log), wall:")
    print("\n".join(map(str, history)))
    assert p["goodput"] < 1, "a node loss costs wall time"
    unseen = _unseen_seconds(t.records(), start, end, updates)
    print(f"steps no progress update saw their process complete: {unseen:.3f}s in the step log")
    assert abs(p["productiveSeconds"] - log.productive) <= unseen + 0.02 * log.wall, (p, log, unseen)
    assert abs(p["wallSeconds"] - log.wall) <= 1.0, "wall time runs from startTime"
    assert p["totalSteps"] == 5000 and p.get("eta") and p.get("lastSavedStep", 0) >= EVERY

    versions = watch.versions()
    progressed = _progresses(watch)
    assert progressed, "progress appeared in the status"
    # The workers serve step 0 while they start, so a slow start may show progress at step 0 first.
    trained = [q["step"] for q in progressed if q["step"] > 0]
    assert trained and trained[0] <= lost_step, "progress was in the status during training, before the loss"
    stamps = sorted({parse_time(q["updateTime"]) or 0.0 for q in progressed})
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    assert gaps and min(gaps) >= PROGRESS_SECONDS - 0.01, f"progress updated faster than its bound: {gaps}"
    print(f"status writes seen: {len(versions)}, progress updates {len(stamps)} (gaps min {min(gaps):.1f}s)")


def test_termination_taint_stops_gracefully_without_replay(train: Training) -> None:
    """A Karpenter disruption taint: the operator deletes the worker gracefully, the trainer checkpoints on
    SIGTERM, the survivor resumes from exactly the last step (nothing replayed); grows back once cleared."""
    train.apply(training.training_job(JOB, train.ns, minimum=1, maximum=2, steps=5000))
    kube = train.cluster.kube
    result = _lost_node_story(
        train,
        lambda node: chaos.taint_for_termination(node, "karpenter", kube=kube),
        lambda node: chaos.clear_termination(node, "karpenter", kube=kube),
    )
    shrink = next(i for i in result.interruptions if (i.world_before, i.world_after) == (2, 1))
    assert shrink.replayed == 0, result.interruptions


def test_scale_down_up_suspend_resume(train: Training) -> None:
    """`kubectl scale` to 1 and back to 2, then suspend (no pods) and resume: training continues each time."""
    c, ns = train.cluster, train.ns
    train.apply(training.training_job(JOB, ns, minimum=1, maximum=2, steps=5000))
    train.wait_steps("3 steps at world size 2", world=2, count=3)
    c.kubectl("scale", f"llmtrainingjob/{JOB}", "-n", ns, "--replicas=1")
    mark = train.records()[-1]["time"]
    train.wait_steps("3 steps at world size 1 after scale down", world=1, count=3, after=mark)
    c.kubectl("scale", f"llmtrainingjob/{JOB}", "-n", ns, "--replicas=2")
    mark = train.records()[-1]["time"]
    train.wait_steps("3 steps at world size 2 after scale up", world=2, count=3, after=mark)

    c.kubectl("patch", f"llmtrainingjob/{JOB}", "-n", ns, "--type=merge", "-p", '{"spec":{"suspend":true}}')
    wait_for(lambda: not train.workers() and train.status().get("phase") == "Suspended", 120, "suspended")
    stopped = train.records()[-1]
    c.kubectl("patch", f"llmtrainingjob/{JOB}", "-n", ns, "--type=merge", "-p", '{"spec":{"suspend":false}}')
    resumed = train.wait_steps(
        "3 steps at world size 2 after resume", world=2, count=3, after=stopped["time"]
    )
    assert resumed[0]["resumed_from"] == stopped["step"], "suspend checkpoints on SIGTERM: nothing replayed"
    result = train.audit()
    # scale down, scale up, suspend + resume (one gap in the step log)
    assert [(i.world_before, i.world_after) for i in result.interruptions] == [(2, 1), (1, 2), (2, 2)]
    assert all(i.replayed == 0 for i in result.interruptions), "scale and suspend stop gracefully"


def test_shipped_smoke_example_trains_to_success(
    process_cluster: LocalCluster, process_namespace: str, tmp_path: Path
) -> None:
    """deploy/examples/smoke-cpu.yaml with its volume from deploy/examples/smoke-volume/, as a user applies
    them, trains to the end and the job Succeeds. Two changes keep it inside CI on a 2-core machine:
    2 replicas instead of 4, and 60 steps instead of 200 (every other argument as shipped)."""
    c, ns = process_cluster, process_namespace
    operator = PeeredOperatorProcess(ns, tmp_path, ["--namespace", ns], [], {})
    volume = c.volume_dir("smoke-shared")
    shutil.rmtree(volume, ignore_errors=True)
    training.prepare_data(volume)
    operator.start()
    try:
        c.kubectl("apply", "-n", ns, "-f", str(Path("deploy/examples/smoke-volume/volume.yaml").resolve()))
        job = training.example_job()
        job["spec"]["replicas"] = 2
        args = job["spec"]["args"]
        args[args.index("--steps") + 1] = str(SMOKE_STEPS)
        c.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(job))

        def finished() -> dict[str, Any] | None:
            s = (c.kube.get("llmtrainingjob", "smoke", ns) or {}).get("status") or {}
            return s if s.get("phase") in ("Succeeded", "Failed") else None

        status = wait_for(finished, 540, "the smoke job to finish", interval=1.0)
        assert status["phase"] == "Succeeded", f"{status}\n{operator.logs()[-3000:]}"
        records = training.records(volume)
        result = audit(records, training.sample_order(volume))
        assert result.ok, result.problems
        assert result.steps == SMOKE_STEPS and {r["world_size"] for r in records} == {2}
        assert records[-1]["loss"] < records[0]["loss"], "the model learns"
    finally:
        c.kubectl("delete", "llmtrainingjob", "smoke", "-n", ns, "--wait=true", "--timeout=60s", check=False)
        operator.stop()
        c.kubectl("delete", "pvc", "smoke-shared", "-n", ns, "--wait=false", check=False)
        c.kubectl("delete", "pv", "smoke-shared", "--wait=false", check=False)
        shutil.rmtree(volume, ignore_errors=True)


def _trainer_processes(t: Training, pod: str) -> list[psutil.Process]:
    """The trainer processes of a worker pod: every descendant of its container's torchrun agent."""
    obj = t.cluster.kube.get("pod", pod, t.ns) or {}
    statuses = (obj.get("status") or {}).get("containerStatuses") or []
    agent = int(statuses[0]["containerID"].removeprefix("podrunner://"))
    return psutil.Process(agent).children(recursive=True)


def test_hung_trainer_is_restarted_and_training_resumes(train: Training) -> None:
    """SIGSTOP one worker's trainer (a hang: its agent stays alive, its peer blocks in a collective): the
    operator sees no step for progressTimeoutSeconds, restarts the workers (Stalled, restarts + 1), and
    training resumes from the newest checkpoint with no sample lost."""
    job = training.training_job(
        JOB,
        train.ns,
        minimum=2,
        maximum=2,
        steps=5000,
        failure_policy={"progressTimeoutSeconds": 10, "progressStartupSeconds": 180},
    )
    job["spec"]["terminationGracePeriodSeconds"] = 5  # a stopped trainer cannot checkpoint on SIGTERM
    train.apply(job)
    train.wait_steps("a checkpoint and 3 more steps", world=2, count=EVERY + 3)
    restarts = train.status().get("restarts", 0)
    frozen = _trainer_processes(train, f"{JOB}-worker-0")
    assert frozen, "worker-0 runs its trainer under torchrun"
    for proc in frozen:
        proc.send_signal(signal.SIGSTOP)
    hung_at = train.records()[-1]["time"]

    def stalled() -> dict[str, Any] | None:
        s = train.status()
        cond = next((c for c in s.get("conditions", []) if c["type"] == "Stalled"), None)
        return s if cond and cond["status"] == "True" and s.get("restarts", 0) > restarts else None

    seen = wait_for(stalled, 120, "the Stalled condition and a restart", interval=0.5)
    stall = next(c for c in seen["conditions"] if c["type"] == "Stalled")
    assert "step" in stall["message"], stall
    train.wait_steps("training to resume after the restart", world=2, count=3, after=hung_at)
    wait_for(
        lambda: any(
            c["type"] == "Stalled" and c["status"] == "False" for c in train.status().get("conditions", [])
        ),
        120,
        "Stalled to turn False once steps complete again",
    )
    result = train.audit()
    assert result.interruptions, result
    assert all(i.replayed <= MAX_REPLAY for i in result.interruptions), result.interruptions
