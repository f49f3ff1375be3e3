"""The test bed's `llmjob` subcommands: cluster, tools, chaos (``localcluster.cli``), images, doc-tables and
demo."""

from __future__ import annotations

import argparse
from typing import Any

from llm_testbed import doctables
from llm_testbed.images import cli as images_cli
from llm_testbed.localcluster import cli as cluster_cli


def _cmd_demo(args: argparse.Namespace) -> int:
    """The chosen story: real training (``demo_training``) or, with --fake-nodes, ``demo``."""
    if args.fake_nodes:
        from llm_testbed import demo

        return demo.run(args)
    from llm_testbed import demo_training

    return demo_training.run(args)


def register(subparsers: Any) -> None:
    """Add the test bed's commands to ``llmjob``'s subparsers (each sets ``func``)."""
    cluster_cli.register(subparsers)
    images_cli.register(subparsers)
    doctables.register(subparsers)
    p = subparsers.add_parser(
        "demo", help="local cluster + operator + a job that trains through a node loss; prints a timeline"
    )
    p.add_argument("--keep", action="store_true", help="leave the cluster running at the end")
    p.add_argument(
        "--recovery",
        choices=["inProcess", "restart"],
        default="inProcess",
        help="the job's failurePolicy.recovery (default inProcess, the fastest path; restart: torchrun)",
    )
    p.add_argument(
        "--fake-nodes",
        action="store_true",
        help="the operator-only story on fake nodes whose pods run nothing (reaction times, shrink, grow)",
    )
    p.add_argument(
        "--containers",
        action="store_true",
        help="every worker in a container of the trainer image (`make images`, podman + runc)",
    )
    p.add_argument(
        "--kubelet",
        action="store_true",
        help="real kubelet nodes (the kubelet tier: root) pulling the trainer image (`make images`)",
    )
    p.add_argument("--nodes", type=int, default=4, help="--fake-nodes: fake p5.48xlarge nodes (default 4)")
    p.add_argument("--grace", type=int, default=0, help="--fake-nodes: nodeFailureGraceSeconds (default 0)")
    p.set_defaults(func=_cmd_demo)
