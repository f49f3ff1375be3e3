"""Node health as a worker sees it: pre-flight checks before it becomes a member, the same checks again
periodically, and straggler detection from the step's commit (``spec.healthCheck``, env
``$LLMJOB_HEALTH_CHECK``).

A worker that fails a check, or is found a straggler, leaves the job and exits with :data:`EXIT_UNHEALTHY`
(78) after writing one line with the reason to its termination message file
(``$LLMJOB_TERMINATION_LOG``, default ``/dev/termination-log``): the operator records the node, emits an
Event and avoids the node for the job's new pods. The checks:

* the checkpoint folder is writable, and a 4 MiB write + fsync takes at most ``checkpointWriteMaxSeconds``;
* the shared-memory folder holds ``minSharedMemory`` bytes (or what the snapshots need);
* with a GPU (and ``gpu``): the devices this node's processes need exist and a bf16 matmul gives finite
  results at a sane rate;
* the user's ``command`` (argv, never a shell string) exits 0 within a minute.

Stragglers: every member adds its local compute time of the step (from the step's start to its first
gradient bucket, i.e. before it waits for anyone) to the commit; a member whose time stays above
``stragglerFactor`` x the median of the others for ``stragglerWindowSteps`` steps in a row is a straggler.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from llm_elastic.contract import EXIT_NODE_UNHEALTHY, HEALTH_ENV, TERMINATION_LOG_ENV
from llm_elastic.errors import contract_error

EXIT_UNHEALTHY = EXIT_NODE_UNHEALTHY
DEFAULT_TERMINATION_LOG = "/dev/termination-log"
PROBE_BYTES = 4 << 20
COMMAND_TIMEOUT = 60.0
MIN_EXCESS_SECONDS = 0.01
"""A member is never a straggler by less than this per step (timer noise on millisecond steps)."""


@dataclass(frozen=True)
class HealthPolicy:
    """``spec.healthCheck`` as the worker reads it (the operator fills the defaults)."""

    enabled: bool = True
    checkpointWriteMaxSeconds: float = 2.0  # the API's field names
    minSharedMemory: int = 0
    intervalSeconds: float = 300.0
    stragglerFactor: float = 1.5
    stragglerWindowSteps: int = 20
    command: tuple[str, ...] = ()
    gpu: bool = True


def parse_quantity(value: Any) -> int:
    """Bytes of a Kubernetes quantity (``64Gi``, ``512M``, ``1000``)."""
    if isinstance(value, int | float):
        return int(value)
    text = str(value).strip()
    if not text:
        return 0
    units = {
        "Ki": 1 << 10,
        "Mi": 1 << 20,
        "Gi": 1 << 30,
        "Ti": 1 << 40,
        "k": 10**3,
        "M": 10**6,
        "G": 10**9,
        "T": 10**12,
    }
    for suffix, factor in units.items():
        if text.endswith(suffix):
            return int(float(text[: -len(suffix)]) * factor)
    return int(float(text))


def read_policy(env: Mapping[str, str] | None = None) -> HealthPolicy:
    """The policy from ``$LLMJOB_HEALTH_CHECK`` (defaults without it); a bad value exits 2 naming it."""
    raw = (os.environ if env is None else env).get(HEALTH_ENV, "")
    if not raw:  # not run by the operator: nobody would replace a straggler, so do not look for one
        return HealthPolicy(stragglerWindowSteps=0)
    try:
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        known = set(HealthPolicy.__dataclass_fields__)
        values: dict[str, Any] = {k: v for k, v in data.items() if k in known}
        if "minSharedMemory" in values:
            values["minSharedMemory"] = parse_quantity(values["minSharedMemory"])
        if "command" in values:
            if not isinstance(values["command"], list) or not all(
                isinstance(a, str) for a in values["command"]
            ):
                raise ValueError("command must be a list of strings (argv)")
            values["command"] = tuple(values["command"])
        return HealthPolicy(**values)
    except (ValueError, TypeError) as exc:
        contract_error(f"${HEALTH_ENV}: {exc}")


@dataclass(frozen=True)
class Finding:
    """A failed check: which one and why (one line)."""

    check: str
    reason: str
    phase: str = "preflight"
    """``preflight`` (before the worker became a member: no restart is counted) or ``periodic`` (while it
    trained, a straggler too: the operator counts a restart)."""

    def line(self) -> str:
        """The termination message: ``<phase> <check>: <reason>`` (docs/CONTRACTS.md)."""
        return f"{self.phase} {self.check}: {self.reason}"


def check_checkpoint_dir(folder: Path, max_seconds: float) -> Finding | None:
    """A 4 MiB write + fsync in ``folder`` succeeds within ``max_seconds``.

    The probe file's name is made unique by the file system (``mkstemp``): every worker of a job checks the
    same shared folder at once, and a PID alone is not unique across pods (each container has its own PID
    namespace: two workers' trainers often have the same PID).
    """
    started = time.monotonic()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".llm-elastic-health-", dir=folder)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(os.urandom(PROBE_BYTES))
                handle.flush()
                os.fsync(handle.fileno())
        finally:
            Path(probe).unlink()
    except OSError as exc:
        return Finding("checkpoint-write", f"{folder} is not writable ({exc.strerror or exc})")
    elapsed = time.monotonic() - started
    if elapsed > max_seconds:
        return Finding(
            "checkpoint-write",
            f"writing 4 MiB with fsync to {folder} took {elapsed:.2f}s (max {max_seconds:g}s)",
        )
    return None


def check_shared_memory(folder: Path, need: int) -> Finding | None:
    """``folder`` (a shared-memory mount) has ``need`` bytes free."""
    if need <= 0:
        return None
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if free < need:
        return Finding(
            "shared-memory",
            f"{probe} has {free / 2**20:.1f} MiB free, {need / 2**20:.1f} MiB needed "
            "(raise spec.sharedMemory)",
        )
    return None


def check_command(argv: Sequence[str]) -> Finding | None:
    """The user's check exits 0 within a minute (argv, never a shell string)."""
    if not argv:
        return None
    try:
        done = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=COMMAND_TIMEOUT, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Finding("command", f"{argv[0]}: {exc}")
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or [""]
        return Finding("command", f"{' '.join(argv)} exited {done.returncode}: {tail[0][:200]}")
    return None


def check_gpu(local_world_size: int) -> Finding | None:
    """The node's GPUs: enough devices, and a bf16 matmul that gives finite results at a sane rate."""
    import torch

    if not torch.cuda.is_available():
        return None
    count = torch.cuda.device_count()
    if count < local_world_size:
        return Finding("gpu", f"{count} GPU(s) visible, {local_world_size} process(es) need one each")
    size = 4096
    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    started = time.monotonic()
    for _ in range(10):
        c = a @ b
    torch.cuda.synchronize()
    tflops = 10 * 2 * size**3 / max(time.monotonic() - started, 1e-9) / 1e12
    if not bool(torch.isfinite(c).all()):
        return Finding("gpu", "a bf16 matmul gave non-finite results")
    if tflops < 20:
        return Finding("gpu", f"bf16 matmul at {tflops:.0f} TFLOP/s (a healthy H100 gives several hundred)")
    return None


@dataclass
class Checks:
    """What to check on this worker."""

    policy: HealthPolicy
    checkpoint_dir: str
    shared_memory_dir: str
    shared_memory_need: int
    local_world_size: int

    def run(self, periodic: bool = False) -> Finding | None:
        """The first failed check, or None. The periodic run skips the GPU matmul (it would steal the GPU)."""
        if not self.policy.enabled:
            return None
        steps: list[Callable[[], Finding | None]] = []
        if self.checkpoint_dir:
            steps.append(
                lambda: check_checkpoint_dir(Path(self.checkpoint_dir), self.policy.checkpointWriteMaxSeconds)
            )
        need = max(self.policy.minSharedMemory, self.shared_memory_need)
        if self.shared_memory_dir and need:
            steps.append(lambda: check_shared_memory(Path(self.shared_memory_dir), need))
        if self.policy.gpu and not periodic:
            steps.append(lambda: check_gpu(self.local_world_size))
        if self.policy.command:
            steps.append(lambda: check_command(self.policy.command))
        for step in steps:
            finding = step()
            if finding is not None:
                return replace(finding, phase="periodic") if periodic else finding
        return None


def write_termination_message(line: str, env: Mapping[str, str] | None = None) -> None:
    """Write ``line`` where Kubernetes reads the termination message (``$LLMJOB_TERMINATION_LOG``)."""
    path = Path((os.environ if env is None else env).get(TERMINATION_LOG_ENV, DEFAULT_TERMINATION_LOG))
    with contextlib.suppress(OSError):  # not in a pod (no /dev/termination-log): the log says it too
        path.write_text(line + "\n")


def report_unhealthy(finding: Finding, env: Mapping[str, str] | None = None) -> None:
    """Write the reason where Kubernetes reads the termination message, and say it on stderr."""
    write_termination_message(finding.line(), env)
    print(f"llm_elastic: unhealthy: {finding.line()}", flush=True)


@dataclass
class StragglerWatch:
    """Counts the steps in a row this member's compute time was above factor x the others' median."""

    factor: float
    window: int
    streak: int = 0
    ratios: deque[float] = field(default_factory=lambda: deque(maxlen=64))

    def observe(self, mine: float, others: Sequence[float]) -> Finding | None:
        """One step's local compute times; a finding once the streak reaches the window."""
        valid = [t for t in others if t > 0]
        if mine <= 0 or not valid or self.factor <= 0 or self.window <= 0:
            return None
        median = statistics.median(valid)
        ratio = mine / median
        self.ratios.append(ratio)
        slower = ratio > self.factor and mine - median > MIN_EXCESS_SECONDS
        self.streak = self.streak + 1 if slower else 0
        if self.streak >= self.window:
            return Finding(
                "straggler",
                f"step compute {ratio:.1f}x the job's median for {self.streak} steps in a row "
                f"(factor {self.factor:g})",
                "periodic",
            )
        return None
