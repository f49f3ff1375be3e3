"""What every source kind shares: the new job's metadata, the spec's field order, rendezvous timing."""

from __future__ import annotations

from typing import Any

from llm_operator.api.models import API_VERSION, KIND, LLMTrainingJobSpec
from llm_operator.convert.source import ConvertError, Node, Report

# torchrun's rendezvous settings (rdzv_conf keys) and the job's fields for them.
RDZV_CONF: dict[str, str] = {
    "join_timeout": "timeoutSeconds",
    "last_call_timeout": "lastCallSeconds",
    "close_timeout": "closeTimeoutSeconds",
    "heartbeat_timeout": "heartbeatTimeoutSeconds",
    "keep_alive_interval": "heartbeatSeconds",
    "keep_alive_max_attempt": "heartbeatMisses",
}


def open_document(doc: dict[str, Any], report: Report) -> tuple[dict[str, Any], Node]:
    """A source object's new metadata and its ``spec`` node (apiVersion, kind and status are known)."""
    root = Node(doc, "", report)
    root.ignore("apiVersion", "kind", "status")
    meta = metadata(root.child("metadata"))
    source = root.child("spec")
    root.done()
    return meta, source


def metadata(node: Node) -> dict[str, Any]:
    """The new job's metadata: name, namespace, labels and annotations of the source object."""
    name = node.take_str("name")
    if not name:
        raise ConvertError([f"{node.at('name')}: required"])
    out: dict[str, Any] = {"name": name}
    namespace = node.take_str("namespace")
    if namespace:
        out["namespace"] = namespace
    for key in ("labels", "annotations"):
        value = node.take_map(key)
        if value:
            out[key] = value
    node.ignore("uid", "resourceVersion", "generation", "creationTimestamp", "managedFields", "selfLink")
    node.done()
    return out


def job(meta: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """An LLMTrainingJob document with the spec's fields in the API's order."""
    order = list(LLMTrainingJobSpec.model_fields)
    ordered = {key: spec[key] for key in sorted(spec, key=lambda k: order.index(k) if k in order else 99)}
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": meta, "spec": ordered}


def merge(into: dict[str, Any], more: dict[str, Any]) -> dict[str, Any]:
    """``more`` over ``into``, objects field by field (the source kind's own fields over its pod's)."""
    out = dict(into)
    for key, value in more.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def rdzv_conf(items: dict[str, Any], path: str, node: Node) -> dict[str, int]:
    """torchrun rendezvous settings (key -> value) as spec.rendezvous fields; the others are reported."""
    out: dict[str, int] = {}
    for key, value in items.items():
        field = RDZV_CONF.get(key)
        if field is None:
            node.report.warn(f"{path} ({key})", "no equivalent rendezvous setting; dropped")
            continue
        try:
            out[field] = int(float(str(value)))
        except ValueError:
            raise ConvertError([f"{path} ({key}): must be a number, got {value!r}"]) from None
    return out


def require_image(spec: dict[str, Any], where: str) -> None:
    if not spec.get("image"):
        raise ConvertError([f"{where}: the training container has no image"])
