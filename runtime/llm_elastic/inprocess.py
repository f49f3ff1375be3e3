"""Recovery in process: the process is a member of the job's live membership in etcd. Each generation (an
agreed set of members) gets a fresh process group; on a lost or evicted peer the step in flight is
discarded, the survivors agree on the next generation, re-wrap the same model, a joiner gets the state from
a peer, and the loop goes on with the same objects. A local error is not a membership change: the process
leaves at once and the exception propagates (the pod's supervisor restarts the process).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from llm_elastic.abort import Watchdog, every_group
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
from llm_elastic.modes import RecoveryMode, World
from llm_elastic.peer_loss import judge
from llm_elastic.step import Step
from llm_elastic.transfer import synchronise
from llm_elastic.wrap import WrapPolicy

if TYPE_CHECKING:
    from llm_elastic.live.layout import Generation as LiveGeneration
    from llm_elastic.live.membership import Membership
    from llm_elastic.session import Elastic

log = logging.getLogger("llm_elastic")


class InProcess(RecoveryMode):
    """Generations of the live membership, each with its own process group."""

    name = IN_PROCESS
    live = True

    def __init__(self, config: ElasticConfig) -> None:
        self.config = config
        self.membership: Membership | None = None
        self.gen: LiveGeneration | None = None
        self.pids: list[int] | None = None
        self.standby = False
        self.watchdog: Watchdog | None = None
        self.end_generation = False
        self.failed_generations = 0
        self.outside_warned = False

    def check(self, wrap: WrapPolicy) -> None:
        if not wrap.elastic:
            contract_error(
                f"recovery inProcess re-wraps the model for every generation: use wrap=DDP() or HSDP(...), "
                f"not {type(wrap).__name__}"
            )

    def labels(self, contract: Contract) -> dict[str, str]:
        return {"member": contract.member}

    # -- the loop -------------------------------------------------------------------------------------------

    def run(self, s: Elastic) -> Iterator[Step]:
        from llm_elastic.live.membership import Membership
        from llm_elastic.rendezvous.etcd_client import EtcdClient, parse_endpoints

        c, cfg = s.contract, self.config
        client = EtcdClient(parse_endpoints(c.etcd))
        membership = Membership(
            client, c.prefix, c.member, cfg.lease_ttl, s.wrap_policy.shard_size, c.target_members
        )
        self.membership = membership
        if cfg.start_when:
            s.reporter.event("waiting", time=time.time(), pid=os.getpid())
            while not Path(cfg.start_when).exists():
                self._check_stop(s)
                time.sleep(0.02)
            s.reporter.event("released", time=time.time(), pid=os.getpid())
        s.health.preflight(lambda: not s.left)
        membership.register()
        left = 0
        while True:
            gen = self._next_generation(s, left)
            if gen is None:
                return
            ok = False
            try:
                ok = self._form(s, gen)
                while ok and s.progress.step < cfg.total_steps and not self.end_generation:
                    step = Step(s, s.progress.step)
                    yield step
                    if step.peer_lost:
                        ok = False
                        break
                    s.after_step(step)
                if ok and not self.end_generation:
                    s.persistence.final_save()
                    if s.rank == 0:
                        membership.finish()
                    return
            except Leave:
                s.leave_now()  # before the generation's groups are dropped: the others re-form at once
                raise
            except StateLost as exc:
                log.error("%s; exiting for the restart path", exc)
                raise Leave(EXIT_STATE_LOST) from None
            except RuntimeError as exc:
                if not self.peer_lost(exc):
                    s.leave_now()
                    raise
                first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                log.warning("generation %d failed at step %d: %s", gen.number, s.progress.step, first)
                ok = False
            finally:
                self._close_generation(s)
            self.failed_generations = 0 if ok else self.failed_generations + 1
            if self.failed_generations > cfg.max_reforms:
                log.error(
                    "%d generations in a row failed without a step: handing over", self.failed_generations
                )
                failed = RecoveryExhausted(f"{self.failed_generations} generations failed in a row")
                raise Leave(EXIT_RECOVERY_EXHAUSTED, failed)
            log.info("membership changed after step %d; re-forming", s.progress.step)
            left = gen.number

    def _next_generation(self, s: Elastic, left: int) -> LiveGeneration | None:
        assert self.membership is not None
        self.end_generation = False
        try:
            return self.membership.next_generation(
                left, s.contract.min_members, self.config.form_timeout, lambda: self._while_waiting(s)
            )
        except RunFinished:
            return None
        except Evicted as exc:
            log.warning("%s; exiting", exc)
            raise Leave(EXIT_EVICTED) from None
        except TimeoutError as exc:
            log.error("%s", exc)
            raise Leave(EXIT_NO_GENERATION) from None

    def _while_waiting(self, s: Elastic) -> None:
        """Called while a generation forms: stop signals, the standby state of a spare, and a member left
        outside a generation that should have taken it in."""
        self._check_stop(s)
        membership = self.membership
        if membership is None:
            return
        if membership.standby != self.standby:
            self.standby = membership.standby
            s.reporter.update(standby=1.0 if self.standby else 0.0)
            if self.standby:
                s.reporter.event("standby", time=time.time(), pid=os.getpid(), step=s.progress.step)
        self._report_outside(s, membership)

    def _report_outside(self, s: Elastic, membership: Membership) -> None:
        """The guard for what no test foresaw: a gauge of the wait, and one warning past the bound."""
        since = membership.outside_since
        waited = 0.0 if since is None else time.monotonic() - since
        s.reporter.update(outside_seconds=waited)
        if since is None:
            self.outside_warned = False
        elif waited >= self.config.outside_warn_seconds and not self.outside_warned:
            self.outside_warned = True
            log.warning(
                "member %s has waited %.0fs outside a running generation that is not full "
                "(it should be taken in at the next step boundary)",
                membership.member,
                waited,
            )
            s.reporter.event("outside", time=time.time(), pid=os.getpid(), waited=round(waited, 1))

    @staticmethod
    def _check_stop(s: Elastic) -> None:
        """A stop signal while no step runs (waiting, forming): leave at once."""
        if s.stop.requested:
            log.info("stopped by %s while not training; left the job", s.stop.signal_name)
            raise Leave(0)

    # -- a generation ---------------------------------------------------------------------------------------

    def _form(self, s: Elastic, gen: LiveGeneration) -> bool:
        """Form ``gen``'s process group, wrap the model and take the state."""
        from llm_elastic.live import layout
        from llm_elastic.rendezvous.etcd_store import EtcdV3Store

        membership = self.membership
        assert membership is not None
        formed_at = time.time()
        self.gen = gen
        membership.current = gen
        if self.standby:
            self.standby = False
            s.reporter.update(standby=0.0)
        s.reporter.update(outside_seconds=0.0)
        self.outside_warned = False
        s.world = World(gen.rank_of(s.contract.member), gen.world_size, gen.number)
        timeout = timedelta(seconds=self.config.live_collective_timeout)
        prefix = layout.store_prefix(s.contract.prefix, gen.number)
        store = EtcdV3Store(membership.client, prefix, membership.lease, timeout=timeout)
        dist.init_process_group(
            s.backend, store=store, rank=s.rank, world_size=gen.world_size, timeout=timeout
        )
        pid = torch.tensor([os.getpid()], dtype=torch.int64)
        gathered = [torch.zeros(1, dtype=torch.int64) for _ in range(gen.world_size)]
        dist.all_gather(gathered, pid)
        self.pids = [int(t.item()) for t in gathered]
        job_step = membership.job_step()
        s.open_generation()
        if s.device.type == "cuda":  # NCCL: a lost peer raises nothing, so abort from the watch
            self.watchdog = Watchdog(
                lambda: membership.member_gone(gen), membership.changes, every_group
            ).start()

        def receiving() -> None:
            s.progress.fresh = True

        s.progress, source = synchronise(
            s.state,
            s.progress,
            None,
            job_step,
            receiving,
            s.restore_collective,
            s.wrapped.replica_group,
            s.wrapped.shard_size,
        )
        s.persistence.restored = replace(s.persistence.restored, resumed_from=s.progress.step)
        if s.rank == 0:
            s.reporter.log_pending(s.progress, time.time())
            if gen.number > 1:
                membership.forget_generation(gen.number - 1)
        s.reporter.event(
            "formed",
            generation=gen.number,
            world_size=gen.world_size,
            rank=s.rank,
            step=s.progress.step,
            source=source,
            formed_at=formed_at,
            ready_at=time.time(),
            pid=os.getpid(),
        )
        return True

    def _close_generation(self, s: Elastic) -> None:
        """Drop the generation's groups (their connections close, so a peer blocked on us fails at once)."""
        if self.watchdog is not None:
            self.watchdog.stop()
            self.watchdog = None
        self.gen = None
        s.close_generation()

    # -- at a commit, a boundary, a failure -----------------------------------------------------------------

    def membership_changed(self) -> bool:
        if self.membership is None or self.gen is None:
            return False
        return self.membership.changed_since(self.gen)

    def at_boundary(self, s: Elastic, step: Step) -> bool:
        verdict = step.verdict
        assert verdict is not None
        if verdict.stopping >= s.world_size:
            # No member stays: the state must outlive this generation. A graceful leave of some members
            # (a drained node, a scale down) saves nothing: the survivors hold the whole state (every
            # member a full replica, or under HSDP every host one), and whoever is stopped last (a
            # suspend's signals arrive at different times) saves it here.
            s.persistence.save()
            log.info("every member stopped at step %d (saved)", s.progress.step)
            raise Leave(0)
        if step.evicted is not None:
            log.warning("%s; exiting", step.evicted)
            raise Leave(EXIT_EVICTED)
        s.health.leave_if_unhealthy()
        if s.stop.requested and verdict.stop_announced:
            # Only a stop that rode this step's commit: the others know it and saved with us. A signal
            # that came after the commit is announced in the next one (a stop of every member must
            # find the last step saved, whatever order the signals arrive in).
            log.info("stopped by %s at step %d; left the job", s.stop.signal_name, s.progress.step)
            raise Leave(0)
        if verdict.changed:
            self.end_generation = True
        return verdict.changed

    def peer_lost(self, exc: BaseException) -> bool:
        if self.membership is None or self.gen is None:
            return False
        return judge(exc, self.membership, self.gen, self.config)

    def completed(self, s: Elastic) -> None:
        self.failed_generations = 0
        if self.membership is not None and s.rank == 0:
            self.membership.set_job_step(s.progress.step)

    def record(self, s: Elastic) -> tuple[int, dict[str, Any]]:
        return s.progress.restarts, {
            "members": list(self.gen.members) if self.gen else None,
            "pids": self.pids,
        }

    def leave(self) -> None:
        if self.membership is not None:
            try:
                self.membership.leave()
            except Exception:  # leaving is best effort: the lease expires anyway
                log.debug("leaving the membership failed", exc_info=True)

    def close(self) -> None:
        if self.membership is not None:
            self.membership.client.close()
