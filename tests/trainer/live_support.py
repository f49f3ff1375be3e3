"""Helpers of the live-recovery tests and benchmark: start members, read the metrics and events."""

from __future__ import annotations

import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import numpy as np
from llm_trainer.data.order import GlobalOrder
from llm_trainer.data.shards import TokenShards
from llm_trainer.metrics import read_records
from trainer_support import Processes, trainer_env

GLOBAL_BATCH = 12
SEQ_LEN = 32
SEED = 1234


def member_argv(corpus: Path, metrics: Path, etcd: str, prefix: str, member: str, *extra: str) -> list[str]:
    """One member of the live driver with the tiny model (same batch settings as the trainer tests)."""
    return [
        sys.executable,
        "-m",
        "llm_trainer.live",
        "--data",
        str(corpus),
        "--metrics",
        str(metrics),
        "--etcd",
        etcd,
        "--prefix",
        prefix,
        "--member",
        member,
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
        *extra,
    ]


def start_member(procs: Processes, argv: list[str], name: str) -> subprocess.Popen[bytes]:
    """Start a member with one thread and INFO logs."""
    return procs.start(argv, name, env=trainer_env({"LOGLEVEL": "INFO"}))


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
