"""The etcd key layout of live membership, and the pure decisions made on it (no I/O here).

Under a job prefix ``P`` (ends with "/"):

* ``P/members/<member>``: one key per live member, attached to the member's lease; the value is JSON
  ``{"pid": ..., "host": ...}``. Deleting it evicts the member at once
  (:func:`llm_elastic.live.membership.evict`).
* ``P/generation``: JSON ``{"generation": N, "members": [sorted ids]}``; changed only by compare-and-set
  on its mod revision, so exactly one proposal wins per generation.
* ``P/g<N>/arrived/<member>``: a member of generation N is ready to build its process group.
* ``P/g<N>/store/``: the c10d store of generation N's process group (fresh per generation).
* ``P/step``: the last step completed (rank 0 writes it every step): a generation of only new members
  refuses to start from scratch when it is above 0.
* ``P/done``: the run finished; late joiners exit instead of waiting.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

from llm_elastic.contract import GENERATION_KEY, MEMBERS_DIR
from llm_elastic.rendezvous.etcd_client import KeyValue


def members_prefix(prefix: str) -> str:
    """Folder of the member keys."""
    return f"{prefix}{MEMBERS_DIR}"


def member_key(prefix: str, member: str) -> str:
    """The lease-backed key of one member."""
    return f"{members_prefix(prefix)}{member}"


def generation_key(prefix: str) -> str:
    """The generation record (compare-and-set only)."""
    return f"{prefix}{GENERATION_KEY}"


def generation_prefix(prefix: str, generation: int) -> str:
    """Everything that belongs to one generation."""
    return f"{prefix}g{generation}/"


def arrived_key(prefix: str, generation: int, member: str) -> str:
    """Set by a member of ``generation`` once it is ready to form the process group."""
    return f"{generation_prefix(prefix, generation)}arrived/{member}"


def store_prefix(prefix: str, generation: int) -> str:
    """Prefix of the c10d store of ``generation``."""
    return f"{generation_prefix(prefix, generation)}store/"


def step_key(prefix: str) -> str:
    """The job's last completed step."""
    return f"{prefix}step"


def done_key(prefix: str) -> str:
    """Marks the run as finished."""
    return f"{prefix}done"


def valid_member_id(member: str) -> bool:
    """Member ids are one path segment of printable ASCII without "/"."""
    return bool(member) and "/" not in member and member.isprintable() and member.isascii()


def host_of(member: str) -> str:
    """The host (pod) part of a member id ``<host>.<n>``."""
    return member.rsplit(".", 1)[0]


def complete_hosts(live: list[str], shard_size: int) -> list[str]:
    """The members that may form a generation: with sharding inside a host (HSDP, ``shard_size`` > 1) only
    hosts with exactly ``shard_size`` live members count (a host missing a process holds no full replica
    and waits until its replacement registers); with ``shard_size`` 1 every live member counts."""
    if shard_size <= 1:
        return list(live)
    hosts: dict[str, list[str]] = {}
    for member in live:
        hosts.setdefault(host_of(member), []).append(member)
    return sorted(m for members in hosts.values() if len(members) == shard_size for m in members)


@dataclass(frozen=True)
class Generation:
    """One agreed membership: ranks are the positions in ``members`` (sorted ids)."""

    number: int
    members: tuple[str, ...]

    def rank_of(self, member: str) -> int:
        """This member's rank in the generation."""
        return self.members.index(member)

    @property
    def world_size(self) -> int:
        """How many members train in this generation."""
        return len(self.members)

    def encode(self) -> bytes:
        """The stored JSON."""
        return json.dumps({"generation": self.number, "members": list(self.members)}).encode()

    @staticmethod
    def decode(raw: bytes) -> Generation:
        """Parse a stored record."""
        data = json.loads(raw)
        return Generation(int(data["generation"]), tuple(str(m) for m in data["members"]))


