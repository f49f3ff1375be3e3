"""Recovery in process: the process is a member of the job's live membership in etcd. Each generation (an
agreed set of members) gets a fresh process group; on a lost or evicted peer the step in flight is
discarded, the survivors agree on the next generation, re-wrap the same model, a joiner gets the state from
a peer, and the loop goes on with the same objects. A local error is not a membership change: the error
propagates, and ``Elastic.steps()`` leaves the job before the generation is closed (the pod's supervisor
restarts the process).

``Elastic`` (session.py) runs the generation loop and asks :class:`InProcess` at each turn
(:mod:`llm_elastic.recovery`): the next generation, its group, the agreed state, a failure's judgement, a
boundary's decision, a generation's end (the budget of failed generations). Nothing here calls the loop.
"""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING, Any

import torch

from llm_elastic import heap
from llm_elastic.commit import Verdict
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
from llm_elastic.position import Position, World
from llm_elastic.recovery import Outcome, Parts, RecoveryMode, Restore
from llm_elastic.state import TrainState
from llm_elastic.transfer import Agreement, synchronise
from llm_elastic.wrap import Wrapped, WrapPolicy

if TYPE_CHECKING:
    from llm_elastic.live.group import LiveGroup
    from llm_elastic.live.membership import Membership
    from llm_elastic.live.waiting import Waiting

log = logging.getLogger("llm_elastic")


