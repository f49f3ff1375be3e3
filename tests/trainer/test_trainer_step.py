"""The real ``Trainer`` in this process (one gloo rank): the loss options change nothing it records, and
``--compile`` trains the same steps."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from llm_trainer.config import TrainConfig
from llm_trainer.distributed import DistEnv, init_distributed, unwrap
from llm_trainer.signals import StopRequest
from llm_trainer.train import Trainer

pytestmark = pytest.mark.trainer

TIMING = {"time", "tokens_per_s", "step_time", "process_started"}
"""Fields of metrics.jsonl that depend on the clock."""


@pytest.fixture
def one_rank(monkeypatch: pytest.MonkeyPatch) -> Iterator[DistEnv]:
    """A one-process gloo group (no torchrun variables), destroyed after the test."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "LLMJOB_CHECKPOINT_DIR"):
        monkeypatch.delenv(name, raising=False)
    env = init_distributed(60)
    try:
        yield env
    finally:
        dist.destroy_process_group()


def _config(corpus: Path, folder: Path, **overrides: Any) -> TrainConfig:
    settings: dict[str, Any] = dict(
        data=str(corpus),
        checkpoint_dir=str(folder),
        model="tiny",
        seq_len=32,
        global_batch=6,
        micro_batch=4,  # two micro-steps of 4 and 2 samples: 128 and 64 tokens
        steps=2,
        warmup_steps=1,
        checkpoint_every=0,
        async_checkpoint=False,
        metrics_port=0,
    )
    settings.update(overrides)
    return TrainConfig(**settings)


def _train(cfg: TrainConfig, env: DistEnv) -> tuple[list[dict[str, Any]], dict[str, torch.Tensor]]:
    trainer = Trainer(cfg, env, StopRequest())
    trainer.restore()
    assert trainer.train() == 0
    records = [
        json.loads(line) for line in (Path(cfg.checkpoint_dir) / "metrics.jsonl").read_text().splitlines()
    ]
    state = {k: v.detach().clone() for k, v in unwrap(trainer.model).state_dict().items()}
    return records, state


def _assert_same_training(
    got: tuple[list[dict[str, Any]], dict[str, torch.Tensor]],
    expected: tuple[list[dict[str, Any]], dict[str, torch.Tensor]],
    loss_rtol: float,
    lr: float,
) -> None:
    """Same records but for the clock; losses to ``loss_rtol``; weights to rounding. AdamW moves every
    weight by about ``lr`` per step whatever its gradient's size, so a weight whose gradient is nearly 0 can
    move differently on a rounding difference: each weight within 2 % of ``lr``, the mean far below."""
    records, state = got
    want_records, want_state = expected
    assert len(records) == len(want_records) == 2
    for record, want in zip(records, want_records, strict=True):
        assert record["loss"] == pytest.approx(want["loss"], rel=loss_rtol)
        same = {k: v for k, v in record.items() if k not in TIMING | {"loss"}}
        assert same == {k: v for k, v in want.items() if k not in TIMING | {"loss"}}
    assert state.keys() == want_state.keys()
    for name, tensor in want_state.items():
        diff = (state[name] - tensor).abs()
        assert diff.max().item() <= 0.02 * lr, (name, diff.max().item())
        assert diff.mean().item() <= 1e-4 * lr, (name, diff.mean().item())


def test_chunked_loss_trains_the_same_steps_and_records_the_same_metrics(
    corpus: Path, tmp_path: Path, one_rank: DistEnv
) -> None:
    plain = _train(_config(corpus, tmp_path / "plain", loss_chunk_tokens=0), one_rank)
    chunked = _train(_config(corpus, tmp_path / "chunked", loss_chunk_tokens=48), one_rank)
    # Same samples (positions, ids' CRC), same lr and accumulation; the loss and weights to fp32 rounding.
    _assert_same_training(chunked, plain, loss_rtol=1e-5, lr=TrainConfig.lr)
    assert plain[0][0]["grad_accum"] == 2 and plain[0][1]["sample_end"] == 12


def test_compiled_model_trains_the_same_steps(corpus: Path, tmp_path: Path, one_rank: DistEnv) -> None:
    """``--compile`` on CPU (inductor, C++ codegen): the first step compiles the DDP-wrapped model with the
    chunked loss in its forward, about 45 s on the 2-core development VM with a cold compile cache."""
    eager = _train(_config(corpus, tmp_path / "eager", loss_chunk_tokens=48), one_rank)
    torch._dynamo.utils.counters.clear()
    started = time.monotonic()
    compiled = _train(_config(corpus, tmp_path / "compiled", loss_chunk_tokens=48, compile=True), one_rank)
    elapsed = time.monotonic() - started
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    torch._dynamo.reset()
    assert graphs >= 1, "nothing was compiled"
    _assert_same_training(compiled, eager, loss_rtol=1e-5, lr=TrainConfig.lr)
    print(f"compiled run: {elapsed:.1f}s")
