"""A training driver whose processes survive membership changes (issue 11).

Each process is one member. It trains the project's model on the project's data order; when a peer is
lost (a collective raises, or the etcd watch shows the membership changed) it drops the partial step,
destroys the process group, agrees on the next generation in etcd, builds a fresh gloo group on a fresh
store prefix, takes the most advanced state from a peer (a joiner gets everything this way, no checkpoint
is read) and continues from the last completed step with its share of the global batch recomputed for the
new world size. Rank 0 of each generation appends one line per step to the metrics file (same fields as
``train.py``'s metrics.jsonl, plus the generation and the members' PIDs).

With ``--checkpoint-dir`` and ``--checkpoint-every`` the members also save collective checkpoints (the
trainer's format and ``COMPLETE`` marker). They are the restart path under the live one: when every member
of a generation is new (all holders of the state are gone at once, or the job's etcd was replaced), the
members load the newest complete checkpoint instead of a peer's state.

SIGTERM or SIGINT stops a member at the next step boundary: all members first save a checkpoint of that
step (while all are still there), then it leaves the membership and the others re-form without it. A
suspend's signals reach the members at slightly different times; whoever is stopped last finds the last
step saved.

Exit codes: 0 when the run finished or the member was stopped by a signal, ``EXIT_EVICTED`` when this
member was removed from the job, ``EXIT_NO_GENERATION`` when no generation formed within
``--form-timeout``, ``EXIT_STATE_LOST`` when every member holding the state is gone and no checkpoint exists.
"""

from __future__ import annotations

import gc
import json
import logging
import math
import os
import signal
import sys
import time
import zlib
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from llm_trainer.cli_errors import ExitOnErrorParser, usage_error
from llm_trainer.config import TrainConfig, learning_rate, model_config
from llm_trainer.data.loader import DistributedBatches, StepBatch
from llm_trainer.data.order import GlobalOrder
from llm_trainer.data.shards import TokenShards
from llm_trainer.distributed import gradient_sync
from llm_trainer.live import layout
from llm_trainer.live.layout import Generation
from llm_trainer.live.membership import Evicted, Membership, RunFinished
from llm_trainer.live.sync import Progress, StateLost, synchronise
from llm_trainer.metrics import METRICS_FILE, Exporter, StepLog, last_record
from llm_trainer.model import Transformer
from llm_trainer.rendezvous.etcd_client import EtcdClient, parse_endpoints
from llm_trainer.rendezvous.etcd_store import EtcdV3Store

if TYPE_CHECKING:  # imported when first used: DCP and DTensor cost a joiner ~1.3 s of start-up
    from llm_trainer.checkpoint import Checkpointer
    from llm_trainer.live import sharded

log = logging.getLogger("llm_trainer.live")

EXIT_EVICTED = 3
EXIT_NO_GENERATION = 4
EXIT_STATE_LOST = 5

ETCD_ENV = "LLMJOB_LIVE_ETCD"
PREFIX_ENV = "LLMJOB_LIVE_PREFIX"
MEMBER_ENV = "LLMJOB_LIVE_MEMBER"
MIN_MEMBERS_ENV = "LLMJOB_LIVE_MIN_MEMBERS"
POD_ENV = "LLMJOB_POD_NAME"
"""The operator's pod name: member ids default to ``<pod>.<pid>``, so the operator can evict a pod."""
CHECKPOINT_ENV = "LLMJOB_CHECKPOINT_DIR"


