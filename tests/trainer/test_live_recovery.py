"""Recovery without restarting, with real processes on a real etcd (gloo on CPU).

Three members train; one is SIGKILLed (and evicted, as the operator does) and the survivors go on with
the same PIDs; a warm spare joins and gets the state from a peer (there is no checkpoint dir at all);
then rank 0 itself is killed without an eviction (its lease expires) and the rest goes on again. The
metrics log must hold every step exactly once, each on the samples an uninterrupted run would use.
"""

from __future__ import annotations

import random
import subprocess
from pathlib import Path

from live_support import check_exact_sequence, member_argv, records, start_member
from llm_elastic.live.membership import evict
from llm_elastic.rendezvous.etcd_client import EtcdClient, parse_endpoints
from llm_testbed.local_etcd import LocalEtcd
from support.live_events import events
from trainer_support import Processes, wait_for

STARTUP = 240.0  # three interpreters importing torch at once on a loaded 2-core box
EVENT = 60.0


def alive(proc: subprocess.Popen[bytes]) -> bool:
    return proc.poll() is None


def test_survivors_keep_their_processes_and_a_joiner_gets_state_from_a_peer(
    etcd: LocalEtcd, corpus: Path, tmp_path: Path, procs: Processes
) -> None:
    metrics = tmp_path / "metrics.jsonl"
    prefix = "/live-recovery/"
    release = tmp_path / "release-spare"
    common = ("--steps", "100000", "--min-step-seconds", "0.05", "--min-members", "3")
    names = ["m0", "m1", "m2"]
    members = {
        n: start_member(procs, member_argv(corpus, metrics, etcd.endpoint, prefix, n, *common), n)
        for n in names
    }
    spare = start_member(
        procs,
        member_argv(corpus, metrics, etcd.endpoint, prefix, "s0", *common, "--start-when", str(release)),
        "s0",
    )
    original = {p.pid for p in members.values()} | {spare.pid}

    wait_for(lambda: len(records(metrics)) >= 5, STARTUP, "five steps of three members")
    assert {r["world_size"] for r in records(metrics)} == {3}

    # 1. Lose m1: SIGKILL (the node is gone) and evict it, as the operator does when it sees the node die.
    Processes.kill_group(members["m1"])
    members["m1"].wait(10)
    killed_at = len(records(metrics))
    client = EtcdClient(parse_endpoints(etcd.endpoint))
    try:
        assert evict(client, prefix, "m1") is True
    finally:
        client.close()
    survivors = {members["m0"].pid, members["m2"].pid}

    def two_survivor_steps() -> bool:
        after = [r for r in records(metrics) if r["world_size"] == 2]
        return len(after) >= 3

    wait_for(two_survivor_steps, EVENT, "three steps of the two survivors")
    assert alive(members["m0"]) and alive(members["m2"])
    for record in records(metrics)[killed_at:]:
        if record.get("pids") is not None:  # a step logged late by the new rank 0 has no pid list
            assert set(record["pids"]) <= survivors, record

    # 2. A warm spare joins: it receives parameters, optimizer state and the step from a survivor.
    release.touch()

    def joined() -> bool:
        return any(r["world_size"] == 3 and spare.pid in (r["pids"] or []) for r in records(metrics))

    wait_for(joined, EVENT, "a step at world size 3 that includes the spare")
    formed = [e for e in events(procs.log_of(spare)) if e.get("event") == "formed"]
    assert formed, procs.log_of(spare)
    assert formed[0]["step"] > 0, formed[0]  # it started at the survivors' step, not at 0
    assert formed[0]["source"] is not None and formed[0]["source"] != formed[0]["rank"], formed[0]
    joined_step = formed[0]["step"]
    first_loss = records(metrics)[0]["loss"]
    loss_after_join = next(r["loss"] for r in records(metrics) if r["step"] == joined_step + 1)
    assert loss_after_join < first_loss, (first_loss, loss_after_join)

    # 3. Lose rank 0 (the member that writes the metrics) without an eviction: its lease expires.
    Processes.kill_group(members["m0"])
    members["m0"].wait(10)
    before = len(records(metrics))

    def went_on_without_m0() -> bool:
        return any(
            r["world_size"] == 2 and set(r["pids"] or []) == {members["m2"].pid, spare.pid}
            for r in records(metrics)[before:]
        )

    wait_for(went_on_without_m0, EVENT, "steps of m2 and the spare after rank 0 died")
    assert alive(members["m2"]) and alive(spare)

    log = records(metrics)
    check_exact_sequence(log, corpus)
    every_pid = {pid for r in log for pid in (r["pids"] or [])}
    assert every_pid <= original, "a member process was restarted"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["logs", "metrics.jsonl", "release-spare"]


