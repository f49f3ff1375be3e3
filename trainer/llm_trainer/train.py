"""The training loop of the reference trainer: one loop for every recovery mode, a client of ``llm_elastic``.

The runtime (``llm_elastic.Elastic``) owns what happens around the loop: the process group (torchrun's in
restart mode, a fresh one per generation in process), restoring from a snapshot, a checkpoint or a peer,
checkpoints and snapshots at step boundaries, the step log, the metrics endpoint, SIGTERM. This module
owns the model, its optimizer, the data and one step. Exit codes: ``llm_elastic.errors``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from pathlib import Path
from typing import Any

import torch
from llm_elastic import (
    DDP,
    HSDP,
    IN_PROCESS,
    RESTART,
    Contract,
    Elastic,
    ElasticConfig,
    ElasticSampler,
    Step,
    WrapPolicy,
    read_contract,
)
from torch import nn

from llm_trainer.config import ModelConfig, TrainConfig, learning_rate, model_config
from llm_trainer.data.loader import DistributedBatches, StepBatch
from llm_trainer.data.shards import TokenShards
from llm_trainer.distributed import choose_parallel, gradient_sync
from llm_trainer.model import Transformer

log = logging.getLogger(__name__)

RAISE_AT_STEP_ENV = "LLM_TRAINER_FAULT_RAISE_AT_STEP"
"""Fault injection for tests: a bug in the step (``ValueError``) when step N starts, in this process only
(a local failure, not a lost peer: recovery layer 2 restarts the process)."""
NAN_AT_STEPS_ENV = "LLM_TRAINER_FAULT_NAN_AT_STEPS"
"""Fault injection for tests: comma-separated 1-based steps (``3`` or ``5,6``) whose loss is NaN in this
process only, each once (a step trained again after a rollback is clean): the backward and the commit carry
the NaN, as a real overflow would; the job's loss rules (``$LLMJOB_LOSS_RULES``) decide what happens."""


NAN_REPLICA_ENV = "LLM_TRAINER_FAULT_NAN_REPLICA"
"""With ``$LLM_TRAINER_FAULT_NAN_AT_STEPS``: only the worker of this replica index (``$LLMJOB_REPLICA_INDEX``,
set by the operator) injects, so a job's env can break one member of many."""


def nan_steps(raw: str) -> set[int]:
    """The steps of ``$LLM_TRAINER_FAULT_NAN_AT_STEPS`` (empty: none)."""
    try:
        return {int(part) for part in raw.split(",") if part.strip()}
    except ValueError:
        raise ValueError(f"${NAN_AT_STEPS_ENV} must be comma-separated step numbers, got {raw!r}") from None


class DataIdentity:
    """The token shards a run trains on, as a ``Stateful``: a saved state made for other data is refused."""

    def __init__(self, shards: TokenShards) -> None:
        self.fingerprint = shards.fingerprint

    def state_dict(self) -> dict[str, Any]:
        return {"fingerprint": self.fingerprint}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("fingerprint") != self.fingerprint:
            raise ValueError(
                "the saved data position refers to different shards or seq_len "
                f"({state.get('fingerprint')} != {self.fingerprint}); point --checkpoint-dir elsewhere "
                "or match --data/--seq-len/--seed"
            )


def _optimizer(cfg: TrainConfig, model: nn.Module, cuda: bool) -> torch.optim.Optimizer:
    return torch.optim.AdamW(
        model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay, fused=cuda
    )


def build(
    cfg: TrainConfig, shape: ModelConfig, contract: Contract, cuda: bool, bf16: bool
) -> tuple[nn.Module, torch.optim.Optimizer, WrapPolicy]:
    """The model (on the meta device when a policy shards it), its optimizer and the wrap policy."""
    world = contract.world_size if contract.mode == RESTART else contract.local_world_size
    parallel = choose_parallel(cfg.parallel, shape, world)
    device = torch.device("cuda", contract.local_rank) if cuda else torch.device("cpu")
    if parallel == "ddp":
        model = Transformer(shape)
        model.init_weights(cfg.seed)
        model.to(device)
        return model, _optimizer(cfg, model, cuda), DDP(compile=cfg.compile)
    # fsdp: shard over every rank in restart mode; in process over the pod's processes, replicated across
    # pods (losing a pod then loses no shard). hsdp: always the latter.
    shard = (
        contract.world_size
        if parallel == "fsdp" and contract.mode != IN_PROCESS
        else contract.local_world_size
    )
    mixed: Any = None
    if bf16:
        from torch.distributed.fsdp import MixedPrecisionPolicy

        mixed = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)

    def make() -> nn.Module:
        return Transformer(shape)

    def init(module: nn.Module) -> None:
        assert isinstance(module, Transformer)
        module.init_weights(cfg.seed)

    def blocks(module: nn.Module) -> list[nn.Module]:
        assert isinstance(module, Transformer)
        return list(module.layers)

    with torch.device("meta"):
        model = Transformer(shape)
    policy = HSDP(
        build=make,
        init=init,
        make_optimizer=lambda m: _optimizer(cfg, m, cuda),
        shard_size=max(1, shard),
        blocks=blocks,
        subgroup_timeout=cfg.subgroup_timeout,
        mixed_precision=mixed,
        compile=cfg.compile,
    )
    return model, _optimizer(cfg, model, cuda), policy


