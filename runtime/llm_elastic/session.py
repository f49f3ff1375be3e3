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
(:mod:`llm_elastic.contract`), an object of :mod:`llm_elastic.modes` (restart under torchrun, standalone) or
:mod:`llm_elastic.inprocess` (generations of a live membership).

A step counts once :meth:`Step.commit` returned (every member's gradients were reduced); what the loop
does after it (the optimizer's update) is local. Checkpoints, snapshots, the step log and the metrics the
operator's hang detection reads happen at the end of each step, in ``with step``'s exit.

:class:`Elastic` is a facade: it wires the parts (docs/runtime-design.md) and runs the loop. The parts:
the mode, :mod:`~llm_elastic.commit`, :mod:`~llm_elastic.persistence`, :mod:`~llm_elastic.reporting`,
:mod:`~llm_elastic.health_watch`; every exit of the process goes through :class:`~llm_elastic.leave.Leave`.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Generator, Iterable, Iterator, Mapping
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from llm_elastic import heap
from llm_elastic.commit import Signals, Verdict
from llm_elastic.committer import Committer
from llm_elastic.config import ElasticConfig
from llm_elastic.contract import IN_PROCESS, RESTART, STANDALONE, read_contract
from llm_elastic.data import ElasticSampler
from llm_elastic.errors import Evicted, contract_error, first_line
from llm_elastic.health_watch import HealthWatch
from llm_elastic.leave import Leave
from llm_elastic.loss_actions import LossActions
from llm_elastic.loss_rules import Firing
from llm_elastic.modes import backend_for, make_mode, pick_device
from llm_elastic.persistence import Persistence, SavePoint, layout_key
from llm_elastic.position import Position, RestoreFacts, World
from llm_elastic.recovery import Outcome, Parts
from llm_elastic.reporting import Reporter
from llm_elastic.signals import StopRequest
from llm_elastic.state import Stateful, TrainState
from llm_elastic.step import Step
from llm_elastic.wrap import DDP, WrapContext, Wrapped, WrapPolicy

__all__ = ["Elastic", "Step"]

log = logging.getLogger("llm_elastic")


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
        self.contract_env = env
        self.config = config.resolved(self.contract)
        problems = self.config.problems()
        if problems:
            name, message = problems[0]
            contract_error(f"ElasticConfig.{name}: {message}")
        self.recovery = make_mode(self.contract.mode, self.config)
        self.wrap_policy = wrap or DDP()
        self.recovery.check(self.wrap_policy)
        extras: dict[str, Stateful] = dict(state or {})
        self.sampler = sampler
        if sampler is not None:
            extras.setdefault("sampler", sampler)
        self.state = TrainState(model, optimizer, extras)
        self.device = pick_device(self.contract.local_rank)
        self.stop = StopRequest()
        self.position = Position()
        """Where the run stands; :meth:`move` is the one way it changes."""
        self.wrapped = Wrapped(model, model, self.state.optimizers)
        self._open = False
        """A generation is formed or forming (a live one is closed when it ends, or at the loop's end)."""
        self.left = False
        """Set once this process left the job (:meth:`leave_now`); the periodic health checks stop then."""
        c = self.contract
        self.health = HealthWatch(env, self.config, c.local_world_size, self.recovery.live, self.wrap_policy)
        port = self.config.metrics_port + c.local_rank if self.config.metrics_port else 0
        labels = self.recovery.labels(c)
        self.reporter = Reporter(self.config, labels, port, c.process_restarts, sampler)
        self.persistence = Persistence(
            self.config,
            self.state,
            lambda: SavePoint(self.position.progress, self.world_size, self.commits.job_process_restarts),
            lambda step: self.reporter.update(last_saved_step=step, last_saved_timestamp_seconds=time.time()),
            live=self.recovery.live,
            sampler=sampler,
        )
        parts = (self.health, self.persistence, self.reporter, self.stop, self.recovery.membership_changed)
        self.commits = Committer(self.device, *parts, restarted=c.process_restarts != 0)
        self.loss_rules = LossActions(self.config.loss_rules, self.persistence, self.reporter, env)

    # -- read-only facts (docs/runtime-api.md) ---------------------------------------------------------------

    @property
    def mode(self) -> str:
        """The recovery mode: ``restart``, ``inProcess`` or ``standalone``."""
        return self.recovery.name

    @property
    def model(self) -> nn.Module:
        """The model whose state is trained (unwrapped under DDP; a new object per generation under HSDP)."""
        return self.state.model

    @property
    def optimizers(self) -> list[torch.optim.Optimizer]:
        """The optimizers (new objects per generation only under HSDP)."""
        return self.state.optimizers

    @property
    def rank(self) -> int:
        """This process's rank in the current generation."""
        return self.position.world.rank

    @property
    def world_size(self) -> int:
        """Processes in the current generation."""
        return self.position.world.world_size

    @property
    def generation(self) -> int:
        """The generation number (restart mode: torchelastic's restart count)."""
        return self.position.world.generation

    @property
    def step(self) -> int:
        """Steps completed so far."""
        return self.position.progress.step

    @property
    def restored(self) -> RestoreFacts:
        """Where this process's state came from (step resumed at, source, seconds, peers)."""
        return self.position.restored

    @property
    def backend(self) -> str:
        """gloo on CPU; NCCL for device tensors with gloo beside it for CPU collectives."""
        return backend_for(self.device)

    # -- the loop -------------------------------------------------------------------------------------------

    def steps(self) -> Iterator[Step]:
        """Yield the steps still to train; forms generations and recovers in between (see the module doc).

        Ends (StopIteration) when ``total_steps`` are done. Ends the process (``SystemExit``) when it was
        stopped by a signal (0, after saving), evicted (3), when no generation formed (4), when the state is
        lost (5) or, in restart mode, when another rank stopped (75): the one place a :class:`Leave` turns
        into leave-then-exit."""
        self.stop.install()
        try:
            yield from self._generations()
        except Leave as leave:
            self.leave_now()
            raise SystemExit(leave.code) from leave.cause
        finally:
            self._close()

    def _generations(self) -> Iterator[Step]:
        """The loop: the mode names each generation, this trains it until an :class:`Outcome`, closes it,
        and tells the mode how it ended (the mode decides; it never calls back here)."""
        mode = self.recovery
        c, wrap = self.contract, self.wrap_policy
        mode.start(Parts(c, self.reporter, self.health, self.persistence, self.stop, wrap), self.backend)
        while (world := mode.next_world(self.position.progress.step)) is not None:
            outcome = yield from self._generation(world)
            if mode.live:
                self._close_generation()
            if outcome is Outcome.DONE:
                return
            mode.ended(outcome, self.position.progress.step)

    def _generation(self, world: World) -> Generator[Step, None, Outcome]:
        """Form the generation ``world`` names and train in it until an outcome. A ``Leave`` or a local
        error propagates with the generation open: :meth:`steps` leaves, then :meth:`_close` drops it."""
        mode, formed_at = self.recovery, time.time()
        self._open = True
        try:
            self.move(self.position.joined(world))
            job_step = mode.form(self.backend)
            self._open_generation()
            mode.watch(self.device)
            restore = functools.partial(self.persistence.restore, self.rank)
            agreement = mode.agree(self.state, self.position, restore, self.wrapped, job_step)
            self.move(agreement.position)
            if agreement.loaded is not None:
                self.commits.job_process_restarts = agreement.loaded.job_process_restarts
            mode.formed(self.position, agreement, formed_at)
            while self.position.progress.step < self.config.total_steps:
                step = Step(self, self.position.progress.step, mode.peer_lost, self.state.zero_grad)
                yield step
                if step.peer_lost:
                    lost = (world.generation, step.index + 1, step.peer_lost)
                    log.warning("generation %d: a peer is gone during step %d (%s)", *lost)
                    return Outcome.PEER_LOST
                if self.after_step(step):
                    return Outcome.CHANGED
            self.persistence.final_save()
            mode.finished(self.rank)
            return Outcome.DONE
        except RuntimeError as exc:
            if not mode.peer_lost(exc):
                raise
            log.warning("generation %d failed at step %d: %s", world.generation, self.step, first_line(exc))
            return Outcome.PEER_LOST

    def after_step(self, step: Step) -> bool:
        """The step boundary (collective): a loss rule's action, the mode acts on the verdict, then the
        cadence of saves. True when the generation ends after this step (the membership changed)."""
        assert step.verdict is not None
        if step.firing is not None:
            rolled_back = self.loss_rules.act(step.firing, self.rank, self.position)
            if rolled_back is not None:
                self.move(rolled_back)
                self.recovery.completed(self.rank, self.step)
        if self.recovery.at_boundary(step.verdict, step.evicted, self.world_size, self.step):
            return True
        self.persistence.at_step_end(step.verdict.busy)
        return False

    # -- what a step asks of the loop (llm_elastic.step.StepHost) --------------------------------------------

    @property
    def step_module(self) -> nn.Module:
        """The model as wrapped for the generation."""
        return self.wrapped.module

    def signals(self, started: float) -> tuple[Signals, Evicted | None]:
        """This member's flags for the step's commit (:class:`~llm_elastic.committer.Committer`)."""
        return self.commits.signals(started)

    def commit(self, value: torch.Tensor | float, signals: Signals, mean: bool) -> Verdict:
        """The step's one collective (:class:`~llm_elastic.committer.Committer`)."""
        return self.commits.commit(value, signals, mean, self.rank, self.world_size)

    def abandon(self) -> None:
        """The loop's own code failed (or exited) inside a step: that exception is the loop's, raised in its
        own frame, so it never passes through :meth:`steps`; leave here, at once, so the others re-form
        without waiting for the lease."""
        self.leave_now()

    def judge_loss(self, verdict: Verdict, step: int) -> Firing | None:
        """A commit's verdict for the loss rules: the rule that fires (reported), or None."""
        return self.loss_rules.judge(verdict.nonfinite, step)

    def complete(self, step: Step) -> None:
        """The step ended (applied, or dropped by a loss rule): count it, report it."""
        elapsed = time.monotonic() - step.started
        if step.dropped:  # the state is the previous step's: so is its loss
            step.record(skipped=True)
        self.move(self.position.trained(step.index + 1, None if step.dropped else step.loss))
        now, progress = time.time(), self.position.progress
        self.reporter.step_metrics(step, progress, elapsed, now, self.world_size)
        self.recovery.completed(self.rank, progress.step)
        restart, fields = self.recovery.record(self.position)
        world = (self.world_size, self.generation)
        self.reporter.step_record(step, progress, elapsed, now, world, restart, self.restored, fields)

    # -- generations ----------------------------------------------------------------------------------------

    def _open_generation(self) -> None:
        """Wrap the model and make the generation's checkpointer, snapshotter and step log."""
        gen = WrapContext(
            self.world_size,
            self.rank,
            self.device,
            self.backend,
            timedelta(seconds=self.config.live_collective_timeout),
            self.health.wrap_clock,
        )
        self.loss_rules.reset()  # a streak of broken steps counts within one generation
        self.wrapped = self.wrap_policy.wrap(self.state.model, self.state.optimizers, gen)
        self.state.replace(self.wrapped.base, self.wrapped.optimizers)
        replicated = self.wrapped.shard_size == 1 and self.wrap_policy.elastic
        shard_size, meta = self.wrap_policy.shard_size, self.config.meta
        key = layout_key(self.state.model, shard_size, meta) if self.config.snapshot_every else ""
        self.persistence.open(self.rank, self.world_size, self.contract.local_world_size, key, replicated)
        self.reporter.open(self.rank)

    def _close_generation(self) -> None:
        """Drop the generation's groups (their connections close, so a peer blocked on us fails at once)."""
        self.recovery.close_generation()
        self._open = False
        self.wrap_policy.park(self.wrapped)
        self.wrapped = Wrapped(self.state.model, self.state.model, self.state.optimizers)
        self.persistence.close()
        if dist.is_initialized():
            dist.destroy_process_group()
        heap.settle()  # the failed step's frames may hold the old groups' connections

    def move(self, to: Position) -> None:
        """The one way the run's position changes: a generation, a restore, a transfer, a step."""
        self.position = to

    # -- leaving --------------------------------------------------------------------------------------------

    def leave_now(self) -> None:
        """Leave the membership at once (revoking the lease), so the others re-form without waiting."""
        if self.left:
            return
        self.left = True
        self.health.stop()
        self.recovery.leave()

    def _close(self) -> None:
        """Leave first (the others re-form at once), then drop what the mode holds (in process: a generation
        a Leave or an error left open), then wait for a checkpoint still persisting."""
        self.leave_now()
        if self._open and self.recovery.live:
            self._close_generation()
        self.recovery.close()
        self.persistence.wait()
        if dist.is_initialized():
            dist.destroy_process_group()
