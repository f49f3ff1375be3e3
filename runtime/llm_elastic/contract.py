"""The operator's contract with a worker process: which recovery mode, and the environment each mode needs.

The operator sets ``LLMJOB_RECOVERY`` (``restart`` or ``inProcess``) on every worker, from
``spec.failurePolicy.recovery``:

* ``restart``: the program runs under torchrun (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_*`` from
  the agent); a membership change restarts every worker, which resumes from the newest snapshot or
  checkpoint.
* ``inProcess``: the program runs directly (or under ``torchrun --standalone`` for several processes per
  pod, local supervision only) with ``LLMJOB_LIVE_ETCD`` (host:port), ``LLMJOB_LIVE_PREFIX`` (the job's
  key prefix), ``LLMJOB_LIVE_MIN_MEMBERS`` and ``LLMJOB_POD_NAME``; processes are members of the job's live
  membership and survive the loss of a peer.

Without ``LLMJOB_RECOVERY`` the mode follows from what is set (``LLMJOB_LIVE_ETCD``: in process; torchrun's
``RANK``/``WORLD_SIZE``: restart; nothing: ``standalone``, one process, for a laptop). Pure: reads a
mapping, raises :class:`~llm_elastic.errors.ContractError` with one line naming the variable.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from llm_elastic.errors import contract_error

if TYPE_CHECKING:  # the supervisor (a pod's PID 1) imports this module: it loads nothing more on the way
    from llm_elastic.loss_rules import LossRule

RESTART = "restart"
IN_PROCESS = "inProcess"
STANDALONE = "standalone"
MODES = (RESTART, IN_PROCESS)

RECOVERY_ENV = "LLMJOB_RECOVERY"
ETCD_ENV = "LLMJOB_LIVE_ETCD"
PREFIX_ENV = "LLMJOB_LIVE_PREFIX"
MEMBER_ENV = "LLMJOB_LIVE_MEMBER"
MIN_MEMBERS_ENV = "LLMJOB_LIVE_MIN_MEMBERS"
TARGET_MEMBERS_ENV = "LLMJOB_LIVE_TARGET_MEMBERS"
"""Most members a generation takes (replicas x nprocPerNode); members beyond it are standby spares."""
HEALTH_ENV = "LLMJOB_HEALTH_CHECK"
"""The job's spec.healthCheck as JSON (llm_elastic.health)."""
POD_ENV = "LLMJOB_POD_NAME"
CHECKPOINT_ENV = "LLMJOB_CHECKPOINT_DIR"
SNAPSHOT_ENV = "LLMJOB_SNAPSHOT_DIR"
LOSS_RULES_ENV = "LLMJOB_LOSS_RULES"
"""The job's loss rules (``loss: nonFinite``) as a JSON list (llm_elastic.loss_rules)."""
PROCESS_RESTARTS_ENV = "LLMJOB_PROCESS_RESTARTS"
"""Set by the in-pod supervisor (``python -m llm_elastic.supervise``): how often it restarted the program."""


@dataclass(frozen=True)
class Contract:
    """Where this process sits, as the operator (or torchrun) told it."""

    mode: str
    """``restart``, ``inProcess`` or ``standalone``."""
    local_rank: int
    local_world_size: int
    rank: int = 0
    """Restart mode: torchrun's rank (in process the rank comes from each generation)."""
    world_size: int = 1
    etcd: str = ""
    prefix: str = ""
    member: str = ""
    min_members: int = 1
    target_members: int = 0
    """In process: most members a generation takes (0: all); the others wait as spares."""
    checkpoint_dir: str = ""
    snapshot_dir: str = ""
    agent_restarts: int = 0
    """Restart mode: torchelastic's restart count of this agent."""
    process_restarts: int = 0
    """In process: how often the pod's supervisor restarted this program."""
    loss_rules: tuple[LossRule, ...] = ()
    """The job's loss rules (``$LLMJOB_LOSS_RULES``; empty: a non-finite loss changes nothing)."""


def _int(env: Mapping[str, str], name: str, default: int, least: int = 0) -> int:
    raw = env.get(name, "")
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        contract_error(f"${name} must be an integer, got {raw!r}")
    if value < least:
        contract_error(f"${name} must be at least {least}, got {value}")
    return value


