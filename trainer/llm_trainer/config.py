"""Typed configuration: model shapes by name and the training run's settings.

Each field carries a docstring; the command line (``llm_trainer.cli``) is generated from these dataclasses
and uses the docstrings as its help text.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from pathlib import Path

from llm_elastic import CHECKPOINT_ENV as CHECKPOINT_DIR_ENV
from llm_elastic import ElasticConfig as _RUNTIME


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a Llama-style decoder."""

    dim: int
    """Width of the residual stream (hidden size)."""
    n_layers: int
    """Number of transformer blocks."""
    n_heads: int
    """Number of query heads; ``dim`` must be divisible by it."""
    n_kv_heads: int
    """Number of key/value heads (grouped-query attention); divides ``n_heads``."""
    ffn_dim: int
    """Hidden width of the SwiGLU feed-forward layer."""
    vocab_size: int
    """Number of token ids the embedding and output layers cover."""
    max_seq_len: int
    """Longest sequence the rotary embedding table is built for."""
    rope_theta: float = 10000.0
    """Base of the rotary position embedding frequencies."""
    norm_eps: float = 1e-5
    """Epsilon of RMSNorm."""
    tie_embeddings: bool = False
    """Share the token embedding matrix with the output projection."""

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.dim // self.n_heads

    def validate(self) -> None:
        """Raise ``ValueError`` when the shape is inconsistent."""
        if min(self.dim, self.n_layers, self.n_heads, self.n_kv_heads, self.ffn_dim, self.vocab_size) < 1:
            raise ValueError("every model dimension must be positive")
        if self.dim % self.n_heads:
            raise ValueError(f"dim {self.dim} is not divisible by n_heads {self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads {self.n_heads} is not divisible by n_kv_heads {self.n_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} must be even for rotary embeddings")

    def num_params(self) -> int:
        """Parameter count (embeddings included, counted once when tied)."""
        d, f, v = self.dim, self.ffn_dim, self.vocab_size
        kv = self.n_kv_heads * self.head_dim
        attn = d * d * 2 + d * kv * 2
        block = attn + 3 * d * f + 2 * d
        embed = v * d * (1 if self.tie_embeddings else 2)
        return self.n_layers * block + embed + d


BYTE_VOCAB = 256 + 2  # bytes + BOS + EOS of the built-in tokenizer

MODELS: dict[str, ModelConfig] = {
    # Seconds on a laptop CPU: for tests, demos and the recovery benchmark.
    "tiny": ModelConfig(
        dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=176, vocab_size=320, max_seq_len=512
    ),
    # GPT-3 small / Llama-style 125M.
    "125m": ModelConfig(
        dim=768, n_layers=12, n_heads=12, n_kv_heads=4, ffn_dim=2048, vocab_size=32000, max_seq_len=2048
    ),
    # Llama 3.2 1B shape.
    "1b": ModelConfig(
        dim=2048,
        n_layers=16,
        n_heads=32,
        n_kv_heads=8,
        ffn_dim=8192,
        vocab_size=128256,
        max_seq_len=8192,
        rope_theta=500000.0,
        tie_embeddings=True,
    ),
    # Llama 3 8B shape.
    "8b": ModelConfig(
        dim=4096,
        n_layers=32,
        n_heads=32,
        n_kv_heads=8,
        ffn_dim=14336,
        vocab_size=128256,
        max_seq_len=8192,
        rope_theta=500000.0,
    ),
    # Llama 3 70B shape.
    "70b": ModelConfig(
        dim=8192,
        n_layers=80,
        n_heads=64,
        n_kv_heads=8,
        ffn_dim=28672,
        vocab_size=128256,
        max_seq_len=8192,
        rope_theta=500000.0,
    ),
}


def model_config(name: str) -> ModelConfig:
    """The named shape; ``llama-`` prefixes and case are ignored (``llama-8b`` == ``8b``)."""
    key = name.lower().removeprefix("llama-").removeprefix("llama")
    if key not in MODELS:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    return MODELS[key]