@dataclass(frozen=True)
class LiveOptions:
    """The driver's own options (the training ones are a :class:`TrainConfig`)."""

    etcd: str
    prefix: str
    member: str
    metrics: Path
    min_members: int
    lease_ttl: int
    collective_timeout: float
    form_timeout: float
    start_when: Path | None
    """Warm spare: wait (imported, model built) until this file exists before joining."""
    checkpoint_dir: Path | None = None
    checkpoint_every: int = 0
    keep_checkpoints: int = 2
    metrics_port: int = 0
    """Prometheus port of local rank 0 (+ LOCAL_RANK for the others); 0: none."""
    parallel: str = "ddp"
    """ddp (every member holds the whole state) or hsdp (replicated across hosts, sharded within one)."""
    shard_size: int = 1
    """hsdp: processes per host that share one replica (member ids ``<host>.<n>``)."""
    subgroup_timeout: float = 5.0
    """hsdp: timeout of the mesh's groups (a blocked gloo op cannot be interrupted; see decisions L5)."""


def parse_args(argv: list[str]) -> tuple[TrainConfig, LiveOptions]:
    """Options; a bad value exits 2 with one line naming it."""
    parser = ExitOnErrorParser(prog="python -m llm_trainer.live", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="folder of token shards")
    parser.add_argument(
        "--metrics", default="", help=f"rank 0's step log (default <checkpoint dir>/{METRICS_FILE})"
    )
    parser.add_argument(
        "--checkpoint-dir",
        default=os.environ.get(CHECKPOINT_ENV, ""),
        help=f"checkpoints: the fallback when every holder of the state is gone (${CHECKPOINT_ENV})",
    )
    parser.add_argument("--checkpoint-every", type=int, default=0, help="steps between checkpoints (0: none)")
    parser.add_argument("--keep-checkpoints", type=int, default=2)
    parser.add_argument(
        "--metrics-port", type=int, default=9400, help="Prometheus port (+ LOCAL_RANK); 0: no endpoint"
    )
    parser.add_argument(
        "--parallel",
        choices=["ddp", "hsdp"],
        default="ddp",
        help="ddp: whole state on every member; hsdp: replicated across hosts, sharded within a host",
    )
    parser.add_argument(
        "--shard-size",
        type=int,
        default=_int_env("LOCAL_WORLD_SIZE", 1),
        help="hsdp: processes per host sharing a replica ($LOCAL_WORLD_SIZE)",
    )
    parser.add_argument("--etcd", default=os.environ.get(ETCD_ENV, ""), help=f"host:port (${ETCD_ENV})")
    parser.add_argument(
        "--prefix", default=os.environ.get(PREFIX_ENV, ""), help=f"key prefix (${PREFIX_ENV})"
    )
    parser.add_argument(
        "--member",
        default=os.environ.get(MEMBER_ENV, ""),
        help=f"member id (${MEMBER_ENV}; default <pod>.<pid> with ${POD_ENV}, else <host>.<pid>)",
    )
    parser.add_argument(
        "--min-members",
        type=int,
        default=_int_env(MIN_MEMBERS_ENV, 1),
        help=f"members needed to form generation 1 (${MIN_MEMBERS_ENV})",
    )
    parser.add_argument("--lease-ttl", type=int, default=3, help="seconds a silent member stays a member")
    parser.add_argument("--collective-timeout", type=float, default=30.0)
    parser.add_argument(
        "--subgroup-timeout",
        type=float,
        default=5.0,
        help="hsdp: seconds a mesh-group collective may wait (a spurious timeout only re-forms)",
    )
    parser.add_argument("--form-timeout", type=float, default=120.0)
    parser.add_argument(
        "--start-when", default="", help="warm spare: join only once this file exists (imports done before)"
    )
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--global-batch", type=int, default=12)
    parser.add_argument("--micro-batch", type=int, default=2)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--warmup-steps", type=int, default=10)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--min-step-seconds", type=float, default=0.0)
    args = parser.parse_args(argv)
    prog = parser.prog
    if not args.etcd:
        usage_error(prog, f"--etcd is required (or set ${ETCD_ENV})")
    try:
        parse_endpoints(args.etcd)
    except ValueError as exc:
        usage_error(prog, f"--etcd: {exc}")
    if not args.prefix.startswith("/") or not args.prefix.endswith("/"):
        usage_error(prog, f"--prefix must start and end with '/', got {args.prefix!r}")
    member = args.member or f"{os.environ.get(POD_ENV) or os.uname().nodename}.{os.getpid()}"
    if not layout.valid_member_id(member):
        usage_error(prog, f"--member {member!r} must be printable ASCII without '/'")
    if args.min_members < 1:
        usage_error(prog, "--min-members must be at least 1")
    if args.lease_ttl < 2:
        usage_error(prog, "--lease-ttl must be at least 2 seconds")
    for name in ("steps", "global_batch", "micro_batch", "seq_len", "keep_checkpoints"):
        if getattr(args, name) < 1:
            usage_error(prog, f"--{name.replace('_', '-')} must be at least 1")
    if not 0 <= args.metrics_port <= 65535:
        usage_error(prog, "--metrics-port must be a TCP port, or 0 for none")
    if args.subgroup_timeout <= 0 or args.collective_timeout <= 0:
        usage_error(prog, "--collective-timeout and --subgroup-timeout must be above 0")
    if args.shard_size < 1:
        usage_error(prog, "--shard-size must be at least 1")
    if args.checkpoint_every < 0:
        usage_error(prog, "--checkpoint-every must be 0 (off) or more")
    if args.checkpoint_every and not args.checkpoint_dir:
        usage_error(prog, f"--checkpoint-every needs --checkpoint-dir (or ${CHECKPOINT_ENV})")
    if not args.metrics and not args.checkpoint_dir:
        usage_error(prog, "--metrics is required without --checkpoint-dir")
    checkpoint_dir = Path(args.checkpoint_dir) if args.checkpoint_dir else None
    metrics = Path(args.metrics) if args.metrics else Path(args.checkpoint_dir) / METRICS_FILE
    cfg = TrainConfig(
        data=args.data,
        model=args.model,
        seq_len=args.seq_len,
        global_batch=args.global_batch,
        micro_batch=args.micro_batch,
        steps=args.steps,
        lr=args.lr,
        warmup_steps=args.warmup_steps,
        seed=args.seed,
        min_step_seconds=args.min_step_seconds,
        metrics_port=0,
    )
    try:
        model_config(cfg.model)
    except (KeyError, ValueError) as exc:
        usage_error(prog, f"--model: {exc}")
    opts = LiveOptions(
        etcd=args.etcd,
        prefix=args.prefix,
        member=member,
        metrics=metrics,
        min_members=args.min_members,
        lease_ttl=args.lease_ttl,
        collective_timeout=args.collective_timeout,
        subgroup_timeout=args.subgroup_timeout,
        form_timeout=args.form_timeout,
        start_when=Path(args.start_when) if args.start_when else None,
        checkpoint_dir=checkpoint_dir,
        checkpoint_every=args.checkpoint_every,
        keep_checkpoints=args.keep_checkpoints,
        metrics_port=args.metrics_port,
        parallel=args.parallel,
        shard_size=args.shard_size if args.parallel == "hsdp" else 1,
    )
    return cfg, opts


