"""The runtime's settings around a program's loop (no torch: a program's CLI can check them first)."""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llm_elastic import contract as contract_mod
from llm_elastic.contract import Contract
from llm_elastic.loss_rules import ROLLBACK, LossRule
from llm_elastic.metrics import METRICS_FILE

__all__ = ["SNAPSHOT_ROOT", "ElasticConfig"]

SNAPSHOT_ROOT = "/dev/shm/llm-elastic"


@dataclass
class ElasticConfig:
    """What the runtime does around the program's loop; every field has a default but ``total_steps``."""

    total_steps: int
    """Optimizer steps of the whole run (a resumed run continues up to it)."""
    checkpoint_dir: str = ""
    """Folder of ``step-N`` checkpoints and the step log (default ``$LLMJOB_CHECKPOINT_DIR``; empty: none)."""
    checkpoint_every: int = 0
    """Save a checkpoint every N steps (0: only on a stop and at the end)."""
    keep_checkpoints: int = 3
    """Complete checkpoints kept (older ones are deleted)."""
    async_checkpoint: bool = True
    """Stage the state into host memory and write it in the background (training waits for the copy)."""
    snapshot_every: int = 0
    """Snapshot the state into host shared memory (and a buddy node's) every N steps (0: off)."""
    snapshot_dir: str = ""
    """Folder in shared memory (default ``$LLMJOB_SNAPSHOT_DIR``, else under /dev/shm/llm-elastic)."""
    metrics_port: int = contract_mod.METRICS_PORT
    """Prometheus port base (this process listens on port + LOCAL_RANK); 0: no endpoint."""
    step_log: str = ""
    """Rank 0's JSON-lines step log (default ``<checkpoint_dir>/metrics.jsonl``; empty without either)."""
    collective_timeout: float = 300.0
    """Seconds a collective may block (restart mode; in process a lost peer is seen through etcd)."""
    live_collective_timeout: float = 30.0
    """In process: seconds a collective may block before the generation is given up."""
    form_timeout: float = 120.0
    """In process: seconds to wait for a generation to form."""
    lease_ttl: int = 3
    """In process: seconds a silent member stays a member."""
    store_outage_seconds: float = 60.0
    """In process: how long a failed collective waits for an unreachable etcd before it is judged local."""
    outside_warn_seconds: float = 60.0
    """In process: a member that waits this long outside a healthy generation that is not full (one that
    should take it in at its next step boundary) says so in its log, and every such wait is in the gauge
    ``llm_trainer_outside_seconds``."""
    max_reforms: int = 8
    """In process: generations in a row that may fail before a step completes; then the next layer."""
    peer_stop_grace: float = 5.0
    """Restart mode: after a stop another rank received, seconds to wait for our own signal."""
    start_when: str = ""
    """In process, warm spare: join only once this file exists (imports and model done before)."""
    log_every: int = 10
    """Log a progress line every N steps (rank 0)."""
    loss_rules: tuple[LossRule, ...] = ()
    """What the members do when a step's loss is not finite (default: the job's ``$LLMJOB_LOSS_RULES``;
    none: the step is applied as it is). See :mod:`llm_elastic.loss_rules`."""
    meta: dict[str, Any] = field(default_factory=dict)
    """JSON-serialisable facts saved in each checkpoint's marker (for example the model's name)."""

    def resolved(self, contract: Contract) -> ElasticConfig:
        """Defaults that come from the environment."""
        out = dataclasses.replace(self, meta=dict(self.meta))
        out.checkpoint_dir = self.checkpoint_dir or contract.checkpoint_dir
        out.snapshot_dir = self.snapshot_dir or contract.snapshot_dir
        out.loss_rules = tuple(self.loss_rules or contract.loss_rules)
        if not out.snapshot_dir and out.checkpoint_dir:
            key = hashlib.sha256(str(Path(out.checkpoint_dir).resolve()).encode()).hexdigest()[:16]
            out.snapshot_dir = f"{SNAPSHOT_ROOT}/{key}"
        if not out.step_log and out.checkpoint_dir:
            out.step_log = str(Path(out.checkpoint_dir) / METRICS_FILE)
        return out

    def problems(self) -> list[tuple[str, str]]:
        """``(field, message)`` for every invalid setting."""
        out: list[tuple[str, str]] = []
        if self.total_steps < 1:
            out.append(("total_steps", "must be at least 1"))
        for name in ("checkpoint_every", "snapshot_every", "metrics_port", "max_reforms"):
            if getattr(self, name) < 0:
                out.append((name, "must not be negative"))
        if self.keep_checkpoints < 1:
            out.append(("keep_checkpoints", "must be at least 1"))
        if self.checkpoint_every and not self.checkpoint_dir:
            out.append(("checkpoint_every", f"needs a checkpoint_dir (or ${contract_mod.CHECKPOINT_ENV})"))
        if self.metrics_port > 65535:
            out.append(("metrics_port", "must be a TCP port, or 0 for none"))
        if self.lease_ttl < 2:
            out.append(("lease_ttl", "must be at least 2 seconds"))
        for name in ("collective_timeout", "live_collective_timeout", "form_timeout", "outside_warn_seconds"):
            if getattr(self, name) <= 0:
                out.append((name, "must be above 0"))
        for rule in self.loss_rules:
            if rule.action == ROLLBACK and not self.snapshot_every:
                out.append(
                    (
                        "loss_rules",
                        f"rule {rule.name!r} rolls back to the newest in-memory snapshot: "
                        f"set snapshot_every (the trainer's --snapshot-every)",
                    )
                )
        return out
