"""Recovery time after a lost node: etcd-v3 vs torch's c10d rendezvous, side by side, tiny model on CPU.

For each backend: three torchrun agents (``--nnodes=1:3``, one worker each) train the tiny model; then,
``--kills`` times: kill a random agent with its worker (a lost node), measure the time from the kill to the
first step completed after the survivors resumed (from metrics.jsonl), start a replacement agent and wait
until the world is back to 3 (the scale-up time is reported too). The c10d backend talks to
``python -m llm_elastic.rendezvous.tcpstore_server`` (the operator's dedicated rendezvous pod).

    python bench/trainer_recovery.py --kills 10                 # both backends, tuned rendezvous settings
    python bench/trainer_recovery.py --backends c10d --conf default --kills 3   # torch's defaults

Writes a JSON report (``--out``) and prints a Markdown table. A recovery slower than ``--timeout`` counts as
a failure (reported as such, not as a number).
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
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import psutil
from llm_elastic import read_records
from llm_testbed.local_etcd import LocalEtcd, etcd_binary, free_port
from llm_trainer.data.prepare import main as prepare

TUNED_CONF = (
    "join_timeout=900,last_call_timeout=2,close_timeout=10,heartbeat_timeout=5,"
    "keep_alive_interval=1,keep_alive_max_attempt=3"
)
BIN = Path(sys.executable).parent
SERIES = ("recovery_s", "rendezvous_s", "worker_start_s", "regrow_s")


class Agents:
    """The torchrun agents of one job."""

    def __init__(self, argv: list[str], logs: Path, env: dict[str, str]) -> None:
        self.argv = argv
        self.logs = logs
        self.env = env
        self.alive: list[subprocess.Popen[bytes]] = []
        self.count = 0

    def start(self) -> subprocess.Popen[bytes]:
        self.count += 1
        with (self.logs / f"agent{self.count}.log").open("ab") as log:
            proc = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
            )
        self.alive.append(proc)
        return proc

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        kill_tree(proc)
        self.alive.remove(proc)

    def close(self) -> None:
        for proc in list(self.alive):
            kill_tree(proc)
        self.alive.clear()


def kill_tree(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL a process, its group and all descendants (torchrun workers run in their own sessions)."""
    try:
        pids = [proc.pid, *(c.pid for c in psutil.Process(proc.pid).children(recursive=True))]
    except psutil.NoSuchProcess:
        pids = []
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(30)


def records(ckpt: Path) -> list[dict[str, Any]]:
    path = ckpt / "metrics.jsonl"
    return read_records(path) if path.exists() else []


def last(ckpt: Path) -> dict[str, Any]:
    found = records(ckpt)
    return found[-1] if found else {}


def first_after(ckpt: Path, restart: int, world_size: int | None = None) -> dict[str, Any] | None:
    """The first step logged by a trainer start later than ``restart`` (optionally at ``world_size``)."""
    for record in records(ckpt):
        if record["restart"] > restart and world_size in (None, record["world_size"]):
            return record
    return None