def _int_env(name: str, default: int) -> int:
    raw = os.environ.get(name, "")
    try:
        return int(raw) if raw else default
    except ValueError:
        usage_error("python -m llm_trainer.live", f"${name} must be an integer, got {raw!r}")


class Stop:
    """SIGTERM/SIGINT: inside the training loop the member stops at the next step boundary (the flag rides
    on the step's all-reduce); anywhere else (waiting for a generation, forming one) it exits at once."""

    def __init__(self) -> None:
        self.requested = False
        self.deferred = False

    def install(self) -> Stop:
        signal.signal(signal.SIGTERM, self._handle)
        signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        log.info("%s: stopping", signal.Signals(signum).name)
        self.requested = True
        if not self.deferred:
            raise Stopped()


class Stopped(Exception):
    """This member was asked to stop (a signal) and left the job."""


class PeerChange(Exception):
    """The members agreed at a step boundary that the membership changed."""


class AllStopped(Exception):
    """Every member was asked to stop at the same step boundary (suspend, delete): saved, done."""


class LiveTrainer:
    """Model, optimizer and progress that outlive process groups."""

    def __init__(
        self, cfg: TrainConfig, opts: LiveOptions, membership: Membership, stop: Stop | None = None
    ) -> None:
        self.cfg = cfg
        self.opts = opts
        self.membership = membership
        self.stop = stop or Stop()
        self.checkpointer: Checkpointer | None = None
        self.saved_step = -1
        self.shards = TokenShards(Path(cfg.data), cfg.seq_len)
        self.shape = model_config(cfg.model)
        if opts.parallel == "hsdp":  # built and sharded per generation (llm_trainer.live.sharded)
            with torch.device("meta"):
                self.model: nn.Module = Transformer(self.shape)
        else:
            self.model = Transformer(self.shape)
            self.model.init_weights(cfg.seed)
        self.optimizer = self._optimizer_for(self.model)
        self.kept: sharded.LocalState | None = None
        """hsdp: this process's shards between generations (None before the first)."""
        self.progress = Progress(step=0, position=0, last_loss=math.nan, fresh=True)
        self.order = GlobalOrder(self.shards.num_samples, cfg.seed)
        self.process_started = time.time()
        port = opts.metrics_port + int(os.environ.get("LOCAL_RANK", "0")) if opts.metrics_port else 0
        self.exporter = Exporter(port, {"member": opts.member})

    def _optimizer_for(self, model: nn.Module) -> torch.optim.Optimizer:
        cfg = self.cfg
        return torch.optim.AdamW(
            model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay
        )

    def _wrap(self, gen: Generation) -> tuple[nn.Module, dist.ProcessGroup | None]:
        """The data-parallel module of this generation, and the replica group of an hsdp mesh."""
        if self.opts.parallel != "hsdp":
            return DistributedDataParallel(self.model, init_sync=False), None
        from llm_trainer.live import sharded

        timeout = timedelta(seconds=self.opts.subgroup_timeout)
        mesh = sharded.hsdp_mesh(gen.world_size, self.opts.shard_size, timeout)
        self.model, self.optimizer = sharded.build(
            self.shape, mesh, self.cfg.seed, self._optimizer_for, self.kept
        )
        self.kept = None
        return self.model, mesh.get_group("replicate")

    def _park(self) -> None:
        """hsdp, at the end of a generation: keep the local shards, drop the module that holds the
        generation's groups so that their connections close (a peer blocked in a collective with this
        process then fails at once instead of at the collective timeout)."""
        if self.opts.parallel != "hsdp":
            return
        from llm_trainer.live import sharded

        if not sharded.is_sharded(self.model):
            return
        self.kept = sharded.detach(self.model, self.optimizer)
        with torch.device("meta"):
            self.model = Transformer(self.shape)
        self.optimizer = self._optimizer_for(self.model)

    # -- one generation -------------------------------------------------------------------------------------

    def run_generation(self, gen: Generation) -> bool:
        """Form ``gen``'s group, sync state, train until done (True) or a membership change (False).

        Any collective failure propagates as ``RuntimeError`` (``DistBackendError`` is one).
        """
        formed_at = time.time()
        rank = gen.rank_of(self.opts.member)
        store = EtcdV3Store(
            self.membership.client,
            layout.store_prefix(self.opts.prefix, gen.number),
            self.membership.lease,
            timeout=timedelta(seconds=self.opts.collective_timeout),
        )
        dist.init_process_group(
            "gloo",
            store=store,
            rank=rank,
            world_size=gen.world_size,
            timeout=timedelta(seconds=self.opts.collective_timeout),
        )
        try:
            pids_tensor = [torch.zeros(1, dtype=torch.int64) for _ in range(gen.world_size)]
            dist.all_gather(pids_tensor, torch.tensor([os.getpid()], dtype=torch.int64))
            pids = [int(t.item()) for t in pids_tensor]
            stored_step = self.membership.client.get(layout.step_key(self.opts.prefix))
            job_step = int(stored_step.value) if stored_step is not None else 0

            def receiving() -> None:
                self.progress = replace(self.progress, fresh=True)

            if self.opts.checkpoint_dir is not None:
                from llm_trainer.checkpoint import Checkpointer

                self.checkpointer = Checkpointer(self.opts.checkpoint_dir, self.opts.keep_checkpoints, rank)
            ddp, replica_group = self._wrap(gen)
            self.progress, source = synchronise(
                self.model,
                self.optimizer,
                self.progress,
                None,
                job_step,
                receiving,
                self._restore,
                replica_group,
                self.opts.shard_size,
            )
            batches = DistributedBatches(
                self.shards, self.cfg.seed, self.cfg.global_batch, self.cfg.micro_batch, rank, gen.world_size
            )
            batches.position = self.progress.position
            if batches.position != self.progress.step * self.cfg.global_batch:
                raise AssertionError(
                    f"data position {batches.position} does not match step {self.progress.step}"
                )
            step_log = StepLog(self.opts.metrics) if rank == 0 else None
            if step_log is not None:
                self._log_pending(step_log)
                if gen.number > 1:
                    self.membership.client.delete_prefix(
                        layout.generation_prefix(self.opts.prefix, gen.number - 1)
                    )
            event = {
                "event": "formed",
                "generation": gen.number,
                "world_size": gen.world_size,
                "rank": rank,
                "step": self.progress.step,
                "source": source,
                "formed_at": formed_at,
                "ready_at": time.time(),
                "pid": os.getpid(),
            }
            print(json.dumps(event), flush=True)
            resumed_from = self.progress.step
            self.stop.deferred = True
            try:
                if self.stop.requested:
                    raise Stopped()
                while self.progress.step < self.cfg.steps:
                    self._train_step(ddp, batches, gen, pids, step_log, resumed_from)
            finally:
                self.stop.deferred = False
            self._save()
            if rank == 0:
                self.membership.finish()
            return True
        except PeerChange:
            return False
        except AllStopped:
            self._save()
            raise
        finally:
            self._park()
            dist.destroy_process_group()

    def _restore(self) -> Progress | None:
        """Collective, when every member is new: the newest complete checkpoint (rank 0 picks it for all)."""
        if self.checkpointer is None:
            return None
        from llm_trainer.checkpoint import latest_checkpoint

        choice = [latest_checkpoint(self.checkpointer.root) if dist.get_rank() == 0 else None]
        dist.broadcast_object_list(choice, src=0)
        info = choice[0]
        if info is None:
            return None
        data = info.meta.get("data") or {}
        if data.get("fingerprint") != self.shards.fingerprint or int(data.get("seed", -1)) != self.cfg.seed:
            raise StateLost(
                f"checkpoint {info.path} was saved for other data or another --seed ({data}); "
                "point --checkpoint-dir elsewhere or match --data/--seq-len/--seed"
            )
        meta = self.checkpointer.load(info, self.model, self.optimizer)
        self.saved_step = info.step
        restarts = int(meta.get("restarts", 0)) + 1
        log.info("every member was new: resumed from checkpoint step-%d", info.step)
        loss = float(meta.get("last_loss", math.nan))
        return Progress(info.step, int(data["position"]), loss, False, restarts)

    def _save(self) -> None:
        """Collective checkpoint of the current step, unless it is saved already or checkpoints are off."""
        if self.checkpointer is None or self.saved_step == self.progress.step or self.progress.step == 0:
            return
        data = {
            "position": self.progress.position,
            "seed": self.cfg.seed,
            "fingerprint": self.shards.fingerprint,
        }
        meta = {
            "data": data,  # the same data-position record as train.py's checkpoints
            "samples_seen": self.progress.position,
            "last_loss": self.progress.last_loss,
            "restarts": self.progress.restarts,
            "world_size": dist.get_world_size(),
            "model": self.cfg.model,
        }
        self.checkpointer.save(self.progress.step, self.model, self.optimizer, meta)
        self.saved_step = self.progress.step

    def _train_step(
        self,
        ddp: nn.Module,
        batches: DistributedBatches,
        gen: Generation,
        pids: list[int],
        step_log: StepLog | None,
        resumed_from: int,
    ) -> None:
        cfg = self.cfg
        started = time.monotonic()
        step = self.progress.step
        batch = batches.next_step()
        tokens_in_step = cfg.global_batch * cfg.seq_len
        scale = gen.world_size / tokens_in_step
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate(cfg, step)
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum = torch.zeros(())
        last = len(batch.micro_batches) - 1
        for index, micro in enumerate(batch.micro_batches):
            with gradient_sync(ddp, index == last):
                logits = ddp(micro.inputs)
                token_loss = F.cross_entropy(
                    logits.float().reshape(-1, logits.shape[-1]), micro.targets.reshape(-1), reduction="sum"
                )
                scaled: torch.Tensor = token_loss * (scale * micro.weight)
                scaled.backward()  # type: ignore[no-untyped-call]
            loss_sum += token_loss.detach() * micro.weight
        stopping = self.stop.requested
        evicted: Evicted | None = None
        changed = False
        try:
            changed = self.membership.changed.is_set() and self.membership.differs(gen)
        except Evicted as exc:  # leave at this step boundary, after the others summed this step with us
            evicted = exc
        changed = changed or stopping or evicted is not None
        flags = [1.0 if changed else 0.0, 1.0 if stopping else 0.0]
        reduced = torch.cat([loss_sum.reshape(1), torch.tensor(flags)])
        # The step is complete once this all-reduce returns: every member's gradients were summed.
        dist.all_reduce(reduced)
        if cfg.grad_clip > 0:
            nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
        self.optimizer.step()
        loss = float(reduced[0].item()) / tokens_in_step
        self.progress = Progress(step + 1, batch.stop, loss, fresh=False, restarts=self.progress.restarts)
        self.exporter.update(
            step=step + 1,
            loss=loss,
            tokens_per_second=tokens_in_step / max(time.monotonic() - started, 1e-9),
            last_step_timestamp_seconds=time.time(),
            world_size=gen.world_size,
            samples_seen=batch.stop,
        )
        if cfg.min_step_seconds > 0:
            time.sleep(max(0.0, cfg.min_step_seconds - (time.monotonic() - started)))
        if step_log is not None:
            step_log.append(self._record(batch, gen, pids, loss, time.monotonic() - started, resumed_from))
            self.membership.client.put(layout.step_key(self.opts.prefix), str(step + 1).encode())
        stopping_members = int(reduced[2].item())
        if stopping_members:
            # Save while every member is still here: signals reach members at slightly different times
            # (a suspend), and a member that gets its own later while forming the next generation leaves
            # at once; this checkpoint then holds the last step.
            self._save()
        if stopping_members >= gen.world_size:
            raise AllStopped()
        if evicted is not None:
            raise evicted
        if stopping:
            raise Stopped()
        if reduced[1].item() > 0:
            raise PeerChange()  # no checkpoint now: a member may be leaving; the next one is due soon
        every = self.opts.checkpoint_every
        if every and self.progress.step % every == 0 and self.progress.step < cfg.steps:
            self._save()

    def _record(
        self,
        batch: StepBatch,
        gen: Generation | None,
        pids: list[int] | None,
        loss: float,
        elapsed: float,
        resumed_from: int | None,
    ) -> dict[str, object]:
        ids = self.order.sample_ids(batch.start, batch.stop)
        return {
            "time": round(time.time(), 3),
            "step": self.progress.step,
            "loss": round(loss, 6) if math.isfinite(loss) else None,
            "world_size": gen.world_size if gen is not None else None,
            "global_batch": self.cfg.global_batch,
            "samples_seen": batch.stop,
            "sample_start": batch.start,
            "sample_end": batch.stop,
            "samples_crc32": zlib.crc32(np.asarray(ids, dtype="<i8").tobytes()),
            "step_time": round(elapsed, 4),
            "restart": self.progress.restarts,
            "generation": gen.number if gen is not None else None,
            "members": list(gen.members) if gen is not None else None,
            "pids": pids,
            "resumed_from": resumed_from,
        }

    def _log_pending(self, step_log: StepLog) -> None:
        """Log the step a survivor completed whose rank 0 died before writing it (at most one)."""
        previous = last_record(self.opts.metrics)
        logged = int(previous["step"]) if previous else 0
        if logged >= self.progress.step:
            return
        if logged != self.progress.step - 1:
            log.warning("metrics end at step %d but training completed %d", logged, self.progress.step)
        stop = self.progress.position
        batch = StepBatch(stop - self.cfg.global_batch, stop, [], [])
        record = self._record(batch, None, None, self.progress.last_loss, 0.0, None)
        record["logged_late"] = True
        step_log.append(record)
        self.membership.client.put(layout.step_key(self.opts.prefix), str(self.progress.step).encode())


