"""``python -m llm_testbed.podrunner --kubeconfig K --state-dir D --cluster NAME [--program etcd=PATH]
[--containers]``.

Started in the background by ``llmjob cluster up --run-pods`` (see :mod:`.daemon`); runs until SIGTERM,
then kills every pod process it started.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from llm_testbed.podrunner.runner import serve


def _program(text: str) -> tuple[str, str]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=PATH, got {text!r}")
    return name, path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m llm_testbed.podrunner")
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument(
        "--cluster", required=True, help="cluster name (names the cgroups and /dev/shm folder)"
    )
    parser.add_argument("--program", type=_program, action="append", default=[],
                        help="image command -> local binary, e.g. etcd=/path/to/etcd")  # fmt: skip
    parser.add_argument("--containers", action="store_true",
                        help="container mode: pods whose images are in the local podman storage run in "
                        "containers of them (podman + runc)")  # fmt: skip
    args = parser.parse_args(argv)
    args.state_dir.mkdir(parents=True, exist_ok=True)
    try:
        asyncio.run(serve(args.kubeconfig, args.state_dir, args.cluster, dict(args.program), args.containers))
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
