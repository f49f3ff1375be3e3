"""The snapshot space check before training (``llm_elastic.snapshot.space``): the arithmetic, the predicted
shard against a real snapshot's payload, and the one-line refusal in a real 1 MiB tmpfs."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections import namedtuple
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from llm_elastic.snapshot import space
from llm_elastic.snapshot.manager import Snapshotter
from llm_elastic.snapshot.space import (
    SnapshotSpaceError,
    check_snapshot_space,
    node_bytes,
    payload_bytes,
    shard_bytes,
    space_problem,
    state_entry_bytes,
)
from llm_trainer.config import ModelConfig, model_config
from llm_trainer.model import Transformer
from trainer_support import train_argv, trainer_env

pytestmark = pytest.mark.trainer

MIB = 1 << 20
GIB = 1 << 30
Usage = namedtuple("Usage", "total used free")


def test_entries_are_64_byte_aligned_and_files_whole_pages() -> None:
    assert payload_bytes([1, 64, 65, 0, 4]) == 64 + 64 + 128 + 0 + 64
    # 5 entries: payload 320 B -> one page; header 5 x 256 B -> one page.
    assert shard_bytes([1, 64, 65, 0, 4]) == 2 * 4096
    assert shard_bytes([10_000]) == 3 * 4096 + 4096


@pytest.mark.parametrize(
    ("local_ranks", "with_buddy", "expected"),
    [(1, False, 2 * 1000), (1, True, 4 * 1000), (8, True, 8 * 4 * 1000), (8, False, 8 * 2 * 1000)],
)
def test_a_node_holds_two_slots_of_own_and_of_buddy_shards(
    local_ranks: int, with_buddy: bool, expected: int
) -> None:
    assert node_bytes(1000, local_ranks, with_buddy) == expected


def test_the_docs_sizing_of_8b_on_two_nodes() -> None:
    """docs/trainer.md: 8B (8.03 B params, 12 bytes each) on 2 nodes needs 193 GB of /dev/shm per node."""
    shard = 12 * model_config("8b").num_params() // 16  # FSDP over 2 nodes x 8 GPUs
    assert node_bytes(shard, 8, with_buddy=True) == pytest.approx(193e9, rel=0.005)


def test_the_problem_names_both_sizes_and_what_to_change() -> None:
    assert space_problem(GIB, GIB, "/dev/shm/x") is None
    assert space_problem(GIB, 2 * GIB, "/dev/shm/x") is None
    message = space_problem(3 * GIB + GIB // 2, 2 * GIB, "/dev/shm/x")
    assert message is not None and "\n" not in message
    for part in ("3.50 GiB", "2.00 GiB", "/dev/shm/x", "spec.sharedMemory", "resources.memory"):
        assert part in message
    assert "--snapshot-every 0" in message
    small = space_problem(3 * MIB, MIB, "/s")
    assert small is not None and "3.0 MiB" in small and "1.0 MiB" in small


def test_free_space_counts_the_shards_already_in_the_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[Path] = []

    def usage(path: Path) -> Usage:
        asked.append(Path(path))
        return Usage(100 * MIB, 90 * MIB, 10 * MIB)

    monkeypatch.setattr(shutil, "disk_usage", usage)
    folder = tmp_path / "snap"
    # Not there yet: the file system of its nearest existing ancestor.
    assert space.free_bytes(folder / "deeper") == 10 * MIB and asked[-1] == tmp_path
    folder.mkdir()
    (folder / "local-r0.s0.bin").write_bytes(b"x" * 10_000)  # rewritten in place: counts as free
    (folder / "local-r0.s0.json").write_text("{}")
    (folder / "buddy-r3.s1.bin").write_bytes(b"x" * 5000)  # left from another world: removed later
    (folder / "notes.txt").write_bytes(b"x" * 50_000)  # not a snapshot: stays
    assert space.free_bytes(folder) == 10 * MIB + 3 * 4096 + 4096 + 2 * 4096


@pytest.mark.parametrize("tie", [False, True])
def test_the_predicted_shard_is_the_payload_a_snapshot_writes(
    tie: bool, tmp_path: Path, one_rank: None
) -> None:
    cfg = ModelConfig(
        dim=32,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        ffn_dim=40,
        vocab_size=77,
        max_seq_len=16,
        tie_embeddings=tie,
    )
    model = Transformer(cfg)
    model.init_weights(0)
    optimizer = torch.optim.AdamW(model.parameters())
    predicted = payload_bytes(state_entry_bytes(model, optimizer))  # before the optimizer has any state
    model(torch.zeros(1, 4, dtype=torch.long)).sum().backward()
    optimizer.step()
    snapshots = Snapshotter(tmp_path, 0, 1, 1, dist.new_group(backend="gloo"), "test", replicated=True)
    snapshots.take(1, model, optimizer, {"step": 1})
    header = snapshots.local.read_header()
    assert header is not None and header["payload_bytes"] == predicted


def test_check_refuses_and_accepts_by_the_free_space(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_rank: None
) -> None:
    model = Transformer(
        ModelConfig(dim=16, n_layers=1, n_heads=2, n_kv_heads=1, ffn_dim=8, vocab_size=50, max_seq_len=8)
    )
    optimizer = torch.optim.AdamW(model.parameters())
    need = node_bytes(shard_bytes(state_entry_bytes(model, optimizer)), 2, with_buddy=True)
    monkeypatch.setattr(shutil, "disk_usage", lambda _: Usage(need, 0, need))
    assert check_snapshot_space(tmp_path, model, optimizer, world_size=4, local_world_size=2) == need
    monkeypatch.setattr(shutil, "disk_usage", lambda _: Usage(need, 1, need - 1))
    with pytest.raises(SnapshotSpaceError, match=r"spec\.sharedMemory"):
        check_snapshot_space(tmp_path, model, optimizer, world_size=4, local_world_size=2)
    # One node: no buddy shards, half the bytes.
    assert check_snapshot_space(tmp_path, model, optimizer, world_size=2, local_world_size=2) == need // 2


def _can_mount_tmpfs() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        [
            "unshare",
            "--user",
            "--map-root-user",
            "--mount",
            "sh",
            "-c",
            "mount -t tmpfs -o size=1m none /mnt",
        ],
        capture_output=True,
        timeout=30,
    )
    return probe.returncode == 0


@pytest.mark.skipif(not _can_mount_tmpfs(), reason="needs unprivileged user + mount namespaces (unshare)")
def test_too_small_shared_memory_is_one_error_line_and_exit_1(corpus: Path, tmp_path: Path) -> None:
    """A real 1 MiB tmpfs (in a private mount namespace) for the tiny model's 3 MiB of snapshots."""
    shm = tmp_path / "shm"
    shm.mkdir()
    argv = train_argv(corpus, tmp_path / "ckpt", "--snapshot-every", "1", "--snapshot-dir", str(shm / "snap"))
    script = f'mount -t tmpfs -o size=1m none "{shm}" && exec "$@"'
    result = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script, "sh", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env=trainer_env({"PYTHONPATH": ":".join(sys.path)}),
    )
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1, result.stderr
    assert "need 3.1 MiB" in errors[0] and "only 1.0 MiB is free" in errors[0], errors[0]
    assert "spec.sharedMemory" in errors[0]
    assert not (tmp_path / "ckpt" / "metrics.jsonl").exists()  # refused before the first step
