"""Output projection + cross-entropy over chunks of tokens: the ``[tokens, vocab]`` logits never exist whole.

With a 128k vocabulary the plain path (``F.linear`` then ``F.cross_entropy`` on ``logits.float()``) keeps
several ``[tokens, vocab]`` tensors alive at once: the logits in the compute dtype, their fp32 copy, the
saved log-softmax, and in backward the fp32 gradient of the logits and its cast. For 8192 tokens each fp32
one is 4.2 GB. :func:`linear_cross_entropy` walks the tokens ``chunk_tokens`` at a time instead: per chunk
it computes the logits, upcasts them to fp32, takes the log-sum-exp and the target logit, and, when a
gradient is wanted, turns the same buffer into ``softmax - one_hot`` in place and multiplies it out into the
gradients of the hidden states and of the weight right away (the weight's is accumulated in fp32 across
chunks). Backward then only scales those two by the incoming gradient. So at most one chunk's logits exist
at a time, and nothing is recomputed: three matmuls of the output layer per token, as on the plain path
(``docs/decisions.md`` T14 compares this with recomputing the chunk's logits in backward).

Precision follows the plain path: under autocast the matmuls run in the autocast dtype (bf16) and the
softmax in fp32; without autocast in the inputs' dtype. The result is the **sum** of the token losses
(the trainer scales it itself). Targets must be valid token ids (no ``ignore_index``: the trainer has no
padding tokens).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F


def plain_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Summed token cross-entropy through the full logits (the reference path)."""
    logits = F.linear(hidden, weight)
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="sum")


def compute_dtype(hidden: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The dtype the output projection runs in: autocast's when it is on, else the inputs' common dtype."""
    device_type = hidden.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return torch.promote_types(hidden.dtype, weight.dtype)


def chunked_loss_and_grads(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    chunk_tokens: int,
    dtype: torch.dtype,
    want_hidden_grad: bool,
    want_weight_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """``(summed loss, d loss / d hidden, d loss / d weight)`` for ``hidden [tokens, dim]``, ``weight
    [vocab, dim]`` and ``targets [tokens]``, one chunk of tokens at a time (gradients None unless wanted).

    The softmax runs in fp32 (fp64 for fp64 inputs), the hidden gradient has ``dtype``, the weight gradient
    is accumulated in fp32 (or fp64).
    """
    h = hidden.to(dtype)
    w = weight.to(dtype)
    tokens = h.shape[0]
    wide = torch.promote_types(dtype, torch.float32)
    total = torch.zeros((), dtype=wide, device=h.device)
    grad_hidden = torch.empty_like(h) if want_hidden_grad else None
    grad_weight = torch.zeros(weight.shape, dtype=wide, device=weight.device) if want_weight_grad else None
    want_grad = grad_hidden is not None or grad_weight is not None
    for start in range(0, tokens, chunk_tokens):
        stop = min(start + chunk_tokens, tokens)
        h_chunk = h[start:stop]
        t_chunk = targets[start:stop]
        # The chunk's only [chunk, vocab] fp32 buffer (no copy when dtype is fp32).
        logits = (h_chunk @ w.t()).to(wide)
        target_logit = logits.gather(1, t_chunk.unsqueeze(1)).squeeze(1)
        if torch.compiler.is_compiling():
            # Traced by torch.compile: Inductor fuses logsumexp and exp into a few kernels and plans the
            # buffers itself (the in-place chain below makes it keep three chunk-sized buffers: measured).
            lse = torch.logsumexp(logits, dim=1, keepdim=True)
            probs = logits.sub_(lse).exp_()
        else:
            # Eager: max, exp, sum and division in the logits' own buffer (torch.logsumexp would allocate
            # two more buffers of its size).
            row_max = logits.amax(dim=1, keepdim=True)
            probs = logits.sub_(row_max).exp_()
            row_sum = probs.sum(dim=1, keepdim=True)
            lse = row_sum.log() + row_max
            if want_grad:
                probs.div_(row_sum)
        total += (lse.squeeze(1) - target_logit).sum()
        if want_grad:
            # d loss / d logits = softmax - one_hot(target), in the same buffer.
            probs[torch.arange(stop - start, device=probs.device), t_chunk] -= 1.0
            d_logits = probs.to(dtype)
            if grad_hidden is not None:
                torch.mm(d_logits, w, out=grad_hidden[start:stop])
            if grad_weight is not None:
                if dtype == wide:
                    grad_weight.addmm_(d_logits.t(), h_chunk)
                else:
                    grad_weight += d_logits.t() @ h_chunk
            del d_logits
        del logits, probs  # before the next chunk's matmul allocates its buffer
    return total, grad_hidden, grad_weight


class _LinearCrossEntropy(torch.autograd.Function):
    """Loss and both gradients in forward; backward scales the gradients by the incoming one."""

    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        targets: torch.Tensor,
        chunk_tokens: int,
        dtype: torch.dtype,
    ) -> torch.Tensor:
        with torch.autocast(hidden.device.type, enabled=False):
            total, grad_hidden, grad_weight = chunked_loss_and_grads(
                hidden,
                weight,
                targets,
                chunk_tokens,
                dtype,
                want_hidden_grad=ctx.needs_input_grad[0],
                want_weight_grad=ctx.needs_input_grad[1],
            )
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.input_dtypes = (hidden.dtype, weight.dtype)
        return total

    @staticmethod
    def backward(ctx: Any, grad_total: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        grad_hidden, grad_weight = ctx.saved_tensors
        hidden_dtype, weight_dtype = ctx.input_dtypes
        # In place: no second weight-sized buffer; a second backward through the same graph then fails
        # loudly (autograd's saved-tensor version check) instead of scaling twice.
        d_hidden = None if grad_hidden is None else grad_hidden.mul_(grad_total).to(hidden_dtype)
        d_weight = None if grad_weight is None else grad_weight.mul_(grad_total).to(weight_dtype)
        return d_hidden, d_weight, None, None, None


def linear_cross_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk_tokens: int
) -> torch.Tensor:
    """Sum over tokens of ``cross_entropy(hidden @ weight.T, targets)``.

    ``hidden`` is ``[..., dim]``, ``weight`` ``[vocab, dim]``, ``targets`` ``[...]`` (token ids).
    ``chunk_tokens`` > 0 computes the logits that many tokens at a time (a chunk as large as the input is
    still one buffer fewer than the plain path); 0 takes the plain path through the full logits.
    """
    if chunk_tokens <= 0:
        return plain_cross_entropy(hidden, weight, targets)
    flat_hidden = hidden.reshape(-1, hidden.shape[-1])
    flat_targets = targets.reshape(-1)
    dtype = compute_dtype(hidden, weight)
    if not (torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)):
        with torch.no_grad(), torch.autocast(hidden.device.type, enabled=False):
            return chunked_loss_and_grads(
                flat_hidden, weight, flat_targets, chunk_tokens, dtype, False, False
            )[0]
    total: torch.Tensor = _LinearCrossEntropy.apply(flat_hidden, weight, flat_targets, chunk_tokens, dtype)
    return total
