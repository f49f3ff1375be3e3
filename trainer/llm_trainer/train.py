"""The training loop: resume from the newest complete checkpoint, train, checkpoint on interval and on stop.

Exit codes: 0 when training finished or this process was asked to stop (SIGTERM/SIGINT) and saved;
``EXIT_PEER_STOPPED`` when another rank was asked to stop, the job saved, and no stop signal reached this
process within ``--peer-stop-grace`` seconds (its agent should re-rendezvous without the leaving node, so
the exit must not look like success, which would end the agent).
"""

from __future__ import annotations

import contextlib
import logging
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from llm_trainer.checkpoint import Checkpointer, CheckpointInfo, latest_checkpoint
from llm_trainer.config import TrainConfig, learning_rate, model_config
from llm_trainer.data.loader import DistributedBatches, StepBatch
from llm_trainer.data.shards import TokenShards
from llm_trainer.distributed import DistEnv, build_model, choose_parallel, cpu_group, gradient_sync
from llm_trainer.metrics import METRICS_FILE, Exporter, StepLog, process_start_time
from llm_trainer.signals import StopRequest
from llm_trainer.snapshot.manager import Snapshotter
from llm_trainer.snapshot.space import check_snapshot_space, human

log = logging.getLogger(__name__)

EXIT_PEER_STOPPED = 75


def host_values(reduced: torch.Tensor) -> list[float]:
    """The step's reduced values on the host: the training loop's one device-to-host sync per step."""
    values: list[float] = reduced.tolist()
    return values


