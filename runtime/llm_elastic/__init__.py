"""llm_elastic: the elastic runtime any PyTorch training loop adopts under the Elastic LLM Operator.

The public API (everything else is internal and may change):

* :class:`Elastic`, :class:`ElasticConfig`, :class:`Step` -- wrap the loop (``llm_elastic.session``;
  the settings in ``llm_elastic.config``);
* :class:`DDP`, :class:`HSDP`, :class:`AsIs` -- how the model is wrapped per generation
  (``llm_elastic.wrap``);
* :class:`ElasticSampler` -- the global sample order cut per step and rank (``llm_elastic.data``);
* :class:`RNGState`, :class:`Stateful` -- extras handed over as ``Stateful`` objects (``llm_elastic.state``);
* :func:`read_contract`, :class:`Contract` -- the operator's env contract (``llm_elastic.contract``);
* the typed failures and exit codes (``llm_elastic.errors``).

Guide: docs/byo-training.md; reference: docs/runtime-api.md.
"""

from llm_elastic.config import ElasticConfig
from llm_elastic.contract import IN_PROCESS, RESTART, STANDALONE, Contract, read_contract
from llm_elastic.data import ElasticSampler
from llm_elastic.errors import (
    EXIT_EVICTED,
    EXIT_LOCAL_FAILURE,
    EXIT_NO_GENERATION,
    EXIT_PEER_STOPPED,
    EXIT_RECOVERY_EXHAUSTED,
    EXIT_STATE_LOST,
    ContractError,
    LocalFailure,
    PeerLost,
    RecoveryExhausted,
    StateLost,
    UsageError,
)
from llm_elastic.session import Elastic, Step
from llm_elastic.state import RNGState, Stateful
from llm_elastic.wrap import DDP, HSDP, AsIs

__all__ = [
    "DDP",
    "EXIT_EVICTED",
    "EXIT_LOCAL_FAILURE",
    "EXIT_NO_GENERATION",
    "EXIT_PEER_STOPPED",
    "EXIT_RECOVERY_EXHAUSTED",
    "EXIT_STATE_LOST",
    "HSDP",
    "IN_PROCESS",
    "RESTART",
    "STANDALONE",
    "AsIs",
    "Contract",
    "ContractError",
    "Elastic",
    "ElasticConfig",
    "ElasticSampler",
    "LocalFailure",
    "PeerLost",
    "RNGState",
    "RecoveryExhausted",
    "StateLost",
    "Stateful",
    "Step",
    "UsageError",
    "read_contract",
]
