"""Pure decisions of live membership: who proposes, who waits, who joins; ranks by sorted member id."""

from __future__ import annotations

import pytest
from llm_elastic.live import layout
from llm_elastic.live.layout import Action, Generation

G1 = Generation(1, ("a", "b", "c"))
G2 = Generation(2, ("a", "c"))


@pytest.mark.parametrize(
    ("stored", "live", "me", "left", "min_members", "expected"),
    [
        # First start: wait for enough members, then propose.
        (None, ["a"], "a", 0, 3, Action.WAIT),
        (None, ["a", "b", "c"], "a", 0, 3, Action.PROPOSE),
        # A joiner waits while a healthy generation trains without it.
        (G1, ["a", "b", "c", "d"], "d", 0, 1, Action.WAIT),
        # ... but helps to supersede a generation that lost a member.
        (G1, ["a", "c", "d"], "d", 0, 1, Action.PROPOSE),
        # Survivors of generation 1 propose generation 2.
        (G1, ["a", "c"], "a", 1, 1, Action.PROPOSE),
        # A newer generation that includes us and whose members are live: join it.
        (G2, ["a", "c"], "c", 1, 1, Action.JOIN),
        (G2, ["a", "c", "d"], "a", 1, 1, Action.JOIN),
        # A newer generation whose member is gone again: supersede it.
        (G2, ["c"], "c", 1, 1, Action.PROPOSE),
        # The generation we just left (a member changed): propose the next one, min_members no longer holds.
        (G2, ["a"], "a", 2, 3, Action.PROPOSE),
        # A joiner named in the stored generation joins it.
        (Generation(3, ("a", "c", "d")), ["a", "c", "d"], "d", 0, 1, Action.JOIN),
    ],
)
def test_decide(
    stored: Generation | None, live: list[str], me: str, left: int, min_members: int, expected: Action
) -> None:
    assert layout.decide(stored, live, me, left, min_members) is expected


def test_propose_ranks_by_sorted_id_and_counts_up() -> None:
    first = layout.propose(None, ["node-b-7", "node-a-3", "node-a-3"])
    assert first == Generation(1, ("node-a-3", "node-b-7"))
    assert first.rank_of("node-b-7") == 1
    assert layout.propose(first, ["z", "a"]) == Generation(2, ("a", "z"))


def test_generation_round_trips_and_keys_are_per_generation() -> None:
    gen = Generation(7, ("a", "b"))
    assert Generation.decode(gen.encode()) == gen
    assert layout.member_key("/job/", "a") == "/job/members/a"
    assert layout.store_prefix("/job/", 7) == "/job/g7/store/"
    assert layout.store_prefix("/job/", 8) != layout.store_prefix("/job/", 7)


@pytest.mark.parametrize(
    ("member", "ok"), [("node-1-42", True), ("", False), ("a/b", False), ("tab\t", False), ("é", False)]
)
def test_member_ids(member: str, ok: bool) -> None:
    assert layout.valid_member_id(member) is ok


def test_only_complete_hosts_form_an_hsdp_generation() -> None:
    live = ["h0.1", "h0.2", "h1.7", "h2.3", "h2.4", "h2.5", "h10.1", "h10.2"]
    assert layout.complete_hosts(live, 2) == ["h0.1", "h0.2", "h10.1", "h10.2"]  # h1 short, h2 over
    assert layout.complete_hosts(live, 1) == live, "without sharding every member counts"
    assert layout.host_of("train-worker-1.4242") == "train-worker-1"


@pytest.mark.parametrize(
    ("current", "live", "target", "shard", "expected"),
    [
        (None, ["c", "a", "b"], 0, 1, ("a", "b", "c")),  # no cap: everyone
        (None, ["c", "a", "b"], 2, 1, ("a", "b")),  # a new job: the first ids train, "c" is a spare
        (("b", "c"), ["a", "b", "c"], 2, 1, ("b", "c")),  # full: a new spare "a" does not displace anyone
        (("b", "c"), ["a", "c"], 2, 1, ("a", "c")),  # "b" lost: the spare "a" is promoted
        (("b", "c"), ["c"], 2, 1, ("c",)),  # no spare left: go on smaller
        ((), ["h1.0", "h1.1", "h0.0", "h0.1", "h2.0", "h2.1"], 4, 2, ("h0.0", "h0.1", "h1.0", "h1.1")),
        (
            ("h1.0", "h1.1", "h2.0", "h2.1"),
            ["h0.0", "h0.1", "h2.0", "h2.1"],
            4,
            2,
            ("h0.0", "h0.1", "h2.0", "h2.1"),
        ),
    ],
)
def test_select_keeps_survivors_and_fills_from_spares_up_to_the_target(
    current: tuple[str, ...] | None, live: list[str], target: int, shard: int, expected: tuple[str, ...]
) -> None:
    gen = Generation(3, current) if current is not None else None
    assert layout.select(gen, live, target, shard) == expected


def test_a_spare_waits_beside_a_full_healthy_generation_and_proposes_when_a_member_is_gone() -> None:
    full = Generation(4, ("a", "b"))
    assert layout.decide(full, ["a", "b", "s"], "s", left=0, min_members=2, target=2) is Action.WAIT
    assert layout.decide(full, ["a", "b", "s"], "s", left=3, min_members=2, target=2) is Action.WAIT
    assert layout.decide(full, ["a", "s"], "s", left=0, min_members=2, target=2) is Action.PROPOSE
    assert layout.propose(full, ["a", "s"], target=2) == Generation(5, ("a", "s"))
    # Without a cap a member that left re-forms with everyone (the behaviour before spares).
    assert layout.decide(full, ["a", "b", "s"], "s", left=3, min_members=2) is Action.PROPOSE