def _loss_rules(env: Mapping[str, str]) -> tuple[LossRule, ...]:
    raw = env.get(LOSS_RULES_ENV, "")
    if not raw.strip():
        return ()
    from llm_elastic.loss_rules import parse_loss_rules

    try:
        return parse_loss_rules(raw)
    except ValueError as exc:
        contract_error(f"${LOSS_RULES_ENV}: {exc}")


def valid_member_id(member: str) -> bool:
    """Member ids are one path segment of printable ASCII without "/"."""
    return bool(member) and "/" not in member and member.isprintable() and member.isascii()


def default_member(host: str, local_rank: int, pid: int | None = None) -> str:
    """``<pod>.<local rank>-<pid>``: the operator evicts a pod by the prefix ``<pod>.``; sorting keeps a pod's
    processes in local-rank order (HSDP shard index); the pid makes a restarted process a new member."""
    return f"{host}.{local_rank:02d}-{os.getpid() if pid is None else pid}"


def detect_mode(env: Mapping[str, str]) -> str:
    """The recovery mode this process runs in (see the module docstring)."""
    declared = env.get(RECOVERY_ENV, "")
    if declared:
        if declared not in MODES:
            contract_error(f"${RECOVERY_ENV} must be {' or '.join(MODES)}, got {declared!r}")
        return declared
    if env.get(ETCD_ENV):
        return IN_PROCESS
    if env.get("RANK") and env.get("WORLD_SIZE"):
        return RESTART
    return STANDALONE


def read_contract(
    env: Mapping[str, str] | None = None, supported: Collection[str] = (*MODES, STANDALONE)
) -> Contract:
    """Read and check the contract; exits 2 with one line when the mode is not in ``supported`` or the mode's
    environment is incomplete."""
    env = os.environ if env is None else env
    mode = detect_mode(env)
    if mode not in supported:
        contract_error(
            f"this program supports recovery {', '.join(sorted(supported))}, but runs with "
            f"{RECOVERY_ENV}={mode}; set spec.failurePolicy.recovery to a supported mode"
        )
    local_rank = _int(env, "LOCAL_RANK", 0)
    local_world = _int(env, "LOCAL_WORLD_SIZE", 1, least=1)
    common = {
        "local_rank": local_rank,
        "local_world_size": local_world,
        "checkpoint_dir": env.get(CHECKPOINT_ENV, ""),
        "snapshot_dir": env.get(SNAPSHOT_ENV, ""),
        "loss_rules": _loss_rules(env),
    }
    if mode == RESTART:
        if not (env.get("RANK") and env.get("WORLD_SIZE")):
            contract_error(
                f"{RECOVERY_ENV}=restart runs the program under torchrun, but RANK/WORLD_SIZE are not set "
                "(start it with torchrun, or let the operator do it)"
            )
        return Contract(
            mode=mode,
            rank=_int(env, "RANK", 0),
            world_size=_int(env, "WORLD_SIZE", 1, least=1),
            agent_restarts=_int(env, "TORCHELASTIC_RESTART_COUNT", 0),
            **common,  # type: ignore[arg-type]
        )
    if mode == STANDALONE:
        return Contract(mode=mode, **common)  # type: ignore[arg-type]
    etcd = env.get(ETCD_ENV, "")
    if not etcd:
        contract_error(f"{RECOVERY_ENV}=inProcess needs ${ETCD_ENV} (host:port of the job's etcd)")
    prefix = env.get(PREFIX_ENV, "")
    if not prefix.startswith("/") or not prefix.endswith("/"):
        contract_error(f"${PREFIX_ENV} must start and end with '/', got {prefix!r}")
    host = env.get(POD_ENV) or socket.gethostname()
    member = env.get(MEMBER_ENV) or default_member(host, local_rank)
    if not valid_member_id(member):
        contract_error(
            f"member id {member!r} (${MEMBER_ENV} or ${POD_ENV}) must be printable ASCII without '/'"
        )
    return Contract(
        mode=mode,
        etcd=etcd,
        prefix=prefix,
        member=member,
        min_members=_int(env, MIN_MEMBERS_ENV, 1, least=1),
        target_members=_int(env, TARGET_MEMBERS_ENV, 0),
        process_restarts=_int(env, PROCESS_RESTARTS_ENV, 0),
        **common,  # type: ignore[arg-type]
    )
