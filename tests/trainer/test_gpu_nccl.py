"""GPU tier (skipped without CUDA; run on a GPU machine): recovery in process over NCCL on one GPU.

NCCL refuses two ranks on one GPU of one host ("Duplicate GPU detected"); each member gets its own
``NCCL_HOSTID`` so that it looks like a host of its own, with the socket transport (no P2P, no shared
memory). Three members train the tiny model on the GPU; one is SIGKILLed and evicted: the survivors'
watchdog aborts their NCCL communicators (a lost peer raises nothing on NCCL), they form a new generation
with new communicators and go on; a joiner receives the state over NCCL. Every step trained exactly once.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from live_support import check_exact_sequence, member_argv, records, start_member
from llm_elastic.live.membership import evict
from llm_elastic.rendezvous.etcd_client import EtcdClient, parse_endpoints
from llm_testbed.local_etcd import LocalEtcd
from support.live_events import events
from trainer_support import Processes, wait_for

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (NCCL)")

NCCL_ONE_GPU = {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_SOCKET_IFNAME": "lo"}


def test_nccl_survivors_abort_and_go_on_and_a_joiner_gets_state_over_nccl(
    etcd: LocalEtcd, corpus: Path, tmp_path: Path, procs: Processes
) -> None:
    metrics = tmp_path / "metrics.jsonl"
    common = ("--steps", "100000", "--min-step-seconds", "0.05", "--min-members", "3")

    def start(name: str, host_id: int) -> object:
        argv, env = member_argv(corpus, metrics, etcd.endpoint, "/nccl/", name, *common)
        return start_member(procs, (argv, {**env, **NCCL_ONE_GPU, "NCCL_HOSTID": f"host-{host_id}"}), name)

    members = {n: start(n, i) for i, n in enumerate(("m0", "m1", "m2"))}
    wait_for(lambda: len(records(metrics)) >= 5, 300, "five steps of three members on NCCL")
    procs.kill_group(members["m1"])  # type: ignore[arg-type]
    client = EtcdClient(parse_endpoints(etcd.endpoint))
    try:
        evict(client, "/nccl/", "m1")
    finally:
        client.close()
    lost = len(records(metrics))
    wait_for(lambda: sum(r["world_size"] == 2 for r in records(metrics)[lost:]) >= 3, 60, "the survivors")
    joiner = start("m3", 3)
    wait_for(lambda: any(r["world_size"] == 3 for r in records(metrics)[lost:]), 300, "the joiner")
    formed = [e for e in events(procs.log_of(joiner)) if e.get("event") == "formed"]  # type: ignore[arg-type]
    assert formed and isinstance(formed[0]["source"], int), formed
    assert "aborting" in procs.log_of(members["m0"]), "the survivor's watchdog aborted NCCL"  # type: ignore[arg-type]
    check_exact_sequence(records(metrics), corpus)
