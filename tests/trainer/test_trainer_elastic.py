"""Elastic run: three torchrun agents on the etcd-v3 rendezvous lose one node and gain one back.

The metrics log must show world sizes 3 -> 2 -> 3, and a sample sequence with no gap and no repeat beyond
the steps replayed after the checkpoint that training resumed from.
"""

from __future__ import annotations

import itertools
import signal
import subprocess
import sys
import time
import uuid
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
from llm_elastic.metrics import read_records
from llm_elastic.order import GlobalOrder
from llm_testbed.local_etcd import LocalEtcd
from llm_trainer.data.shards import TokenShards
from trainer_support import Processes, train_argv, wait_for

pytestmark = pytest.mark.trainer

TORCHRUN = str(Path(sys.executable).parent / "torchrun")
STEPS = 60
EVERY = 5
BATCH = 12
SEED = 1234
RDZV_CONF = (
    "join_timeout=180,last_call_timeout=2,close_timeout=10,heartbeat_timeout=5,"
    "keep_alive_interval=1,keep_alive_max_attempt=3"
)


def agent_argv(
    etcd: LocalEtcd, run_id: str, corpus: Path, ckpt: Path, steps: int = STEPS, nnodes: str = "1:3"
) -> list[str]:
    trainer = train_argv(corpus, ckpt, "--steps", str(steps), "--checkpoint-every", str(EVERY))
    trainer += ["--min-step-seconds", "0.3", "--seed", str(SEED)]
    return [
        TORCHRUN,
        f"--nnodes={nnodes}",
        "--nproc-per-node=1",
        "--rdzv-backend=etcd-v3",
        f"--rdzv-endpoint={etcd.endpoint}",
        f"--rdzv-id={run_id}",
        f"--rdzv-conf={RDZV_CONF}",
        "--max-restarts=10",
        *trainer[1:],  # torchrun runs `-m llm_trainer ...` with this interpreter
    ]


def records(ckpt: Path) -> list[dict[str, Any]]:
    path = ckpt / "metrics.jsonl"
    return read_records(path) if path.exists() else []


def rank0_agent(agents: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes] | None:
    """The agent whose worker is global rank 0 (also the host of the workers' TCPStore)."""
    for agent in agents:
        try:
            for child in psutil.Process(agent.pid).children(recursive=True):
                if child.environ().get("RANK") == "0":
                    return agent
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return None


def test_lose_a_node_then_gain_one(etcd: LocalEtcd, corpus: Path, tmp_path: Path, procs: Processes) -> None:
    ckpt = tmp_path / "ckpt"
    argv = agent_argv(etcd, uuid.uuid4().hex[:12], corpus, ckpt)
    agents = [procs.start(argv, f"agent{i}") for i in range(3)]

    def alive() -> bool:
        return all(a.poll() is None for a in agents)

    wait_for(
        lambda: any(r["world_size"] == 3 and r["step"] >= 7 for r in records(ckpt)) or not alive(),
        240,
        "step 7 at world size 3",
    )
    assert alive(), procs.dump()

    # A node is lost: kill the agent of rank 0 with its worker (the hardest member to lose).
    victim = wait_for(lambda: rank0_agent(agents), 30, "the agent of rank 0")
    procs.kill_group(victim)
    victim.wait(timeout=30)
    killed_at = time.time()
    survivors = [a for a in agents if a is not victim]
    wait_for(
        lambda: (
            any(r["world_size"] == 2 for r in records(ckpt)) or any(a.poll() is not None for a in survivors)
        ),
        180,
        "training to resume at world size 2",
    )
    first_w2 = next(r for r in records(ckpt) if r["world_size"] == 2)
    print(f"recovered at world size 2 after {first_w2['time'] - killed_at:.1f}s")
    wait_for(lambda: sum(r["world_size"] == 2 for r in records(ckpt)) >= 3, 60, "three steps at world size 2")

    # Capacity comes back: a new agent joins and the world grows to 3 again.
    joined_after = records(ckpt)[-1]["restart"]
    joiner = procs.start(argv, "agent-join")
    wait_for(
        lambda: any(r["world_size"] == 3 and r["restart"] > joined_after for r in records(ckpt)),
        240,
        "world size 3 after the join",
    )
    for agent in [*survivors, joiner]:
        assert agent.wait(timeout=300) == 0, procs.dump()

    check_sample_sequence(records(ckpt), corpus)


