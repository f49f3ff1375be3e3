"""Chunked output projection + cross-entropy (``llm_trainer.loss``) against the plain path, and its option."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from llm_trainer.cli import parse_train_args
from llm_trainer.config import ModelConfig, TrainConfig
from llm_trainer.loss import linear_cross_entropy, plain_cross_entropy
from llm_trainer.model import Transformer
from torch.utils._python_dispatch import TorchDispatchMode

pytestmark = pytest.mark.trainer

SMALL: dict[str, int] = dict(
    dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, vocab_size=517, max_seq_len=64
)


def _inputs(batch: int, seq: int, vocab: int, dim: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(batch * 100 + seq)
    hidden = torch.randn(batch, seq, dim, generator=gen, dtype=dtype, requires_grad=True)
    weight = (torch.randn(vocab, dim, generator=gen, dtype=dtype) * dim**-0.5).requires_grad_()
    targets = torch.randint(0, vocab, (batch, seq), generator=gen)
    return hidden, weight, targets


def _reference(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Full logits in the inputs' own dtype (fp64 stays fp64, unlike the trainer's plain path)."""
    logits = hidden @ weight.t()
    return F.cross_entropy(logits.reshape(-1, weight.shape[0]), targets.reshape(-1), reduction="sum")


def _loss_and_grads(
    chunk: int | None, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Loss and the gradients of hidden and weight; chunk None: the fp64-capable reference."""
    h = hidden.detach().clone().requires_grad_()
    w = weight.detach().clone().requires_grad_()
    loss = _reference(h, w, targets) if chunk is None else linear_cross_entropy(h, w, targets, chunk)
    (loss * 0.37).backward()  # type: ignore[no-untyped-call]
    assert h.grad is not None and w.grad is not None
    return loss.detach(), h.grad, w.grad


@pytest.mark.parametrize(
    ("batch", "seq", "chunk"),
    [(3, 17, 16), (3, 17, 1), (2, 8, 5), (1, 33, 1000), (4, 16, 64), (2, 9, 18)],
)
def test_chunked_loss_and_gradients_equal_full_logits_in_fp64(batch: int, seq: int, chunk: int) -> None:
    hidden, weight, targets = _inputs(batch, seq, 211, 12, torch.float64)
    reference = _loss_and_grads(None, hidden, weight, targets)
    chunked = _loss_and_grads(chunk, hidden, weight, targets)
    assert chunked[0].dtype == torch.float64
    for expected, got in zip(reference, chunked, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("batch", "seq", "chunk"), [(3, 17, 16), (2, 30, 7), (1, 12, 12)])
def test_chunked_loss_and_gradients_equal_the_plain_path_in_fp32(batch: int, seq: int, chunk: int) -> None:
    hidden, weight, targets = _inputs(batch, seq, 211, 12, torch.float32)
    plain = _loss_and_grads(0, hidden, weight, targets)
    chunked = _loss_and_grads(chunk, hidden, weight, targets)
    torch.testing.assert_close(chunked[0], plain[0], rtol=1e-6, atol=0)
    for expected, got in zip(plain[1:], chunked[1:], strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6 * expected.abs().max().item())


def _model_grads(cfg: ModelConfig, chunk: int, tokens: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
    model = Transformer(cfg)
    model.init_weights(seed=3)
    loss = model(tokens[:, :-1], tokens[:, 1:], chunk)
    (loss * 0.01).backward()
    return loss.detach(), {name: p.grad for name, p in model.named_parameters()}


@pytest.mark.parametrize("tie", [False, True])
@pytest.mark.parametrize(("batch", "seq", "chunk"), [(3, 17, 16), (2, 24, 7), (1, 40, 40), (2, 5, 64)])
def test_every_parameter_gradient_equals_the_plain_path(tie: bool, batch: int, seq: int, chunk: int) -> None:
    cfg = ModelConfig(**SMALL, tie_embeddings=tie)
    tokens = torch.randint(0, cfg.vocab_size, (batch, seq + 1), generator=torch.Generator().manual_seed(seq))
    plain_loss, plain = _model_grads(cfg, 0, tokens)
    loss, grads = _model_grads(cfg, chunk, tokens)
    torch.testing.assert_close(loss, plain_loss, rtol=2e-6, atol=0)
    assert set(grads) == set(plain) and len(plain) == 2 + 9 * cfg.n_layers + (0 if tie else 1)
    for name, expected in plain.items():
        got = grads[name]
        assert expected is not None and got is not None, name
        assert got.dtype == expected.dtype == torch.float32
        scale = expected.abs().max().item()
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5 * scale, msg=name)


def test_the_branch_torch_compile_traces_gives_the_same_loss_and_gradients() -> None:
    """Under torch.compile the chunk's softmax is written for Inductor (logsumexp); ``aot_eager`` traces it
    as compile does, without code generation."""
    hidden, weight, targets = _inputs(3, 17, 211, 12, torch.float32)
    compiled = torch.compile(linear_cross_entropy, backend="aot_eager", fullgraph=True)
    h = hidden.detach().clone().requires_grad_()
    w = weight.detach().clone().requires_grad_()
    loss = compiled(h, w, targets, 16)
    (loss * 0.37).backward()  # type: ignore[no-untyped-call]
    torch._dynamo.reset()
    plain = _loss_and_grads(0, hidden, weight, targets)
    assert h.grad is not None and w.grad is not None
    torch.testing.assert_close(loss.detach(), plain[0], rtol=1e-6, atol=0)
    for expected, got in zip(plain[1:], (h.grad, w.grad), strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6 * expected.abs().max().item())


def test_bf16_autocast_follows_the_plain_path() -> None:
    hidden, weight, targets = _inputs(2, 40, 300, 24, torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plain = _loss_and_grads(0, hidden, weight, targets)
        chunked = _loss_and_grads(16, hidden, weight, targets)
    # Gradients arrive in the parameters' dtype, computed like the plain path (bf16 matmuls, fp32 softmax).
    assert chunked[1].dtype == chunked[2].dtype == torch.float32
    torch.testing.assert_close(chunked[0], plain[0], rtol=1e-3, atol=0)
    for expected, got in zip(plain[1:], chunked[1:], strict=True):
        torch.testing.assert_close(got, expected, rtol=0.02, atol=0.02 * expected.abs().max().item())


def test_without_grad_only_the_loss_is_computed() -> None:
    hidden, weight, targets = _inputs(2, 11, 50, 8, torch.float32)
    with torch.no_grad():
        loss = linear_cross_entropy(hidden, weight, targets, 4)
        expected = plain_cross_entropy(hidden, weight, targets)
    assert loss.grad_fn is None
    torch.testing.assert_close(loss, expected, rtol=1e-6, atol=0)


class LargestTensor(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Records the most elements of any tensor an operation returns."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.largest = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for item in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(item, torch.Tensor):
                self.largest = max(self.largest, item.numel())
        return out


@pytest.mark.parametrize(("chunk", "holds_full_logits"), [(0, True), (8, False)])
def test_the_chunked_path_never_makes_a_tokens_by_vocab_tensor(chunk: int, holds_full_logits: bool) -> None:
    tokens, vocab, dim = 64, 1000, 16  # tokens x vocab (64k) > vocab x dim (16k, the weight's gradient)
    hidden, weight, targets = _inputs(1, tokens, vocab, dim, torch.float32)
    with LargestTensor() as seen:
        loss = linear_cross_entropy(hidden, weight, targets, chunk)
        loss.backward()  # type: ignore[no-untyped-call]
    assert (seen.largest >= tokens * vocab) is holds_full_logits, seen.largest
    if not holds_full_logits:
        assert seen.largest == vocab * dim


def test_a_second_backward_through_the_same_loss_fails_loudly() -> None:
    hidden, weight, targets = _inputs(1, 10, 40, 8, torch.float32)
    loss = linear_cross_entropy(hidden, weight, targets, 4)
    loss.backward(retain_graph=True)  # type: ignore[no-untyped-call]
    # The saved gradients are scaled in place: reusing them must not silently scale twice.
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()  # type: ignore[no-untyped-call]


# -- the option ---------------------------------------------------------------------------------------------


def test_loss_chunk_tokens_default_and_values(corpus: Path) -> None:
    base = ["--data", str(corpus), "--checkpoint-dir", "/c"]
    assert parse_train_args(base).loss_chunk_tokens == TrainConfig().loss_chunk_tokens == 2048
    assert parse_train_args([*base, "--loss-chunk-tokens", "0"]).loss_chunk_tokens == 0
    assert parse_train_args([*base, "--loss-chunk-tokens", "777"]).loss_chunk_tokens == 777


@pytest.mark.parametrize(
    ("value", "message"), [("-1", "must not be negative"), ("many", "invalid int value")]
)
def test_bad_loss_chunk_tokens_is_one_line_exit_2(value: str, message: str, corpus: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)}
    argv = [sys.executable, "-m", "llm_trainer", "--data", str(corpus), "--checkpoint-dir", "/c"]
    result = subprocess.run(
        [*argv, "--loss-chunk-tokens", value], capture_output=True, text=True, timeout=60, env=env
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--loss-chunk-tokens" in lines[0] and message in lines[0], result.stderr
