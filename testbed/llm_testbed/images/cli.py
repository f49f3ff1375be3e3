"""``llmjob images build|list`` and ``python -m llm_testbed.images`` (standard library only).

``build`` prints one line per image on stdout, ``<name> <reference>``, for scripts and tests to read;
progress goes to stderr. A failure is reported on stderr (the step, the reason, the log's tail and path)
with exit status 1, no traceback (``LLMJOB_DEBUG=1`` shows it).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Sequence
from typing import Any

from llm_testbed.images import build
from llm_testbed.images.podman import Podman
from llm_testbed.images.recipe import RECIPES
from llm_testbed.localcluster.errors import LocalClusterError
from llm_testbed.localcluster.paths import repo_root


def cmd_build(args: argparse.Namespace) -> int:
    refs = build.ensure(args.images or list(RECIPES))
    for name, reference in refs.items():
        print(f"{name} {reference}")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    podman = Podman.of_cache() if shutil.which("podman") else None
    root = repo_root()
    for name in args.images or list(RECIPES):
        image = build.plan(root, RECIPES[name])
        state = "missing (no podman on PATH)"
        if podman is not None:
            built = podman.image_exists(image.reference)
            state = f"built, {podman.size(image.reference) / 2**20:.0f} MiB" if built else "missing"
        print(f"{name:<9} {image.reference}  {state}")
    return 0


def _handled(args: argparse.Namespace) -> int:
    try:
        code: int = args.images_func(args)
    except LocalClusterError as exc:
        if os.environ.get("LLMJOB_DEBUG"):
            raise
        print(f"llmjob images {args.images_command}: error: {exc}", file=sys.stderr)
        return 1
    return code


def _image_name(text: str) -> str:
    if text not in RECIPES:
        raise argparse.ArgumentTypeError(f"no image {text!r}: choose from {', '.join(RECIPES)}")
    return text


def _add_actions(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="images_command", required=True, metavar="ACTION")
    names: dict[str, Any] = {"nargs": "*", "type": _image_name, "metavar": "IMAGE", "help": "default: all"}
    b = sub.add_parser(
        "build", help="build what the per-machine cache lacks; print '<name> <reference>' lines"
    )
    b.add_argument("images", **names)
    b.set_defaults(images_func=cmd_build)
    lst = sub.add_parser("list", help="each image's reference for this checkout and whether it is built")
    lst.add_argument("images", **names)
    lst.set_defaults(images_func=cmd_list)
    p.set_defaults(func=_handled)


def register(subparsers: Any) -> None:
    """Add ``images`` to ``llmjob``'s subparsers (it sets ``func``)."""
    _add_actions(
        subparsers.add_parser("images", help="operator and trainer images built with podman: build | list")
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m llm_testbed.images", description=__doc__)
    _add_actions(parser)
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
    except KeyboardInterrupt:
        print("images: interrupted", file=sys.stderr)
        return 130
    return code
