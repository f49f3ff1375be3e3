"""A Llama-style decoder in plain PyTorch: RMSNorm, RoPE, SwiGLU, grouped-query attention through SDPA."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from llm_trainer.config import ModelConfig
from llm_trainer.loss import linear_cross_entropy


class RMSNorm(nn.Module):
    """Root-mean-square layer norm with a learned scale (no bias, no mean subtraction)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight

    def reset_parameters(self) -> None:
        """Scale of one."""
        nn.init.ones_(self.weight)


def rope_tables(
    seq_len: int, head_dim: int, theta: float, device: torch.device | None = None
) -> torch.Tensor:
    """``[seq_len, head_dim // 2, 2]``: cos and sin of every position and frequency."""
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), freqs)
    return torch.stack((angles.cos(), angles.sin()), dim=-1)


def apply_rope(x: torch.Tensor, tables: torch.Tensor) -> torch.Tensor:
    """Rotate pairs of channels of ``x`` (``[batch, seq, heads, head_dim]``) by their position's angle."""
    pairs = x.float().reshape(*x.shape[:-1], -1, 2)
    cos = tables[: x.shape[1], :, 0].unsqueeze(1)
    sin = tables[: x.shape[1], :, 1].unsqueeze(1)
    real = pairs[..., 0] * cos - pairs[..., 1] * sin
    imag = pairs[..., 0] * sin + pairs[..., 1] * cos
    return torch.stack((real, imag), dim=-1).flatten(-2).type_as(x)


class Attention(nn.Module):
    """Causal self-attention with grouped-query heads and rotary positions."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.n_kv_heads = cfg.n_kv_heads
        self.head_dim = cfg.head_dim
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        q = self.wq(x).view(batch, seq, self.n_heads, self.head_dim)
        k = self.wk(x).view(batch, seq, self.n_kv_heads, self.head_dim)
        v = self.wv(x).view(batch, seq, self.n_kv_heads, self.head_dim)
        q, k = apply_rope(q, rope), apply_rope(k, rope)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        if self.n_kv_heads != self.n_heads:
            repeat = self.n_heads // self.n_kv_heads
            k = k.repeat_interleave(repeat, dim=1)
            v = v.repeat_interleave(repeat, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        projected: torch.Tensor = self.wo(out.transpose(1, 2).reshape(batch, seq, -1))
        return projected


class FeedForward(nn.Module):
    """SwiGLU: ``w2(silu(w1 x) * w3 x)``."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)
        self.w3 = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)
        self.w2 = nn.Linear(cfg.ffn_dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.w2(F.silu(self.w1(x)) * self.w3(x))
        return out


class Block(nn.Module):
    """Pre-norm transformer block: attention then feed-forward, each with a residual."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.feed_forward = FeedForward(cfg)

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), rope)
        out: torch.Tensor = x + self.feed_forward(self.ffn_norm(x))
        return out


class Transformer(nn.Module):
    """Token embedding, ``n_layers`` blocks, final norm and output projection to logits."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        # Derived from the config, rebuilt by init_weights(): not part of the checkpoint.
        self.register_buffer(
            "rope", rope_tables(cfg.max_seq_len, cfg.head_dim, cfg.rope_theta), persistent=False
        )

    def init_weights(self, seed: int | None = None) -> None:
        """(Re)initialise every parameter and buffer, e.g. after ``to_empty`` from the meta device."""
        generator_state = torch.random.get_rng_state()
        if seed is not None:
            torch.manual_seed(seed)
        device = self.tok_embeddings.weight.device
        self.rope = rope_tables(self.cfg.max_seq_len, self.cfg.head_dim, self.cfg.rope_theta, device=device)
        out_std = 0.02 / math.sqrt(2 * self.cfg.n_layers)
        nn.init.normal_(self.tok_embeddings.weight, std=0.02)
        for block in self.layers:
            assert isinstance(block, Block)
            for linear in (block.attention.wq, block.attention.wk, block.attention.wv, block.feed_forward.w1):
                nn.init.normal_(linear.weight, std=0.02)
            nn.init.normal_(block.feed_forward.w3.weight, std=0.02)
            nn.init.normal_(block.attention.wo.weight, std=out_std)
            nn.init.normal_(block.feed_forward.w2.weight, std=out_std)
            block.attention_norm.reset_parameters()
            block.ffn_norm.reset_parameters()
        self.norm.reset_parameters()
        if not self.cfg.tie_embeddings:
            nn.init.normal_(self.output.weight, std=self.cfg.dim**-0.5)
        if seed is not None:
            torch.random.set_rng_state(generator_state)

    def hidden_states(self, tokens: torch.Tensor) -> torch.Tensor:
        """The final (normed) hidden states ``[batch, seq, dim]`` for token ids ``[batch, seq]``: what the
        output projection turns into logits."""
        x = self.tok_embeddings(tokens)
        rope = self.rope
        for block in self.layers:
            x = block(x, rope)
        normed: torch.Tensor = self.norm(x)
        return normed

    def forward(
        self, tokens: torch.Tensor, targets: torch.Tensor | None = None, loss_chunk_tokens: int = 0
    ) -> torch.Tensor:
        """Logits ``[batch, seq, vocab]`` for token ids ``[batch, seq]``; with ``targets`` instead the sum of
        the token cross-entropies (a scalar), the logits computed ``loss_chunk_tokens`` tokens at a time
        (0: all at once; see ``llm_trainer.loss``). The loss is part of the forward so that DDP/FSDP see the
        output weight used inside the wrapped module."""
        hidden = self.hidden_states(tokens)
        if targets is None:
            logits: torch.Tensor = self.output(hidden)
            return logits
        return linear_cross_entropy(hidden, self.output.weight, targets, loss_chunk_tokens)


def flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """Training FLOPs per token: 6 x parameters (forward + backward) plus the attention score terms."""
    non_embedding = cfg.num_params() - cfg.vocab_size * cfg.dim * (1 if cfg.tie_embeddings else 2)
    matmul_params = non_embedding + cfg.vocab_size * cfg.dim  # the output projection is a matmul
    attention = 12 * cfg.n_layers * cfg.dim * seq_len  # QK^T and AV, forward + backward, causal not halved
    return 6.0 * matmul_params + attention
