"""What a member reports: the Prometheus gauges (:class:`~llm_elastic.metrics.Exporter`), rank 0's step log
(:class:`~llm_elastic.metrics.StepLog`) and the JSON event lines on stdout (``waiting``, ``released``,
``standby``, ``formed``) that tests and benchmarks time recovery by, and ``rule-fired`` (a loss rule, on
every member; the pod's supervisor and the operator read it). One :class:`Reporter` per process.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any

from llm_elastic.config import ElasticConfig
from llm_elastic.data import ElasticSampler
from llm_elastic.logs import set_context
from llm_elastic.loss_rules import Firing
from llm_elastic.metrics import Exporter, StepLog, last_record, process_start_time
from llm_elastic.position import Progress, RestoreFacts
from llm_elastic.step import Step

log = logging.getLogger("llm_elastic")


def sample_fields(sampler: ElasticSampler | None, index: int) -> dict[str, Any]:
    """The step log's record of which samples step ``index`` (0-based) trained (empty without a sampler)."""
    if sampler is None:
        return {}
    start, stop = sampler.step_range(index)
    return {
        "global_batch": sampler.global_batch,
        "samples_seen": stop,
        "sample_start": start,
        "sample_end": stop,
        "samples_crc32": sampler.crc32(index),
    }


class Reporter:
    """The gauges, the step log and the events of one process."""

    def __init__(
        self,
        config: ElasticConfig,
        labels: dict[str, str],
        port: int,
        process_restarts: int,
        sampler: ElasticSampler | None,
    ) -> None:
        self.config = config
        self.sampler = sampler
        self.exporter = Exporter(port, labels)
        self.exporter.update(total_steps=config.total_steps, process_restarts=process_restarts)
        self.step_log: StepLog | None = None
        # One process per pod logs the progress line too (local rank 0): a log rule of the job
        # (spec.monitoring.rules, e.g. 'step (\d+) loss') sees it in every worker's log, not only rank 0's.
        self.pod_leader = os.environ.get("LOCAL_RANK", "0") == "0"
        self.process_started = process_start_time()
        self.steps_done = 0
        self.step_seconds = 0.0

    def open(self, rank: int) -> None:
        """A generation (or the process's one group) starts: rank 0 writes the step log."""
        cfg = self.config
        self.step_log = StepLog(Path(cfg.step_log)) if cfg.step_log and rank == 0 else None

    def event(self, name: str, **fields: Any) -> None:
        """One JSON event line on stdout (a generation's number and step also go to the log context)."""
        set_context(**{k: fields[k] for k in ("generation", "step") if k in fields})
        print(json.dumps({"event": name, **fields}), flush=True)

    def update(self, **values: float) -> None:
        """Set gauges by name."""
        self.exporter.update(**values)

    def rule_fired(self, firing: Firing) -> None:
        """A loss rule fired: its counter and one ``rule-fired`` line (every member prints its own)."""
        self.exporter.rule_fired(firing.rule, firing.action)
        self.event(
            "rule-fired",
            rule=firing.rule,
            action=firing.action,
            step=firing.step,
            streak=firing.streak,
            detail=firing.detail,
            time=time.time(),
        )

    def runs_before(self, rank: int) -> int:
        """Restart mode: runs of this job before this one, from the step log's last record (rank 0)."""
        if rank != 0 or not self.config.step_log:
            return 0
        previous = last_record(Path(self.config.step_log))
        return int(previous.get("restart", 0)) + 1 if previous else 0

    def step_metrics(
        self, step: Step, progress: Progress, elapsed: float, now: float, world_size: int
    ) -> None:
        """The gauges after a completed step."""
        self.steps_done += 1
        self.step_seconds += elapsed
        set_context(step=progress.step)
        tokens = step.fields.get("tokens")
        if step.dropped:
            self.exporter.step_skipped()
        self.exporter.update(
            step=progress.step,
            loss=progress.last_loss,
            last_step_timestamp_seconds=now,
            world_size=world_size,
            step_time_seconds_sum=self.step_seconds,
            step_time_seconds_count=self.steps_done,
            **({"tokens_per_second": float(tokens) / max(elapsed, 1e-9)} if tokens else {}),
            **({"samples_seen": progress.step * self.sampler.global_batch} if self.sampler else {}),
        )

    def step_record(
        self,
        step: Step,
        progress: Progress,
        elapsed: float,
        now: float,
        world: tuple[int, int],
        restart: int,
        restored: RestoreFacts,
        mode_fields: dict[str, Any],
    ) -> None:
        """Rank 0's step log line, and every ``log_every`` steps a progress log line (rank 0 and local rank 0
        of every pod)."""
        world_size, generation = world
        every = self.config.log_every
        due = every and (progress.step % every == 0 or progress.step == (restored.resumed_from or 0) + 1)
        if due and (self.step_log is not None or self.pod_leader):
            log.info("step %d loss %.4f world %d %.3fs", progress.step, step.loss, world_size, elapsed)
        if self.step_log is None:
            return
        record: dict[str, Any] = {
            "time": round(now, 3),
            "step": progress.step,
            "loss": round(step.loss, 6) if math.isfinite(step.loss) else None,
            "world_size": world_size,
            "step_time": round(elapsed, 4),
            "restart": restart,
            "generation": generation,
            "resumed_from": restored.resumed_from,
            "restore_source": restored.source,
            "process_started": self.process_started,
            **mode_fields,
            **sample_fields(self.sampler, step.index),
            **step.fields,
        }
        record.pop("tokens", None)
        self.step_log.append(record)

    def log_pending(self, progress: Progress, now: float) -> None:
        """Log the step a survivor completed whose rank 0 died before writing it (at most one)."""
        if self.step_log is None:
            return
        previous = last_record(Path(self.config.step_log))
        logged = int(previous["step"]) if previous else 0
        if logged >= progress.step:
            return
        if logged != progress.step - 1:
            log.warning("the step log ends at step %d but training completed %d", logged, progress.step)
        record: dict[str, Any] = {
            "time": round(now, 3),
            "step": progress.step,
            "loss": round(progress.last_loss, 6) if math.isfinite(progress.last_loss) else None,
            "world_size": None,
            "step_time": 0.0,
            "restart": progress.restarts,
            "generation": None,
            "members": None,
            "pids": None,
            "resumed_from": None,
            "logged_late": True,
            **sample_fields(self.sampler, progress.step - 1),
        }
        self.step_log.append(record)
