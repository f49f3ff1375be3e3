"""``llmjob cluster ...``, ``llmjob tools ...`` and ``llmjob chaos ...``.

:func:`register` adds the three commands to ``llmjob``'s subparsers; :func:`main` runs them on their own
(``python -m llm_testbed.localcluster``). Every handler returns an exit code and reports a failure as
one line on stderr, never a traceback (``LLMJOB_DEBUG=1`` shows it).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from llm_testbed.localcluster import chaos, kind, nodes, paths, tools
from llm_testbed.localcluster.cluster import (
    DEFAULT_CPU_NODES,
    DEFAULT_GPU_NODES,
    DEFAULT_NAME,
    LocalCluster,
    cluster_names,
)
from llm_testbed.localcluster.errors import LocalClusterError
from llm_testbed.localcluster.kubectl import Kubectl

Handler = Callable[[argparse.Namespace], int]


def _one_line_errors(command: str) -> Callable[[Handler], Handler]:
    def decorate(fn: Handler) -> Handler:
        @functools.wraps(fn)
        def run(args: argparse.Namespace) -> int:
            try:
                return fn(args)
            except (LocalClusterError, ValueError) as exc:
                if os.environ.get("LLMJOB_DEBUG"):
                    raise
                print(f"llmjob {command}: error: {exc}", file=sys.stderr)
                return 1

        return run

    return decorate


# --------------------------------------------------------------------------------------------- cluster
@_one_line_errors("cluster up")
def cmd_cluster_up(args: argparse.Namespace) -> int:
    crds = paths.crds_dir()
    if args.kind:
        if args.karpenter or args.kubelet or args.argocd:
            raise LocalClusterError("--karpenter, --kubelet, --argocd run on this machine: not with --kind")
        kubectl = tools.ensure(["kubectl"])["kubectl"]
        nodes_wanted = DEFAULT_GPU_NODES if args.nodes is None else args.nodes
        kubeconfig = kind.up(args.name, nodes_wanted, args.cpu_nodes, kubectl, crds)
    else:
        cluster = LocalCluster(args.name)
        if args.containers and not args.run_pods:
            raise LocalClusterError("--containers runs pods in containers: it needs --run-pods")
        if args.kubelet and args.karpenter:
            raise LocalClusterError("--karpenter launches kwok nodes: it cannot go with --kubelet")
        cluster.up(args.nodes, args.cpu_nodes, port=args.port, crds_dir=crds, run_pods=args.run_pods,
                   containers=args.containers, karpenter=args.karpenter, kubelet=args.kubelet,
                   argocd=args.argocd)  # fmt: skip
        kubeconfig = cluster.kubeconfig
    print(f"kubeconfig: {kubeconfig}")
    print(f"export KUBECONFIG={kubeconfig}")
    return 0


@_one_line_errors("cluster down")
def cmd_cluster_down(args: argparse.Namespace) -> int:
    if args.kind:
        names = [args.name]
        removed = [kind.down(n) for n in names]
    else:
        names = cluster_names() if args.all else [args.name]
        removed = [LocalCluster(n, tool_paths=_kwokctl_only()).down() for n in names]
    for name, gone in zip(names, removed, strict=True):
        print(f"cluster {name}: {'deleted' if gone else 'does not exist, nothing to do'}")
    if args.all and not names:
        print("no local clusters")
    return 0


def _kwokctl_only() -> dict[str, Path]:
    """``down`` must work even when the apiserver binaries were removed: it needs kwokctl alone."""
    return tools.ensure(["kwokctl", "kubectl"])


@_one_line_errors("cluster status")
def cmd_cluster_status(args: argparse.Namespace) -> int:
    names = cluster_names() if args.all else [args.name]
    if not names:
        print("no local clusters")
        return 0
    all_running = True
    for name in names:
        status = LocalCluster(name).status()
        all_running &= status.running
        print("\n".join(status.lines()))
    return 0 if all_running else 1


@_one_line_errors("cluster kubeconfig")
def cmd_cluster_kubeconfig(args: argparse.Namespace) -> int:
    cluster = LocalCluster(args.name, tool_paths={})
    if not cluster.exists():
        raise LocalClusterError(
            f"cluster {args.name} does not exist: run `llmjob cluster up --name {args.name}`"
        )
    print(cluster.kubeconfig)
    return 0


# ----------------------------------------------------------------------------------------------- tools
@_one_line_errors("tools build")
def cmd_tools_build(args: argparse.Namespace) -> int:
    wanted = args.tools or list(tools.ALL_TOOLS)
    tools.ensure(wanted)
    _print_tools(wanted)
    return 0


@_one_line_errors("tools list")
def cmd_tools_list(args: argparse.Namespace) -> int:
    _print_tools(list(tools.ALL_TOOLS))
    return 0


def _print_tools(names: list[str]) -> None:
    for info in tools.describe(names):
        print(f"{info.name:<24} {info.version:<9} {info.source:<8} {info.path}")


# ----------------------------------------------------------------------------------------------- chaos
def _chaos_kube(args: argparse.Namespace) -> Kubectl:
    """``--name`` picks a local cluster; otherwise ``$KUBECONFIG``; otherwise the default cluster."""
    if args.name is None and os.environ.get("KUBECONFIG"):
        return Kubectl.from_env()
    cluster = LocalCluster(args.name or DEFAULT_NAME, tool_paths=tools.ensure(["kubectl"]))
    if not cluster.exists():
        raise LocalClusterError(f"cluster {cluster.name} does not exist and KUBECONFIG is not set")
    return cluster.kube


@_one_line_errors("chaos")
def cmd_chaos(args: argparse.Namespace) -> int:
    kube = _chaos_kube(args)
    action: str = args.action
    if action == "node-not-ready":
        chaos.node_not_ready(args.node, kube=kube)
        print(f"node {args.node}: NotReady")
    elif action == "node-ready":
        chaos.node_ready(args.node, kube=kube)
        print(f"node {args.node}: Ready")
    elif action == "delete-node":
        chaos.delete_node(args.node, kube=kube)
        print(f"node {args.node}: deleted")
    elif action == "add-node":
        name = chaos.add_node(args.node_name, kind=args.type, zone=args.zone, kube=kube)
        print(f"node {name}: added and Ready")
    elif action == "taint":
        chaos.taint_for_termination(args.node, args.kind, kube=kube)
        print(f"node {args.node}: marked for termination ({args.kind})")
    elif action == "untaint":
        chaos.clear_termination(args.node, args.kind, kube=kube)
        print(f"node {args.node}: {args.kind} termination mark removed")
    elif action == "fault":
        value = chaos.node_fault(args.node, args.kind, args.value, kube=kube)
        print(f"node {args.node}: fault {args.kind}={value} (pods the runner starts there from now on)")
    elif action == "clear-fault":
        chaos.clear_node_fault(args.node, args.kind, kube=kube)
        print(f"node {args.node}: fault {args.kind or 'marks'} cleared")
    elif action == "fail-pod":
        chaos.fail_pod(args.namespace, args.pod, args.exit_code, kube=kube)
        print(f"pod {args.namespace}/{args.pod}: exited with code {args.exit_code}")
    elif action == "condition":
        chaos.set_node_condition(args.node, args.type, args.status, kube=kube)
        print(f"node {args.node}: {args.type}={args.status}")
    else:  # pragma: no cover - argparse only lets known actions through
        raise LocalClusterError(f"unknown chaos action {action}")
    return 0


# ------------------------------------------------------------------------------------------- argparse
def _nonneg(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"not a TCP port: {value}")
    return value


def register(subparsers: Any) -> None:
    """Add ``cluster``, ``tools`` and ``chaos`` to ``llmjob``'s subparsers (each sets ``func``)."""
    _register_cluster(subparsers)
    _register_tools(subparsers)
    _register_chaos(subparsers)


