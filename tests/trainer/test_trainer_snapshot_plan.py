"""The snapshot restore planner (pure) and the shared-memory shard files."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from llm_elastic.snapshot.plan import Held, Source, buddy_of, choose, node_files
from llm_elastic.snapshot.store import ShardFile, entries_json, entries_of, entry_view, inventory, layout

L = "tiny|fsdp"


def held(holder: int, step: int, source: int, world: int, kind: str = "local", lay: str = L) -> Held:
    return Held(holder, step, source, world, lay, kind)


CASES = [
    # (name, held, world, replicated, not_before, expected step, expected (holder, source, kind) per rank)
    ("nothing held", [], 2, False, 0, None, None),
    (
        "each rank its own local shard",
        [held(0, 5, 0, 2), held(1, 5, 1, 2)],
        2,
        False,
        0,
        5,
        [(0, 0, "local"), (1, 1, "local")],
    ),
    (
        "lost node: the survivor's buddy copy serves the replacement",
        [held(0, 5, 0, 2), held(0, 5, 1, 2, "buddy")],
        2,
        False,
        0,
        5,
        [(0, 0, "local"), (0, 1, "buddy")],
    ),
    (
        "ranks swapped after a restart: each serves itself from its node",
        [held(0, 5, 1, 2), held(0, 5, 0, 2, "buddy"), held(1, 5, 0, 2), held(1, 5, 1, 2, "buddy")],
        2,
        False,
        0,
        5,
        [(0, 0, "buddy"), (1, 1, "buddy")],
    ),
    (
        "never mix steps: newest step incomplete, the older complete one wins",
        [held(0, 6, 0, 2), held(0, 5, 0, 2), held(1, 5, 1, 2)],
        2,
        False,
        0,
        5,
        [(0, 0, "local"), (1, 1, "local")],
    ),
    ("sharded state needs the same world size", [held(0, 5, 0, 1)], 2, False, 0, None, None),
    (
        "replicated state serves any world size",
        [held(1, 7, 0, 3)],
        2,
        True,
        0,
        7,
        [(1, 0, "local"), (1, 0, "local")],
    ),
    ("older than the newest checkpoint", [held(0, 5, 0, 1)], 1, True, 6, None, None),
    ("as new as the newest checkpoint: memory wins", [held(0, 6, 0, 1)], 1, True, 6, 6, [(0, 0, "local")]),
    ("another layout is ignored", [held(0, 5, 0, 1, lay="other")], 1, True, 0, None, None),
]


@pytest.mark.parametrize(
    ("name", "found", "world", "replicated", "not_before", "step", "sources"),
    CASES,
    ids=[c[0] for c in CASES],
)
def test_choose(
    name: str,
    found: list[Held],
    world: int,
    replicated: bool,
    not_before: int,
    step: int | None,
    sources: list[tuple[int, int, str]] | None,
) -> None:
    plan = choose(found, world, L, replicated, not_before)
    if step is None:
        assert plan is None
        return
    assert plan is not None and plan.step == step
    assert list(plan.sources) == [Source(*s) for s in sources or []]


def test_shard_file_round_trip_and_torn_write(tmp_path: Path) -> None:
    tensors = [
        ("a", torch.arange(5, dtype=torch.float32)),
        ("b", torch.ones(3, 2, dtype=torch.bfloat16)),
        ("c", torch.tensor([7], dtype=torch.int64)),
    ]
    entries, size = layout(tensors)
    assert all(e.offset % 64 == 0 for e in entries) and size >= sum(e.nbytes for e in entries)
    shard = ShardFile(tmp_path, "local", 3)
    payload = shard.payload(size)
    for entry, (_, tensor) in zip(entries, tensors, strict=True):
        entry_view(payload, entry).copy_(tensor)
    assert inventory(tmp_path) == []  # no header yet: not a snapshot
    shard.commit({"step": 4, "rank": 3, "entries": entries_json(entries), "payload_bytes": size})
    shard.close()

    again = ShardFile(tmp_path, "local", 3)
    header = again.read_header()
    assert header is not None and [h["kind"] for h in inventory(tmp_path)] == ["local"]
    for entry, (_, tensor) in zip(entries_of(header), tensors, strict=True):
        assert torch.equal(entry_view(again.payload(size), entry), tensor)
    again.invalidate()  # what a writer does before overwriting the payload
    assert inventory(tmp_path) == []


@pytest.mark.parametrize(
    ("rank", "world", "nproc", "buddy", "files"),
    [
        (0, 1, 1, None, {"local-r0"}),
        (1, 2, 2, None, {"local-r0", "local-r1"}),  # one node: no buddy
        (0, 2, 1, (1, 1), {"local-r0", "buddy-r1"}),
        (3, 6, 2, (5, 1), {"local-r2", "local-r3", "buddy-r0", "buddy-r1"}),
        (5, 6, 2, (1, 3), {"local-r4", "local-r5", "buddy-r2", "buddy-r3"}),
    ],
)
def test_buddy_and_node_files(
    rank: int, world: int, nproc: int, buddy: tuple[int, int] | None, files: set[str]
) -> None:
    assert buddy_of(rank, world, nproc) == buddy
    assert node_files(rank, world, nproc) == {f"{name}.s{slot}.json" for name in files for slot in (0, 1)}
