"""Recovery in process: the process is a member of the job's live membership in etcd. Each generation (an
agreed set of members) gets a fresh process group; on a lost or evicted peer the step in flight is
discarded, the survivors agree on the next generation, re-wrap the same model, a joiner gets the state from
a peer, and the loop goes on with the same objects. A local error is not a membership change: the error
propagates, and ``Elastic.steps()`` leaves the job before the generation is closed (the pod's supervisor
restarts the process).

:meth:`InProcess.run` is the generation loop: form, train until an :class:`Outcome`, close, spend the
budget of failed generations.
"""

from __future__ import annotations

import enum
import logging
import os
import time
from collections.abc import Generator, Iterator
from typing import TYPE_CHECKING, Any

from llm_elastic import heap
from llm_elastic.config import ElasticConfig
from llm_elastic.contract import IN_PROCESS, Contract
from llm_elastic.errors import (
    EXIT_EVICTED,
    EXIT_NO_GENERATION,
    EXIT_RECOVERY_EXHAUSTED,
    EXIT_STATE_LOST,
    Evicted,
    RecoveryExhausted,
    RunFinished,
    StateLost,
    contract_error,
)
from llm_elastic.leave import Leave
from llm_elastic.live import keys
from llm_elastic.position import World
from llm_elastic.recovery import ModeHost, RecoveryMode
from llm_elastic.step import Step
from llm_elastic.transfer import synchronise
from llm_elastic.wrap import WrapPolicy

if TYPE_CHECKING:
    from llm_elastic.live.group import LiveGroup
    from llm_elastic.live.layout import Generation
    from llm_elastic.live.membership import Membership
    from llm_elastic.live.waiting import Waiting

log = logging.getLogger("llm_elastic")


class Outcome(enum.Enum):
    """How a generation ended."""

    DONE = "done"
    """Every step is trained."""
    CHANGED = "changed"
    """The members agreed at a step boundary that the membership changed (a joiner, a leaver)."""
    PEER_LOST = "peer lost"
    """A peer vanished: the step in flight was discarded (a failed generation)."""


