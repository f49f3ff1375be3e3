"""The operator's only use of kopf's private API, kept in this one function (docs/decisions.md, "One
daemon per job, woken by events, with no finalizer").

kopf gives every daemon a finalizer (``kopf.daemon`` registers its handler with ``requires_finalizer=True``,
and no argument or setting changes that). Ours needs none: the job's children are garbage-collected through
``ownerReferences`` and its loop ends on the job's ``DELETED`` event, while a finalizer would block the
deletion of jobs and namespaces whenever the operator is down. kopf's maintainer declined an option for it
(nolar/kopf pull requests 896 and 1183, closed), so there is no public way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import kopf


def daemon_without_finalizer(fn: Callable[..., Any], registry: kopf.OperatorRegistry | None = None) -> None:
    """Clear ``requires_finalizer`` on the daemon handlers of ``fn`` (already registered with
    ``@kopf.daemon``) in ``registry`` (default: kopf's default registry). Reaches into
    ``registry._spawning._handlers`` (kopf 1.x; pinned ``kopf<2``); raises when it finds no such handler, so
    a kopf that moved them fails at import instead of putting finalizers back silently."""
    spawning = (registry if registry is not None else kopf.get_default_registry())._spawning
    handlers = list(spawning._handlers)
    if not any(h.fn is fn for h in handlers):
        raise RuntimeError(f"no daemon handler of {fn.__name__} in kopf's registry to clear the finalizer of")
    spawning._handlers = [
        dataclasses.replace(h, requires_finalizer=False) if h.fn is fn else h for h in handlers
    ]
