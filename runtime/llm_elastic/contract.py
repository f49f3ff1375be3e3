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

This module is the whole contract between the runtime and the operator, and it is versioned: the
``LLMJOB_*`` environment, the etcd keys the operator reads or deletes, the exit codes and termination
messages it acts on, and the metrics it scrapes. The operator imports these names from here.
:data:`CONTRACT_VERSION` rises with every change of one of them (:func:`fingerprint`; a unit test fails
when the names change and the version does not); a worker serves it as the gauge :data:`CONTRACT_METRIC`,
and the operator refuses a job whose runtime speaks a version outside its range (condition
``RuntimeUnsupported``; docs/operations.md, "Version skew").
"""

from __future__ import annotations

import hashlib
import os
import socket
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

# EXIT_RULE_FIRED (79) is defined with the other exit codes (public there) and is part of the contract here.
from llm_elastic.errors import EXIT_RULE_FIRED as EXIT_RULE_FIRED
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
LOG_RULES_ENV = "LLMJOB_LOG_RULES"
"""The job's log rules as JSON, for the supervisor (llm_elastic.logrules)."""
TERMINATION_LOG_ENV = "LLMJOB_TERMINATION_LOG"
"""Where the termination message goes (default ``/dev/termination-log``)."""
LOG_FORMAT_ENV = "LLMJOB_LOG_FORMAT"
"""``text`` or ``json`` log lines: the one ``LLMJOB_*`` name a user may set."""
NODE_ENV = "LLMJOB_NODE_NAME"
POD_IP_ENV = "LLMJOB_POD_IP"
JOB_ENV = "LLMJOB_JOB_NAME"
INDEX_ENV = "LLMJOB_REPLICA_INDEX"
ATTEMPT_ENV = "LLMJOB_ATTEMPT"
ETCD_USER_ENV = "LLMJOB_ETCD_USER"
"""The job's own etcd user (etcd auth on; llm_elastic.rendezvous.etcd_auth)."""
ETCD_PASSWORD_FILE_ENV = "LLMJOB_ETCD_PASSWORD_FILE"  # noqa: S105 (a variable name)
"""A file holding that user's password: the job's Secret, mounted into its workers only."""

# The etcd keys the operator reads and deletes under a job's live prefix (llm_elastic.live.layout).
MEMBERS_DIR = "members/"
"""``<prefix>members/<member>``: one lease-backed key per live member; the operator evicts a pod's members
by deleting the range ``<prefix>members/<pod>.``."""
MEMBER_SEPARATOR = "."
"""Member ids are ``<pod><MEMBER_SEPARATOR><local rank>-<pid>``."""
GENERATION_KEY = "generation"
"""``<prefix>generation``: JSON with the generation's ``members`` (the operator reads who trains)."""
GENERATION_MEMBERS_FIELD = "members"

# Exit codes and termination messages the operator acts on.
EXIT_NODE_UNHEALTHY = 78
"""A node health check failed, or the worker is a straggler, or a log rule replaces the node."""
RULE_FIRED_PREFIX = "rule-fired:"
"""Exit 79 (or 78 for replaceNode): ``rule-fired: <rule> <action>: <detail>``."""
HEALTH_PHASES = ("preflight", "periodic")
"""Exit 78: ``<phase> <check>: <detail>``; ``preflight``: before the worker became a member."""
TERMINATION_LIMIT = 1024

# What the operator scrapes: ``<METRIC_PREFIX><gauge>`` on METRICS_PORT + local rank.
METRICS_PORT = 9400
METRIC_PREFIX = "llm_trainer_"
SCRAPED_GAUGES = (
    "step",
    "last_step_timestamp_seconds",
    "total_steps",
    "loss",
    "tokens_per_second",
    "step_time_seconds_sum",
    "step_time_seconds_count",
    "last_saved_step",
    "last_saved_timestamp_seconds",
    "job_process_restarts",
    "world_size",
    "contract_version",
)
RULE_FIRED_METRIC = "llm_trainer_rule_fired_total"
"""Counter of loss rules that fired, labels ``rule`` and ``action``."""
CONTRACT_METRIC = METRIC_PREFIX + "contract_version"

CONTRACT_VERSION = 3
"""The contract this runtime speaks. 1: release 0.1.0 (it serves no :data:`CONTRACT_METRIC`: a worker
without it speaks 1). 2: adds the loss and log rules (``LLMJOB_LOSS_RULES``, ``LLMJOB_LOG_RULES``, exit 79,
``rule-fired:``, :data:`RULE_FIRED_METRIC`) and :data:`CONTRACT_METRIC`. 3: adds the job's etcd credentials
(``LLMJOB_ETCD_USER``, ``LLMJOB_ETCD_PASSWORD_FILE``): a runtime of 1 or 2 cannot authenticate."""
UNANNOUNCED_VERSION = 1
"""The version of a worker that serves metrics but no :data:`CONTRACT_METRIC` (release 0.1.0)."""
FINGERPRINTS = {2: "c96c951736f469ba", 3: "212be51285c9f56b"}
"""Version -> :func:`fingerprint` of its names and values. Entries are never edited: a change of the
contract adds a version (tests/unit/test_contract_version.py)."""
_BOOKKEEPING = frozenset({"CONTRACT_VERSION", "FINGERPRINTS", "UNANNOUNCED_VERSION", "TYPE_CHECKING"})


def fingerprint() -> str:
    """sha256 (16 hex digits) of every public constant of this module, by name: what a version stands for."""
    values = {
        k: v
        for k, v in globals().items()
        if k.isupper()
        and not k.startswith("_")
        and k not in _BOOKKEEPING
        and isinstance(v, str | int | tuple)
    }
    text = "\n".join(f"{k}={v!r}" for k, v in sorted(values.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def rule_fired_message(rule: str, action: str, detail: str) -> str:
    """The termination message of a worker a monitoring rule ended."""
    return f"{RULE_FIRED_PREFIX} {rule} {action}: {detail}"[:TERMINATION_LIMIT]


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
