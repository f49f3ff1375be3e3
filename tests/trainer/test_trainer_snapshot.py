"""In-memory snapshots with real processes: a restarted worker resumes from its node's shared memory, a
lost node's shards come back from the buddy copy, and a memory restore continues bit-identically."""

from __future__ import annotations

import shutil
import sys
import uuid
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
from llm_elastic.checkpoint import complete_checkpoints
from llm_elastic.contract import SNAPSHOT_ENV as SNAPSHOT_DIR_ENV
from llm_elastic.metrics import read_records
from llm_elastic.order import GlobalOrder
from llm_elastic.snapshot.store import inventory
from llm_testbed.local_etcd import LocalEtcd
from llm_trainer.data.shards import TokenShards
from trainer_support import Processes, launch_world, train_argv, trainer_env, wait_for

pytestmark = pytest.mark.trainer

TORCHRUN = str(Path(sys.executable).parent / "torchrun")
BATCH = 12
SEED = 1234
RDZV_CONF = (
    "join_timeout=180,last_call_timeout=1,close_timeout=10,heartbeat_timeout=5,"
    "keep_alive_interval=1,keep_alive_max_attempt=3"
)


def records(ckpt: Path) -> list[dict[str, Any]]:
    path = ckpt / "metrics.jsonl"
    return read_records(path) if path.exists() else []


def check_samples(log: list[dict[str, Any]], corpus: Path) -> None:
    """Every step trained on exactly its own global batch of the seeded order."""
    order = GlobalOrder(TokenShards(corpus, 32).num_samples, SEED)
    for record in log:
        step = record["step"]
        assert (record["sample_start"], record["sample_end"]) == ((step - 1) * BATCH, step * BATCH)
        ids = order.sample_ids(record["sample_start"], record["sample_end"])
        assert record["samples_crc32"] == zlib.crc32(np.asarray(ids, dtype="<i8").tobytes())


def check_resumed_from_memory(log: list[dict[str, Any]], snapshotted: int, steps: int) -> None:
    """The run after the failure restored from memory, at least the step known to be ``snapshotted`` and
    losing at most one step of the failed run, and continued to the end."""
    after = [r for r in log if r["restart"] > 0]
    assert after, "no step after the restart"
    first = after[0]
    assert first["restore_source"] == "memory", first
    last_done = max(r["step"] for r in log if r["restart"] == 0)
    assert first["resumed_from"] >= max(snapshotted, last_done - 1), (first["resumed_from"], last_done)
    assert first["step"] == first["resumed_from"] + 1
    assert sorted({r["step"] for r in log}) == list(range(1, steps + 1))


