"""`llmjob operator`: run kopf with our handlers, peering, liveness and metrics."""

from __future__ import annotations

import argparse
import logging

import kopf

from llm_operator import metrics


def run_operator(args: argparse.Namespace) -> int:
    """Run until interrupted. Cluster-wide unless namespaces are given."""
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    import llm_operator.handlers  # noqa: F401  (registers the handlers)

    metrics.serve(args.metrics_port)
    liveness = f"http://0.0.0.0:{args.liveness_port}/healthz" if args.liveness_port else None
    namespaces = list(args.namespace)
    kopf.run(
        standalone=args.standalone,
        peering_name=None if args.standalone else args.peering,
        clusterwide=not namespaces,
        namespaces=namespaces,
        liveness_endpoint=liveness,
    )
    return 0
