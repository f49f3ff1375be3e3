"""`llmjob`: the command line (render, convert, crd, api-docs, operator).

More commands come from plugins: every entry point of the group ``llmjob.commands`` names a function
``register(subparsers)`` that adds its commands. The test bed registers ``cluster``, ``tools``, ``chaos``
and ``demo`` there (pyproject.toml); the operator package never imports it, and in the operator image,
which does not carry the test bed, the entry point finds no module and is skipped.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from importlib.metadata import PackageNotFoundError, entry_points, version
from typing import Any

from llm_operator.logs import FORMATS as LOG_FORMATS
from llm_operator.render import RenderError, render_documents, write_documents
from llm_operator.settings import Settings

EXIT_USAGE = 2
DISTRIBUTION = "elastic-llm-operator"
"""The installed project whose version ``llmjob --version`` prints (pyproject.toml's, the one version)."""
PLUGIN_GROUP = "llmjob.commands"
"""Entry-point group of the plugins that add commands to ``llmjob``."""

Register = Callable[[Any], None]
"""A plugin: adds its commands to ``llmjob``'s subparsers (each command sets ``func``)."""


def installed_plugins() -> Iterator[Register]:
    """The ``register`` functions of the installed plugins. One that cannot be imported is skipped, as the
    test bed is in the operator image (its entry point is in the project's metadata, its package is not);
    ``LLMJOB_DEBUG`` set: the import error is raised instead."""
    for point in entry_points(group=PLUGIN_GROUP):
        try:
            register: Register = point.load()
        except ImportError:
            if os.environ.get("LLMJOB_DEBUG"):
                raise
            continue
        yield register


def _cmd_render(args: argparse.Namespace) -> int:
    try:
        settings = Settings.from_env()
    except ValueError as exc:
        print(f"llmjob render: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        objects = render_documents(args.filename, settings, namespace=args.namespace)
    except RenderError as exc:
        for line in exc.problems:
            print(line, file=sys.stderr)
        print(f"llmjob render: {len(exc.problems)} problem(s); nothing rendered", file=sys.stderr)
        return EXIT_USAGE
    write_documents(objects, sys.stdout)
    return 0


def _cmd_convert(args: argparse.Namespace) -> int:
    from llm_operator.convert import ConvertError, convert_documents
    from llm_operator.render import load_documents, write_stream

    try:
        converted = convert_documents(load_documents(args.filename))
    except RenderError as exc:  # unreadable file, not YAML
        problems = exc.problems
    except ConvertError as exc:
        problems = [f"{args.filename}: {line}" for line in exc.problems]
    else:
        problems = []
    if problems:
        for line in problems:
            print(f"llmjob convert: {line}", file=sys.stderr)
        print("llmjob convert: nothing converted", file=sys.stderr)
        return EXIT_USAGE
    for item in converted:
        for line in item.warnings:
            print(f"llmjob convert: warning: {item.source}: {line}", file=sys.stderr)
    write_stream([item.job for item in converted], sys.stdout)
    return 0


def _cmd_crd(args: argparse.Namespace) -> int:
    from llm_operator.api.crd import crd_yaml

    sys.stdout.write(crd_yaml(args.kind))
    return 0


def _cmd_docs(args: argparse.Namespace) -> int:
    from llm_operator.api.reference import reference

    sys.stdout.write(reference())
    return 0


def _cmd_operator(args: argparse.Namespace) -> int:
    from llm_operator.runner import run_operator

    if args.mark_unhealthy_nodes:  # read with the other settings (Settings.from_env)
        os.environ["LLMJOB_MARK_UNHEALTHY_NODES"] = "true"
    return run_operator(args)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def installed_version() -> str:
    """The installed project's version (its metadata, written from pyproject.toml)."""
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return "unknown (not installed: pip install .)"


def build_parser(plugins: Sequence[Register] = ()) -> argparse.ArgumentParser:
    """The whole command line: the built-in commands, the installed plugins', then ``plugins`` (those not
    installed already; ``python -m llm_testbed`` passes its own)."""
    parser = argparse.ArgumentParser(
        prog="llmjob",
        description="Elastic LLM training on Kubernetes: render jobs, run the operator, local clusters.",
        epilog=f"Plugins add more commands (entry-point group {PLUGIN_GROUP}); the test bed's cluster, tools,"
        " chaos and demo appear once the project is installed (`make setup`, `pip install -e .`).",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {installed_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("render", help="print every object the operator would create for job manifests")
    p.add_argument(
        "-f",
        "--filename",
        action="append",
        required=True,
        help="job and runtime manifests (YAML, '-' = stdin); a job's runtime must be in one of them",
    )
    p.add_argument("-n", "--namespace", help="namespace for manifests that name none (default: default)")
    p.set_defaults(func=_cmd_render)

    p = sub.add_parser(
        "convert",
        help="print a Kubeflow PyTorchJob, TorchElastic ElasticJob or Kubeflow TrainJob as an LLMTrainingJob",
        description="Convert kubeflow.org/v1 PyTorchJob, elastic.pytorch.org/v1alpha1 ElasticJob and"
        " trainer.kubeflow.org/v1alpha1 TrainJob (with its ClusterTrainingRuntime or TrainingRuntime in the"
        " same file) into LLMTrainingJob YAML on standard output; one warning line per source field without"
        " an equivalent on standard error. Invalid input: exit 2.",
    )
    p.add_argument("-f", "--filename", required=True, help="the source manifest (YAML, '-' = stdin)")
    p.set_defaults(func=_cmd_convert)

    p = sub.add_parser("crd", help="print a CRD generated from the API models (default: LLMTrainingJob)")
    p.add_argument(
        "--kind",
        default="LLMTrainingJob",
        choices=["LLMTrainingJob", "LLMTrainingRuntime", "ClusterLLMTrainingRuntime"],
        help="which kind's CRD",
    )
    p.set_defaults(func=_cmd_crd)

    p = sub.add_parser("api-docs", help="print the Markdown API reference generated from the models")
    p.set_defaults(func=_cmd_docs)

    p = sub.add_parser("operator", help="run the operator (kopf) against the current kubeconfig")
    scope = p.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", action="append", default=[], help="watch this namespace (repeat)")
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch every namespace (default)")
    p.add_argument("--metrics-port", type=int, default=9090, help="Prometheus /metrics port (0 = off)")
    p.add_argument(
        "--liveness-port", type=int, default=8080, help="probe port: /healthz and /readyz (0 = off)"
    )
    peer = p.add_mutually_exclusive_group()
    peer.add_argument(
        "--peering",
        default="elastic-llm-operator",
        help="kopf peering object name (HA); created at start-up when missing and permitted",
    )
    peer.add_argument("--standalone", action="store_true", help="no peering (single replica, tests)")
    p.add_argument(
        "--priority",
        type=_positive_int,
        default=0,
        help="peering priority: the highest live one serves (default: random per start)",
    )
    p.add_argument(
        "--startup-timeout",
        type=float,
        default=60.0,
        help="seconds to wait for the CRDs and the peering object at start-up before exiting 3",
    )
    p.add_argument(
        "--mark-unhealthy-nodes",
        action="store_true",
        help="label and taint (NoSchedule) nodes a worker found unhealthy, for every workload; needs"
        " patch on nodes (same as LLMJOB_MARK_UNHEALTHY_NODES=true)",
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument(
        "--log-format",
        default="text",
        choices=LOG_FORMATS,
        help="text lines, or one JSON object per line (timestamp, severity, logger, message; a job's lines"
        " also name it under 'object'); docs/operations.md, \"Logs\"",
    )
    p.set_defaults(func=_cmd_operator)

    registered: list[Register] = []
    for register in [*installed_plugins(), *plugins]:
        if register not in registered:
            register(sub)
            registered.append(register)
    return parser


def main(argv: Sequence[str] | None = None, plugins: Sequence[Register] = ()) -> int:
    parser = build_parser(plugins)
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
    except BrokenPipeError:  # e.g. `llmjob render ... | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print("llmjob: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # one line, never a traceback, unless asked for
        if os.environ.get("LLMJOB_DEBUG"):
            raise
        print(f"llmjob {args.command}: error: {exc}", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
