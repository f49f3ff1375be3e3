"""The restart path under the live one, and graceful stops (real processes, real etcd, gloo on CPU).

* Every member killed at once (no survivor holds the state): new members find no peer with state and
  load the newest complete checkpoint; the sample accounting proves nothing was skipped and at most one
  checkpoint interval (plus the step in flight) was trained again.
* SIGTERM to one member: it leaves at a step boundary, the others go on with the same PIDs and lose no
  step. SIGTERM to every member at once (a suspend): they save a checkpoint of the last step and exit 0.
"""

from __future__ import annotations

import signal
from pathlib import Path

from live_support import GLOBAL_BATCH, SEED, SEQ_LEN, check_exact_sequence, member_argv, records, start_member
from llm_elastic.accounting import audit
from llm_elastic.checkpoint import latest_checkpoint
from llm_elastic.order import GlobalOrder
from llm_testbed.local_etcd import LocalEtcd
from llm_trainer.data.shards import TokenShards
from trainer_support import Processes, wait_for

STARTUP = 240.0  # interpreters importing torch at once on a loaded 2-core box
EVENT = 60.0
EVERY = 5


def _order(corpus: Path) -> GlobalOrder:
    return GlobalOrder(TokenShards(corpus, SEQ_LEN).num_samples, SEED)


def test_every_member_lost_falls_back_to_the_newest_checkpoint(
    etcd: LocalEtcd, corpus: Path, tmp_path: Path, procs: Processes
) -> None:
    checkpoints = tmp_path / "ckpt"
    metrics = checkpoints / "metrics.jsonl"
    prefix = "/live-fallback/"
    common = ("--steps", "100000", "--min-step-seconds", "0.05", "--min-members", "2")
    common += ("--checkpoint-dir", str(checkpoints), "--checkpoint-every", str(EVERY))
    first = [
        start_member(procs, member_argv(corpus, metrics, etcd.endpoint, prefix, n, *common), n)
        for n in ("a0", "a1")
    ]
    wait_for(lambda: len(records(metrics)) >= 2 * EVERY + 2, STARTUP, "two checkpoints and two more steps")
    for proc in first:
        Processes.kill_group(proc)
        proc.wait(10)
    lost_at = int(records(metrics)[-1]["step"])
    saved = latest_checkpoint(checkpoints)
    assert saved is not None and saved.step >= EVERY, saved

    second = [
        start_member(procs, member_argv(corpus, metrics, etcd.endpoint, prefix, n, *common), n)
        for n in ("b0", "b1")
    ]

    def resumed() -> list[dict[str, object]] | None:
        after = [r for r in records(metrics) if r.get("restart") == 1]
        return after if len(after) >= 3 else None

    after = wait_for(resumed, STARTUP, "three steps of the new members")
    assert after[0]["resumed_from"] == saved.step, (after[0], saved)
    assert all(p.poll() is None for p in second)
    result = audit(records(metrics), _order(corpus))
    assert result.ok, result.problems
    # The only interruption that trained steps again (a new member may first train alone, then grow).
    fallback = [i for i in result.interruptions if i.resumed_from != i.last_step]
    assert len(fallback) == 1 and fallback[0].resumed_from == saved.step, result.interruptions
    assert fallback[0].last_step == lost_at, (fallback, lost_at)
    # Saves are synchronous here: a kill during the save of step k leaves k - EVERY as the newest.
    assert 0 <= fallback[0].replayed <= EVERY, fallback
    assert all(r["global_batch"] == GLOBAL_BATCH for r in records(metrics))


def test_a_stopped_member_leaves_and_a_stop_of_all_saves_the_last_step(
    etcd: LocalEtcd, corpus: Path, tmp_path: Path, procs: Processes
) -> None:
    checkpoints = tmp_path / "ckpt"
    metrics = checkpoints / "metrics.jsonl"
    prefix = "/live-stop/"
    common = ("--steps", "100000", "--min-step-seconds", "0.05", "--min-members", "3")
    common += ("--checkpoint-dir", str(checkpoints), "--checkpoint-every", "1000")
    members = {
        n: start_member(procs, member_argv(corpus, metrics, etcd.endpoint, prefix, n, *common), n)
        for n in ("m0", "m1", "m2")
    }
    wait_for(lambda: len(records(metrics)) >= 3, STARTUP, "three steps of three members")

    members["m1"].send_signal(signal.SIGTERM)
    assert members["m1"].wait(EVENT) == 0, procs.log_of(members["m1"])
    stayed = {members["m0"].pid, members["m2"].pid}
    wait_for(
        lambda: sum(1 for r in records(metrics) if set(r["pids"] or []) == stayed) >= 3,
        EVENT,
        "three steps of the two members that stayed",
    )

    for name in ("m0", "m2"):
        members[name].send_signal(signal.SIGTERM)
    codes = [members[n].wait(EVENT) for n in ("m0", "m2")]
    assert codes == [0, 0], [procs.log_of(members[n]) for n in ("m0", "m2")]
    log = records(metrics)
    check_exact_sequence(log, corpus)
    saved = latest_checkpoint(checkpoints)
    assert saved is not None and saved.step == log[-1]["step"], (saved, log[-1]["step"])