def elastic_config(cfg: TrainConfig) -> ElasticConfig:
    """The runtime's settings from the trainer's options (one place)."""
    return ElasticConfig(
        total_steps=cfg.steps,
        checkpoint_dir=cfg.checkpoint_dir,
        checkpoint_every=cfg.checkpoint_every,
        keep_checkpoints=cfg.keep_checkpoints,
        async_checkpoint=cfg.async_checkpoint,
        snapshot_every=cfg.snapshot_every,
        snapshot_dir=cfg.snapshot_dir,
        metrics_port=cfg.metrics_port,
        step_log=cfg.step_log,
        collective_timeout=cfg.dist_timeout,
        live_collective_timeout=cfg.live_timeout,
        form_timeout=cfg.form_timeout,
        lease_ttl=cfg.lease_ttl,
        peer_stop_grace=cfg.peer_stop_grace,
        start_when=cfg.start_when,
        meta={"model": cfg.model, "seed": cfg.seed, "seq_len": cfg.seq_len},
    )


class Trainer:
    """Owns the model, optimizer and data of one worker process; ``llm_elastic`` runs the loop around it."""

    def __init__(self, cfg: TrainConfig, env: dict[str, str] | None = None) -> None:
        self.cfg = cfg
        self.contract = read_contract(env)
        self.shape = model_config(cfg.model)
        self.shards = TokenShards(Path(cfg.data), cfg.seq_len)
        if self.shards.meta.vocab_size > self.shape.vocab_size:
            raise ValueError(
                f"the data's vocabulary ({self.shards.meta.vocab_size}) is larger than model "
                f"{cfg.model}'s ({self.shape.vocab_size})"
            )
        cuda = torch.cuda.is_available()
        self.bf16 = cfg.precision == "bf16" or (cfg.precision == "auto" and cuda)
        model, optimizer, policy = build(cfg, self.shape, self.contract, cuda, self.bf16)
        self.sampler = ElasticSampler(self.shards.num_samples, cfg.global_batch, cfg.seed)
        self.elastic = Elastic(
            model,
            optimizer,
            elastic_config(cfg),
            state={"data": DataIdentity(self.shards)},
            sampler=self.sampler,
            wrap=policy,
            env=env,
        )
        self.autocast_ddp = self.bf16 and isinstance(policy, DDP) and cuda
        only = os.environ.get(NAN_REPLICA_ENV)
        mine = only is None or only == os.environ.get("LLMJOB_REPLICA_INDEX")
        self.nan_due = nan_steps(os.environ.get(NAN_AT_STEPS_ENV, "")) if mine else set()

    @property
    def model(self) -> nn.Module:
        """The model whose state is trained (unwrapped under DDP)."""
        return self.elastic.model

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The optimizer (a new object per generation only under HSDP)."""
        return self.elastic.optimizers[0]

    def _autocast(self, device: torch.device) -> contextlib.AbstractContextManager[Any]:
        if self.autocast_ddp:
            return torch.autocast(device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    @staticmethod
    def _to_device(tokens: torch.Tensor, device: torch.device) -> torch.Tensor:
        """Token ids on the device without waiting for it (pinned memory first on CUDA)."""
        if device.type != "cuda":
            return tokens
        return tokens.pin_memory().to(device, non_blocking=True)

    def batch(self, index: int, rank: int, world_size: int) -> StepBatch:
        """This rank's micro-batches of step ``index`` (the global order, whatever the world size)."""
        cfg = self.cfg
        batches = DistributedBatches(
            self.shards, cfg.seed, cfg.global_batch, cfg.micro_batch, rank, world_size
        )
        batches.position = index * cfg.global_batch
        return batches.next_step()

    def train(self) -> int:
        """Train up to ``--steps``; returns 0 (the runtime exits the process itself on a stop or eviction)."""
        for step in self.elastic.steps():
            with step:
                self.train_step(step)
        return 0

    def train_step(self, step: Step) -> float:
        """One step: the rank's micro-batches, the commit, the update; returns the global loss."""
        cfg = self.cfg
        tokens_in_step = cfg.global_batch * cfg.seq_len
        started = time.monotonic()
        if os.environ.get(RAISE_AT_STEP_ENV) == str(step.index + 1):
            raise ValueError(f"{RAISE_AT_STEP_ENV}: a bug in step {step.index + 1}")
        batch = self.batch(step.index, step.rank, step.world_size)
        model, optimizer, device = step.model, step.optimizer, step.device
        # Mean over the whole global batch whatever the world size and accumulation.
        scale = step.world_size / tokens_in_step
        if step.index + 1 in self.nan_due:
            self.nan_due.discard(step.index + 1)
            scale = math.nan
        lr = learning_rate(cfg, step.index)
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss_sum = torch.zeros((), device=device)
        last = len(batch.micro_batches) - 1
        for index, micro in enumerate(batch.micro_batches):
            inputs = self._to_device(micro.inputs, device)
            targets = self._to_device(micro.targets, device)
            with gradient_sync(model, index == last), self._autocast(device):
                token_loss: torch.Tensor = model(inputs, targets, cfg.loss_chunk_tokens)
                scaled: torch.Tensor = token_loss * (scale * micro.weight)
                scaled.backward()  # type: ignore[no-untyped-call]
            loss_sum += token_loss.detach() * micro.weight
        loss = step.commit(loss_sum * scale)  # mean over members of this: the per-token loss
        if cfg.grad_clip > 0:
            nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if cfg.min_step_seconds > 0:
            time.sleep(max(0.0, cfg.min_step_seconds - (time.monotonic() - started)))
        elapsed = time.monotonic() - started
        step.record(
            lr=lr,
            grad_accum=len(batch.micro_batches),
            tokens=tokens_in_step,
            tokens_per_s=round(tokens_in_step / max(elapsed, 1e-9), 1),
        )
        return loss
