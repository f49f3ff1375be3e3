"""Steps: where the job's workers are by topology domain, where new ones go, and what status shows.

Only jobs with ``spec.scheduling.topology`` are touched (docs/platform.md, "Topology"; the rules are in
``policy.topology``). The fallback when the survivors' domain is full is the mode's:

- ``preferred``: the scheduler places the worker in another domain (a preferred term); the first pass
  that sees the workers span several domains emits a Warning Event ``TopologySpread``.
- ``required``: the worker waits in the domain (a required term); after pendingTimeoutSeconds the sizing
  step shrinks the job to what runs (never below minReplicas), and it grows back only when the domain
  has a free node (``observe_topology`` gives the sizing step the domain to count in).
"""

from __future__ import annotations

from llm_operator.policy.capacity import free_nodes
from llm_operator.policy.topology import SPREAD, free_by_domain, home, occupancy, place, spread_message
from llm_operator.policy.topology import assigned_domains as kueue_domains
from llm_operator.steps.state import PassState


def observe_topology(s: PassState) -> None:
    """The active bound workers per domain and the survivors' domain (home), before sizing."""
    topology = s.job.spec.scheduling.topology
    if topology is None:
        return
    s.occupied = occupancy((p for p, _ in s.active), s.nodes, topology.key)
    s.home = home(s.occupied)


def place_workers(s: PassState) -> None:
    """The topology terms of the workers this pass creates: home, or pod affinity for the first ones
    with a preference for the domain with the most free nodes (counted only then)."""
    topology = s.job.spec.scheduling.topology
    if topology is None or not s.out.create:
        return
    leaving = {d.pod.uid for d in s.out.delete}
    staying = [p for p, _ in s.active if p.uid not in leaving]
    occupied = occupancy(staying, s.nodes, topology.key)
    allowed = kueue_domains(s.admission.topology if s.admission is not None else None, topology.key)
    free: dict[str, int] = {}
    if not occupied:
        room = free_nodes(
            s.job, s.nodes.values(), s.all_workers, [p for p, _ in s.verdicts], s.out.avoid_nodes
        )
        free = free_by_domain(room, topology.key)
    s.out.placement = place(topology.key, topology.mode, occupied, free, allowed)


def topology_status(s: PassState) -> None:
    """status.topology (the status step writes it with the rest), and the TopologySpread Warning Event
    when the workers start to span several domains."""
    topology = s.job.spec.scheduling.topology
    if topology is None:
        return
    occupied = s.occupied
    spread = len(occupied) > 1
    s.topology = {
        "key": topology.key,
        "domain": s.home,
        "domains": [{"name": name, "workers": count} for name, count in occupied.items()],
        "spread": spread,
    }
    before = s.job.status.topology
    if spread and (before is None or not before.spread or before.key != topology.key):
        s.out.events.append(("Warning", SPREAD, spread_message(topology.key, occupied, topology.mode)))