def _register_cluster(subparsers: Any) -> None:
    p = subparsers.add_parser("cluster", help="local control plane: up | down | status | kubeconfig")
    sub = p.add_subparsers(dest="cluster_command", required=True, metavar="ACTION")

    up = sub.add_parser("up", help="start a local cluster of fake p5.48xlarge nodes (idempotent)")
    up.add_argument("--name", default=DEFAULT_NAME, help=f"cluster name (default {DEFAULT_NAME})")
    up.add_argument(
        "--nodes",
        type=_nonneg,
        default=None,
        help=f"static fake p5.48xlarge GPU nodes (default {DEFAULT_GPU_NODES}; 0 with --karpenter)",
    )
    up.add_argument(
        "--cpu-nodes",
        type=_nonneg,
        default=DEFAULT_CPU_NODES,
        help=f"fake m5.2xlarge CPU nodes for rendezvous servers (default {DEFAULT_CPU_NODES})",
    )
    up.add_argument("--port", type=_port, default=0, help="kube-apiserver port (default: a free one)")
    up.add_argument(
        "--run-pods",
        action="store_true",
        help="run the pods for real as local processes (the local pod runner) instead of faking them",
    )
    up.add_argument(
        "--containers",
        action="store_true",
        help="with --run-pods: pods whose images `make images` built run in containers (podman + runc)",
    )
    up.add_argument(
        "--karpenter",
        action="store_true",
        help="run real Karpenter (its kwok provider): it launches p5.48xlarge/m5.2xlarge nodes for Pending "
        "pods and consolidates empty ones; no static GPU nodes unless --nodes says so",
    )
    up.add_argument(
        "--kubelet",
        action="store_true",
        help="the nodes are real: a kubelet and containerd each on this machine, CNI bridges, CoreDNS, "
        "kube-proxy, images from a local registry (root; builds the node tier's tools the first time)",
    )
    up.add_argument(
        "--argocd",
        action="store_true",
        help="run Argo CD core (application controller, repo server, Redis) against the cluster, with a "
        "local git repository to sync Applications from (builds Argo CD the first time: several minutes)",
    )
    up.add_argument(
        "--kind",
        action="store_true",
        help="create a kind cluster instead (needs kind and Docker; not used by tests)",
    )
    up.set_defaults(func=cmd_cluster_up)

    down = sub.add_parser("down", help="stop a local cluster and delete its files (idempotent)")
    which = down.add_mutually_exclusive_group()
    which.add_argument("--name", default=DEFAULT_NAME, help=f"cluster name (default {DEFAULT_NAME})")
    which.add_argument("--all", action="store_true", help="every local cluster")
    down.add_argument("--kind", action="store_true", help="delete the kind cluster of that name")
    down.set_defaults(func=cmd_cluster_down)

    status = sub.add_parser("status", help="components and nodes; exit 0 only if running")
    which = status.add_mutually_exclusive_group()
    which.add_argument("--name", default=DEFAULT_NAME, help=f"cluster name (default {DEFAULT_NAME})")
    which.add_argument("--all", action="store_true", help="every local cluster")
    status.set_defaults(func=cmd_cluster_status)

    kc = sub.add_parser("kubeconfig", help="print the kubeconfig path of a cluster")
    kc.add_argument("--name", default=DEFAULT_NAME, help=f"cluster name (default {DEFAULT_NAME})")
    kc.set_defaults(func=cmd_cluster_kubeconfig)


