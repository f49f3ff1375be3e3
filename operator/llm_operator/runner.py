"""`llmjob operator`: start-up checks, then kopf with our handlers, peering, probes and metrics."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import secrets
import socket
from typing import Any

import kopf

from llm_operator import metrics
from llm_operator.kube import connect
from llm_operator.logs import configure_logging
from llm_operator.peering import EXIT_NOT_READY, StartupError, peering_targets, prepare
from llm_operator.readiness import ServingMonitor, serve_probes

log = logging.getLogger("llm_operator.runner")


def own_identity() -> str:
    """The name this replica has in the peering object: the pod name in a cluster (POD_ID), else host/pid."""
    return os.environ.get("POD_ID") or f"{socket.gethostname()}/{os.getpid()}/{secrets.token_hex(3)}"


def kopf_identity(identity: str) -> Any:
    """kopf's Identity type is not exported; at run time it is the string itself."""
    return identity


def random_priority() -> int:
    """Every replica gets its own peering priority: with equal priorities kopf pauses all of them."""
    return secrets.randbelow(2**31 - 2) + 1


async def operate(args: argparse.Namespace) -> int:
    """Probes first (they answer "starting"), then the start-up checks, then kopf until it stops."""
    import llm_operator.handlers  # noqa: F401  (registers the handlers)

    namespaces = list(dict.fromkeys(args.namespace))
    identity = own_identity()
    priority = args.priority or random_priority()
    targets = [] if args.standalone else peering_targets(args.peering, namespaces)
    monitor = ServingMonitor(targets, identity, args.standalone)
    probes = await serve_probes(monitor, args.liveness_port) if args.liveness_port else None
    api = await connect()
    watcher: asyncio.Task[None] | None = None
    try:
        try:
            await prepare(
                api,
                namespaces=namespaces,
                standalone=args.standalone,
                peering_name=args.peering,
                timeout=args.startup_timeout,
            )
        except StartupError as exc:
            log.error(f"cannot start: {exc}")
            return EXIT_NOT_READY
        scope = "every namespace" if not namespaces else ", ".join(namespaces)
        log.info(f"starting kopf as {identity!r} (priority {priority}) for {scope}")
        watcher = asyncio.create_task(monitor.run(api), name="serving monitor")
        await kopf.operator(
            standalone=args.standalone,
            peering_name=None if args.standalone else args.peering,
            priority=priority,
            identity=kopf_identity(identity),
            clusterwide=not namespaces,
            namespaces=namespaces,
        )
    finally:
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        if probes is not None:
            await probes.cleanup()
        await api.close()
    return 0


def run_operator(args: argparse.Namespace) -> int:
    """Run until interrupted. Cluster-wide unless namespaces are given."""
    configure_logging(args.log_level, args.log_format)
    metrics.serve(args.metrics_port)
    with contextlib.suppress(asyncio.CancelledError):
        return asyncio.run(operate(args))
    return 0
