"""The one object a training loop adopts: :class:`Elastic` wraps the loop, :class:`Step` is one step of it.

::

    elastic = Elastic(model, optimizer, ElasticConfig(total_steps=1000), state={"sched": sched})
    for step in elastic.steps():
        with step:
            for x, y in my_batches(sampler.indices(step.index, step.rank, step.world_size)):
                step.model(x).loss(y).backward()        # step.model: wrapped for this generation
            step.commit(loss)                           # the step's one collective of the runtime
            optimizer.step(); optimizer.zero_grad(); sched.step()

What happens around the loop depends on the recovery mode the operator runs the program in
(:mod:`llm_elastic.contract`):

* **restart** (under torchrun) and **standalone**: one process group for the life of the process; at start
  the state comes from the newest in-memory snapshot or complete checkpoint; a failure ends the process
  and torchrun restarts every worker.
* **inProcess**: the process is a member of the job's live membership in etcd. Each *generation* (an
  agreed set of members) gets a fresh process group; on a lost or evicted peer the step in flight is
  discarded, the survivors agree on the next generation, re-wrap the same model, a joiner gets the state
  from a peer, and the loop goes on with the same objects. A local error (out of memory, a bug) is not a
  membership change: the process leaves the job at once and the exception propagates (the pod's
  supervisor restarts the process, which joins as a new member).

A step counts once :meth:`Step.commit` returned (every member's gradients were reduced); what the loop
does after it (the optimizer's update) is local. Checkpoints, snapshots, the step log and the metrics the
operator's hang detection reads happen at the end of each step, in ``with step``'s exit.
"""

from __future__ import annotations

import base64
import gc
import io
import json
import logging
import math
import os
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from datetime import timedelta
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from llm_elastic.abort import Watchdog
from llm_elastic.config import ElasticConfig
from llm_elastic.contract import IN_PROCESS, RESTART, STANDALONE, read_contract
from llm_elastic.data import ElasticSampler
from llm_elastic.errors import (
    EXIT_EVICTED,
    EXIT_NO_GENERATION,
    EXIT_PEER_STOPPED,
    EXIT_RECOVERY_EXHAUSTED,
    EXIT_STATE_LOST,
    Evicted,
    RecoveryExhausted,
    RunFinished,
    StateLost,
    UsageError,
    contract_error,
)
from llm_elastic.health import EXIT_UNHEALTHY, Checks, Finding, StragglerWatch, read_policy, report_unhealthy
from llm_elastic.metrics import Exporter, StepLog, last_record, process_start_time
from llm_elastic.rendezvous.etcd_client import EtcdError
from llm_elastic.signals import StopRequest
from llm_elastic.state import Stateful, TrainState
from llm_elastic.transfer import Progress, Source, synchronise
from llm_elastic.wrap import DDP, Generation, StepClock, Wrapped, WrapPolicy

if TYPE_CHECKING:  # imported when first used: DCP and DTensor cost a joiner ~1.3 s of start-up
    from llm_elastic.checkpoint import Checkpointer
    from llm_elastic.live.layout import Generation as LiveGeneration
    from llm_elastic.live.membership import Membership
    from llm_elastic.snapshot.manager import Snapshotter

log = logging.getLogger("llm_elastic")

FLAGS = 4
"""Flags on a commit's all-reduce: membership changed, members stopping, a snapshot copy busy, restarted
programs not yet counted."""
COMM_WORDS = ("gloo", "nccl", "connection", "timed out", "timeout", "closed by peer", "abort", "socket")


def host_values(reduced: torch.Tensor) -> list[float]:
    """The step's reduced values on the host: the runtime's one device-to-host sync per step."""
    values: list[float] = reduced.tolist()
    return values


def looks_like_communication(exc: BaseException) -> bool:
    """Whether ``exc`` came from a collective or the store (what a vanished peer raises)."""
    if isinstance(exc, dist.DistError):
        return True
    if isinstance(exc, torch.OutOfMemoryError) or not isinstance(exc, RuntimeError):
        return False
    text = str(exc).lower()
    return any(word in text for word in COMM_WORDS)


