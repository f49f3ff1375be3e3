"""``python -m llm_elastic.supervise [--max-restarts N] -- PROGRAM ARGS...``: recovery layer 2 inside a pod.

The operator runs an in-process worker (one process per pod) under this supervisor. When the program fails
on its own (an exit code that is not one of the runtime's final answers, or a signal such as the kernel's
OOM kill), the supervisor starts it again in the same pod: the new process joins the job as a new member
and gets the state from a peer. After ``--max-restarts`` restarts it gives up and exits with the program's
code, so the pod fails and the operator replaces it (layer 3). It imports nothing heavy (no torch).

With ``--rules-env NAME`` (the operator passes ``LLMJOB_LOG_RULES``), the supervisor also evaluates the
job's log rules (``llm_elastic.logrules``): it reads the program's stdout and stderr, writes every byte on
unchanged to its own, and matches each line. A rule that fires prints ``{"event": "rule-fired", "rule",
"action", "detail", "time"}`` and acts: ``event`` records only; ``restartWorker`` stops the program (SIGTERM
to its process group, SIGKILL after ``--kill-grace`` seconds) and starts it again, a restart like any other
(at most ``--max-rule-restarts``, then as restartJob); ``replaceNode`` stops it and exits 78 with
``rule-fired: <rule> replaceNode: <detail>`` as the termination message (the node is avoided);
``restartJob`` and ``failJob`` stop it and exit 79 with that message (the operator restarts every worker,
or fails the job). Without rules the program's output is not touched.

Final answers, passed on without a restart: 0 (done or stopped), 2 (usage), 3 (evicted: the pod is being
replaced), 4 (no generation formed), 5 (the state is lost: only a job restart helps), 78 (the node is
unhealthy: the operator replaces the pod elsewhere), 79 (a monitoring rule said restartJob or failJob: the
operator acts on the job). SIGTERM and SIGINT go
to the program, and a supervisor that received one never restarts it (nor starts it, if the signal came
first: it exits 128 + the signal's number). Each restart prints one JSON line
``{"event": "process-restarted", ...}`` and sets ``$LLMJOB_PROCESS_RESTARTS`` for the program (its metrics
export it as ``llm_trainer_process_restarts``; the members add it up in ``llm_trainer_job_process_restarts``,
which the operator reads and counts against maxRestarts).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType

from llm_elastic.cli_errors import ExitOnErrorParser
from llm_elastic.contract import PROCESS_RESTARTS_ENV, TERMINATION_LOG_ENV, rule_fired_message
from llm_elastic.errors import EXIT_RULE_FIRED
from llm_elastic.health import DEFAULT_TERMINATION_LOG, EXIT_UNHEALTHY
from llm_elastic.logrules import Firing, LogRules, RuleError
from llm_elastic.logrules import parse as parse_rules
from llm_elastic.watched import Output, Watched

FINAL = frozenset({0, 2, 3, 4, 5, EXIT_UNHEALTHY, EXIT_RULE_FIRED})
"""Exit codes passed on without a restart: the program's own final answers, including a rule's
(:data:`EXIT_RULE_FIRED`: restartJob or failJob, from a log rule here or a loss rule in the program)."""
KILL_GRACE = 10.0
"""Seconds a program stopped by a rule gets after SIGTERM (its process group), before SIGKILL."""


def termination_line(firing: Firing) -> str:
    """The termination message of a worker a rule ended (read by the operator, docs/CONTRACTS.md)."""
    return rule_fired_message(firing.rule, firing.action, firing.detail)


def should_restart(code: int) -> bool:
    """Whether an exit code means the program failed on its own (a signal shows as a negative code)."""
    return code not in FINAL


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = ExitOnErrorParser(prog="python -m llm_elastic.supervise", description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-restarts", type=int, default=3, help="restarts inside the pod (default 3)")
    parser.add_argument(
        "--rules-env", default="", help="environment variable with the log rules as JSON (LLMJOB_LOG_RULES)"
    )
    parser.add_argument(
        "--max-rule-restarts",
        type=int,
        default=None,
        help="restarts for restartWorker (default --max-restarts)",
    )
    parser.add_argument(
        "--kill-grace",
        type=float,
        default=KILL_GRACE,
        help="seconds after SIGTERM before SIGKILL (default 10)",
    )
    parser.add_argument("program", nargs=argparse.REMAINDER, help="-- PROGRAM ARGS...")
    args = parser.parse_args(list(argv))
    if args.program[:1] == ["--"]:
        args.program = args.program[1:]
    if not args.program:
        parser.error("no program given: python -m llm_elastic.supervise -- PROGRAM ARGS...")
    if args.max_restarts < 0:
        parser.error("--max-restarts must not be negative")
    if args.max_rule_restarts is None:
        args.max_rule_restarts = args.max_restarts
    if args.max_rule_restarts < 0:
        parser.error("--max-rule-restarts must not be negative")
    try:
        args.rules = parse_rules(os.environ.get(args.rules_env, "")) if args.rules_env else []
    except RuleError as exc:
        parser.error(f"${args.rules_env}: {exc}")
    return args


def _finish(firing: Firing, code: int) -> int:
    """Write the termination message of a worker a rule ends; its exit code."""
    with contextlib.suppress(OSError):  # not in a pod: the pod log has the rule-fired line anyway
        Path(os.environ.get(TERMINATION_LOG_ENV, DEFAULT_TERMINATION_LOG)).write_text(
            termination_line(firing) + "\n"
        )
    return code


def _start(program: list[str], watched: bool, restarts: int) -> subprocess.Popen[bytes]:
    """Start the program (``$LLMJOB_PROCESS_RESTARTS`` set); watched: its output piped, in its own process
    group, so a rule stops everything it started."""
    env = dict(os.environ, **{PROCESS_RESTARTS_ENV: str(restarts)})
    if not watched:
        return subprocess.Popen(program, env=env)
    return subprocess.Popen(
        program, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )


def _wait(
    child: subprocess.Popen[bytes],
    rules: LogRules | None,
    out: Output,
    kill_grace: float,
    stopping: Callable[[], bool],
) -> tuple[int, Firing | None]:
    """Until the program ends: its exit code, and the rule that stopped it (None: it ended on its own)."""
    if rules is None:
        return child.wait(), None
    rules.start(time.monotonic())
    watched = Watched(child, rules, out)
    while True:
        result, firing = watched.wait()
        if firing is None:
            return (result if result is not None else child.wait()), None
        out.event(firing.event(time.time()))
        if firing.action == "event" or stopping():
            continue
        return watched.stop(kill_grace), firing


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
    rules = LogRules(args.rules) if args.rules else None
    out = Output()
    restarts = rule_restarts = 0
    while True:
        if stop_signal is not None:  # told to stop before (or between) starts: start nothing more
            return 128 + stop_signal
        try:
            child = _start(args.program, rules is not None, restarts)
        except OSError as exc:
            print(
                f"python -m llm_elastic.supervise: error: cannot start {args.program[0]!r}: {exc}",
                file=sys.stderr,
            )
            return 127
        if stop_signal is not None:  # the signal came while the child was being started
            child.send_signal(stop_signal)
        code, firing = _wait(child, rules, out, args.kill_grace, lambda: stop_signal is not None)
        if firing is not None and stop_signal is None:
            if firing.action == "restartWorker" and rule_restarts < args.max_rule_restarts:
                rule_restarts += 1
                restarts += 1
                event = {
                    "event": "process-restarted",
                    "time": time.time(),
                    "exit_code": code,
                    "restarts": restarts,
                    "rule": firing.rule,
                }
                out.event(event)
                continue
            return _finish(firing, EXIT_UNHEALTHY if firing.action == "replaceNode" else EXIT_RULE_FIRED)
        if stop_signal is not None or not should_restart(code) or restarts >= args.max_restarts:
            return code if code >= 0 else 128 - code
        restarts += 1
        event = {"event": "process-restarted", "time": time.time(), "exit_code": code, "restarts": restarts}
        print(json.dumps(event), flush=True)


if __name__ == "__main__":
    sys.exit(main())