def _register_tools(subparsers: Any) -> None:
    p = subparsers.add_parser("tools", help="pinned upstream binaries: build | list")
    sub = p.add_subparsers(dest="tools_command", required=True, metavar="ACTION")
    build = sub.add_parser("build", help="build missing tools into the per-machine cache")
    build.add_argument(
        "tools", nargs="*", metavar="TOOL", help=f"default: all of {', '.join(tools.ALL_TOOLS)}"
    )
    build.set_defaults(func=cmd_tools_build)
    lst = sub.add_parser("list", help="paths, versions and state of every tool (builds nothing)")
    lst.set_defaults(func=cmd_tools_list)


def _register_chaos(subparsers: Any) -> None:
    p = subparsers.add_parser("chaos", help="inject node and pod failures into a local cluster")
    p.add_argument(
        "--name", default=None, help=f"local cluster (default: $KUBECONFIG, else cluster {DEFAULT_NAME})"
    )
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    for action, text in (
        ("node-not-ready", "the node's kubelet stops reporting ready"),
        ("node-ready", "the node reports ready again"),
        ("delete-node", "the node object goes away (instance terminated)"),
    ):
        a = sub.add_parser(action, help=text)
        a.add_argument("node")
    add = sub.add_parser("add-node", help="add a fake node (capacity comes back)")
    add.add_argument("--node-name", default=None, help="default: next free <type>-node-<i>")
    add.add_argument("--type", choices=sorted(nodes.SHAPES), default="gpu", help="gpu (default) or cpu")
    add.add_argument("--zone", default=None, help="topology.kubernetes.io/zone (default: like the others)")
    for action, text in (("taint", "mark the node for termination"), ("untaint", "remove that mark")):
        t = sub.add_parser(action, help=text)
        t.add_argument("node")
        t.add_argument(
            "--kind",
            choices=chaos.TERMINATION_KINDS,
            required=True,
            help="karpenter: karpenter.sh/disrupted; spot: NTH spot-itn taint; cordon",
        )
    fault = sub.add_parser(
        "fault", help="make the node's pods fail a health check for real (needs cluster up --run-pods)"
    )
    fault.add_argument("node")
    fault.add_argument(
        "--kind",
        choices=chaos.FAULT_KINDS,
        required=True,
        help="readonly-volumes: PVC volumes mounted read-only; cpu: a CPU quota of --value cores (0.1);"
        " shm: /dev/shm a tmpfs of --value bytes (1Mi)",
    )
    fault.add_argument("--value", default=None, help="cores (cpu) or a size such as 1Mi (shm)")
    clear = sub.add_parser("clear-fault", help="remove a fault mark (default: all) from the node")
    clear.add_argument("node")
    clear.add_argument("--kind", choices=chaos.FAULT_KINDS, default=None)
    cond = sub.add_parser(
        "condition", help="set a node condition as a node agent does (EKS node monitoring agent's, say)"
    )
    cond.add_argument("node")
    cond.add_argument(
        "--type", default="AcceleratedHardwareReady", help="condition type (default: %(default)s)"
    )
    cond.add_argument("--status", choices=("True", "False", "Unknown"), required=True)
    fail = sub.add_parser("fail-pod", help="the pod's containers exit with a code (0: Succeeded)")
    fail.add_argument("pod")
    fail.add_argument("--namespace", "-n", default="default")
    fail.add_argument("--exit-code", type=int, default=1)
    p.set_defaults(func=cmd_chaos)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llmjob", description="local control plane of Elastic LLM Operator")
    register(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except KeyboardInterrupt:
        print("llmjob: interrupted", file=sys.stderr)
        return 130
    return code