def run(cfg: TrainConfig, opts: LiveOptions) -> int:
    """Train as one member until the run is done; returns the exit code."""
    stop = Stop().install()
    try:
        return _run(cfg, opts, stop)
    except Stopped:
        log.info("stopped by a signal; left the job")
        return 0


def _run(cfg: TrainConfig, opts: LiveOptions, stop: Stop) -> int:
    client = EtcdClient(parse_endpoints(opts.etcd))
    membership = Membership(client, opts.prefix, opts.member, opts.lease_ttl, opts.shard_size)
    trainer = LiveTrainer(cfg, opts, membership, stop)
    if opts.start_when is not None:
        print(json.dumps({"event": "waiting", "time": time.time(), "pid": os.getpid()}), flush=True)
        while not opts.start_when.exists():
            time.sleep(0.02)
        print(json.dumps({"event": "released", "time": time.time(), "pid": os.getpid()}), flush=True)
    membership.register()
    left = 0
    try:
        while True:
            try:
                gen = membership.next_generation(left, opts.min_members, opts.form_timeout)
            except RunFinished:
                return 0
            except Evicted as exc:
                log.warning("%s; exiting", exc)
                return EXIT_EVICTED
            except TimeoutError as exc:
                log.error("%s", exc)
                return EXIT_NO_GENERATION
            try:
                if trainer.run_generation(gen):
                    return 0
                log.info("membership changed after step %d; re-forming", trainer.progress.step)
            except AllStopped:
                log.info("every member stopped at step %d (checkpoint saved)", trainer.progress.step)
                return 0
            except Evicted as exc:
                log.warning("%s; exiting", exc)
                return EXIT_EVICTED
            except StateLost as exc:
                log.error("%s; exiting for the restart path", exc)
                return EXIT_STATE_LOST
            except RuntimeError as exc:
                # A peer vanished mid-step: the partial step is dropped (its gradients are zeroed next step).
                first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                log.warning("generation %d failed at step %d: %s", gen.number, trainer.progress.step, first)
            # Free what still references the old generation's groups (the failed step's frames and autograd
            # graph): their destructors close the connections peers may still be blocked on.
            gc.collect()
            left = gen.number
    finally:
        membership.leave()
        client.close()


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m llm_trainer.live``."""
    logging.basicConfig(
        level=os.environ.get("LOGLEVEL", "INFO").upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    cfg, opts = parse_args(sys.argv[1:] if argv is None else argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    return run(replace(cfg), opts)
