"""Data: shards, the global sample order (world-size independent) and resumable per-rank batches."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from llm_elastic.order import GlobalOrder
from llm_trainer.data.loader import DistributedBatches
from llm_trainer.data.prepare import main as prepare
from llm_trainer.data.shards import TokenShards, read_meta
from llm_trainer.data.tokenizer import ByteTokenizer
from trainer_support import write_corpus

pytestmark = pytest.mark.trainer


@pytest.mark.parametrize("n", [1, 2, 3, 7, 64, 1000, 4099])
def test_order_is_a_permutation_per_epoch(n: int) -> None:
    order = GlobalOrder(n, seed=5)
    for epoch in range(2):
        ids = order.sample_ids(epoch * n, (epoch + 1) * n)
        assert sorted(ids) == list(range(n))


def test_order_depends_on_seed_and_epoch_only() -> None:
    a, b = GlobalOrder(500, seed=1), GlobalOrder(500, seed=1)
    assert a.sample_ids(0, 500) == b.sample_ids(0, 500)
    assert a.sample_ids(0, 500) != GlobalOrder(500, seed=2).sample_ids(0, 500)
    assert a.sample_ids(0, 500) != a.sample_ids(500, 1000)  # a new shuffle each epoch
    assert a.sample_ids(0, 500) != list(range(500))


def test_shards_hold_the_tokenized_documents(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("héllo")
    (tmp_path / "b.txt").write_text("world")
    assert (
        prepare(
            [
                str(tmp_path / "a.txt"),
                str(tmp_path / "b.txt"),
                "-o",
                str(tmp_path / "s"),
                "--shard-tokens",
                "4",
            ]
        )
        == 0
    )
    meta = read_meta(tmp_path / "s")
    eos = ByteTokenizer.eos_id
    expected = [*"héllo".encode(), eos, *b"world", eos]
    stored = np.concatenate([np.fromfile(tmp_path / "s" / f, dtype=meta.dtype) for f in meta.files])
    assert stored.tolist() == expected
    assert meta.tokens == (4, 4, 4, 1) and meta.vocab_size == 258


def test_samples_are_windows_of_one_shard(corpus: Path) -> None:
    shards = TokenShards(corpus, seq_len=32)
    meta = shards.meta
    assert shards.num_samples == sum((n - 1) // 32 for n in meta.tokens)
    first = np.fromfile(corpus / meta.files[0], dtype=meta.dtype)
    assert shards.sample(0).tolist() == first[:33].tolist()
    assert shards.sample(1).tolist() == first[32:65].tolist()
    last_of_first = (meta.tokens[0] - 1) // 32 - 1
    second = np.fromfile(corpus / meta.files[1], dtype=meta.dtype)
    assert shards.sample(last_of_first + 1).tolist() == second[:33].tolist()


@pytest.mark.parametrize("global_batch", [12, 13])
def test_step_samples_do_not_depend_on_world_size(corpus: Path, global_batch: int) -> None:
    shards = TokenShards(corpus, seq_len=32)
    reference = DistributedBatches(shards, seed=3, global_batch=global_batch, micro_batch=2)
    steps = [reference.next_step() for _ in range(4)]
    for world in (2, 3, 5):
        ranks = [DistributedBatches(shards, 3, global_batch, 2, rank, world) for rank in range(world)]
        for step in steps:
            per_rank = [r.next_step() for r in ranks]
            assert sorted(i for b in per_rank for i in b.sample_ids) == sorted(step.sample_ids)
            assert {(b.start, b.stop) for b in per_rank} == {(step.start, step.stop)}
            # Every rank runs the same number of micro-steps (lockstep collectives) ...
            assert len({len(b.micro_batches) for b in per_rank}) == 1
            # ... and the real (non-padding) samples add up to the global batch.
            counted = sum(int(m.inputs.shape[0] * m.weight) for b in per_rank for m in b.micro_batches)
            assert counted == global_batch


def test_micro_batches_are_inputs_and_shifted_targets(corpus: Path) -> None:
    shards = TokenShards(corpus, seq_len=32)
    batch = DistributedBatches(shards, seed=3, global_batch=4, micro_batch=2).next_step()
    first = batch.micro_batches[0]
    sample = torch.from_numpy(shards.sample(batch.sample_ids[0]))
    assert torch.equal(first.inputs[0], sample[:-1]) and torch.equal(first.targets[0], sample[1:])
    assert first.inputs.shape == (2, 32) and len(batch.micro_batches) == 2


def test_resume_mid_stream_gives_identical_next_batches(corpus: Path) -> None:
    shards = TokenShards(corpus, seq_len=32)
    uninterrupted = DistributedBatches(shards, 11, 12, 2, rank=1, world_size=3)
    for _ in range(5):
        uninterrupted.next_step()
    saved = json.loads(json.dumps(uninterrupted.state_dict()))  # as stored in a checkpoint marker
    expected = [uninterrupted.next_step() for _ in range(3)]

    restored = DistributedBatches(shards, 11, 12, 2, rank=1, world_size=3)
    restored.load_state_dict(saved)
    for want in expected:
        got = restored.next_step()
        assert got.sample_ids == want.sample_ids and (got.start, got.stop) == (want.start, want.stop)
        for a, b in zip(got.micro_batches, want.micro_batches, strict=True):
            assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets)


def test_restored_position_rejects_other_data_or_seed(corpus: Path) -> None:
    shards = TokenShards(corpus, seq_len=32)
    state = DistributedBatches(shards, 11, 12, 2).state_dict()
    with pytest.raises(ValueError, match="seed"):
        DistributedBatches(shards, 12, 12, 2).load_state_dict(state)
    with pytest.raises(ValueError, match="different shards"):
        DistributedBatches(TokenShards(corpus, seq_len=16), 11, 12, 2).load_state_dict(state)


def test_global_batch_smaller_than_world_is_refused(corpus: Path) -> None:
    with pytest.raises(ValueError, match="--global-batch"):
        DistributedBatches(TokenShards(corpus, 32), 1, global_batch=2, micro_batch=1, rank=0, world_size=3)


def test_prepare_with_a_local_tokenizer_json(tmp_path: Path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    docs = write_corpus(tmp_path / "text", documents=2, words=200)
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    trainer = tokenizers.trainers.WordLevelTrainer(special_tokens=["<unk>", "</s>"])
    tok.train([str(p) for p in docs], trainer)
    tok.save(str(tmp_path / "tokenizer.json"))
    out = tmp_path / "shards"
    assert (
        prepare([str(tmp_path / "text"), "-o", str(out), "--tokenizer", str(tmp_path / "tokenizer.json")])
        == 0
    )
    meta = read_meta(out)
    eos = tok.token_to_id("</s>")
    assert meta.eos_id == eos and meta.tokenizer.startswith("tokenizer.json:")
    stored = np.fromfile(out / meta.files[0], dtype=meta.dtype).tolist()
    first_doc = tok.encode(docs[0].read_text()).ids
    assert stored[: len(first_doc) + 1] == [*first_doc, eos]


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--shard-tokens", "1"], "--shard-tokens"),
        (["--tokenizer", "/nonexistent.json"], "--tokenizer"),
        (["--shard-tokens", "many"], "--shard-tokens"),
    ],
)
def test_prepare_rejects_bad_options_in_one_line(tmp_path: Path, args: list[str], option: str) -> None:
    (tmp_path / "a.txt").write_text("x")
    argv = [
        sys.executable,
        "-m",
        "llm_trainer",
        "prepare",
        str(tmp_path / "a.txt"),
        "-o",
        str(tmp_path / "o"),
        *args,
    ]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and option in lines[0] and "Traceback" not in result.stderr