class Step:
    """One training step: a context manager that discards the step when a peer is lost mid-step."""

    def __init__(self, session: Elastic, index: int) -> None:
        self._session = session
        self.index = index
        """0-based index of this step (the number of steps completed before it)."""
        self.committed = False
        self.loss = math.nan
        """The committed value (mean over the members unless ``mean=False``)."""
        self.peer_lost = False
        self._stopping = 0
        self._stop_announced = False
        self._changed = False
        self._busy = False
        self._evicted: Evicted | None = None
        self._record: dict[str, Any] = {}
        self._started = time.monotonic()

    # -- what the loop reads -----------------------------------------------------------------------------

    @property
    def rank(self) -> int:
        """This process's rank in the current generation."""
        return self._session.rank

    @property
    def world_size(self) -> int:
        """Members (processes) training this step."""
        return self._session.world_size

    @property
    def model(self) -> nn.Module:
        """The model to call this step (wrapped for the generation: DDP, HSDP, or as given)."""
        return self._session.wrapped.module

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The (first) optimizer; a new object per generation only under HSDP."""
        return self._session.state.optimizers[0]

    @property
    def device(self) -> torch.device:
        """This process's device (its GPU, or the CPU)."""
        return self._session.device

    @property
    def generation(self) -> int:
        """The generation number (restart mode: torchelastic's restart count)."""
        return self._session.generation_number

    def record(self, **fields: Any) -> None:
        """Add JSON-serialisable fields to this step's line in the step log."""
        self._record.update(fields)

    # -- the commit ---------------------------------------------------------------------------------------

    def commit(self, value: torch.Tensor | float = 0.0, *, mean: bool = True) -> float:
        """End the step's collective work: one all-reduce of ``value`` (the loss, say) together with the
        runtime's flags (membership changed, a member stopping, a snapshot copy busy). Returns the mean of
        ``value`` over the members (the sum with ``mean=False``). Call it after the backward and before the
        optimizer's update; once it returns the step is complete on every member."""
        if self.committed:
            raise UsageError("step.commit() was called twice in one step")
        s = self._session
        changed = False
        if s.membership is not None and s.live_gen is not None:
            try:
                changed = s.membership.changed.is_set() and s.membership.differs(s.live_gen)
            except Evicted as exc:  # leave at this step boundary, after the others summed this step with us
                self._evicted = exc
            except EtcdError as exc:  # the store is out: training goes on; it is needed only to re-form
                if not s.membership.store_out:
                    log.warning("membership unreadable (training goes on): %s", exc)
                s.membership.store_out = True
        stopping = s.stop.requested
        busy = s.snapshots is not None and s.snapshots.busy
        leaving = self._evicted is not None or s.unhealthy is not None
        base = value.detach().float().reshape(()) if isinstance(value, torch.Tensor) else None
        if base is None:
            base = torch.tensor(float(value), device=s.device)
        elif base.device != s.device:
            base = base.to(s.device)
        # Flags and every member's local compute time (its own slot) ride on the step's one all-reduce.
        world = s.world_size
        # Layout: 4 flags, then per rank its compute time, then per rank the job's layer-2 restart count as
        # it knows it (a joiner knows 0: the maximum over the ranks is the job's).
        flags = s.commit_buffer(FLAGS + 2 * world)
        flags.zero_()
        flags[0] = 1.0 if (changed or stopping or leaving) else 0.0
        flags[1] = 1.0 if stopping else 0.0
        flags[2] = 1.0 if busy else 0.0
        flags[3] = 0.0 if s.restart_announced else 1.0
        flags[FLAGS + s.rank] = s.local_compute_seconds(self._started)
        flags[FLAGS + world + s.rank] = s.job_process_restarts
        extra = flags.to(s.device, non_blocking=True) if s.device.type != "cpu" else flags.clone()
        reduced = torch.cat([base.reshape(1), extra])
        dist.all_reduce(reduced)
        if s.checkpointer is not None:
            s.checkpointer.before_update()  # staging copies must have read the parameters
        values = host_values(reduced)
        total, changed_any, stopping_members, busy_any, announced = values[: 1 + FLAGS]
        self._changed = changed_any > 0
        self._stopping = round(stopping_members)
        self._stop_announced = stopping
        self._busy = busy_any > 0
        s.observe_compute(values[1 + FLAGS : 1 + FLAGS + world])
        s.count_process_restarts(max(values[1 + FLAGS + world : 1 + FLAGS + 2 * world]) + announced)
        self.loss = total / s.world_size if mean else total
        self.committed = True
        return self.loss

    # -- the context --------------------------------------------------------------------------------------

    def __enter__(self) -> Step:
        self._started = time.monotonic()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        s = self._session
        if exc is None:
            if not self.committed:
                s.leave_now()
                raise UsageError("a step ended without step.commit(): call it after backward()")
            s.complete(self)
            return False
        if isinstance(exc, (KeyboardInterrupt, SystemExit, GeneratorExit)):
            s.leave_now()
            return False
        if s.mode == IN_PROCESS and s.peer_lost(exc):
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            log.warning(
                "generation %d: a peer is gone during step %d (%s)",
                s.generation_number,
                self.index + 1,
                first,
            )
            self.peer_lost = True
            s.state.zero_grad()
            return True
        # A local failure: leave at once so that the others re-form without waiting for the lease.
        log.error("step %d failed in this process (%s): leaving the job", self.index + 1, type(exc).__name__)
        s.leave_now()
        return False


