"""The real ``Trainer`` in this process (standalone: the runtime's one-rank gloo group): the loss options
change nothing it records, ``--compile`` trains the same steps, and a step reads device values back to the
host once."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from llm_elastic import Step
from llm_elastic import commit as commit_module
from llm_elastic.commit import FLAGS
from llm_trainer.config import TrainConfig
from llm_trainer.train import Trainer
from torch.utils._python_dispatch import TorchDispatchMode

pytestmark = pytest.mark.trainer

TIMING = {"time", "tokens_per_s", "step_time", "process_started"}
"""Fields of metrics.jsonl that depend on the clock."""


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


STANDALONE: dict[str, str] = {}
"""No operator or torchrun variables: the runtime makes a one-process group of its own."""


def _train(cfg: TrainConfig) -> tuple[list[dict[str, Any]], dict[str, torch.Tensor]]:
    trainer = Trainer(cfg, STANDALONE)
    assert trainer.train() == 0
    records = [
        json.loads(line) for line in (Path(cfg.checkpoint_dir) / "metrics.jsonl").read_text().splitlines()
    ]
    state = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
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
    corpus: Path, tmp_path: Path
) -> None:
    plain = _train(_config(corpus, tmp_path / "plain", loss_chunk_tokens=0))
    chunked = _train(_config(corpus, tmp_path / "chunked", loss_chunk_tokens=48))
    # Same samples (positions, ids' CRC), same lr and accumulation; the loss and weights to fp32 rounding.
    _assert_same_training(chunked, plain, loss_rtol=1e-5, lr=TrainConfig.lr)
    assert plain[0][0]["grad_accum"] == 2 and plain[0][1]["sample_end"] == 12


def test_compiled_model_trains_the_same_steps(corpus: Path, tmp_path: Path) -> None:
    """``--compile`` on CPU (inductor, C++ codegen): the first step compiles the DDP-wrapped model with the
    chunked loss in its forward, about 45 s on the 2-core development VM with a cold compile cache."""
    eager = _train(_config(corpus, tmp_path / "eager", loss_chunk_tokens=48))
    torch._dynamo.utils.counters.clear()
    started = time.monotonic()
    compiled = _train(_config(corpus, tmp_path / "compiled", loss_chunk_tokens=48, compile=True))
    elapsed = time.monotonic() - started
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    torch._dynamo.reset()
    assert graphs >= 1, "nothing was compiled"
    _assert_same_training(compiled, eager, loss_rtol=1e-5, lr=TrainConfig.lr)
    print(f"compiled run: {elapsed:.1f}s")


class ScalarReads(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Counts the operations that hand one tensor value to Python (``.item()``, ``float(t)``, ``bool(t)``):
    each is a device-to-host sync on a GPU."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.reads = 0
        self.paused = False

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.ops.aten._local_scalar_dense.default and not self.paused:
            self.reads += 1
        return func(*args, **(kwargs or {}))


def test_a_step_reads_its_values_back_in_one_transfer(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = _config(corpus, tmp_path, steps=3, global_batch=12, micro_batch=2)  # 6 micro-steps per step
    trainer = Trainer(cfg, STANDALONE)
    transfers: list[int] = []
    real_host_values = commit_module.host_values

    def counted(reduced: torch.Tensor) -> list[float]:
        transfers.append(reduced.numel())
        return real_host_values(reduced)

    monkeypatch.setattr(commit_module, "host_values", counted)
    reads = ScalarReads()
    real_step = trainer.optimizer.step

    def unwatched_step(*args: Any, **kwargs: Any) -> Any:
        # CPU AdamW reads its step counter with .item(); CUDA's fused AdamW (what the trainer uses on a
        # GPU) keeps it on the device. Not the trainer's own code: not counted.
        reads.paused = True
        try:
            return real_step(*args, **kwargs)
        finally:
            reads.paused = False

    monkeypatch.setattr(trainer.optimizer, "step", unwatched_step)
    monkeypatch.setattr(trainer.elastic.persistence, "final_save", lambda: None)  # not part of a step
    with reads:
        assert trainer.train() == 0
    assert reads.reads == 0
    # One transfer per step: the loss, the five flags (non-finite values, membership changed, stopping,
    # snapshot busy, a restarted program) and per member its compute time and the job's restart count.
    assert transfers == [1 + FLAGS + 2] * 3
    records = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in records] == [1, 2, 3]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (CUDA's sync debug mode)")
def test_a_gpu_step_never_waits_for_the_device(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a GPU: after a warm-up step (DDP's and the allocators' first-use work), the trainer queues a
    step's micro-steps without a single synchronising call (CUDA raises on the first one); the commit's
    one read-back is the step's only sync."""
    trainer = Trainer(_config(corpus, tmp_path, global_batch=8, micro_batch=2, steps=3), STANDALONE)
    real_batch, real_commit = Trainer.batch, Step.commit
    checked: list[int] = []

    def strict_batch(self: Trainer, index: int, rank: int, world_size: int) -> Any:
        out = real_batch(self, index, rank, world_size)
        if index >= 1:
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
            checked.append(index)
        return out

    def relaxed_commit(self: Step, *args: Any, **kwargs: Any) -> float:
        torch.cuda.set_sync_debug_mode("default")
        return real_commit(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "batch", strict_batch)
    monkeypatch.setattr(Step, "commit", relaxed_commit)
    try:
        assert trainer.train() == 0
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert checked == [1, 2]
