"""Is the checkpoint directory shared by every worker? Resuming on another node needs it to be.

The CRD already rejects a checkpointDir outside ``spec.fsx.mountPath`` when ``fsx`` is set (CEL rule in
``api/rules.py``); what it accepts and still cannot resume across nodes is a checkpointDir with no shared
volume at all (node-local disk), or one on a read-only mount. Those get a warning, not an error: a
single-node job, or one that writes checkpoints through its own means, is legitimate.
"""

from __future__ import annotations

from llm_operator.api.models import LLMTrainingJob

CONDITION = "CheckpointNotShared"
REASON = "CheckpointNotShared"


def _under(path: str, mount: str) -> bool:
    base = mount.rstrip("/") or "/"
    return path == base or path.startswith(base + "/") or base == "/"


def checkpoint_warning(job: LLMTrainingJob) -> str | None:
    """A one-line warning naming spec.checkpointDir, or None when checkpoints can resume anywhere."""
    spec = job.spec
    path = spec.checkpointDir
    if spec.maxReplicas <= 1 or not path:
        return None
    fsx = spec.fsx
    if fsx is None:
        return (
            f"spec.checkpointDir ({path}) is not on a shared volume (no spec.fsx): with maxReplicas"
            f" {spec.maxReplicas}, a worker replaced on another node cannot resume from it"
        )
    if not _under(path, fsx.mountPath):
        return (
            f"spec.checkpointDir ({path}) is not under spec.fsx.mountPath ({fsx.mountPath}): a worker"
            " replaced on another node cannot resume from it"
        )
    if fsx.readOnly:
        return (
            f"spec.checkpointDir ({path}) is on spec.fsx, which is mounted readOnly: checkpoints cannot"
            " be written"
        )
    return None