class Elastic:
    """Wraps a training loop: membership, recovery, checkpoints, snapshots, metrics (see the module doc)."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | Iterable[torch.optim.Optimizer],
        config: ElasticConfig,
        *,
        state: Mapping[str, Stateful] | None = None,
        sampler: ElasticSampler | None = None,
        wrap: WrapPolicy | None = None,
        modes: Iterable[str] = (RESTART, IN_PROCESS, STANDALONE),
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.contract = read_contract(env, tuple(modes))
        self.mode = self.contract.mode
        self.config = config.resolved(self.contract)
        problems = self.config.problems()
        if problems:
            name, message = problems[0]
            contract_error(f"ElasticConfig.{name}: {message}")
        self.wrap_policy = wrap or DDP()
        if self.mode == IN_PROCESS and not self.wrap_policy.elastic:
            contract_error(
                f"recovery inProcess re-wraps the model for every generation: use wrap=DDP() or HSDP(...), "
                f"not {type(self.wrap_policy).__name__}"
            )
        extras: dict[str, Stateful] = dict(state or {})
        self.sampler = sampler
        if sampler is not None:
            extras.setdefault("sampler", sampler)
        self.state = TrainState(model, optimizer, extras)
        self.device = self._device()
        self.stop = StopRequest()
        self.progress = Progress(step=0, last_loss=math.nan, fresh=True)
        self.rank = 0
        self.world_size = 1
        self.generation_number = 0
        self.wrapped = Wrapped(model, model, self.state.optimizers)
        self.membership: Membership | None = None
        self.live_gen: LiveGeneration | None = None
        self.checkpointer: Checkpointer | None = None
        self.snapshots: Snapshotter | None = None
        self.step_log: StepLog | None = None
        self.pids: list[int] | None = None
        self.resumed_from: int | None = None
        self.restore_source: str | None = None
        self.restore_seconds = 0.0
        self.restore_peers = 0
        """Ranks that received their snapshot shard from another node at start."""
        self.saved_step = -1
        self.steps_done = 0
        self.step_seconds = 0.0
        self.process_started = process_start_time()
        self._left = False
        self._restarts = 0
        """Restart mode: runs of this job before this one (from the step log), for the step records."""
        self.job_process_restarts = 0
        """Layer-2 restarts of the job's programs so far, as the members agree on it at each commit."""
        self.restart_announced = self.contract.process_restarts == 0
        """This program's own restart (if it is one) was counted in a commit."""
        self._standby = False
        self._watchdog: Watchdog | None = None
        self._commit_buffer: torch.Tensor | None = None
        self.health = read_policy(env)
        snapshot_need = 0
        self.checks = Checks(
            self.health,
            self.config.checkpoint_dir,
            "/dev/shm" if self.config.snapshot_every else "",
            snapshot_need,
            self.contract.local_world_size,
        )
        self.straggler = StragglerWatch(self.health.stragglerFactor, self.health.stragglerWindowSteps)
        self.unhealthy: Finding | None = None
        """A failed periodic check or a straggler verdict: this member leaves at the next step boundary."""
        self.step_clock = StepClock()
        watching = self.mode == IN_PROCESS and self.health.enabled and self.health.stragglerWindowSteps > 0
        if watching and isinstance(self.wrap_policy, DDP) and not self.wrap_policy.compile:
            self.wrap_policy.clock = self.step_clock  # the first bucket's time: a comm hook, only when needed
        self._end_generation = False
        self._failed_generations = 0
        labels = (
            {"member": self.contract.member} if self.mode == IN_PROCESS else {"rank": str(self.contract.rank)}
        )
        port = self.config.metrics_port + self.contract.local_rank if self.config.metrics_port else 0
        self.exporter = Exporter(port, labels)
        self.exporter.update(
            total_steps=self.config.total_steps, process_restarts=self.contract.process_restarts
        )

    # -- small facts ---------------------------------------------------------------------------------------

    # -- health --------------------------------------------------------------------------------------------

    def commit_buffer(self, size: int) -> torch.Tensor:
        """A reused host buffer for the commit's flags (pinned on a GPU, so the copy does not block)."""
        buf = self._commit_buffer
        if buf is None or buf.numel() != size:
            buf = torch.zeros(size, dtype=torch.float32)
            if self.device.type == "cuda":
                buf = buf.pin_memory()
            self._commit_buffer = buf
        return buf

    def local_compute_seconds(self, started: float) -> float:
        """This step's local compute time: to the first gradient bucket (DDP, before any wait for a peer),
        else to the commit."""
        first = self.step_clock.first_bucket
        self.step_clock.first_bucket = None
        end = first if first is not None and first >= started else time.monotonic()
        return max(0.0, end - started)

    def count_process_restarts(self, total: float) -> None:
        """The job-wide count of programs restarted in their pods, served as a gauge for the operator."""
        self.restart_announced = True
        self.job_process_restarts = round(total)
        self.exporter.update(job_process_restarts=self.job_process_restarts)

    def observe_compute(self, times: list[float]) -> None:
        """Straggler detection: this member against the others' median."""
        if self.mode != IN_PROCESS or self.world_size < 2 or self.unhealthy is not None:
            return
        mine = times[self.rank]
        others = [t for r, t in enumerate(times) if r != self.rank]
        finding = self.straggler.observe(mine, others)
        if finding is not None:
            self.unhealthy = finding

    def _preflight(self) -> None:
        """Before this worker becomes a member: the node's checks; exit 78 with the reason on a failure."""
        finding = self.checks.run()
        if finding is not None:
            report_unhealthy(finding)
            raise SystemExit(EXIT_UNHEALTHY)
        interval = self.health.intervalSeconds
        if self.health.enabled and interval > 0:
            threading.Thread(
                target=self._recheck, args=(interval,), name="llm-elastic-health", daemon=True
            ).start()

    def _recheck(self, interval: float) -> None:
        while not self._left and self.unhealthy is None:
            time.sleep(interval)
            try:
                finding = self.checks.run(periodic=True)
            except Exception:  # a check that breaks is logged, not fatal
                log.exception("periodic health check failed to run")
                continue
            if finding is not None:
                log.error("health check failed: %s (leaving at the next step boundary)", finding.line())
                self.unhealthy = finding

    def _device(self) -> torch.device:
        if torch.cuda.is_available():
            device = torch.device("cuda", self.contract.local_rank % max(1, torch.cuda.device_count()))
            torch.cuda.set_device(device)
            return device
        return torch.device("cpu")

    @property
    def backend(self) -> str:
        """gloo on CPU; NCCL for device tensors with gloo beside it for CPU collectives."""
        return "cpu:gloo,cuda:nccl" if self.device.type == "cuda" else "gloo"

    @property
    def step(self) -> int:
        """Steps completed so far."""
        return self.progress.step

    # -- the loop -------------------------------------------------------------------------------------------

    def steps(self) -> Iterator[Step]:
        """Yield the steps still to train; forms generations and recovers in between (see the module doc).

        Ends (StopIteration) when ``total_steps`` are done. Ends the process (``SystemExit``) when it was
        stopped by a signal (0, after saving), evicted (3), when no generation formed (4), when the state is
        lost (5) or, in restart mode, when another rank stopped (75)."""
        self.stop.install()
        try:
            if self.mode == IN_PROCESS:
                yield from self._live_loop()
            else:
                yield from self._fixed_loop()
        finally:
            self._close()

    def _fixed_loop(self) -> Iterator[Step]:
        timeout = timedelta(seconds=self.config.collective_timeout)
        if self.mode == RESTART:
            dist.init_process_group(self.backend, timeout=timeout)
        else:
            from torch._C._distributed_c10d import HashStore

            dist.init_process_group(self.backend, store=HashStore(), rank=0, world_size=1, timeout=timeout)
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.generation_number = self.contract.agent_restarts
        self._open_generation()
        self._restore_at_start()
        while self.progress.step < self.config.total_steps:
            step = Step(self, self.progress.step)
            yield step
            self._after_step(step)
        self._final_save()

    def _live_loop(self) -> Iterator[Step]:
        from llm_elastic.live.membership import Membership
        from llm_elastic.rendezvous.etcd_client import EtcdClient, parse_endpoints

        c = self.contract
        client = EtcdClient(parse_endpoints(c.etcd))
        self.membership = Membership(
            client, c.prefix, c.member, self.config.lease_ttl, self.wrap_policy.shard_size, c.target_members
        )
        if self.config.start_when:
            print(json.dumps({"event": "waiting", "time": time.time(), "pid": os.getpid()}), flush=True)
            while not Path(self.config.start_when).exists():
                self._check_stop_outside_steps()
                time.sleep(0.02)
            print(json.dumps({"event": "released", "time": time.time(), "pid": os.getpid()}), flush=True)
        self._preflight()
        self.membership.register()
        left = 0
        while True:
            gen = self._next_generation(left)
            if gen is None:
                return
            ok = False
            try:
                ok = self._form(gen)
                while ok and self.progress.step < self.config.total_steps and not self._end_generation:
                    step = Step(self, self.progress.step)
                    yield step
                    if step.peer_lost:
                        ok = False
                        break
                    self._after_step(step)
                if ok and not self._end_generation:
                    self._final_save()
                    if self.rank == 0:
                        self.membership.finish()
                    return
            except StateLost as exc:
                log.error("%s; exiting for the restart path", exc)
                raise SystemExit(EXIT_STATE_LOST) from None
            except RuntimeError as exc:
                if not self.peer_lost(exc):
                    self.leave_now()
                    raise
                first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                log.warning("generation %d failed at step %d: %s", gen.number, self.progress.step, first)
                ok = False
            finally:
                self._close_generation()
            self._failed_generations = 0 if ok else self._failed_generations + 1
            if self._failed_generations > self.config.max_reforms:
                self.leave_now()
                log.error(
                    "%d generations in a row failed without a step: handing over", self._failed_generations
                )
                raise SystemExit(EXIT_RECOVERY_EXHAUSTED) from RecoveryExhausted(
                    f"{self._failed_generations} generations failed in a row"
                )
            log.info("membership changed after step %d; re-forming", self.progress.step)
            left = gen.number

    def _next_generation(self, left: int) -> LiveGeneration | None:
        assert self.membership is not None
        self._end_generation = False
        try:
            return self.membership.next_generation(
                left, self.contract.min_members, self.config.form_timeout, self._while_waiting
            )
        except RunFinished:
            return None
        except Evicted as exc:
            log.warning("%s; exiting", exc)
            self.leave_now()
            raise SystemExit(EXIT_EVICTED) from None
        except TimeoutError as exc:
            log.error("%s", exc)
            self.leave_now()
            raise SystemExit(EXIT_NO_GENERATION) from None

    def _while_waiting(self) -> None:
        """Called while a generation forms: stop signals, and the standby state of a spare."""
        self._check_stop_outside_steps()
        membership = self.membership
        if membership is not None and membership.standby != self._standby:
            self._standby = membership.standby
            self.exporter.update(standby=1.0 if self._standby else 0.0)
            if self._standby:
                event = {
                    "event": "standby",
                    "time": time.time(),
                    "pid": os.getpid(),
                    "step": self.progress.step,
                }
                print(json.dumps(event), flush=True)

    def _check_stop_outside_steps(self) -> None:
        """A stop signal while no step runs (waiting, forming): leave at once."""
        if self.stop.requested:
            log.info("stopped by %s while not training; left the job", self.stop.signal_name)
            self.leave_now()
            raise SystemExit(0)

    # -- generations ----------------------------------------------------------------------------------------

    def _form(self, gen: LiveGeneration) -> bool:
        """Form ``gen``'s process group, wrap the model and take the state."""
        from llm_elastic.live import layout
        from llm_elastic.rendezvous.etcd_store import EtcdV3Store

        assert self.membership is not None
        formed_at = time.time()
        self.live_gen = gen
        self.membership.current = gen
        if self._standby:
            self._standby = False
            self.exporter.update(standby=0.0)
        self.generation_number = gen.number
        self.rank, self.world_size = gen.rank_of(self.contract.member), gen.world_size
        timeout = timedelta(seconds=self.config.live_collective_timeout)
        store = EtcdV3Store(
            self.membership.client,
            layout.store_prefix(self.contract.prefix, gen.number),
            self.membership.lease,
            timeout=timeout,
        )
        dist.init_process_group(
            self.backend, store=store, rank=self.rank, world_size=gen.world_size, timeout=timeout
        )
        pid = torch.tensor([os.getpid()], dtype=torch.int64)
        gathered = [torch.zeros(1, dtype=torch.int64) for _ in range(gen.world_size)]
        dist.all_gather(gathered, pid)
        self.pids = [int(t.item()) for t in gathered]
        job_step = self.membership.job_step()
        self._open_generation()
        if self.device.type == "cuda":  # NCCL: a lost peer raises nothing, so abort from the watch
            self._watchdog = Watchdog(
                lambda: self.membership is not None and self.membership.member_gone(gen),
                self.membership.alarm,
                self._nccl_groups,
            ).start()

        def receiving() -> None:
            self.progress.fresh = True

        self.progress, source = synchronise(
            self.state,
            self.progress,
            None,
            job_step,
            receiving,
            self._restore_collective,
            self.wrapped.replica_group,
            self.wrapped.shard_size,
        )
        self.resumed_from = self.progress.step
        if self.rank == 0:
            self._log_pending()
            if gen.number > 1:
                self.membership.forget_generation(gen.number - 1)
        self._report_formed(gen, source, formed_at)
        return True

    def _report_formed(self, gen: LiveGeneration, source: Source, formed_at: float) -> None:
        event = {
            "event": "formed",
            "generation": gen.number,
            "world_size": gen.world_size,
            "rank": self.rank,
            "step": self.progress.step,
            "source": source,
            "formed_at": formed_at,
            "ready_at": time.time(),
            "pid": os.getpid(),
        }
        print(json.dumps(event), flush=True)

    def _open_generation(self) -> None:
        """Wrap the model and make the generation's checkpointer, snapshotter and step log."""
        gen = Generation(
            self.world_size,
            self.rank,
            self.device,
            self.backend,
            timedelta(seconds=self.config.live_collective_timeout),
        )
        self.wrapped = self.wrap_policy.wrap(self.state.model, self.state.optimizers, gen)
        self.state.replace(self.wrapped.base, self.wrapped.optimizers)
        cfg = self.config
        if cfg.checkpoint_dir:
            from llm_elastic.checkpoint import Checkpointer

            persist_group = self._cpu_group() if cfg.async_checkpoint else None
            self.checkpointer = Checkpointer(
                Path(cfg.checkpoint_dir),
                cfg.keep_checkpoints,
                self.rank,
                persist_group,
                cache_plans=self.mode != IN_PROCESS,  # the group changes with every generation
            )
        if cfg.snapshot_every:
            from llm_elastic.snapshot.manager import Snapshotter
            from llm_elastic.snapshot.space import SnapshotSpaceError, check_snapshot_space, human

            try:
                need = check_snapshot_space(
                    Path(cfg.snapshot_dir),
                    self.state.model,
                    self.state.optimizers[0],
                    self.world_size,
                    self.contract.local_world_size,
                )
            except SnapshotSpaceError as exc:  # one line now, rather than SIGBUS at the first snapshot
                log.error("%s", exc)
                self.leave_now()
                raise SystemExit(1) from None
            log.info("snapshots need %s per node in %s", human(need), cfg.snapshot_dir)
            self.snapshots = Snapshotter(
                Path(cfg.snapshot_dir),
                self.rank,
                self.world_size,
                self.contract.local_world_size,
                self._cpu_group(),
                self._layout_key(),
                replicated=self.wrapped.shard_size == 1 and self.wrap_policy.elastic,
            )
        self.step_log = StepLog(Path(cfg.step_log)) if cfg.step_log and self.rank == 0 else None

    def _nccl_groups(self) -> list[Any]:
        """Every process group of the generation (the default one and those made from it)."""
        groups = [dist.group.WORLD]
        groups += [g for g in dist.distributed_c10d._world.pg_map if g is not dist.group.WORLD]
        return groups

    def _close_generation(self) -> None:
        """Drop the generation's groups (their connections close, so a peer blocked on us fails at once)."""
        if self._watchdog is not None:
            self._watchdog.stop()
            self._watchdog = None
        self.wrap_policy.park(self.wrapped)
        self.wrapped = Wrapped(self.state.model, self.state.model, self.state.optimizers)
        self.checkpointer = None
        self.snapshots = None
        self.live_gen = None
        if dist.is_initialized():
            dist.destroy_process_group()
        gc.collect()  # the failed step's frames may hold the old groups' connections

    def _cpu_group(self) -> dist.ProcessGroup:
        group = dist.new_group(backend="gloo")
        assert isinstance(group, dist.ProcessGroup)
        return group

    def _layout_key(self) -> str:
        params = sum(p.numel() for p in self.state.model.parameters())
        meta = json.dumps(self.config.meta, sort_keys=True)
        return f"{type(self.state.model).__name__}|{params}|{self.wrap_policy.shard_size}|{meta}"

    # -- restore ------------------------------------------------------------------------------------------

    def _restore_at_start(self) -> None:
        started = time.monotonic()
        restored = self._restore_collective()
        if restored is not None:
            self.progress = restored
            self.resumed_from = restored.step
            self.restore_seconds = time.monotonic() - started
            if self.rank == 0:
                log.info(
                    "resumed from step %d from %s in %.2fs",
                    restored.step,
                    self.restore_source,
                    self.restore_seconds,
                )
        else:
            self.progress.fresh = False
        if self.rank == 0 and self.config.step_log:
            previous = last_record(Path(self.config.step_log))
            self._restarts = int(previous.get("restart", 0)) + 1 if previous else 0

    def _restore_collective(self) -> Progress | None:
        """Collective: the newest in-memory snapshot every rank can get, else the newest complete checkpoint
        (rank 0 picks it for all); None when neither exists."""
        from llm_elastic.checkpoint import CheckpointInfo, complete_checkpoints, read_extras

        cfg = self.config
        candidates: list[CheckpointInfo] = []
        if cfg.checkpoint_dir:
            choice: list[list[CheckpointInfo] | None] = [
                complete_checkpoints(Path(cfg.checkpoint_dir))[::-1] if self.rank == 0 else None
            ]
            dist.broadcast_object_list(choice, src=0)
            candidates = choice[0] or []
        info = candidates[0] if candidates else None
        if self.snapshots is not None:
            found = self.snapshots.restore(self.state.model, self._optims(), info.step if info else 0)
            if found is not None:
                meta, where, self.restore_peers = found
                self._load_extras(meta.get("extras"))
                self.restore_source = "memory"
                self.job_process_restarts = int(meta.get("job_process_restarts", 0))
                log.info("rank %d: snapshot shard from %s", self.rank, where)
                return Progress(
                    int(meta["step"]),
                    float(meta.get("last_loss", math.nan)),
                    False,
                    int(meta.get("restarts", 0)),
                )
        if info is None or self.checkpointer is None:
            return None
        loaded: dict[str, Any] | None = None
        for info in candidates:  # newest first; a checkpoint that will not load falls back to the one before
            try:
                loaded = self.checkpointer.load(info, self.state.model, self._optims())
                break
            except (KeyError, ValueError, RuntimeError) as exc:  # DCP raises on every rank alike
                log.error("checkpoint %s does not load (%s): trying the one before", info.path, exc)
        if loaded is None:
            raise StateLost(f"no complete checkpoint under {cfg.checkpoint_dir} loads")
        meta = loaded
        raw = read_extras(info)
        self._load_extras(base64.b64encode(raw).decode() if raw else None)
        self.saved_step = info.step
        self.restore_source = "checkpoint"
        self.job_process_restarts = int(meta.get("job_process_restarts", 0))
        restarts = int(meta.get("restarts", 0)) + (1 if self.mode == IN_PROCESS else 0)
        if self.mode == IN_PROCESS:
            log.info("every member was new: resumed from checkpoint step-%d", info.step)
        return Progress(info.step, float(meta.get("last_loss", math.nan)), False, restarts)

    def _optims(self) -> torch.optim.Optimizer | tuple[torch.optim.Optimizer, ...]:
        opts = self.state.optimizers
        return opts[0] if len(opts) == 1 else tuple(opts)

    def _extras_blob(self) -> bytes:
        buffer = io.BytesIO()
        torch.save(self.state.extras_state(), buffer)
        return buffer.getvalue()

    def _load_extras(self, encoded: str | None) -> None:
        if not encoded:
            return
        state = torch.load(io.BytesIO(base64.b64decode(encoded)), weights_only=False)
        try:
            self.state.load_extras_state(state)
        except ValueError as exc:
            raise StateLost(f"the saved state does not fit this run: {exc}") from exc

    # -- after a step ---------------------------------------------------------------------------------------

    def complete(self, step: Step) -> None:
        """The step ended well: count it, log it, and act on what the commit said."""
        elapsed = time.monotonic() - step._started
        self.progress = Progress(step.index + 1, step.loss, False, self.progress.restarts)
        self.steps_done += 1
        self.step_seconds += elapsed
        self._failed_generations = 0
        self._record(step, elapsed)

    def _after_step(self, step: Step) -> None:
        """Checkpoints, snapshots, stops and membership changes at the step boundary (collective)."""
        cfg = self.config
        if self.mode == IN_PROCESS:
            if step._stopping:
                # Save while every member is still here: a suspend's signals reach members at different
                # times; whoever is stopped last then finds this step saved.
                self._save()
            if step._stopping >= self.world_size:
                log.info("every member stopped at step %d (saved)", self.progress.step)
                self._leave_and_exit(0)
            if step._evicted is not None:
                log.warning("%s; exiting", step._evicted)
                self._leave_and_exit(EXIT_EVICTED)
            if self.unhealthy is not None:
                report_unhealthy(self.unhealthy)
                self._leave_and_exit(EXIT_UNHEALTHY)
            if self.stop.requested and step._stop_announced:
                # Only a stop that rode this step's commit: the others know it and saved with us. A signal
                # that came after the commit is announced in the next one (a stop of every member must
                # find the last step saved, whatever order the signals arrive in).
                log.info("stopped by %s at step %d; left the job", self.stop.signal_name, self.progress.step)
                self._leave_and_exit(0)
            if step._changed:
                self._end_generation = True
                return
        elif step._stopping:
            self._final_save()
            self._leave_and_exit(self._stop_exit_code())
        at = self.progress.step
        if cfg.snapshot_every and at % cfg.snapshot_every == 0 and not step._busy and at < cfg.total_steps:
            self._snapshot()
        if cfg.checkpoint_every and at % cfg.checkpoint_every == 0 and at < cfg.total_steps:
            self._save()

    def _meta(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            **self.config.meta,
            "step": self.progress.step,
            "world_size": self.world_size,
            "last_loss": self.progress.last_loss if math.isfinite(self.progress.last_loss) else None,
            "restarts": self.progress.restarts,
            "job_process_restarts": self.job_process_restarts,
        }
        if self.sampler is not None:
            out["samples_seen"] = self.progress.step * self.sampler.global_batch
            out["data"] = {**self.sampler.state_dict(), "position": out["samples_seen"]}
        return out

    def _save(self) -> None:
        """Collective checkpoint of the current step (unless saved already, or checkpoints are off)."""
        if self.checkpointer is None or self.saved_step == self.progress.step or self.progress.step == 0:
            return
        if self.config.async_checkpoint:
            self.checkpointer.save_async(
                self.progress.step, self.state.model, self._optims(), self._meta(), self._extras_blob()
            )
        else:
            self.checkpointer.save(
                self.progress.step, self.state.model, self._optims(), self._meta(), self._extras_blob()
            )
        self.saved_step = self.progress.step
        self.exporter.update(last_saved_step=self.progress.step, last_saved_timestamp_seconds=time.time())

    def _snapshot(self) -> None:
        if self.snapshots is not None:
            meta = {**self._meta(), "extras": base64.b64encode(self._extras_blob()).decode()}
            self.snapshots.take(self.progress.step, self.state.model, self._optims(), meta)

    def _final_save(self) -> None:
        """Stop or end: snapshot and checkpoint the last step and wait for both to be complete."""
        if self.snapshots is not None and self.snapshots.taken_step != self.progress.step:
            self.snapshots.wait()
            self._snapshot()
        self._save()
        if self.checkpointer is not None:
            self.checkpointer.wait()
        if self.snapshots is not None:
            self.snapshots.wait()

    def _stop_exit_code(self) -> int:
        if self.stop.requested or self.stop.wait(self.config.peer_stop_grace):
            log.info("stopped by %s at step %d after saving", self.stop.signal_name, self.progress.step)
            return 0
        log.warning("another rank stopped at step %d; exiting for a re-rendezvous", self.progress.step)
        return EXIT_PEER_STOPPED

    def _record(self, step: Step, elapsed: float) -> None:
        now = time.time()
        tokens = step._record.get("tokens")
        self.exporter.update(
            step=self.progress.step,
            loss=step.loss,
            last_step_timestamp_seconds=now,
            world_size=self.world_size,
            step_time_seconds_sum=self.step_seconds,
            step_time_seconds_count=self.steps_done,
            **({"tokens_per_second": float(tokens) / max(elapsed, 1e-9)} if tokens else {}),
            **({"samples_seen": self.progress.step * self.sampler.global_batch} if self.sampler else {}),
        )
        if self.membership is not None and self.rank == 0:
            self.membership.set_job_step(self.progress.step)
        if self.step_log is None:
            return
        record: dict[str, Any] = {
            "time": round(now, 3),
            "step": self.progress.step,
            "loss": round(step.loss, 6) if math.isfinite(step.loss) else None,
            "world_size": self.world_size,
            "step_time": round(elapsed, 4),
            "restart": self.progress.restarts if self.mode == IN_PROCESS else self._restarts,
            "generation": self.generation_number,
            "resumed_from": self.resumed_from,
            "restore_source": self.restore_source,
            "process_started": self.process_started,
        }
        if self.mode == IN_PROCESS:
            record["members"] = list(self.live_gen.members) if self.live_gen else None
            record["pids"] = self.pids
        else:
            record["agent_restart"] = self.contract.agent_restarts
            record["restore_seconds"] = round(self.restore_seconds, 3)
            record["restore_peers"] = self.restore_peers
        if self.sampler is not None:
            start, stop = self.sampler.step_range(step.index)
            record.update(
                global_batch=self.sampler.global_batch,
                samples_seen=stop,
                sample_start=start,
                sample_end=stop,
                samples_crc32=self.sampler.crc32(step.index),
            )
        record.update(step._record)
        record.pop("tokens", None)
        self.step_log.append(record)
        every = self.config.log_every
        if every and (self.progress.step % every == 0 or self.progress.step == (self.resumed_from or 0) + 1):
            log.info(
                "step %d loss %.4f world %d %.3fs", self.progress.step, step.loss, self.world_size, elapsed
            )

    def _log_pending(self) -> None:
        """Log the step a survivor completed whose rank 0 died before writing it (at most one)."""
        if self.step_log is None:
            return
        previous = last_record(Path(self.config.step_log))
        logged = int(previous["step"]) if previous else 0
        if logged >= self.progress.step:
            return
        if logged != self.progress.step - 1:
            log.warning("the step log ends at step %d but training completed %d", logged, self.progress.step)
        record: dict[str, Any] = {
            "time": round(time.time(), 3),
            "step": self.progress.step,
            "loss": round(self.progress.last_loss, 6) if math.isfinite(self.progress.last_loss) else None,
            "world_size": None,
            "step_time": 0.0,
            "restart": self.progress.restarts,
            "generation": None,
            "members": None,
            "pids": None,
            "resumed_from": None,
            "logged_late": True,
        }
        if self.sampler is not None:
            start, stop = self.sampler.step_range(self.progress.step - 1)
            record.update(
                global_batch=self.sampler.global_batch,
                samples_seen=stop,
                sample_start=start,
                sample_end=stop,
                samples_crc32=self.sampler.crc32(self.progress.step - 1),
            )
        self.step_log.append(record)

    # -- failures and leaving -------------------------------------------------------------------------------

    def peer_lost(self, exc: BaseException) -> bool:
        """In process: whether ``exc`` means the membership changed (a peer is gone), not a local error.

        A collective or store error counts when the membership shows a change within a lease's time (a
        peer that died takes at most its lease TTL to disappear); anything else, or no change, is local."""
        membership, gen = self.membership, self.live_gen
        if membership is None or gen is None:
            return False
        comm = looks_like_communication(exc)
        started = time.monotonic()
        deadline = started + (self.config.lease_ttl + 1.0 if comm else 0.0)
        while True:
            try:
                if membership.differs(gen):
                    return True
            except Evicted:
                return True  # the next generation attempt finds out and exits
            except EtcdError as store_error:
                # The store is out as well: wait for it (bounded) rather than call a lost peer local.
                if comm and deadline < started + self.config.store_outage_seconds:
                    log.warning("judging a failed collective needs etcd, which is out: %s", store_error)
                    deadline = started + self.config.store_outage_seconds
            if time.monotonic() >= deadline:
                return False
            membership.changed.wait(0.05)

    def leave_now(self) -> None:
        """Leave the membership at once (revoking the lease), so the others re-form without waiting."""
        if self._left:
            return
        self._left = True
        if self.membership is not None:
            try:
                self.membership.leave()
            except Exception:  # leaving is best effort: the lease expires anyway
                log.debug("leaving the membership failed", exc_info=True)

    def _leave_and_exit(self, code: int) -> None:
        self.leave_now()
        raise SystemExit(code)

    def _close(self) -> None:
        if self.checkpointer is not None:
            try:
                self.checkpointer.wait()
            except RuntimeError as exc:
                log.warning("%s", exc)
        self.leave_now()
        if self.membership is not None:
            self.membership.client.close()
        if dist.is_initialized():
            dist.destroy_process_group()