def worker_pids(agent_pid: int) -> list[psutil.Process]:
    try:
        children = psutil.Process(agent_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    return [c for c in children if "RANK" in _environ(c)]


def _environ(proc: psutil.Process) -> dict[str, str]:
    try:
        return proc.environ()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return {}


def agent_argv(etcd: LocalEtcd, nnodes: str, nproc: int, trainer: list[str]) -> list[str]:
    return [
        TORCHRUN,
        f"--nnodes={nnodes}",
        f"--nproc-per-node={nproc}",
        "--rdzv-backend=etcd-v3",
        f"--rdzv-endpoint={etcd.endpoint}",
        f"--rdzv-id={uuid.uuid4().hex[:12]}",
        f"--rdzv-conf={RDZV_CONF}",
        "--max-restarts=3",
        *trainer[1:],  # torchrun runs `-m llm_trainer ...` with this interpreter
    ]


def test_restarted_worker_resumes_from_its_node_memory(
    etcd: LocalEtcd, corpus: Path, tmp_path: Path, procs: Processes
) -> None:
    ckpt = tmp_path / "ckpt"
    steps = 14
    trainer = train_argv(
        corpus, ckpt, "--steps", str(steps), "--checkpoint-every", "0", "--snapshot-every", "1"
    )
    trainer += ["--min-step-seconds", "0.2", "--seed", str(SEED)]
    argv = agent_argv(etcd, "1", 2, trainer)
    env = trainer_env({SNAPSHOT_DIR_ENV: str(tmp_path / "shm-node0")})
    agent = procs.start(argv, "agent", env=env)
    wait_for(lambda: any(r["step"] >= 5 for r in records(ckpt)) or agent.poll() is not None, 180, "step 5")
    assert agent.poll() is None, procs.dump()

    victim = wait_for(
        lambda: next((p for p in worker_pids(agent.pid) if _environ(p)["RANK"] == "1"), None), 30, "rank 1"
    )
    snapshotted = max(h["step"] for h in inventory(tmp_path / "shm-node0"))
    victim.kill()  # the worker process dies; its agent restarts the workers on the same node
    assert agent.wait(timeout=240) == 0, procs.dump()

    log = records(ckpt)
    check_resumed_from_memory(log, snapshotted, steps)
    # Nothing came from a checkpoint: none existed before the end of training.
    assert [c.step for c in complete_checkpoints(ckpt)] == [steps]
    check_samples(log, corpus)


def test_lost_node_restores_from_the_buddy_copy(
    etcd: LocalEtcd, corpus: Path, tmp_path: Path, procs: Processes
) -> None:
    """Two nodes (one worker each, FSDP: each holds half the state). One node is lost with its memory; the
    survivor and a fresh replacement restore from memory: the lost shard from the survivor's buddy copy."""
    ckpt = tmp_path / "ckpt"
    steps = 16
    trainer = train_argv(
        corpus, ckpt, "--steps", str(steps), "--checkpoint-every", "0", "--snapshot-every", "1"
    )
    trainer += ["--min-step-seconds", "0.3", "--seed", str(SEED), "--parallel", "fsdp"]
    argv = agent_argv(etcd, "2:2", 1, trainer)

    def node(name: str) -> dict[str, str]:
        return trainer_env({SNAPSHOT_DIR_ENV: str(tmp_path / f"shm-{name}")})

    survivor = procs.start(argv, "node-a", env=node("a"))
    lost = procs.start(argv, "node-b", env=node("b"))
    wait_for(
        lambda: (
            any(r["step"] >= 5 for r in records(ckpt))
            or survivor.poll() is not None
            or lost.poll() is not None
        ),
        240,
        "step 5 on two nodes",
    )
    assert survivor.poll() is None and lost.poll() is None, procs.dump()

    def replicated_up_to_last_step() -> int:
        """The last logged step when node a holds its own shard and node b's copy of it, else 0."""
        last = records(ckpt)[-1]["step"]
        held = inventory(tmp_path / "shm-a")
        kinds = {h["kind"] for h in held if h["step"] == last}
        return last if kinds == {"local", "buddy"} else 0

    last_before = wait_for(replicated_up_to_last_step, 60, "the last step's shards on node a")
    procs.kill_group(lost)  # the node is gone: agent, worker and its memory
    lost.wait(timeout=30)
    shutil.rmtree(tmp_path / "shm-b")
    replacement = procs.start(argv, "node-c", env=node("c"))
    wait_for(lambda: any(r["restart"] > 0 for r in records(ckpt)), 240, "training to resume after the loss")
    # The restore read nothing from the checkpoint directory: it holds no checkpoint at all.
    assert complete_checkpoints(ckpt) == [] and not list(ckpt.glob("step-*"))
    for agent in (survivor, replacement):
        assert agent.wait(timeout=240) == 0, procs.dump()

    log = records(ckpt)
    check_resumed_from_memory(log, last_before, steps)
    first_after = next(r for r in log if r["restart"] > 0)
    assert first_after["restore_peers"] >= 1, "the replacement's shard must come over the network"
    assert first_after["world_size"] == 2
    check_samples(log, corpus)


def test_memory_restore_continues_bit_identically(corpus: Path, tmp_path: Path, procs: Processes) -> None:
    """FSDP over two ranks: stop at step 4 with a snapshot, resume from memory to step 7; the losses equal
    those of an uninterrupted run (model, optimizer and data position all came back)."""
    common = ["--seed", str(SEED), "--parallel", "fsdp", "--checkpoint-every", "0"]
    ckpt = tmp_path / "ckpt"
    snap = ["--snapshot-every", "2", "--snapshot-dir", str(tmp_path / "shm")]
    for steps in ("4", "7"):
        ranks = launch_world(
            procs, [*train_argv(corpus, ckpt, "--steps", steps), *common, *snap], 2, f"run{steps}"
        )
        for proc in ranks:
            assert proc.wait(timeout=180) == 0, procs.dump()
    # The final checkpoint of the first run (step 4) is no newer than the snapshot: memory wins.
    resumed = [r for r in records(ckpt) if r["restart"] == 1]
    assert [r["step"] for r in resumed] == [5, 6, 7] and resumed[0]["restore_source"] == "memory"

    ref = tmp_path / "ref"
    ranks = launch_world(procs, [*train_argv(corpus, ref, "--steps", "7"), *common], 2, "reference")
    for proc in ranks:
        assert proc.wait(timeout=180) == 0, procs.dump()
    expected = {r["step"]: r["loss"] for r in records(ref)}
    assert {r["step"]: r["loss"] for r in resumed} == {s: expected[s] for s in (5, 6, 7)}
