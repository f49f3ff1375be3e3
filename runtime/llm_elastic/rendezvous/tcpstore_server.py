"""A long-running torch ``TCPStore`` server for the operator's dedicated c10d rendezvous pod.

``python -m llm_elastic.rendezvous.tcpstore_server --port 29400`` hosts the store as master without waiting
for workers, prints one ready line, and exits 0 on SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Sequence
from datetime import timedelta
from types import FrameType

from llm_elastic.cli_errors import ExitOnErrorParser


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid port {text!r}") from None
    if not 0 <= value < 65536:
        raise argparse.ArgumentTypeError(f"port {value} is out of range 0-65535")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The command line of the server."""
    parser = ExitOnErrorParser(
        prog="python -m llm_elastic.rendezvous.tcpstore_server",
        description="Host a torch TCPStore for torchrun's c10d rendezvous backend.",
    )
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on (default: all)")  # noqa: S104
    parser.add_argument("--port", type=_port, default=29400, help="TCP port (default: 29400; 0 = any free)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the server until SIGTERM/SIGINT."""
    args = build_parser().parse_args(argv)
    from torch._C._distributed_c10d import TCPStore  # imported late: argument errors stay fast

    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    store = TCPStore(
        host_name=args.host,
        port=args.port,
        is_master=True,
        wait_for_workers=False,
        timeout=timedelta(seconds=60),
        multi_tenant=True,
    )
    print(f"tcpstore: listening on {args.host}:{store.port}", flush=True)
    while not stop.wait(3600):
        pass
    print("tcpstore: stopping", flush=True)
    del store
    return 0


if __name__ == "__main__":
    sys.exit(main())
