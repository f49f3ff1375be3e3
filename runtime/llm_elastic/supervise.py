"""``python -m llm_elastic.supervise [--max-restarts N] -- PROGRAM ARGS...``: recovery layer 2 inside a pod.

The operator runs an in-process worker (one process per pod) under this supervisor. When the program fails
on its own (an exit code that is not one of the runtime's final answers, or a signal such as the kernel's
OOM kill), the supervisor starts it again in the same pod: the new process joins the job as a new member
and gets the state from a peer. After ``--max-restarts`` restarts it gives up and exits with the program's
code, so the pod fails and the operator replaces it (layer 3). It imports nothing heavy (no torch).

Final answers, passed on without a restart: 0 (done or stopped), 2 (usage), 3 (evicted: the pod is being
replaced), 4 (no generation formed), 5 (the state is lost: only a job restart helps), 78 (the node is
unhealthy: the operator replaces the pod elsewhere). SIGTERM and SIGINT go
to the program, and a supervisor that received one never restarts it (nor starts it, if the signal came
first: it exits 128 + the signal's number). Each restart prints one JSON line
``{"event": "process-restarted", ...}`` and sets ``$LLMJOB_PROCESS_RESTARTS`` for the program (its metrics
export it as ``llm_trainer_process_restarts``; the members add it up in ``llm_trainer_job_process_restarts``,
which the operator reads and counts against maxRestarts).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from types import FrameType

from llm_elastic.cli_errors import ExitOnErrorParser
from llm_elastic.contract import PROCESS_RESTARTS_ENV

FINAL = frozenset({0, 2, 3, 4, 5, 78})


def should_restart(code: int) -> bool:
    """Whether an exit code means the program failed on its own (a signal shows as a negative code)."""
    return code not in FINAL


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = ExitOnErrorParser(prog="python -m llm_elastic.supervise", description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-restarts", type=int, default=3, help="restarts inside the pod (default 3)")
    parser.add_argument("program", nargs=argparse.REMAINDER, help="-- PROGRAM ARGS...")
    args = parser.parse_args(list(argv))
    if args.program[:1] == ["--"]:
        args.program = args.program[1:]
    if not args.program:
        parser.error("no program given: python -m llm_elastic.supervise -- PROGRAM ARGS...")
    if args.max_restarts < 0:
        parser.error("--max-restarts must not be negative")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    child: subprocess.Popen[bytes] | None = None
    stop_signal: int | None = None

    def forward(signum: int, _frame: FrameType | None) -> None:
        nonlocal stop_signal
        stop_signal = signum
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    restarts = 0
    while True:
        if stop_signal is not None:  # told to stop before (or between) starts: start nothing more
            return 128 + stop_signal
        env = dict(os.environ, **{PROCESS_RESTARTS_ENV: str(restarts)})
        try:
            child = subprocess.Popen(args.program, env=env)
        except OSError as exc:
            print(
                f"python -m llm_elastic.supervise: error: cannot start {args.program[0]!r}: {exc}",
                file=sys.stderr,
            )
            return 127
        if stop_signal is not None:  # the signal came while the child was being started
            child.send_signal(stop_signal)
        code = child.wait()
        if stop_signal is not None or not should_restart(code) or restarts >= args.max_restarts:
            return code if code >= 0 else 128 - code
        restarts += 1
        event = {"event": "process-restarted", "time": time.time(), "exit_code": code, "restarts": restarts}
        print(json.dumps(event), flush=True)


if __name__ == "__main__":
    sys.exit(main())
