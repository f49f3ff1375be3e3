"""llm_elastic: the elastic runtime any PyTorch training loop adopts under the Elastic LLM Operator.

The public API (everything else is internal and may change):

* :class:`Elastic`, :class:`ElasticConfig`, :class:`Step` -- wrap the loop (``llm_elastic.session``;
  the settings in ``llm_elastic.config``); :class:`RestoreFacts` -- where a process's state came from;
* :class:`DDP`, :class:`HSDP`, :class:`AsIs`, :class:`WrapPolicy` -- how the model is wrapped per generation
  (``llm_elastic.wrap``);
* :class:`ElasticSampler`, :class:`GlobalOrder` -- the global sample order cut per step and rank
  (``llm_elastic.data``, ``llm_elastic.order``);
* :class:`RNGState`, :class:`Stateful` -- extras handed over as ``Stateful`` objects (``llm_elastic.state``);
* :func:`read_contract`, :class:`Contract`, ``CHECKPOINT_ENV``, ``SNAPSHOT_ENV`` -- the operator's env
  contract (``llm_elastic.contract``);
* the typed failures and exit codes (``llm_elastic.errors``); :class:`ExitOnErrorParser`,
  :func:`usage_error` -- options failing in one line, exit 2 (``llm_elastic.cli_errors``);
* :func:`read_records`, :func:`audit` -- the step log read back and audited (``llm_elastic.metrics``,
  ``llm_elastic.accounting``);
* :func:`configure_logging` -- text or JSON log lines (``LLMJOB_LOG_FORMAT``; ``llm_elastic.logs``);
* :class:`LossRule` -- what the members do on a non-finite loss (``ElasticConfig.loss_rules``;
  ``llm_elastic.loss_rules``).

A test (tests/unit/test_import_contract.py) keeps the trainer, the benchmarks and the examples on these names.

Guide: docs/byo-training.md; reference: docs/runtime-api.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llm_elastic.accounting import audit
    from llm_elastic.cli_errors import ExitOnErrorParser, usage_error
    from llm_elastic.config import ElasticConfig
    from llm_elastic.contract import (
        CHECKPOINT_ENV,
        IN_PROCESS,
        RESTART,
        SNAPSHOT_ENV,
        STANDALONE,
        Contract,
        read_contract,
    )
    from llm_elastic.data import ElasticSampler
    from llm_elastic.errors import (
        EXIT_EVICTED,
        EXIT_LOCAL_FAILURE,
        EXIT_NO_GENERATION,
        EXIT_PEER_STOPPED,
        EXIT_RECOVERY_EXHAUSTED,
        EXIT_RULE_FIRED,
        EXIT_STATE_LOST,
        ContractError,
        LocalFailure,
        PeerLost,
        RecoveryExhausted,
        StateLost,
        UsageError,
    )
    from llm_elastic.logs import configure_logging
    from llm_elastic.loss_rules import LossRule
    from llm_elastic.metrics import read_records
    from llm_elastic.order import GlobalOrder
    from llm_elastic.position import RestoreFacts
    from llm_elastic.session import Elastic
    from llm_elastic.state import RNGState, Stateful
    from llm_elastic.step import Step
    from llm_elastic.wrap import DDP, HSDP, AsIs, WrapPolicy

_HOME: dict[str, str] = {
    "audit": "llm_elastic.accounting",
    "ExitOnErrorParser": "llm_elastic.cli_errors",
    "usage_error": "llm_elastic.cli_errors",
    "ElasticConfig": "llm_elastic.config",
    "CHECKPOINT_ENV": "llm_elastic.contract",
    "IN_PROCESS": "llm_elastic.contract",
    "RESTART": "llm_elastic.contract",
    "SNAPSHOT_ENV": "llm_elastic.contract",
    "STANDALONE": "llm_elastic.contract",
    "Contract": "llm_elastic.contract",
    "read_contract": "llm_elastic.contract",
    "ElasticSampler": "llm_elastic.data",
    "EXIT_EVICTED": "llm_elastic.errors",
    "EXIT_LOCAL_FAILURE": "llm_elastic.errors",
    "EXIT_NO_GENERATION": "llm_elastic.errors",
    "EXIT_PEER_STOPPED": "llm_elastic.errors",
    "EXIT_RECOVERY_EXHAUSTED": "llm_elastic.errors",
    "EXIT_RULE_FIRED": "llm_elastic.errors",
    "EXIT_STATE_LOST": "llm_elastic.errors",
    "ContractError": "llm_elastic.errors",
    "LocalFailure": "llm_elastic.errors",
    "PeerLost": "llm_elastic.errors",
    "RecoveryExhausted": "llm_elastic.errors",
    "StateLost": "llm_elastic.errors",
    "UsageError": "llm_elastic.errors",
    "configure_logging": "llm_elastic.logs",
    "LossRule": "llm_elastic.loss_rules",
    "read_records": "llm_elastic.metrics",
    "GlobalOrder": "llm_elastic.order",
    "RestoreFacts": "llm_elastic.position",
    "Elastic": "llm_elastic.session",
    "RNGState": "llm_elastic.state",
    "Stateful": "llm_elastic.state",
    "Step": "llm_elastic.step",
    "DDP": "llm_elastic.wrap",
    "HSDP": "llm_elastic.wrap",
    "AsIs": "llm_elastic.wrap",
    "WrapPolicy": "llm_elastic.wrap",
}
"""Public name -> the module that defines it; resolved on first use (PEP 562)."""


__all__ = [
    "CHECKPOINT_ENV",
    "DDP",
    "EXIT_EVICTED",
    "EXIT_LOCAL_FAILURE",
    "EXIT_NO_GENERATION",
    "EXIT_PEER_STOPPED",
    "EXIT_RECOVERY_EXHAUSTED",
    "EXIT_RULE_FIRED",
    "EXIT_STATE_LOST",
    "HSDP",
    "IN_PROCESS",
    "RESTART",
    "SNAPSHOT_ENV",
    "STANDALONE",
    "AsIs",
    "Contract",
    "ContractError",
    "Elastic",
    "ElasticConfig",
    "ElasticSampler",
    "ExitOnErrorParser",
    "GlobalOrder",
    "LocalFailure",
    "LossRule",
    "PeerLost",
    "RNGState",
    "RecoveryExhausted",
    "RestoreFacts",
    "StateLost",
    "Stateful",
    "Step",
    "UsageError",
    "WrapPolicy",
    "audit",
    "configure_logging",
    "read_contract",
    "read_records",
    "usage_error",
]


def __getattr__(name: str) -> Any:
    """Import a public name's module on first use, so ``python -m llm_elastic.supervise`` (a pod's PID 1)
    starts in milliseconds and sets its signal handlers before anything heavy (torch) is imported."""
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'llm_elastic' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
