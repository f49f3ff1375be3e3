"""Version skew: which runtime contracts this operator serves (pure; docs/operations.md, "Version skew").

A worker's runtime says which contract it speaks (``llm_elastic.contract``: the gauge
``llm_trainer_contract_version``; a runtime that serves metrics without it is release 0.1.0's, contract 1).
This operator serves every contract from :data:`OLDEST_CONTRACT` (the previous release's) to its own.
A job whose workers speak another one is refused (condition ``RuntimeUnsupported``) at the first scrape,
before its first membership change: the operator would otherwise evict members by keys, or read exit
codes and messages, that its runtime does not use.
"""

from __future__ import annotations

from collections.abc import Iterable

from llm_elastic.contract import CONTRACT_VERSION

OLDEST_CONTRACT = 1
"""The oldest runtime contract served: release 0.1.0's (CHANGELOG.md names the previous release)."""
SUPPORTED = range(OLDEST_CONTRACT, CONTRACT_VERSION + 1)
CONDITION = "RuntimeUnsupported"
LOSS_RULES_SINCE = 2
"""Loss rules (``loss: nonFinite``) are evaluated by runtimes of contract 2 and later: an older runtime
would train on through a NaN loss the job asked to act on."""


def describe(versions: range) -> str:
    return f"{versions.start}" if len(versions) == 1 else f"{versions.start}-{versions[-1]}"


def runtime_problem(spoken: Iterable[int], loss_rules: bool, supported: range = SUPPORTED) -> str | None:
    """Why the workers' runtime cannot run under this operator (one line), None when it can. ``spoken``: the
    contract versions the answering workers reported; ``loss_rules``: the job has loss rules."""
    versions = sorted(set(spoken))
    outside = [v for v in versions if v not in supported]
    if outside:
        newer = outside[-1] > supported[-1]
        order = (
            "upgrade the operator first (then the training images)"
            if newer
            else "rebuild the training image with a newer llm_elastic"
        )
        return (
            f"workers run an llm_elastic runtime of contract {outside[-1] if newer else outside[0]}; this "
            f"operator serves contracts {describe(supported)}: {order} (docs/operations.md, 'Version skew')"
        )
    if loss_rules and versions and versions[0] < LOSS_RULES_SINCE:
        return (
            f"spec.monitoring.rules has loss rules, which runtimes of contract {LOSS_RULES_SINCE} and later "
            f"evaluate; workers run contract {versions[0]}: rebuild the training image with a newer "
            "llm_elastic"
        )
    return None