class InProcess(RecoveryMode):
    """Generations of the live membership, each with its own process group."""

    name = IN_PROCESS
    live = True

    def __init__(self, config: ElasticConfig) -> None:
        self.config = config
        self.parts: Parts | None = None
        self.membership: Membership | None = None
        self.group: LiveGroup | None = None
        self.waiting: Waiting | None = None
        self.left_generation = 0
        """The number of the generation this member was in last (0: none yet)."""
        self.failed_generations = 0

    def check(self, wrap: WrapPolicy) -> None:
        if not wrap.elastic:
            contract_error(
                f"recovery inProcess re-wraps the model for every generation: use wrap=DDP() or HSDP(...), "
                f"not {type(wrap).__name__}"
            )

    def labels(self, contract: Contract) -> dict[str, str]:
        return {"member": contract.member}

    # -- a generation, as the loop asks ----------------------------------------------------------------------

    def start(self, parts: Parts, backend: str) -> None:
        """Connect to etcd, wait for the start file, pass the node's checks, register as a member."""
        from llm_elastic.live.group import LiveGroup
        from llm_elastic.live.membership import Membership
        from llm_elastic.live.waiting import Waiting
        from llm_elastic.rendezvous.etcd_auth import credentials_from_env
        from llm_elastic.rendezvous.etcd_client import EtcdClient, parse_endpoints

        c, cfg = parts.contract, self.config
        client = EtcdClient(parse_endpoints(c.etcd), credentials=credentials_from_env(os.environ))
        membership = Membership(
            client, c.prefix, c.member, cfg.lease_ttl, parts.wrap.shard_size, c.target_members
        )
        self.parts, self.membership = parts, membership
        self.group = LiveGroup(membership, cfg)
        self.waiting = Waiting(membership, cfg, parts.reporter, parts.stop)
        if cfg.start_when:
            self.waiting.for_start_file(cfg.start_when)
        parts.health.preflight()
        membership.register()
        heap.freeze()  # each generation's close then collects only what that generation made

    def next_world(self, step: int) -> World | None:
        """This member's place in the next generation it is in (None: the run finished)."""
        assert self.membership is not None and self.waiting is not None and self.parts is not None
        waiting = self.waiting
        try:
            gen = self.membership.next_generation(
                self.left_generation,
                self.parts.contract.min_members,
                self.config.form_timeout,
                lambda: waiting.tick(step),
            )
        except RunFinished:
            return None
        except Evicted as exc:
            log.warning("%s; exiting", exc)
            raise Leave(EXIT_EVICTED) from None
        except TimeoutError as exc:
            log.error("%s", exc)
            raise Leave(EXIT_NO_GENERATION) from None
        assert self.group is not None
        self.group.agreed(gen)
        return World(gen.rank_of(self.parts.contract.member), gen.world_size, gen.number)

    def form(self, backend: str) -> int:
        """Join the generation's process group (a fresh store prefix, the pid exchange)."""
        assert self.group is not None and self.waiting is not None and self.parts is not None
        self.waiting.taken_in()
        self.group.form(backend, self.parts.contract.prefix)
        return self.group.membership.job_step()

    def watch(self, device: torch.device) -> None:
        assert self.group is not None
        self.group.watch(device)

    def agree(
        self, state: TrainState, position: Position, restore: Restore, wrapped: Wrapped, job_step: int
    ) -> Agreement:
        """The survivors agree on the most advanced state; a joiner gets it from a peer."""
        try:
            agreement = synchronise(
                state, position, None, job_step, restore, wrapped.replica_group, wrapped.shard_size
            )
        except StateLost as exc:
            log.error("%s; exiting for the restart path", exc)
            raise Leave(EXIT_STATE_LOST) from None
        return Agreement(agreement.position.resumed(), agreement.source, agreement.loaded)

    def formed(self, position: Position, agreement: Agreement, formed_at: float) -> None:
        assert self.parts is not None and self.group is not None and self.group.gen is not None
        reporter, prefix, gen = self.parts.reporter, self.parts.contract.prefix, self.group.gen
        rank = position.world.rank
        if rank == 0:
            reporter.log_pending(position.progress, time.time())
            if gen.number > 1:
                keys.forget_generation(self.group.membership.client, prefix, gen.number - 1)
        reporter.event(
            "formed",
            generation=gen.number,
            world_size=gen.world_size,
            rank=rank,
            step=position.progress.step,
            source=agreement.source,
            formed_at=formed_at,
            ready_at=time.time(),
            pid=os.getpid(),
        )

    def finished(self, rank: int) -> None:
        if rank == 0 and self.membership is not None and self.parts is not None:
            keys.finish(self.membership.client, self.parts.contract.prefix)

    def close_generation(self) -> None:
        """Stop the generation's watchdog; the next generation is asked for as one that left this one."""
        if self.group is not None:
            if self.group.gen is not None:
                self.left_generation = self.group.gen.number
            self.group.close()

    def ended(self, outcome: Outcome, step: int) -> None:
        """A failed generation spends the budget of ``max_reforms`` in a row; a changed one resets it."""
        self.failed_generations = 0 if outcome is Outcome.CHANGED else self.failed_generations + 1
        if self.failed_generations > self.config.max_reforms:
            log.error("%d generations in a row failed without a step: handing over", self.failed_generations)
            failed = RecoveryExhausted(f"{self.failed_generations} generations failed in a row")
            raise Leave(EXIT_RECOVERY_EXHAUSTED, failed)
        log.info("membership changed after step %d; re-forming", step)

    # -- at a commit, a boundary, a failure -----------------------------------------------------------------

    def membership_changed(self) -> bool:
        return self.group is not None and self.group.changed()

    def at_boundary(self, verdict: Verdict, evicted: Evicted | None, world_size: int, step: int) -> bool:
        assert self.parts is not None
        persistence, stop = self.parts.persistence, self.parts.stop
        if verdict.stopping >= world_size:
            # No member stays: the state must outlive this generation. A graceful leave of some members
            # (a drained node, a scale down) saves nothing: the survivors hold the whole state (every
            # member a full replica, or under HSDP every host one), and whoever is stopped last (a
            # suspend's signals arrive at different times) saves it here.
            persistence.save()
            persistence.wait()  # complete before Leave closes the groups and the process ends
            log.info("every member stopped at step %d (saved)", step)
            raise Leave(0)
        if evicted is not None:
            log.warning("%s; exiting", evicted)
            raise Leave(EXIT_EVICTED)
        self.parts.health.leave_if_unhealthy()
        if stop.requested and verdict.stop_announced:
            # Only a stop that rode this step's commit: the others know it and saved with us. A signal
            # that came after the commit is announced in the next one (a stop of every member must
            # find the last step saved, whatever order the signals arrive in).
            log.info("stopped by %s at step %d; left the job", stop.signal_name, step)
            raise Leave(0)
        return verdict.changed

    def peer_lost(self, exc: BaseException) -> bool:
        return self.group is not None and self.group.judge(exc)

    def completed(self, rank: int, step: int) -> None:
        self.failed_generations = 0
        if self.membership is not None and rank == 0:
            self.membership.set_job_step(step)

    def record(self, position: Position) -> tuple[int, dict[str, Any]]:
        gen = self.group.gen if self.group is not None else None
        return position.progress.restarts, {
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
        """After the loop left (and closed a generation still open): let go of etcd."""
        if self.membership is not None:
            self.membership.client.close()
