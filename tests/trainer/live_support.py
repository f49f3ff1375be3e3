"""Helpers of the live-recovery tests and benchmark: start members, read the metrics and events."""

from __future__ import annotations

import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import numpy as np
from llm_elastic.metrics import read_records
from llm_elastic.order import GlobalOrder
from llm_trainer.data.shards import TokenShards
from trainer_support import Processes, trainer_env

GLOBAL_BATCH = 12
SEQ_LEN = 32
SEED = 1234


Member = tuple[list[str], dict[str, str]]
"""A member's argv and the environment the operator would give it."""

# Options that are the operator's contract (env) rather than the trainer's command line.
CONTRACT_OPTIONS = {
    "--min-members": "LLMJOB_LIVE_MIN_MEMBERS",
}


def member_argv(corpus: Path, metrics: Path, etcd: str, prefix: str, member: str, *extra: str) -> Member:
    """One in-process member of ``python -m llm_trainer`` with the tiny model (the trainer tests' batch
    settings): the etcd, prefix and member id go in the env as the operator sets them. ``--shard-size S``
    (HSDP) becomes ``LOCAL_WORLD_SIZE`` with ``LOCAL_RANK`` from the member id ``<host>.<n>``."""
    env = {
        "LLMJOB_RECOVERY": "inProcess",
        "LLMJOB_LIVE_ETCD": etcd,
        "LLMJOB_LIVE_PREFIX": prefix,
        "LLMJOB_LIVE_MEMBER": member,
    }
    args: list[str] = []
    rest = list(extra)
    while rest:
        option = rest.pop(0)
        if option in CONTRACT_OPTIONS:
            env[CONTRACT_OPTIONS[option]] = rest.pop(0)
        elif option == "--shard-size":
            env["LOCAL_WORLD_SIZE"] = rest.pop(0)
            env["LOCAL_RANK"] = member.rsplit(".", 1)[1]
        else:
            args.append(option)
    argv = [
        sys.executable,
        "-m",
        "llm_trainer",
        "--data",
        str(corpus),
        "--step-log",
        str(metrics),
        "--seq-len",
        str(SEQ_LEN),
        "--global-batch",
        str(GLOBAL_BATCH),
        "--micro-batch",
        "2",
        "--seed",
        str(SEED),
        "--lease-ttl",
        "3",
        "--metrics-port",
        "0",
        "--checkpoint-every",
        "0",
        "--async-checkpoint",
        "false",
        *args,
    ]
    return argv, env


def start_member(procs: Processes, member: Member, name: str) -> subprocess.Popen[bytes]:
    """Start a member with one thread and INFO logs."""
    argv, env = member
    return procs.start(argv, name, env=trainer_env({"LOGLEVEL": "INFO", **env}))


def records(metrics: Path) -> list[dict[str, Any]]:
    """Step records so far (empty before the first step)."""
    return read_records(metrics) if metrics.exists() else []


def check_exact_sequence(log: list[dict[str, Any]], corpus: Path) -> None:
    """Steps 1..N each exactly once, each on exactly the samples an uninterrupted run uses."""
    steps = [int(r["step"]) for r in log]
    assert steps == list(range(1, len(steps) + 1)), f"steps lost or repeated: {steps}"
    order = GlobalOrder(TokenShards(corpus, SEQ_LEN).num_samples, SEED)
    for record in log:
        start = (int(record["step"]) - 1) * GLOBAL_BATCH
        assert (record["sample_start"], record["sample_end"]) == (start, start + GLOBAL_BATCH), record
        ids = order.sample_ids(start, start + GLOBAL_BATCH)
        assert record["samples_crc32"] == zlib.crc32(np.asarray(ids, dtype="<i8").tobytes()), record
