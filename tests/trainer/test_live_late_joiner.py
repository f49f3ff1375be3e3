"""Issue 38 with real processes: a member that starts a moment after the others (its release comes while the
first two form their generation) is taken in, and the job reaches world size 3 with every step once."""

from __future__ import annotations

import time
from pathlib import Path

from live_support import check_exact_sequence, member_argv, records, start_member
from llm_testbed.local_etcd import LocalEtcd
from support.live_events import events
from trainer_support import Processes, wait_for

STARTUP = 240.0  # three interpreters importing torch at once on a loaded 2-core box
JOIN_BOUND = 60.0
"""The late member must train within this long of its release (a step boundary, a forming, a transfer)."""


def test_a_member_released_while_the_others_form_is_taken_in(
    etcd: LocalEtcd, corpus: Path, tmp_path: Path, procs: Processes
) -> None:
    metrics = tmp_path / "metrics.jsonl"
    prefix = "/live-late-joiner/"
    common = ("--steps", "100000", "--min-step-seconds", "0.05", "--min-members", "2")
    releases = {name: tmp_path / f"release-{name}" for name in ("w0", "w1", "w2")}
    members = {
        name: start_member(
            procs,
            member_argv(corpus, metrics, etcd.endpoint, prefix, name, *common, "--start-when", str(path)),
            name,
        )
        for name, path in releases.items()
    }

    def waiting() -> bool:
        return all(
            any(e.get("event") == "waiting" for e in events(procs.log_of(p))) for p in members.values()
        )

    wait_for(waiting, STARTUP, "every member imported and waiting for its release")
    releases["w0"].touch()
    releases["w1"].touch()

    def forming() -> bool:  # w0 has registered: the next registration lands in the forming
        return any(e.get("event") == "released" for e in events(procs.log_of(members["w0"])))

    wait_for(forming, 30, "the first members to start forming")
    released_at = time.monotonic()
    releases["w2"].touch()

    def three() -> bool:
        return any(r["world_size"] == 3 for r in records(metrics))

    wait_for(three, JOIN_BOUND, "a step at world size 3 after the late member's release")
    joined_after = time.monotonic() - released_at
    assert joined_after < JOIN_BOUND
    assert all(p.poll() is None for p in members.values()), "a member exited"
    check_exact_sequence(records(metrics), corpus)
