"""Recovery layers with real processes on a real etcd: a local error is not a membership change.

Two members run as the operator runs them (``python -m llm_elastic.supervise -- python -m llm_trainer``,
member ids ``<pod>.<local rank>-<pid>``). A bug in one member's step (layer 1 must not treat it as a lost
peer and re-form for ever) makes that process leave the membership at once and exit; its supervisor
restarts it inside the same "pod" (layer 2), the new process joins and gets the state from the survivor,
which never stopped. Every step is trained exactly once, and the members count the restart for the operator
(``llm_trainer_job_process_restarts``, which it adds to the job's restarts).
"""

from __future__ import annotations

import re
import sys
import urllib.request
from pathlib import Path

from live_support import GLOBAL_BATCH, SEED, SEQ_LEN, check_exact_sequence, records
from llm_testbed.local_etcd import free_port
from support.live_events import events
from trainer_support import Processes, trainer_env, wait_for

STARTUP = 240.0
EVENT = 120.0
FAULT_STEP = 8


def member(
    corpus: Path, metrics: Path, etcd: str, pod: str, port: int = 0, **env: str
) -> tuple[list[str], dict[str, str]]:
    argv = [
        sys.executable, "-m", "llm_elastic.supervise", "--max-restarts", "2", "--",
        sys.executable, "-m", "llm_trainer", "--data", str(corpus), "--step-log", str(metrics),
        "--seq-len", str(SEQ_LEN), "--global-batch", str(GLOBAL_BATCH), "--micro-batch", "2",
        "--seed", str(SEED), "--steps", "100000", "--checkpoint-every", "0", "--metrics-port", str(port),
        "--min-step-seconds", "0.05", "--async-checkpoint", "false",
    ]  # fmt: skip
    contract = {
        "LLMJOB_RECOVERY": "inProcess",
        "LLMJOB_LIVE_ETCD": etcd,
        "LLMJOB_LIVE_PREFIX": "/layers/",
        "LLMJOB_LIVE_MIN_MEMBERS": "2",
        "LLMJOB_POD_NAME": pod,
        "LOGLEVEL": "INFO",
    }
    return argv, trainer_env({**contract, **env})


def test_a_bug_in_one_member_restarts_only_that_process_which_rejoins_from_a_peer(
    etcd: object, corpus: Path, tmp_path: Path, procs: Processes
) -> None:
    endpoint = etcd.endpoint  # type: ignore[attr-defined]
    metrics = tmp_path / "metrics.jsonl"
    port = free_port()
    argv, env = member(corpus, metrics, endpoint, "pod-a", port)
    survivor = procs.start(argv, "pod-a", env=env)
    argv, env = member(corpus, metrics, endpoint, "pod-b", LLM_TRAINER_FAULT_RAISE_AT_STEP=str(FAULT_STEP))
    faulty = procs.start(argv, "pod-b", env=env)

    def restarted_and_back() -> bool:
        log = procs.log_of(faulty)
        return '"process-restarted"' in log and any(
            r["world_size"] == 2 and r["step"] > FAULT_STEP + 2 for r in records(metrics)
        )

    wait_for(
        restarted_and_back, STARTUP + EVENT, "pod-b's program restarted in place and training at 2 again"
    )
    assert survivor.poll() is None and faulty.poll() is None, procs.dump()
    log_b = procs.log_of(faulty)
    assert f"ValueError: LLM_TRAINER_FAULT_RAISE_AT_STEP: a bug in step {FAULT_STEP}" in log_b
    assert "leaving the job" in log_b, "a local error leaves the membership at once"
    # The survivor kept its process: one PID of pod-a in every record.
    log_a = procs.log_of(survivor)
    formed_a = [e for e in events(log_a) if e.get("event") == "formed"]
    assert len({e["pid"] for e in formed_a}) == 1, formed_a
    # The restarted program joined as a new member and took the state from the survivor.
    formed_b = [e for e in events(log_b) if e.get("event") == "formed"]
    pids_b = [e["pid"] for e in formed_b]
    assert len(set(pids_b)) == 2, formed_b
    rejoined = next(e for e in formed_b if e["pid"] == pids_b[-1])
    assert rejoined["step"] >= FAULT_STEP - 1 and isinstance(rejoined["source"], int), rejoined
    check_exact_sequence(records(metrics), corpus)

    def job_restarts() -> float | None:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        found = re.search(r"^llm_trainer_job_process_restarts\{[^}]*\} (\S+)$", text, re.M)
        return float(found.group(1)) if found else None

    # The survivor's endpoint (the one the operator probes) serves the job's layer-2 count.
    wait_for(lambda: job_restarts() == 1.0, EVENT, "the restart counted by the members")
