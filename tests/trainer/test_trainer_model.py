"""Model shapes, named configs and the training command line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from llm_trainer.cli import field_docs, parse_train_args
from llm_trainer.config import MODELS, ModelConfig, TrainConfig, model_config
from llm_trainer.model import Transformer, apply_rope, rope_tables

pytestmark = pytest.mark.trainer


def test_tiny_forward_shapes_and_loss_at_init() -> None:
    cfg = model_config("tiny")
    model = Transformer(cfg)
    model.init_weights(seed=0)
    tokens = torch.randint(0, cfg.vocab_size, (3, 17), generator=torch.Generator().manual_seed(0))
    logits = model(tokens)
    assert logits.shape == (3, 17, cfg.vocab_size)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, cfg.vocab_size), tokens.reshape(-1))
    # A fresh model predicts roughly uniformly.
    assert abs(loss.item() - torch.log(torch.tensor(float(cfg.vocab_size))).item()) < 1.0


def test_attention_is_causal() -> None:
    cfg = model_config("tiny")
    model = Transformer(cfg).eval()
    model.init_weights(seed=0)
    tokens = torch.randint(0, cfg.vocab_size, (1, 12))
    changed = tokens.clone()
    changed[0, 8:] = (changed[0, 8:] + 1) % cfg.vocab_size
    with torch.no_grad():
        a, b = model(tokens), model(changed)
    assert torch.allclose(a[0, :8], b[0, :8], atol=1e-5)
    assert not torch.allclose(a[0, 8:], b[0, 8:])


def test_grouped_query_attention_has_fewer_kv_weights() -> None:
    cfg = model_config("tiny")
    attention = Transformer(cfg).layers[0].attention
    assert attention.wq.weight.shape == (cfg.n_heads * cfg.head_dim, cfg.dim)
    assert attention.wk.weight.shape == (cfg.n_kv_heads * cfg.head_dim, cfg.dim)
    assert cfg.n_kv_heads < cfg.n_heads


def test_rope_rotation_preserves_norm_and_is_relative() -> None:
    tables = rope_tables(16, 8, 10000.0)
    x = torch.randn(1, 16, 2, 8)
    rotated = apply_rope(x, tables)
    assert torch.allclose(rotated.norm(dim=-1), x.norm(dim=-1), atol=1e-5)
    q = torch.randn(8).expand(1, 16, 1, 8)
    rq = apply_rope(q, tables)[0, :, 0]
    # Dot products depend only on the distance between positions.
    assert torch.allclose(rq[3] @ rq[5], rq[9] @ rq[11], atol=1e-4)


@pytest.mark.parametrize(
    ("name", "low", "high"),
    [("125m", 110e6, 170e6), ("1b", 1.1e9, 1.4e9), ("8b", 7.8e9, 8.2e9), ("70b", 69e9, 72e9)],
)
def test_named_shapes_have_their_advertised_size(name: str, low: float, high: float) -> None:
    cfg = model_config(name)
    cfg.validate()
    assert low <= cfg.num_params() <= high
    # The formula matches the real module, built on the meta device (no memory).
    with torch.device("meta"):
        model = Transformer(cfg)
    assert sum(p.numel() for p in model.parameters()) == cfg.num_params()


def test_model_names_accept_llama_prefix() -> None:
    assert model_config("llama-8b") is MODELS["8b"] and model_config("LLAMA-TINY") is MODELS["tiny"]
    with pytest.raises(KeyError, match="known"):
        model_config("gpt-5")


def test_inconsistent_shape_is_refused() -> None:
    with pytest.raises(ValueError, match="n_kv_heads"):
        ModelConfig(
            dim=64, n_layers=1, n_heads=4, n_kv_heads=3, ffn_dim=8, vocab_size=8, max_seq_len=8
        ).validate()


def test_every_train_option_is_documented() -> None:
    docs = field_docs(TrainConfig)
    assert set(docs) == set(TrainConfig.__dataclass_fields__)
    assert all(len(text) > 10 for text in docs.values())
    assert set(field_docs(ModelConfig)) >= {"dim", "n_layers", "n_heads", "n_kv_heads", "ffn_dim"}


def test_overrides_and_env_default(monkeypatch: pytest.MonkeyPatch, corpus: Path) -> None:
    monkeypatch.setenv("LLMJOB_CHECKPOINT_DIR", "/fsx/ckpt")
    data = str(corpus)
    cfg = parse_train_args(["--data", data, "--model", "125m", "--global-batch", "64", "--compile"])
    assert (cfg.checkpoint_dir, cfg.model, cfg.global_batch, cfg.compile) == ("/fsx/ckpt", "125m", 64, True)
    assert parse_train_args(["--data", data, "--checkpoint-dir", "/x"]).checkpoint_dir == "/x"


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--checkpoint-dir", "/c", "--steps", "ten"], "--steps"),
        (["--checkpoint-dir", "/c", "--model", "huge"], "--model"),
        (["--checkpoint-dir", "/c", "--seq-len", "100000"], "--seq-len"),
        ([], "--checkpoint-dir"),
        (["--checkpoint-dir", "/c", "--parallel", "zero3"], "--parallel"),
        (["--checkpoint-dir", "/c", "--bogus"], "--bogus"),
        (["--checkpoint-dir", "/c", "--data", "/nonexistent"], "--data"),
    ],
)
def test_bad_cli_input_is_one_line_exit_2(args: list[str], option: str, corpus: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)}
    argv = [sys.executable, "-m", "llm_trainer", "--data", str(corpus), *args]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and option in lines[0] and "Traceback" not in result.stderr