def select(
    current: Generation | None, live: list[str], target: int = 0, shard_size: int = 1
) -> tuple[str, ...]:
    """Who trains next: the live members of ``current`` first (survivors stay), then the others in id order,
    up to ``target`` members (0: everyone); the rest wait as standby spares. With ``shard_size`` > 1 whole
    hosts are taken (``live`` holds complete hosts only). Sorted: ranks are positions in the result."""
    alive = sorted(set(live))
    if target <= 0 or len(alive) <= target:
        return tuple(alive)
    keep = [m for m in alive if current is not None and m in current.members]
    others = [m for m in alive if m not in keep]
    if shard_size > 1:  # take hosts, not single processes
        hosts: dict[str, list[str]] = {}
        for member in keep + others:
            hosts.setdefault(host_of(member), []).append(member)
        chosen: list[str] = []
        for members in hosts.values():
            if len(chosen) + len(members) <= target:
                chosen += members
        return tuple(sorted(chosen))
    return tuple(sorted((keep + others)[:target]))


def propose(current: Generation | None, live: list[str], target: int = 0, shard_size: int = 1) -> Generation:
    """The next generation (deterministic on every member): see :func:`select`."""
    number = current.number + 1 if current is not None else 1
    return Generation(number, select(current, live, target, shard_size))


class Action(Enum):
    """What a member that needs a (new) generation does after reading the record and the live members."""

    JOIN = "join"
    """The stored generation is newer than the one we left and includes us: form it."""
    PROPOSE = "propose"
    """Compare-and-set the next generation of every live member."""
    WAIT = "wait"
    """A healthy generation without us is training: wait until it re-forms at a step boundary."""


def decide(
    stored: Generation | None, live: list[str], me: str, left: int, min_members: int, target: int = 0
) -> Action:
    """Choose the next move of member ``me`` that left generation ``left`` (0: never in one).

    Pure: ``stored`` is the generation record, ``live`` the member keys now present; ``min_members`` only
    holds back the first generation (after that, training goes on with whoever is left); ``target`` caps a
    generation's size (0: no cap): a member outside a healthy, full generation waits as a standby spare.
    """
    if stored is not None and stored.number > left and me in stored.members:
        if all(m in live for m in stored.members):
            return Action.JOIN
        return Action.PROPOSE  # one of its members is gone already: supersede it
    if stored is None:  # a new job, or a fresh etcd after an outage (then members that trained go on)
        return Action.PROPOSE if len(live) >= min_members or left > 0 else Action.WAIT
    healthy = all(m in live for m in stored.members)
    full = 0 < target <= stored.world_size
    if me not in stored.members and healthy and (left == 0 or full):
        # A joiner: the running generation takes us in at its next step boundary, or we stay a spare.
        return Action.WAIT
    return Action.PROPOSE


@dataclass(frozen=True)
class View:
    """A job's whole membership as one read of its prefix found it, at one store revision (pure value):
    every decision of a member is made from one view, and a wait for a change starts after ``revision``."""

    revision: int
    members: tuple[str, ...]
    """The live member ids, sorted."""
    generation: Generation | None
    generation_revision: int | None
    """The generation record's mod revision: the compare-and-set token of the next proposal."""
    arrived: Mapping[int, frozenset[str]]
    """Per generation number, the members that announced their arrival."""
    done: bool
    step: int

    def arrived_in(self, number: int) -> frozenset[str]:
        """Who arrived in generation ``number``."""
        return self.arrived.get(number, frozenset())


_ARRIVED = re.compile(r"^g([0-9]+)/arrived/(.+)$")


def view_of(prefix: str, found: Mapping[str, KeyValue], revision: int) -> View:
    """Parse the keys under ``prefix`` (as ``EtcdClient.read_prefix`` returns them) into a :class:`View`."""
    members: list[str] = []
    arrived: dict[int, set[str]] = {}
    generation: Generation | None = None
    generation_revision: int | None = None
    step = 0
    for key, kv in found.items():
        rest = key[len(prefix) :]
        if rest.startswith(MEMBERS_DIR):
            members.append(rest[len(MEMBERS_DIR) :])
        elif rest == GENERATION_KEY:
            generation, generation_revision = Generation.decode(kv.value), kv.mod_revision
        elif key == step_key(prefix):
            step = int(kv.value)
        elif (match := _ARRIVED.match(rest)) is not None:
            arrived.setdefault(int(match.group(1)), set()).add(match.group(2))
    done = done_key(prefix) in found
    frozen = {number: frozenset(who) for number, who in arrived.items()}
    return View(revision, tuple(sorted(members)), generation, generation_revision, frozen, done, step)