@dataclass(frozen=True)
class TrainConfig:
    """Everything one training run needs; every field is a command-line option (``--kebab-case``)."""

    data: str = ""
    """Folder of token shards made by ``python -m llm_trainer prepare``."""
    checkpoint_dir: str = ""
    """Folder for step-N checkpoints and metrics.jsonl (default: $LLMJOB_CHECKPOINT_DIR)."""
    model: str = "tiny"
    """Named model shape: tiny, 125m, 1b, 8b or 70b (a llama- prefix is accepted)."""
    seq_len: int = 128
    """Tokens per training sample (at most the model's max_seq_len)."""
    global_batch: int = 16
    """Samples per optimizer step across all ranks; constant when the world size changes."""
    micro_batch: int = 4
    """Samples per forward/backward on one rank; gradient accumulation covers the rest."""
    steps: int = 100
    """Optimizer steps to train in total (a resumed run continues up to this step)."""
    lr: float = 3e-4
    """Peak learning rate."""
    min_lr_ratio: float = 0.1
    """Final learning rate of the cosine schedule as a fraction of the peak."""
    warmup_steps: int = 10
    """Linear warm-up steps."""
    weight_decay: float = 0.1
    """AdamW weight decay."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value (0 disables)."""
    seed: int = 1234
    """Seed of the weight init and of the global sample order."""
    checkpoint_every: int = 50
    """Save a checkpoint every N steps (0: only on SIGTERM and at the end)."""
    keep_checkpoints: int = _RUNTIME.keep_checkpoints
    """How many complete checkpoints to keep (older ones are deleted)."""
    async_checkpoint: bool = _RUNTIME.async_checkpoint
    """Stage checkpoints into host memory and write them in the background (training waits for the copy)."""
    snapshot_every: int = _RUNTIME.snapshot_every
    """Snapshot the state into host shared memory (and a buddy node's) every N steps (0 disables)."""
    snapshot_dir: str = ""
    """Folder in host shared memory for snapshots (default: $LLMJOB_SNAPSHOT_DIR, else a folder under
    /dev/shm/llm-elastic named after the checkpoint directory)."""
    parallel: str = "auto"
    """Data parallelism: ddp, fsdp, hsdp, or auto (fsdp for models over 1B parameters). In process, fsdp
    shards within a pod and replicates across pods (hsdp), so that losing a pod loses no shard."""
    precision: str = "auto"
    """bf16 (autocast on GPU), fp32, or auto (bf16 on GPU, fp32 on CPU)."""
    compile: bool = False
    """torch.compile the model: the whole DDP-wrapped model, loss included (FSDP2: each block); recommended
    on GPU, costs a compile at every (re)start."""
    loss_chunk_tokens: int = 2048
    """Compute the output projection and cross-entropy this many tokens at a time, so the full
    [tokens, vocab] logits never exist (0: all at once, the plain path)."""
    metrics_port: int = _RUNTIME.metrics_port
    """Prometheus port base (this rank listens on port + LOCAL_RANK); 0 disables."""
    dist_timeout: float = _RUNTIME.collective_timeout
    """Seconds a collective may block before the process group gives up (restart mode)."""
    live_timeout: float = _RUNTIME.live_collective_timeout
    """In process: seconds a collective may block before the generation is given up."""
    subgroup_timeout: float = 5.0
    """In process, hsdp on CPU: seconds a mesh-group collective may wait (a spurious timeout re-forms)."""
    lease_ttl: int = _RUNTIME.lease_ttl
    """In process: seconds a silent member stays a member."""
    form_timeout: float = _RUNTIME.form_timeout
    """In process: seconds to wait for a generation to form."""
    start_when: str = ""
    """In process, warm spare: join only once this file exists (imports and model done before)."""
    step_log: str = ""
    """Rank 0's step log (default: <checkpoint-dir>/metrics.jsonl)."""
    peer_stop_grace: float = _RUNTIME.peer_stop_grace
    """After a stop requested by another rank, seconds to wait for our own SIGTERM before exiting."""
    min_step_seconds: float = 0.0
    """Pad every step to at least this wall time (demos and failure tests on tiny models)."""

    def resolved(self) -> TrainConfig:
        """Fill defaults that come from the environment (the snapshot folder: the runtime's default)."""
        out = self
        if not out.checkpoint_dir and os.environ.get(CHECKPOINT_DIR_ENV):
            out = replace(out, checkpoint_dir=os.environ[CHECKPOINT_DIR_ENV])
        return out

    def problems(self) -> list[tuple[str, str]]:
        """``(field, message)`` for every invalid setting."""
        out: list[tuple[str, str]] = []
        if not self.data:
            out.append(("data", "is required (a folder made by `python -m llm_trainer prepare`)"))
        elif not (Path(self.data) / "meta.json").is_file():
            out.append(("data", f"{self.data} has no meta.json (run `python -m llm_trainer prepare`)"))
        if not self.checkpoint_dir and not self.step_log:
            problem = f"is required (or set ${CHECKPOINT_DIR_ENV}; with --step-log alone: no checkpoints)"
            out.append(("checkpoint_dir", problem))
        if not self.checkpoint_dir and self.checkpoint_every:
            out.append(("checkpoint_every", "needs --checkpoint-dir (0: no checkpoints)"))
        try:
            shape = model_config(self.model)
        except KeyError as exc:
            out.append(("model", str(exc.args[0])))
            shape = None
        positive = ("seq_len", "global_batch", "micro_batch", "steps", "keep_checkpoints")
        for name in positive:
            if getattr(self, name) < 1:
                out.append((name, "must be at least 1"))
        not_negative = (
            "checkpoint_every",
            "warmup_steps",
            "metrics_port",
            "snapshot_every",
            "loss_chunk_tokens",
        )
        for name in not_negative:
            if getattr(self, name) < 0:
                out.append((name, "must not be negative"))
        if shape is not None and self.seq_len > shape.max_seq_len:
            out.append(("seq_len", f"{self.seq_len} exceeds the model's max_seq_len {shape.max_seq_len}"))
        if self.lr <= 0:
            out.append(("lr", "must be positive"))
        if not 0 <= self.min_lr_ratio <= 1:
            out.append(("min_lr_ratio", "must be within 0..1"))
        if self.parallel not in ("auto", "ddp", "fsdp", "hsdp"):
            out.append(("parallel", f"must be auto, ddp, fsdp or hsdp, not {self.parallel!r}"))
        if self.precision not in ("auto", "bf16", "fp32"):
            out.append(("precision", f"must be auto, bf16 or fp32, not {self.precision!r}"))
        if self.metrics_port > 65535:
            out.append(("metrics_port", "must be a TCP port"))
        for name in ("dist_timeout", "peer_stop_grace", "min_step_seconds", "grad_clip", "weight_decay"):
            if getattr(self, name) < 0:
                out.append((name, "must not be negative"))
        for name in ("dist_timeout", "live_timeout", "subgroup_timeout", "form_timeout"):
            if getattr(self, name) <= 0:
                out.append((name, "must be positive"))
        if self.lease_ttl < 2:
            out.append(("lease_ttl", "must be at least 2 seconds"))
        return out


def learning_rate(cfg: TrainConfig, step: int) -> float:
    """Linear warm-up to ``lr``, then cosine decay to ``lr * min_lr_ratio`` at ``steps``."""
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    span = max(1, cfg.steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + (cfg.lr - floor) * 0.5 * (1 + math.cos(math.pi * progress))
