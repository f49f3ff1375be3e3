"""The rendezvous store is not a single point of failure (in process, real processes on a real etcd).

The job's etcd is killed mid-run, training goes on without it, and an empty etcd comes back at the same
address (what a lost rendezvous node does: the operator's Deployment starts a fresh pod behind the same
Service). The members keep their processes and step on; they register again with the fresh store, rank 0
publishes the generation again, and a membership change after the outage re-forms as usual.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from live_support import check_exact_sequence, member_argv, records, start_member
from llm_elastic.metrics import read_records
from llm_testbed.local_etcd import LocalEtcd, etcd_binary
from test_trainer_elastic import agent_argv
from trainer_support import Processes, wait_for

STARTUP = 240.0
EVENT = 90.0


def test_members_train_through_a_lost_and_fresh_etcd_then_re_form(
    corpus: Path, tmp_path: Path, procs: Processes
) -> None:
    metrics = tmp_path / "metrics.jsonl"
    with LocalEtcd(etcd_binary(), tmp_path / "etcd") as etcd:
        common = ("--steps", "100000", "--min-step-seconds", "0.05", "--min-members", "3")
        members = {
            n: start_member(procs, member_argv(corpus, metrics, etcd.endpoint, "/outage/", n, *common), n)
            for n in ("m0", "m1", "m2")
        }
        wait_for(lambda: len(records(metrics)) >= 5, STARTUP, "five steps of three members")
        pids = {p.pid for p in members.values()}

        etcd.kill()
        down_at = len(records(metrics))
        # Longer than the members' lease TTL (3 s at 0.05 s per step): their leases are gone with the store.
        wait_for(lambda: len(records(metrics)) >= down_at + 70, EVENT, "70 steps with the store down")
        etcd.start_fresh()
        back_at = len(records(metrics))
        wait_for(lambda: len(records(metrics)) >= back_at + 60, EVENT, "60 steps with a fresh store")
        assert all(p.poll() is None for p in members.values()), procs.dump()
        so_far = records(metrics)
        assert {pid for r in so_far for pid in (r["pids"] or [])} == pids, "the same processes"
        assert {(r["generation"], r["world_size"]) for r in so_far} == {(1, 3)}, "no re-form for the outage"

        # Membership works again on the fresh store: lose a member, the other two re-form without it.
        Processes.kill_group(members["m1"])
        members["m1"].wait(10)
        lost_at = len(records(metrics))
        wait_for(
            lambda: sum(1 for r in records(metrics)[lost_at:] if r["world_size"] == 2) >= 3,
            EVENT,
            "three steps of the two survivors after the outage",
        )
    check_exact_sequence(records(metrics), corpus)


def test_torchrun_agents_ride_out_a_lost_and_fresh_etcd_in_restart_mode(
    corpus: Path, tmp_path: Path, procs: Processes
) -> None:
    """Restart mode: two torchrun agents on the etcd-v3 rendezvous. The store dies mid-run and an empty
    one comes back at the same address: the agents' keep-alives and monitor ride out the outage (bounded
    retries) instead of exiting, so the workers train on without a restart; afterwards a lost node still
    makes the other re-rendezvous on the fresh store and resume from the checkpoint."""
    ckpt = tmp_path / "ckpt"
    with LocalEtcd(etcd_binary(), tmp_path / "etcd") as etcd:
        argv = agent_argv(etcd, "outage", corpus, ckpt, steps=100000, nnodes="1:2")
        agents = [procs.start(argv, f"agent{i}") for i in range(2)]

        def steps() -> list[dict[str, Any]]:
            path = ckpt / "metrics.jsonl"
            return read_records(path) if path.exists() else []

        wait_for(
            lambda: any(r["world_size"] == 2 for r in steps()[-1:]) and len(steps()) >= 5, STARTUP, "5 steps"
        )
        etcd.kill()
        down_at = len(steps())
        # Longer than the rendezvous heartbeat timeout (5 s at 0.3 s per step).
        wait_for(lambda: len(steps()) >= down_at + 25, EVENT, "25 steps with the store down")
        etcd.start_fresh()
        back_at = len(steps())
        wait_for(lambda: len(steps()) >= back_at + 10, EVENT, "10 steps with a fresh store")
        assert all(a.poll() is None for a in agents), procs.dump()
        assert {(r["restart"], r["world_size"]) for r in steps()} == {(0, 2)}, "no restart for the outage"

        procs.kill_group(agents[1])
        agents[1].wait(30)
        lost_at = len(steps())
        wait_for(
            lambda: any(r["world_size"] == 1 for r in steps()[lost_at:]),
            EVENT * 2,
            "the survivor to re-rendezvous on the fresh store and resume",
        )
