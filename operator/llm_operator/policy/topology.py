"""Where new workers of a job with ``spec.scheduling.topology`` go: the survivors' domain.

A domain is the set of nodes sharing one value of the job's topology key (a node label such as
``topology.k8s.aws/network-node-layer-3``). Pure: reads node and pod views, decides, does no I/O.

Ordered rules for the workers a pass creates (first match wins):

1. Some workers are bound: the **home** domain is the one most of them occupy (ties: the smallest
   value, so every pass agrees). New workers are pinned there: a required ``key In [home]`` node
   affinity term (``required``) or a preferred one (``preferred``: the scheduler spreads them only when
   home has no room left).
2. None is bound (the first workers, or every worker lost): the workers find one domain together
   through pod affinity on the key (kube-scheduler lets the first pod of a group match itself, the
   others follow it), required or preferred as the mode says, with a preference for the domain
   that has the most free nodes fitting the job, when the operator sees one.

With Kueue, the admitted Workload's topology assignment is a constraint on top: workers go only to
the domains Kueue reserved (:func:`assigned_domains`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from llm_operator.observe import NodeView, PodView

Mode = Literal["preferred", "required"]
SPREAD = "TopologySpread"


@dataclass(frozen=True)
class Placement:
    """The topology terms of the workers created in one pass."""

    key: str
    mode: Mode
    home: str = ""
    """The survivors' domain: new workers go there (empty: none bound, they find one by pod affinity)."""
    target: str = ""
    """First placement only: the domain with the most free fitting nodes (a scheduling preference)."""
    allowed: tuple[str, ...] = ()
    """Domains Kueue's topology assignment reserved (empty: no such constraint)."""


def domain_of(node: NodeView | None, key: str) -> str:
    """The node's domain, "" when the node is unknown or lacks the label."""
    return (node.label(key) or "") if node is not None else ""


def occupancy(workers: Iterable[PodView], nodes: Mapping[str, NodeView], key: str) -> dict[str, int]:
    """Workers per domain, counting only workers bound to a known node that carries the key, most first
    (ties by name)."""
    counts = Counter(domain_of(nodes.get(p.node), key) for p in workers if p.node)
    counts.pop("", None)
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def home(occupied: Mapping[str, int]) -> str:
    """The domain with the most workers (ties: the smallest value), "" when none is occupied."""
    return min(occupied, key=lambda d: (-occupied[d], d)) if occupied else ""


def free_by_domain(free_nodes: Iterable[NodeView], key: str) -> dict[str, int]:
    """Free nodes (that fit the job) per domain."""
    counts = Counter(domain_of(n, key) for n in free_nodes)
    counts.pop("", None)
    return dict(counts)


def best_domain(free: Mapping[str, int], allowed: Iterable[str] = ()) -> str:
    """The domain with the most free nodes (ties: the smallest value), within ``allowed`` when given;
    "" when none has room."""
    allow = set(allowed)
    options = {d: n for d, n in free.items() if n > 0 and (not allow or d in allow)}
    return min(options, key=lambda d: (-options[d], d)) if options else ""


def assigned_domains(assignment: Mapping[str, Any] | None, key: str) -> tuple[str, ...]:
    """The values of ``key`` in a Kueue podSet's ``topologyAssignment`` (kueue.x-k8s.io/v1beta2:
    ``levels`` and ``slices[].valuesPerLevel[]`` as ``universal`` or ``individual`` prefix/roots/suffix),
    sorted; empty when there is no assignment or it does not include the level."""
    if not assignment:
        return ()
    levels = list(assignment.get("levels") or [])
    if key not in levels:
        return ()
    at = levels.index(key)
    found: set[str] = set()
    for piece in assignment.get("slices") or []:
        values = list(piece.get("valuesPerLevel") or [])
        if at >= len(values):
            continue
        level = values[at] or {}
        if level.get("universal"):
            found.add(str(level["universal"]))
        individual = level.get("individual") or {}
        prefix, suffix = individual.get("prefix") or "", individual.get("suffix") or ""
        found.update(f"{prefix}{root}{suffix}" for root in individual.get("roots") or [])
    return tuple(sorted(found))


def place(
    key: str,
    mode: Mode,
    occupied: Mapping[str, int],
    free: Mapping[str, int],
    allowed: tuple[str, ...] = (),
) -> Placement:
    """The placement of new workers: home when workers are bound (rules 1), else pod affinity with a
    preference for the roomiest domain (rule 2). A home outside Kueue's assignment is no home."""
    settled = {d: n for d, n in occupied.items() if not allowed or d in allowed}
    where = home(settled)
    if where:
        return Placement(key, mode, home=where, allowed=allowed)
    return Placement(key, mode, target=best_domain(free, allowed), allowed=allowed)


def spread_message(key: str, occupied: Mapping[str, int], mode: Mode) -> str:
    """The Warning Event's message when the workers start to span several domains."""
    parts = ", ".join(f"{d}: {n}" for d, n in occupied.items())
    why = (
        "the survivors' domain had no room for every new worker (mode preferred)"
        if mode == "preferred"
        else "workers were bound outside the required domain"
    )
    return f"workers span {len(occupied)} domains of {key} ({parts}): {why}"