def wait(fn: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(0.2)
    return None


def run_backend(
    backend: str,
    conf: str,
    kills: int,
    timeout: float,
    corpus: Path,
    work: Path,
    endpoints: dict[str, str],
    rng: random.Random,
) -> dict[str, Any]:
    ckpt = work / f"ckpt-{backend}-{conf}"
    logs = work / f"logs-{backend}-{conf}"
    logs.mkdir(parents=True)
    argv = [
        str(BIN / "torchrun"),
        "--nnodes=1:3",
        "--nproc-per-node=1",
        f"--rdzv-backend={backend}",
        f"--rdzv-endpoint={endpoints[backend]}",
        f"--rdzv-id={uuid.uuid4().hex[:12]}",
        "--max-restarts=100",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    env.setdefault("LOGLEVEL", "WARNING")
    if conf == "tuned":
        argv.append(f"--rdzv-conf={TUNED_CONF}")
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    argv += [
        "-m", "llm_trainer", "--data", str(corpus), "--checkpoint-dir", str(ckpt), "--model", "tiny",
        "--seq-len", "32", "--global-batch", "12", "--micro-batch", "2", "--steps", "1000000",
        "--checkpoint-every", "5", "--min-step-seconds", "0.25", "--metrics-port", "0",
    ]  # fmt: skip
    agents = Agents(argv, logs, env)
    result: dict[str, Any] = {
        "backend": backend,
        "conf": conf,
        "recovery_s": [],
        "rendezvous_s": [],
        "worker_start_s": [],
        "regrow_s": [],
        "failures": 0,
    }
    try:
        for _ in range(3):
            agents.start()
        if not wait(lambda: any(r["world_size"] == 3 for r in records(ckpt)), 300):
            raise RuntimeError(f"{backend}: the first rendezvous of 3 nodes did not complete")
        for index in range(kills):
            wait(lambda: last(ckpt).get("world_size") == 3, 60)
            before = records(ckpt)[-1]["restart"]
            victim = rng.choice(agents.alive)
            killed_at = time.time()
            agents.kill(victim)
            resumed = wait(lambda b=before: first_after(ckpt, b), timeout)
            if resumed is None:
                result["failures"] += 1
                print(f"{backend}/{conf} kill {index + 1}: no step within {timeout:g}s", flush=True)
                agents.close()
                for _ in range(3):
                    agents.start()
                wait(lambda: last(ckpt).get("world_size") == 3, 300)
                continue
            recovery = resumed["time"] - killed_at
            result["recovery_s"].append(round(recovery, 2))
            if resumed.get("process_started"):  # kill -> new worker process: detection + rendezvous
                result["rendezvous_s"].append(round(resumed["process_started"] - killed_at, 2))
                result["worker_start_s"].append(round(resumed["time"] - resumed["process_started"], 2))
            after = records(ckpt)[-1]["restart"]
            joined_at = time.time()
            agents.start()
            grown = wait(lambda a=after: first_after(ckpt, a, world_size=3), timeout)
            regrow = grown["time"] - joined_at if grown else None
            if regrow is not None:
                result["regrow_s"].append(round(regrow, 2))
            print(
                f"{backend}/{conf} kill {index + 1}: resumed at world {resumed['world_size']} "
                f"after {recovery:.1f}s (from step {resumed['resumed_from']}), regrow {regrow}",
                flush=True,
            )
    finally:
        agents.close()
    return result


def summary(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p99": None, "min": None, "max": None}
    return {
        "p50": round(statistics.median(values), 2),
        "p99": round(float(np.percentile(values, 99)), 2),
        "min": min(values),
        "max": max(values),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--backends", default="etcd-v3,c10d")
    parser.add_argument("--conf", choices=["tuned", "default"], default="tuned")
    parser.add_argument("--timeout", type=float, default=180.0, help="give up on one recovery after this")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("trainer_recovery.json"))
    args = parser.parse_args()

    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="trainer-recovery-"))
    text = work / "text"
    text.mkdir()
    words = [
        "elastic",
        "training",
        "resumes",
        "from",
        "the",
        "newest",
        "checkpoint",
        "after",
        "every",
        "membership",
        "change",
    ]
    for i in range(4):
        (text / f"d{i}.txt").write_text(" ".join(rng.choice(words) for _ in range(4000)))
    prepare([str(text), "-o", str(work / "shards"), "--shard-tokens", "20000"])

    etcd = LocalEtcd(etcd_binary(), work / "etcd").start()
    port = free_port()
    tcpstore = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "llm_elastic.rendezvous.tcpstore_server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoints = {"etcd-v3": etcd.endpoint, "c10d": f"127.0.0.1:{port}"}
    results = []
    started = time.monotonic()
    try:
        for backend in args.backends.split(","):
            results.append(
                run_backend(
                    backend, args.conf, args.kills, args.timeout, work / "shards", work, endpoints, rng
                )
            )
    finally:
        tcpstore.send_signal(signal.SIGTERM)
        tcpstore.wait(30)
        etcd.stop()
    report = {
        "machine": f"{os.cpu_count()} cores, {platform_text()}",
        "minutes": round((time.monotonic() - started) / 60, 1),
        "conf": TUNED_CONF if args.conf == "tuned" else "torch defaults",
        "results": [{**r, **{k.removesuffix("_s"): summary(r[k]) for k in SERIES}} for r in results],
    }
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(
        "\n| backend | conf | kills | failures | recovery p50 | p99 | max "
        "| kill -> new worker p50 | worker start -> step p50 | regrow p50 |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in report["results"]:
        rec = r["recovery"]
        print(
            f"| {r['backend']} | {r['conf']} | {len(r['recovery_s']) + r['failures']} | {r['failures']} | "
            f"{rec['p50']} s | {rec['p99']} s | {rec['max']} s | {r['rendezvous']['p50']} s | "
            f"{r['worker_start']['p50']} s | {r['regrow']['p50']} s |"
        )
    return 0


def platform_text() -> str:
    import platform

    return f"{platform.machine()} {platform.processor() or ''}, Python {platform.python_version()}".strip()


if __name__ == "__main__":
    sys.exit(main())
