"""Operator settings that come from its environment (the Helm chart sets them)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

DEFAULT_RENDEZVOUS_IMAGE = "quay.io/coreos/etcd:v3.6.16"
ETCD_CLIENT_PORT = 2379
C10D_PORT = 29400
TRAINER_METRICS_PORT = 9400


@dataclass(frozen=True)
class Settings:
    """What the builders need beyond the job itself."""

    rendezvous_image: str = DEFAULT_RENDEZVOUS_IMAGE
    """Image of the operator-managed etcd rendezvous server."""
    rendezvous_node_selector: dict[str, str] = field(default_factory=dict)
    """Node selector for rendezvous servers (keep them off GPU nodes)."""
    kueue: bool = True
    """Kueue admission for jobs with a kueue.x-k8s.io/queue-name label (LLMJOB_KUEUE=false turns it off)."""

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> Settings:
        """Read LLMJOB_RENDEZVOUS_IMAGE and LLMJOB_DEFAULT_NODE_SELECTOR (a JSON object)."""
        env = dict(os.environ) if environ is None else environ
        selector_json = env.get("LLMJOB_DEFAULT_NODE_SELECTOR", "").strip()
        selector: dict[str, str] = {}
        if selector_json:
            try:
                parsed = json.loads(selector_json)
            except json.JSONDecodeError as exc:
                raise ValueError(f"LLMJOB_DEFAULT_NODE_SELECTOR is not valid JSON: {exc}") from exc
            if not isinstance(parsed, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in parsed.items()
            ):
                raise ValueError("LLMJOB_DEFAULT_NODE_SELECTOR must be a JSON object of strings")
            selector = parsed
        return cls(
            rendezvous_image=env.get("LLMJOB_RENDEZVOUS_IMAGE") or DEFAULT_RENDEZVOUS_IMAGE,
            rendezvous_node_selector=selector,
            kueue=kueue_enabled(env),
        )


def kueue_enabled(environ: dict[str, str] | None = None) -> bool:
    """LLMJOB_KUEUE: anything but false/0/no/off (case-insensitive) keeps Kueue support on."""
    env = dict(os.environ) if environ is None else environ
    return env.get("LLMJOB_KUEUE", "true").strip().lower() not in ("false", "0", "no", "off")
