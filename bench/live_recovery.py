"""Recovery without restarting (``python -m llm_trainer`` in process): lost member and joiner, tiny model.

Three members train on a real etcd. Then ``--events`` times: SIGKILL a random member and evict it (what the
operator does when it sees the node die), measure the time from the kill to the first step completed by
the survivors and the completed steps they lost; then release a warm spare (a process that already
imported torch and built the model, waiting with ``--start-when``) and measure the time from its release
to the first step at full size. A new spare is started cold right after, so imports load the box during
the next event as they would on a shared node. ``--cold-joins`` more joins are measured from process start
(imports included). Finally the metrics log is checked: every step once, on the samples an uninterrupted
run uses.

    python bench/live_recovery.py --events 10 --cold-joins 3
    python bench/live_recovery.py --events 3 --cold-joins 0 --no-evict   # no operator: 3 s leases
    python bench/live_recovery.py --events 5 --cold-joins 0 --graceful   # SIGTERM: a drained node's leave

Writes a JSON report (``--out``) and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np
from llm_elastic import GlobalOrder, read_records
from llm_elastic.live.membership import evict
from llm_elastic.rendezvous.etcd_client import EtcdClient, parse_endpoints
from llm_testbed.local_etcd import LocalEtcd, etcd_binary
from llm_trainer.data.prepare import main as prepare
from llm_trainer.data.shards import TokenShards

PREFIX = "/live-bench/"
GLOBAL_BATCH = 12
SEQ_LEN = 32
SEED = 1234


def corpus(root: Path) -> Path:
    """A small generated corpus, prepared into token shards."""
    text = root / "text"
    text.mkdir(parents=True)
    rng = random.Random(7)
    words = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "elastic"]
    for index in range(6):
        (text / f"doc{index}.txt").write_text(" ".join(rng.choice(words) for _ in range(2500)))
    if prepare([str(text), "--output", str(root / "shards"), "--shard-tokens", "20000"]) != 0:
        raise SystemExit("preparing the corpus failed")
    return root / "shards"


class Job:
    """The members of one live job."""

    def __init__(self, data: Path, metrics: Path, etcd: str, logs: Path, step_seconds: float) -> None:
        self.data, self.metrics, self.etcd, self.logs = data, metrics, etcd, logs
        self.step_seconds = step_seconds
        self.members: dict[str, subprocess.Popen[bytes]] = {}
        self.count = 0

    def start(self, release: Path | None = None) -> tuple[str, subprocess.Popen[bytes]]:
        name = f"m{self.count}"
        self.count += 1
        argv = [
            sys.executable, "-m", "llm_trainer",
            "--data", str(self.data), "--step-log", str(self.metrics),
            "--checkpoint-dir", str(self.metrics.parent / "ckpt"), "--checkpoint-every", "0",
            "--metrics-port", "0",
            "--seq-len", str(SEQ_LEN), "--global-batch", str(GLOBAL_BATCH), "--micro-batch", "2",
            "--seed", str(SEED), "--steps", "1000000", "--min-step-seconds", str(self.step_seconds),
        ]  # fmt: skip
        if release is not None:
            argv += ["--start-when", str(release)]
        env = dict(
            os.environ,
            OMP_NUM_THREADS="1",
            PYTHONUNBUFFERED="1",
            LOGLEVEL="WARNING",
            LLMJOB_RECOVERY="inProcess",
            LLMJOB_LIVE_ETCD=self.etcd,
            LLMJOB_LIVE_PREFIX=PREFIX,
            LLMJOB_LIVE_MEMBER=name,
            LLMJOB_LIVE_MIN_MEMBERS="3",
        )
        with (self.logs / f"{name}.log").open("ab") as log:
            proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        self.members[name] = proc
        return name, proc

    def ready(self, name: str) -> bool:
        """Whether a warm spare finished its imports and waits for its release."""
        return '"event": "waiting"' in (self.logs / f"{name}.log").read_text(errors="replace")

    def records(self) -> list[dict[str, Any]]:
        return read_records(self.metrics) if self.metrics.exists() else []

    def training(self) -> list[str]:
        """Names of the members in the newest logged step."""
        last = self.records()[-1]
        pids = set(last["pids"] or [])
        return [n for n, p in self.members.items() if p.pid in pids and p.poll() is None]

    def close(self) -> None:
        for proc in self.members.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        for proc in self.members.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)


def wait(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.01)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def check_sequence(log: list[dict[str, Any]], data: Path) -> None:
    steps = [int(r["step"]) for r in log]
    if steps != list(range(1, len(steps) + 1)):
        raise SystemExit(f"steps lost or repeated in the metrics log: {steps}")
    order = GlobalOrder(TokenShards(data, SEQ_LEN).num_samples, SEED)
    for record in log:
        start = (int(record["step"]) - 1) * GLOBAL_BATCH
        ids = order.sample_ids(start, start + GLOBAL_BATCH)
        if record["samples_crc32"] != zlib.crc32(np.asarray(ids, dtype="<i8").tobytes()):
            raise SystemExit(f"step {record['step']} trained on other samples than an uninterrupted run")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=10, help="losses (and as many warm joins)")
    parser.add_argument("--cold-joins", type=int, default=3, help="joins measured from process start")
    parser.add_argument("--step-seconds", type=float, default=0.05, help="pad each step to this time")
    parser.add_argument(
        "--no-evict",
        action="store_true",
        help="do not evict lost members: they leave when their lease expires",
    )
    parser.add_argument(
        "--graceful",
        action="store_true",
        help="the member leaves on SIGTERM (a drained node, a scale down) instead of being killed",
    )
    parser.add_argument("--timeout", type=float, default=240.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default="live_recovery.json")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="live-bench-"))
    data = corpus(work)
    logs = work / "logs"
    logs.mkdir()
    loss_s: list[float] = []
    steps_lost: list[int] = []
    warm_s: list[float] = []
    cold_s: list[float] = []
    saves: list[int] = []
    """Checkpoints written between a loss and the survivors' first step (a graceful leave saved one?)."""
    with LocalEtcd(etcd_binary(), work / "etcd") as server:
        client = EtcdClient(parse_endpoints(server.endpoint))
        job = Job(data, work / "metrics.jsonl", server.endpoint, logs, args.step_seconds)
        try:
            for _ in range(3):
                job.start()
            release = work / "release-0"
            job.start(release)
            wait(lambda: len(job.records()) >= 5, args.timeout, "the first steps of three members")
            for event in range(args.events):
                spare_name = f"m{job.count - 1}"
                wait(lambda n=spare_name: job.ready(n), args.timeout, "the warm spare to finish starting")
                # -- a lost member --
                name = rng.choice(job.training())
                before = job.records()
                last_step = int(before[-1]["step"])
                saved_before = len(list((work / "ckpt").glob("step-*")))
                killed_at = time.time()
                if args.graceful:
                    os.killpg(job.members[name].pid, signal.SIGTERM)
                else:
                    os.killpg(job.members[name].pid, signal.SIGKILL)
                    if not args.no_evict:
                        evict(client, PREFIX, name)
                job.members[name].wait(120)

                def resumed(n: int = len(before)) -> dict[str, Any] | None:
                    for record in job.records()[n:]:
                        if record["world_size"] == 2 and record["resumed_from"] is not None:
                            return record
                    return None

                first = wait(resumed, args.timeout, f"steps after losing {name}")
                loss_s.append(first["time"] - killed_at)
                saves.append(len(list((work / "ckpt").glob("step-*"))) - saved_before)
                steps_lost.append(max(0, last_step - int(first["resumed_from"])))
                # -- a warm spare joins --
                spare = job.members[f"m{job.count - 1}"]
                released_at = time.time()
                release.touch()

                def full(pid: int = spare.pid) -> bool:
                    return any(r["world_size"] == 3 and pid in (r["pids"] or []) for r in job.records())

                wait(full, args.timeout, "a step at full size with the spare")
                hit = next(
                    r for r in job.records() if r["world_size"] == 3 and spare.pid in (r["pids"] or [])
                )
                warm_s.append(hit["time"] - released_at)
                release = work / f"release-{event + 1}"
                job.start(release)  # the next warm spare, importing while the next event runs
                print(
                    f"event {event + 1}: lost {name} -> first step {loss_s[-1]:.2f}s "
                    f"(steps lost {steps_lost[-1]}); warm join {warm_s[-1]:.2f}s",
                    flush=True,
                )
            for _ in range(args.cold_joins):
                name = rng.choice(job.training())
                before = job.records()
                os.killpg(job.members[name].pid, signal.SIGKILL)
                evict(client, PREFIX, name)
                count = len(before)
                wait(lambda c=count: any(r["world_size"] == 2 for r in job.records()[c:]), 120, "resume")
                started = time.time()
                _, proc = job.start()

                def cold_full(pid: int = proc.pid) -> dict[str, Any] | None:
                    return next(
                        (r for r in job.records() if r["world_size"] == 3 and pid in (r["pids"] or [])), None
                    )

                hit = wait(cold_full, args.timeout, "a step at full size with the cold joiner")
                cold_s.append(hit["time"] - started)
                print(f"cold join {len(cold_s)}: {cold_s[-1]:.2f}s", flush=True)
            check_sequence(job.records(), data)
        finally:
            job.close()
            client.close()

    def row(label: str, values: list[float]) -> str:
        if not values:
            return f"| {label} | 0 | - | - | - |"
        return (
            f"| {label} | {len(values)} | {statistics.median(values):.2f} | {percentile(values, 0.99):.2f} "
            f"| {max(values):.2f} |"
        )

    report = {
        "lost_to_first_step_s": loss_s,
        "steps_lost": steps_lost,
        "warm_join_s": warm_s,
        "cold_join_s": cold_s,
        "checkpoints_saved_per_loss": saves,
    }
    Path(args.out).write_text(json.dumps(report, indent=2))
    print("| event | n | p50 s | p99 s | max s |")
    print("|---|---|---|---|---|")
    how = (
        "SIGTERM, graceful"
        if args.graceful
        else "SIGKILL, lease expiry"
        if args.no_evict
        else "SIGKILL + evict"
    )
    print(row(f"lost member ({how}) -> first step after resume", loss_s))
    print(row("warm spare released -> first step at full size", warm_s))
    print(row("cold joiner started -> first step at full size", cold_s))
    print(f"completed steps lost per loss event: {steps_lost} (sum {sum(steps_lost)})")
    print(f"checkpoints written between a loss and the next step: {saves}")
    print(f"metrics log: {len(job.records())} steps, each once, on the uninterrupted run's samples")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