def test_losses_during_a_recovery_and_joins_of_several_spares_never_wedge(
    etcd: LocalEtcd, corpus: Path, tmp_path: Path, procs: Processes
) -> None:
    metrics = tmp_path / "metrics.jsonl"
    prefix = "/live-churn/"
    common = ("--steps", "100000", "--min-step-seconds", "0.05", "--min-members", "4")
    members = {
        n: start_member(procs, member_argv(corpus, metrics, etcd.endpoint, prefix, n, *common), n)
        for n in ("m0", "m1", "m2", "m3")
    }
    release = tmp_path / "release"
    spares = {
        n: start_member(
            procs,
            member_argv(corpus, metrics, etcd.endpoint, prefix, n, *common, "--start-when", str(release)),
            n,
        )
        for n in ("s0", "s1")
    }
    original = {p.pid for p in members.values()} | {p.pid for p in spares.values()}
    wait_for(lambda: len(records(metrics)) >= 3, STARTUP, "three steps of four members")
    client = EtcdClient(parse_endpoints(etcd.endpoint))
    try:
        # Two losses back to back: the second lands while the survivors are re-forming.
        for name in ("m1", "m2"):
            Processes.kill_group(members[name])
            assert evict(client, prefix, name) is True
        both = {members["m0"].pid, members["m3"].pid}
        wait_for(
            lambda: any(set(r["pids"] or []) == both for r in records(metrics)), EVENT, "steps of m0 and m3"
        )
        wait_for(lambda: all(procs.log_of(s).count('"waiting"') for s in spares.values()), STARTUP, "spares")
        release.touch()
        four = both | {p.pid for p in spares.values()}
        wait_for(lambda: any(set(r["pids"] or []) == four for r in records(metrics)), EVENT, "both spares in")
        # Rank 0 and a joiner lost at once.
        for name, proc in (("m0", members["m0"]), ("s0", spares["s0"])):
            Processes.kill_group(proc)
            assert evict(client, prefix, name) is True
        last = {members["m3"].pid, spares["s1"].pid}
        wait_for(
            lambda: any(set(r["pids"] or []) == last for r in records(metrics)), EVENT, "m3 and s1 go on"
        )
    finally:
        client.close()
    assert members["m3"].poll() is None and spares["s1"].poll() is None
    log = records(metrics)
    check_exact_sequence(log, corpus)
    assert {pid for r in log for pid in (r["pids"] or [])} <= original
    assert {r["world_size"] for r in log} >= {4, 2}


def test_a_finished_run_ends_every_member_and_a_late_joiner(
    etcd: LocalEtcd, corpus: Path, tmp_path: Path, procs: Processes
) -> None:
    metrics = tmp_path / "metrics.jsonl"
    prefix = "/live-finish/"
    common = ("--steps", "6", "--min-members", "2")
    pair = [
        start_member(procs, member_argv(corpus, metrics, etcd.endpoint, prefix, n, *common), n)
        for n in ("a", "b")
    ]
    assert [p.wait(STARTUP) for p in pair] == [0, 0]
    check_exact_sequence(records(metrics), corpus)
    assert [r["step"] for r in records(metrics)] == list(range(1, 7))
    late = start_member(procs, member_argv(corpus, metrics, etcd.endpoint, prefix, "late", *common), "late")
    assert late.wait(STARTUP) == 0
    assert len(records(metrics)) == 6


def test_ten_successive_losses_and_joins_never_wedge(
    etcd: LocalEtcd, corpus: Path, tmp_path: Path, procs: Processes
) -> None:
    """Ten rounds of: a random member SIGKILLed and evicted, the survivors go on, a warm spare joins. The
    next spare starts (imports torch) while the current round runs, as a replacement pod would."""
    metrics = tmp_path / "metrics.jsonl"
    prefix = "/live-ten/"
    common = ("--steps", "100000", "--min-step-seconds", "0.05", "--min-members", "3")

    def member(name: str, *extra: str) -> subprocess.Popen[bytes]:
        argv = member_argv(corpus, metrics, etcd.endpoint, prefix, name, *common, *extra)
        return start_member(procs, argv, name)

    def spare(index: int) -> tuple[subprocess.Popen[bytes], Path]:
        release = tmp_path / f"release-{index}"
        return member(f"s{index}", "--start-when", str(release)), release

    running = {n: member(n) for n in ("m0", "m1", "m2")}
    waiting = spare(0)
    wait_for(lambda: len(records(metrics)) >= 3, STARTUP, "three steps of three members")
    rng = random.Random(11)
    client = EtcdClient(parse_endpoints(etcd.endpoint))
    try:
        for rnd in range(10):
            name = rng.choice(sorted(running))
            victim = running.pop(name)
            Processes.kill_group(victim)
            evict(client, prefix, name)
            left = {p.pid for p in running.values()}
            wait_for(
                lambda left=left: any(set(r["pids"] or []) == left for r in records(metrics)),
                EVENT,
                f"round {rnd}: steps of the two survivors",
            )
            proc, release = waiting
            wait_for(lambda p=proc: '"waiting"' in procs.log_of(p), STARTUP, f"round {rnd}: spare ready")
            release.touch()
            running[f"s{rnd}"] = proc
            waiting = spare(rnd + 1)
            full = {p.pid for p in running.values()}
            wait_for(
                lambda full=full: any(set(r["pids"] or []) == full for r in records(metrics)),
                EVENT,
                f"round {rnd}: the spare trains at world size 3",
            )
    finally:
        client.close()
    assert all(p.poll() is None for p in running.values())
    log = records(metrics)
    check_exact_sequence(log, corpus)
    assert len({r["generation"] for r in log if r.get("generation")}) >= 21, "two re-forms per round"
