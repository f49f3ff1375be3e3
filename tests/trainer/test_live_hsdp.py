"""Recovery in process with HSDP: the state replicated across hosts, sharded among each host's processes.

Two hosts of two processes train (member ids ``<host>.<n>``, FSDP2 on a (replicate, shard) mesh, gloo on
CPU); one host is lost (both processes SIGKILLed and the host evicted, as the operator does for a pod), the
other host goes on with the same PIDs and its full replica; a warm spare host joins and each of its
processes receives its shard from the survivor with the same shard index. No checkpoint exists at all.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from live_support import check_exact_sequence, member_argv, records, start_member
from llm_elastic.live.membership import evict_host
from llm_elastic.rendezvous.etcd_client import EtcdClient, parse_endpoints
from llm_testbed.local_etcd import LocalEtcd
from support.live_events import events
from trainer_support import Processes, wait_for

STARTUP = 300.0  # six interpreters importing torch at once on a loaded 2-core box
EVENT = 90.0


def test_a_lost_host_leaves_a_full_replica_and_a_new_host_gets_its_shards_from_it(
    etcd: LocalEtcd, corpus: Path, tmp_path: Path, procs: Processes
) -> None:
    metrics = tmp_path / "metrics.jsonl"
    prefix = "/live-hsdp/"
    release = tmp_path / "release-h2"
    common = ("--steps", "100000", "--min-step-seconds", "0.05", "--min-members", "4")
    common += ("--parallel", "hsdp", "--shard-size", "2")

    def member(name: str, *extra: str) -> subprocess.Popen[bytes]:
        argv = member_argv(corpus, metrics, etcd.endpoint, prefix, name, *common, *extra)
        return start_member(procs, argv, name)

    hosts = {h: [member(f"{h}.{i}") for i in range(2)] for h in ("h0", "h1")}
    spare = [member(f"h2.{i}", "--start-when", str(release)) for i in range(2)]
    wait_for(lambda: len(records(metrics)) >= 5, STARTUP, "five steps of two hosts")
    assert {r["world_size"] for r in records(metrics)} == {4}

    for proc in hosts["h1"]:
        Processes.kill_group(proc)
        proc.wait(10)
    client = EtcdClient(parse_endpoints(etcd.endpoint))
    try:
        assert evict_host(client, prefix, "h1") == 2
    finally:
        client.close()
    survivors = {p.pid for p in hosts["h0"]}
    wait_for(
        lambda: sum(1 for r in records(metrics) if set(r["pids"] or []) == survivors) >= 3,
        EVENT,
        "three steps of the surviving host",
    )
    assert all(p.poll() is None for p in hosts["h0"])

    release.touch()
    full = survivors | {p.pid for p in spare}
    wait_for(
        lambda: sum(1 for r in records(metrics) if set(r["pids"] or []) == full) >= 3,
        EVENT,
        "three steps with the new host",
    )
    for proc in spare:
        formed = [e for e in events(procs.log_of(proc)) if e.get("event") == "formed"]
        assert formed and formed[0]["step"] > 0, procs.log_of(proc)
        assert formed[0]["source"] in (0, 1), formed[0]  # a rank of the surviving host
    log = records(metrics)
    check_exact_sequence(log, corpus)
    assert all(r["loss"] is not None for r in log), "every step's loss is finite: the shards were kept whole"
    joined_step = min(e["step"] for p in spare for e in events(procs.log_of(p)) if e.get("event") == "formed")
    loss_after_join = next(r["loss"] for r in log if r["step"] == joined_step + 1)
    assert loss_after_join < log[0]["loss"], (log[0]["loss"], loss_after_join)
    assert not any(tmp_path.glob("**/step-*")), "no checkpoint was written or read"