def check_sample_sequence(log: list[dict[str, Any]], corpus: Path) -> None:
    order = GlobalOrder(TokenShards(corpus, 32).num_samples, SEED)
    # Every step trained on its own global batch: positions [(s-1)B, sB) and exactly those sample ids.
    for record in log:
        step = record["step"]
        assert (record["sample_start"], record["sample_end"]) == ((step - 1) * BATCH, step * BATCH)
        ids = order.sample_ids(record["sample_start"], record["sample_end"])
        assert record["samples_crc32"] == zlib.crc32(np.asarray(ids, dtype="<i8").tobytes())

    # Split the log into runs (one per trainer start) and check how each run continues the previous one.
    runs: list[list[dict[str, Any]]] = []
    for record in log:
        if not runs or record["restart"] != runs[-1][-1]["restart"]:
            runs.append([])
        runs[-1].append(record)
    assert [r[0]["world_size"] for r in runs][:1] == [3]
    sizes = [run[0]["world_size"] for run in runs]
    assert 2 in sizes and sizes.index(2) < len(sizes) - 1 and 3 in sizes[sizes.index(2) :], sizes
    for previous, run in itertools.pairwise(runs):
        steps = [r["step"] for r in run]
        assert steps == list(range(steps[0], steps[0] + len(steps))), "steps within a run are consecutive"
        resumed = run[0]["resumed_from"]
        assert resumed is not None and steps[0] == resumed + 1, "a run starts right after its checkpoint"
        last = previous[-1]["step"]
        # No gap: the checkpoint is at most the last step done; repeats only replay steps after it.
        assert resumed <= last
        assert last - resumed < EVERY or resumed == last, "replay is bounded by the checkpoint interval"
    # The scale-up stop was graceful: the run after the last world-size change replays nothing.
    grow = max(i for i, run in enumerate(runs) if i and run[0]["world_size"] > runs[i - 1][-1]["world_size"])
    assert runs[grow][0]["resumed_from"] == runs[grow - 1][-1]["step"]
    assert sorted({r["step"] for r in log}) == list(range(1, STEPS + 1))


def test_sigterm_to_one_node_saves_and_the_other_continues(
    etcd: LocalEtcd, corpus: Path, tmp_path: Path, procs: Processes
) -> None:
    """A pod deleted by the operator: its agent gets SIGTERM, every rank saves the same step, the signalled
    rank exits 0, the other re-rendezvous alone and resumes from that step with nothing replayed."""
    ckpt = tmp_path / "ckpt"
    argv = agent_argv(etcd, uuid.uuid4().hex[:12], corpus, ckpt)
    argv[1] = "--nnodes=1:2"
    steps = 30
    argv[argv.index("--steps") + 1] = str(steps)
    agents = [procs.start(argv, f"agent{i}") for i in range(2)]
    wait_for(
        lambda: (
            any(r["world_size"] == 2 and r["step"] >= 7 for r in records(ckpt))
            or any(a.poll() is not None for a in agents)
        ),
        240,
        "step 7 at world size 2",
    )
    leaving, staying = agents
    leaving.send_signal(signal.SIGTERM)  # torchrun forwards it to its worker
    leaving.wait(timeout=120)
    assert staying.wait(timeout=240) == 0, procs.dump()

    log = records(ckpt)
    before = [r for r in log if r["restart"] == 0]
    after = [r for r in log if r["restart"] > 0]
    assert before and after and {r["world_size"] for r in after} == {1}
    stopped_at = before[-1]["step"]
    assert after[0]["resumed_from"] == stopped_at and after[0]["step"] == stopped_at + 1  # no replay
    assert [r["step"] for r in after] == list(range(stopped_at + 1, steps + 1))
