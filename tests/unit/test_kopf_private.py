"""The one use of kopf's private registry: our daemon carries no finalizer (docs/decisions.md)."""

from __future__ import annotations

from typing import Any

import kopf
import pytest
from llm_operator.kopf_private import daemon_without_finalizer


async def loop(**_: Any) -> None:
    """A daemon."""


async def other(**_: Any) -> None:
    """Another daemon."""


def spawning(registry: kopf.OperatorRegistry) -> dict[str, bool | None]:
    return {h.fn.__name__: h.requires_finalizer for h in registry._spawning._handlers}


def test_kopf_gives_a_daemon_a_finalizer_and_we_clear_only_ours() -> None:
    registry = kopf.OperatorRegistry()
    kopf.daemon("example.dev", "v1", "things", registry=registry)(loop)
    kopf.daemon("example.dev", "v1", "things", registry=registry)(other)
    assert spawning(registry) == {"loop": True, "other": True}  # kopf's behaviour, pinned
    daemon_without_finalizer(loop, registry)
    assert spawning(registry) == {"loop": False, "other": True}


def test_a_daemon_not_in_the_registry_is_an_error_not_a_silent_finalizer() -> None:
    with pytest.raises(RuntimeError, match="no daemon handler of loop"):
        daemon_without_finalizer(loop, kopf.OperatorRegistry())


def test_the_operator_registers_its_job_daemon_without_a_finalizer() -> None:
    from llm_operator import handlers

    ours = [h for h in kopf.get_default_registry()._spawning._handlers if h.fn is handlers.run_job]
    assert ours and all(h.requires_finalizer is False for h in ours)