class InProcess(RecoveryMode):
    """Generations of the live membership, each with its own process group."""

    name = IN_PROCESS
    live = True

    def __init__(self, config: ElasticConfig) -> None:
        self.config = config
        self.host: ModeHost | None = None
        self.membership: Membership | None = None
        self.group: LiveGroup | None = None
        self.waiting: Waiting | None = None
        self.failed_generations = 0

    def check(self, wrap: WrapPolicy) -> None:
        if not wrap.elastic:
            contract_error(
                f"recovery inProcess re-wraps the model for every generation: use wrap=DDP() or HSDP(...), "
                f"not {type(wrap).__name__}"
            )

    def labels(self, contract: Contract) -> dict[str, str]:
        return {"member": contract.member}

    # -- the loop -------------------------------------------------------------------------------------------

    def run(self, s: ModeHost) -> Iterator[Step]:
        group, waiting = self._join(s)
        left = 0
        while (gen := self._next_generation(s, waiting, left)) is not None:
            outcome = yield from self._train(s, group, gen)
            self._close_generation(s, group)
            if outcome is Outcome.DONE:
                return
            self._spend(outcome)
            log.info("membership changed after step %d; re-forming", s.position.progress.step)
            left = gen.number

    def _join(self, s: ModeHost) -> tuple[LiveGroup, Waiting]:
        """Connect to etcd, wait for the start file, pass the node's checks, register as a member."""
        from llm_elastic.live.group import LiveGroup
        from llm_elastic.live.membership import Membership
        from llm_elastic.live.waiting import Waiting
        from llm_elastic.rendezvous.etcd_auth import credentials_from_env
        from llm_elastic.rendezvous.etcd_client import EtcdClient, parse_endpoints

        c, cfg = s.contract, self.config
        client = EtcdClient(parse_endpoints(c.etcd), credentials=credentials_from_env(os.environ))
        membership = Membership(
            client, c.prefix, c.member, cfg.lease_ttl, s.wrap_policy.shard_size, c.target_members
        )
        self.host, self.membership = s, membership
        self.group = LiveGroup(membership, cfg)
        self.waiting = Waiting(membership, cfg, s.reporter, s.stop)
        if cfg.start_when:
            self.waiting.for_start_file(cfg.start_when)
        s.health.preflight(lambda: not s.left)
        membership.register()
        heap.freeze()  # each generation's close then collects only what that generation made
        return self.group, self.waiting

    def _next_generation(self, s: ModeHost, waiting: Waiting, left: int) -> Generation | None:
        """The next generation this member is in (None: the run finished)."""
        assert self.membership is not None
        try:
            return self.membership.next_generation(
                left,
                s.contract.min_members,
                self.config.form_timeout,
                lambda: waiting.tick(s.position.progress.step),
            )
        except RunFinished:
            return None
        except Evicted as exc:
            log.warning("%s; exiting", exc)
            raise Leave(EXIT_EVICTED) from None
        except TimeoutError as exc:
            log.error("%s", exc)
            raise Leave(EXIT_NO_GENERATION) from None

    def _train(self, s: ModeHost, group: LiveGroup, gen: Generation) -> Generator[Step, None, Outcome]:
        """Form ``gen`` and train in it until an outcome. A ``Leave`` or a local error propagates with the
        generation still open: ``Elastic.steps()`` leaves first, then :meth:`close` drops the groups."""
        try:
            self._form(s, group, gen)
            while s.position.progress.step < self.config.total_steps:
                step = Step(s, s.position.progress.step)
                yield step
                if step.peer_lost:
                    return Outcome.PEER_LOST
                if s.after_step(step):
                    return Outcome.CHANGED
            s.persistence.final_save()
            if s.rank == 0:
                keys.finish(group.membership.client, s.contract.prefix)
            return Outcome.DONE
        except StateLost as exc:
            log.error("%s; exiting for the restart path", exc)
            raise Leave(EXIT_STATE_LOST) from None
        except RuntimeError as exc:
            if not group.judge(exc):
                raise
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            log.warning("generation %d failed at step %d: %s", gen.number, s.position.progress.step, first)
            return Outcome.PEER_LOST

    def _spend(self, outcome: Outcome) -> None:
        """A generation ended early: a failed one spends the budget of ``max_reforms`` in a row."""
        self.failed_generations = 0 if outcome is Outcome.CHANGED else self.failed_generations + 1
        if self.failed_generations > self.config.max_reforms:
            log.error("%d generations in a row failed without a step: handing over", self.failed_generations)
            failed = RecoveryExhausted(f"{self.failed_generations} generations failed in a row")
            raise Leave(EXIT_RECOVERY_EXHAUSTED, failed)

    # -- a generation ---------------------------------------------------------------------------------------

    def _form(self, s: ModeHost, group: LiveGroup, gen: Generation) -> None:
        """Form ``gen``'s process group, wrap the model and take the state."""
        assert self.waiting is not None
        formed_at = time.time()
        self.waiting.taken_in()
        s.move(s.position.joined(World(gen.rank_of(s.contract.member), gen.world_size, gen.number)))
        group.form(gen, s.backend, s.contract.prefix)
        job_step = group.membership.job_step()
        s.open_generation()
        group.watch(s.device)
        agreed, source = synchronise(
            s.state,
            s.position,
            None,
            job_step,
            lambda: s.move(s.position.receiving()),
            s.restore_collective,
            s.wrapped.replica_group,
            s.wrapped.shard_size,
        )
        s.move(agreed.resumed())
        if s.rank == 0:
            s.reporter.log_pending(s.position.progress, time.time())
            if gen.number > 1:
                keys.forget_generation(group.membership.client, s.contract.prefix, gen.number - 1)
        s.reporter.event(
            "formed",
            generation=gen.number,
            world_size=gen.world_size,
            rank=s.rank,
            step=s.position.progress.step,
            source=source,
            formed_at=formed_at,
            ready_at=time.time(),
            pid=os.getpid(),
        )

    @staticmethod
    def _close_generation(s: ModeHost, group: LiveGroup) -> None:
        """Drop the generation's groups (their connections close, so a peer blocked on us fails at once)."""
        group.close()
        s.close_generation()

    # -- at a commit, a boundary, a failure -----------------------------------------------------------------

    def membership_changed(self) -> bool:
        return self.group is not None and self.group.changed()

    def at_boundary(self, s: ModeHost, step: Step) -> bool:
        verdict = step.verdict
        assert verdict is not None
        if verdict.stopping >= s.world_size:
            # No member stays: the state must outlive this generation. A graceful leave of some members
            # (a drained node, a scale down) saves nothing: the survivors hold the whole state (every
            # member a full replica, or under HSDP every host one), and whoever is stopped last (a
            # suspend's signals arrive at different times) saves it here.
            s.persistence.save()
            s.persistence.wait()  # complete before Leave closes the groups and the process ends
            log.info("every member stopped at step %d (saved)", s.position.progress.step)
            raise Leave(0)
        if step.evicted is not None:
            log.warning("%s; exiting", step.evicted)
            raise Leave(EXIT_EVICTED)
        s.health.leave_if_unhealthy()
        if s.stop.requested and verdict.stop_announced:
            # Only a stop that rode this step's commit: the others know it and saved with us. A signal
            # that came after the commit is announced in the next one (a stop of every member must
            # find the last step saved, whatever order the signals arrive in).
            log.info("stopped by %s at step %d; left the job", s.stop.signal_name, s.position.progress.step)
            raise Leave(0)
        return verdict.changed

    def peer_lost(self, exc: BaseException) -> bool:
        return self.group is not None and self.group.judge(exc)

    def completed(self, s: ModeHost) -> None:
        self.failed_generations = 0
        if self.membership is not None and s.rank == 0:
            self.membership.set_job_step(s.position.progress.step)

    def record(self, s: ModeHost) -> tuple[int, dict[str, Any]]:
        gen = self.group.gen if self.group is not None else None
        return s.position.progress.restarts, {
            "members": list(gen.members) if gen else None,
            "pids": self.group.pids if self.group is not None else None,
        }

    def leave(self) -> None:
        if self.membership is not None:
            try:
                self.membership.leave()
            except Exception:  # leaving is best effort: the lease expires anyway
                log.debug("leaving the membership failed", exc_info=True)

    def close(self) -> None:
        """After ``Elastic.steps()`` left: drop a generation a ``Leave`` or an error left open, then etcd."""
        if self.group is not None and self.group.gen is not None and self.host is not None:
            self._close_generation(self.host, self.group)
        if self.membership is not None:
            self.membership.client.close()
