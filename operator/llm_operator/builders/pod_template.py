"""The user's pod template (``spec.podTemplate``) merged into a worker pod the operator built.

One pure function, the whole policy (table-tested in tests/unit/test_pod_template.py):

- ``metadata.labels``, ``metadata.annotations``: added; the operator's keys are set last and win;
- ``spec.serviceAccountName``, ``automountServiceAccountToken``, ``imagePullSecrets``, ``securityContext``,
  ``dnsPolicy``, ``dnsConfig``, ``hostAliases``, ``runtimeClassName``: set (the operator sets none of them);
- ``spec.volumes``: after the operator's (``dshm``, ``fsx``);
- ``spec.initContainers``: the pod's init containers, in order (``restartPolicy: Always``: native sidecars);
- ``spec.containers[trainer].volumeMounts``: after the training container's own mounts;
- ``spec.containers[trainer].envFrom``: the training container's ``envFrom`` (explicit env wins over it).

Conflicts with what the operator owns (its label keys, volume names, mount paths, the trainer's name) are
refused at admission (CEL rules in ``llm_operator.api.rules``); the merge still puts the operator's values
last, so no template can change them.
"""

from __future__ import annotations

import copy
from typing import Any

from llm_operator.api.models import PodTemplate
from llm_operator.api.rules import TRAINER_CONTAINER

POD_FIELDS: tuple[str, ...] = (
    "serviceAccountName",
    "automountServiceAccountToken",
    "imagePullSecrets",
    "securityContext",
    "dnsPolicy",
    "dnsConfig",
    "hostAliases",
    "runtimeClassName",
)
"""Pod-level fields a template sets as they are (empty values are left out)."""


def merge_pod_template(pod: dict[str, Any], template: PodTemplate | None) -> dict[str, Any]:
    """``pod`` with ``template`` merged in (see the module docstring); ``pod`` is not changed."""
    if template is None:
        return pod
    out = copy.deepcopy(pod)
    data = template.model_dump(by_alias=True, exclude_none=True, mode="json")
    meta, spec = out["metadata"], out["spec"]
    for key in ("labels", "annotations"):
        merged = {**data["metadata"][key], **(meta.get(key) or {})}
        if merged:
            meta[key] = merged
    given = data["spec"]
    for key in POD_FIELDS:
        if given.get(key) not in (None, [], {}, ""):
            spec[key] = given[key]
    spec["volumes"] = [*spec.get("volumes", []), *given["volumes"]]
    if given["initContainers"]:
        spec["initContainers"] = [*spec.get("initContainers", []), *given["initContainers"]]
    trainer = next(c for c in spec["containers"] if c["name"] == TRAINER_CONTAINER)
    for entry in given["containers"]:
        if entry["name"] != TRAINER_CONTAINER:
            continue
        trainer["volumeMounts"] = [*trainer.get("volumeMounts", []), *entry["volumeMounts"]]
        if entry["envFrom"]:
            trainer["envFrom"] = [*trainer.get("envFrom", []), *entry["envFrom"]]
    return out