class Trainer:
    """Owns the model, optimizer, data position and checkpoints of one worker process."""

    def __init__(self, cfg: TrainConfig, env: DistEnv, stop: StopRequest) -> None:
        self.cfg = cfg
        self.env = env
        self.stop = stop
        self.shape = model_config(cfg.model)
        self.shards = TokenShards(Path(cfg.data), cfg.seq_len)
        if self.shards.meta.vocab_size > self.shape.vocab_size:
            raise ValueError(
                f"the data's vocabulary ({self.shards.meta.vocab_size}) is larger than model "
                f"{cfg.model}'s ({self.shape.vocab_size})"
            )
        cuda = env.device.type == "cuda"
        self.bf16 = cfg.precision == "bf16" or (cfg.precision == "auto" and cuda)
        self.parallel = choose_parallel(cfg.parallel, self.shape, env.world_size)
        self.model = build_model(self.shape, env, self.parallel, self.bf16, cfg.seed, cfg.compile)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=cfg.lr,
            betas=(0.9, 0.95),
            weight_decay=cfg.weight_decay,
            fused=cuda,
        )
        self.batches = DistributedBatches(
            self.shards, cfg.seed, cfg.global_batch, cfg.micro_batch, env.rank, env.world_size
        )
        self.root = Path(cfg.checkpoint_dir)
        # Background work talks over gloo groups of its own, never over the training thread's group.
        persist_group = cpu_group() if cfg.async_checkpoint else None
        self.checkpointer = Checkpointer(self.root, cfg.keep_checkpoints, env.rank, persist_group)
        self.snapshots: Snapshotter | None = None
        if cfg.snapshot_every:
            # Fail now, in one line, rather than with SIGBUS when the first snapshot outgrows /dev/shm.
            need = check_snapshot_space(
                Path(cfg.snapshot_dir), self.model, self.optimizer, env.world_size, env.local_world_size
            )
            log.info("snapshots need %s per node in %s", human(need), cfg.snapshot_dir)
            self.snapshots = Snapshotter(
                Path(cfg.snapshot_dir),
                env.rank,
                env.world_size,
                env.local_world_size,
                cpu_group(),
                self._layout_key(),
                replicated=self.parallel == "ddp",
            )
        self.step_log = StepLog(self.root / METRICS_FILE) if env.rank == 0 else None
        self.exporter = Exporter(
            cfg.metrics_port + env.local_rank if cfg.metrics_port else 0,
            {"rank": str(env.rank)},
        )
        self.step = 0
        self.resumed_from: int | None = None
        self.restore_source: str | None = None
        """Where the state came from at start: ``memory`` or ``checkpoint`` (None: from scratch)."""
        self.restore_seconds = 0.0
        self.restore_peers = 0
        """Ranks that received their snapshot shard from another node at start."""
        self.process_started = process_start_time()
        self.steps_done = 0
        """Steps this process completed (the step-time counters of the metrics endpoint)."""
        self.step_seconds = 0.0

    # -- checkpoints ----------------------------------------------------------------------------------------

    def _layout_key(self) -> str:
        """What a snapshot's tensors mean; only snapshots of the same layout are restored."""
        cfg = self.cfg
        return (
            f"{cfg.model}|{self.parallel}|bf16={self.bf16}|seed={cfg.seed}|data={self.shards.fingerprint}"
            f"|batch={cfg.global_batch}"
        )

    def _meta(self) -> dict[str, Any]:
        return {
            "data": self.batches.state_dict(),
            "world_size": self.env.world_size,
            "samples_seen": self.batches.position,
            "model": self.cfg.model,
        }

    def restore(self) -> None:
        """Resume: from an in-memory snapshot when every rank can get one at least as new as the newest
        complete checkpoint, else from that checkpoint (rank 0 picks it, every rank loads the same one)."""
        started = time.monotonic()
        choice: list[CheckpointInfo | None] = [latest_checkpoint(self.root) if self.env.rank == 0 else None]
        dist.broadcast_object_list(choice, src=0)
        info = choice[0]
        if self.snapshots is not None:
            found = self.snapshots.restore(self.model, self.optimizer, info.step if info else 0)
            if found is not None:
                meta, where, self.restore_peers = found
                self._resume(meta, "memory", started)
                log.info("rank %d: shard from %s", self.env.rank, where)
                return
        if info is None:
            log.info("no complete checkpoint in %s: starting from scratch", self.root)
            return
        meta = self.checkpointer.load(info, self.model, self.optimizer)
        self._resume({**meta, "step": info.step}, "checkpoint", started)

    def _resume(self, meta: dict[str, Any], source: str, started: float) -> None:
        self.step = int(meta["step"]) if "step" in meta else self.step
        self.batches.load_state_dict(meta["data"])
        self.resumed_from = self.step
        self.restore_source = source
        self.restore_seconds = time.monotonic() - started
        if self.env.rank == 0:
            log.info(
                "resumed from step %d from %s in %.2fs (saved at world size %s)",
                self.step,
                source,
                self.restore_seconds,
                meta.get("world_size"),
            )

    def save(self) -> None:
        """Collective checkpoint of the current step (staged and persisted in the background if async)."""
        if self.cfg.async_checkpoint:
            self.checkpointer.save_async(self.step, self.model, self.optimizer, self._meta())
        else:
            self.checkpointer.save(self.step, self.model, self.optimizer, self._meta())
        self.exporter.update(last_saved_step=self.step, last_saved_timestamp_seconds=time.time())

    def snapshot(self) -> None:
        """Collective in-memory snapshot of the current step (all ranks agreed none is busy)."""
        if self.snapshots is not None:
            self.snapshots.take(self.step, self.model, self.optimizer, {**self._meta(), "step": self.step})

    def finish_background(self) -> None:
        """Wait for the checkpoint persist and the snapshot copy in flight (stop and end of training)."""
        self.checkpointer.wait()
        if self.snapshots is not None:
            self.snapshots.wait()

    # -- one step -------------------------------------------------------------------------------------------

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.bf16 and self.parallel == "ddp" and self.env.device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _to_device(self, tokens: torch.Tensor) -> torch.Tensor:
        """Token ids on the training device without waiting for the GPU: a copy from pageable memory would
        block the host until the stream reaches it, so on CUDA the ids go through pinned memory first."""
        if self.env.device.type != "cuda":
            return tokens
        return tokens.pin_memory().to(self.env.device, non_blocking=True)

    def train_step(self, batch: StepBatch) -> torch.Tensor:
        """Forward/backward over the rank's micro-batches and one optimizer step.

        Returns ``[sum of token losses on this rank, stop flag, snapshot copy busy]`` on the device for the
        caller's all-reduce (so every rank agrees whether to stop and whether to skip a snapshot). Nothing
        here waits for the device: the losses are summed on it, the flags are filled in by kernels (a
        tensor made from a Python list would be a blocking host-to-device copy), and the caller reads the
        reduced values back in one transfer, the step's only device-to-host sync.
        """
        cfg = self.cfg
        tokens_in_step = cfg.global_batch * cfg.seq_len
        # Gradients are averaged over ranks by DDP/FSDP; scaling by world size / global tokens makes the
        # result the mean over the whole global batch, whatever the world size and accumulation.
        scale = self.env.world_size / tokens_in_step
        lr = learning_rate(cfg, self.step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        loss_sum = torch.zeros((), device=self.env.device)
        last = len(batch.micro_batches) - 1
        for index, micro in enumerate(batch.micro_batches):
            inputs = self._to_device(micro.inputs)
            targets = self._to_device(micro.targets)
            with gradient_sync(self.model, index == last), self._autocast():
                token_loss: torch.Tensor = self.model(inputs, targets, cfg.loss_chunk_tokens)
                scaled: torch.Tensor = token_loss * (scale * micro.weight)
                scaled.backward()  # type: ignore[no-untyped-call]
            loss_sum += token_loss.detach() * micro.weight
        if cfg.grad_clip > 0:
            nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
        self.checkpointer.before_update()  # the staging copies must have read the parameters
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        stop = 1.0 if self.stop.requested else 0.0
        busy = 1.0 if self.snapshots is not None and self.snapshots.busy else 0.0
        return torch.stack([loss_sum, loss_sum.new_full((), stop), loss_sum.new_full((), busy)])

    # -- the loop -------------------------------------------------------------------------------------------

    def train(self) -> int:
        """Train up to ``--steps`` (after :meth:`restore`); returns the process exit code."""
        cfg = self.cfg
        saved_step = self.step if self.resumed_from is not None else -1
        tokens_in_step = cfg.global_batch * cfg.seq_len
        while self.step < cfg.steps:
            started = time.monotonic()
            batch = self.batches.next_step()
            reduced = self.train_step(batch)
            dist.all_reduce(reduced)
            self.step += 1
            loss_total, stop_flag, busy_flag = host_values(reduced)
            stop = stop_flag > 0
            loss = loss_total / tokens_in_step
            if cfg.min_step_seconds > 0:
                time.sleep(max(0.0, cfg.min_step_seconds - (time.monotonic() - started)))
            elapsed = time.monotonic() - started
            self._record(batch, loss, elapsed)
            busy = busy_flag > 0
            if cfg.snapshot_every and self.step % cfg.snapshot_every == 0 and not busy and not stop:
                self.snapshot()
            if cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0:
                self.save()
                saved_step = self.step
            if stop:
                self._final_save(saved_step)
                return self._stop_exit_code()
        self._final_save(saved_step)
        return 0

    def _final_save(self, saved_step: int) -> None:
        """Stop or end: snapshot and checkpoint the last step and wait for both to be complete."""
        if self.snapshots is not None and self.snapshots.taken_step != self.step:
            self.snapshots.wait()  # every rank waits, so every rank then takes the same snapshot
            self.snapshot()
        if saved_step != self.step:
            self.save()
        self.finish_background()

    def _stop_exit_code(self) -> int:
        if self.stop.requested:
            log.info("stopped by %s at step %d after saving", self.stop.signal_name, self.step)
            return 0
        if self.stop.wait(self.cfg.peer_stop_grace):
            log.info("stopped by %s at step %d after saving", self.stop.signal_name, self.step)
            return 0
        log.warning("another rank stopped at step %d; exiting for a re-rendezvous", self.step)
        return EXIT_PEER_STOPPED

    def _record(self, batch: StepBatch, loss: float, elapsed: float) -> None:
        tokens_per_s = self.cfg.global_batch * self.cfg.seq_len / max(elapsed, 1e-9)
        now = time.time()
        self.steps_done += 1
        self.step_seconds += elapsed
        self.exporter.update(
            step=self.step,
            total_steps=self.cfg.steps,
            step_time_seconds_sum=self.step_seconds,
            step_time_seconds_count=self.steps_done,
            loss=loss,
            tokens_per_second=tokens_per_s,
            last_step_timestamp_seconds=now,
            world_size=self.env.world_size,
            samples_seen=batch.stop,
        )
        if self.step_log is None:
            return
        record = {
            "time": round(now, 3),
            "step": self.step,
            "loss": round(loss, 6),
            "lr": learning_rate(self.cfg, self.step - 1),
            "world_size": self.env.world_size,
            "global_batch": self.cfg.global_batch,
            "grad_accum": len(batch.micro_batches),
            "samples_seen": batch.stop,
            "sample_start": batch.start,
            "sample_end": batch.stop,
            "samples_crc32": zlib.crc32(
                np.asarray(self.batches.order.sample_ids(batch.start, batch.stop), dtype="<i8").tobytes()
            ),
            "tokens_per_s": round(tokens_per_s, 1),
            "step_time": round(elapsed, 4),
            "restart": self.step_log.restart,
            "agent_restart": self.env.restart_count,
            "resumed_from": self.resumed_from,
            "restore_source": self.restore_source,
            "restore_peers": self.restore_peers,
            "restore_seconds": round(self.restore_seconds, 3),
            "process_started": self.process_started,
        }
        self.step_log.append(record)
        if self.step % 10 == 0 or self.step == (self.resumed_from or 0) + 1:
            log.info(
                "step %d loss %.4f world %d %.0f tok/s", self.step, loss, self.env.world_size, tokens_per_s
            )
