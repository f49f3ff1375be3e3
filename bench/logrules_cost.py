"""What log rules cost a worker, and how fast they act (spec.monitoring.rules, docs/benchmarks.md).

Two figures, on this machine, with the three rules of the issue's example (a recurring step rule, a
throughput threshold over 20 numbers, and a pattern alone) and a typical 120-byte step line:

- **reader**: the whole supervisor path, ns per line: a program writes N lines as fast as it can, through
  ``python -m llm_elastic.supervise`` with the rules, minus the same program's time without rules (its output
  then goes straight to the pod log): read, pass through, split, match;
- **to action**: a program prints a step line, then hangs; wall time from that line to the
  ``process-restarted`` event of restartWorker (expectedRecurringSeconds 1; the figure minus 1 s is the
  supervisor's reaction), median over ``--rounds``.

The share of a 1 s step is reader ns/line x lines per step / 1e9, for 1 and 100 lines per step.

    python bench/logrules_cost.py [--lines 200000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RULES = [
    {
        "name": "steps",
        "logPattern": r"step (\d+) loss",
        "expectedRecurringSeconds": 1,
        "action": "restartWorker",
    },
    {
        "name": "throughput",
        "logPattern": r"tokens/s (\d+(\.\d+)?)",
        "metricThreshold": 1000,
        "operator": "lt",
        "dataPoints": 20,
        "action": "replaceNode",
    },
    {"name": "xid", "logPattern": r"NCCL error|Xid \d+", "action": "replaceNode"},
]
LINE = (
    b"step 1234 loss 2.3456 lr 3.0e-04 grad_norm 1.02 tokens/s 45678.9 step_time 0.734 s mem 61.2 GiB"
    + b" " * 22
)
WRITER = """
import sys
line = {line!r} + b"\\n"
out = sys.stdout.buffer
for _ in range({n}):
    out.write(line)
out.flush()
"""
HANG = """
import sys, time, os
if os.environ.get("LLMJOB_PROCESS_RESTARTS", "0") != "0":
    sys.exit(0)
print(f"step 1 loss 2.0 at {time.time():.6f}", flush=True)
time.sleep(60)
"""


def supervise(script: str, rules: list[dict[str, object]] | None, *flags: str) -> tuple[float, bytes]:
    env = dict(os.environ, LLMJOB_LOG_RULES=json.dumps(rules or []))
    with tempfile.TemporaryDirectory() as tmp:
        env["LLMJOB_TERMINATION_LOG"] = str(Path(tmp) / "term")
        argv = [sys.executable, "-m", "llm_elastic.supervise", *flags]
        if rules:
            argv.append("--rules-env=LLMJOB_LOG_RULES")
        start = time.perf_counter()
        done = subprocess.run(
            [*argv, "--", sys.executable, "-c", script], env=env, capture_output=True, check=False
        )
        return time.perf_counter() - start, done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    n = args.lines
    writer = WRITER.format(line=LINE, n=n)
    plain = min(supervise(writer, None)[0] for _ in range(args.rounds))
    ruled = min(supervise(writer, RULES, "--max-restarts=0")[0] for _ in range(args.rounds))
    reader_ns = max(0.0, ruled - plain) / n * 1e9
    print(f"reader: {reader_ns:.0f} ns/line ({n} lines: {plain:.2f} s without rules, {ruled:.2f} s with)")
    for per_step in (1, 100):
        print(f"  share of a 1 s step at {per_step} line(s)/step: {reader_ns * per_step / 1e9 * 100:.4f} %")

    delays = []
    for _ in range(args.rounds):
        _, out = supervise(HANG, RULES[:1], "--max-restarts=0", "--max-rule-restarts=1", "--kill-grace=1")
        lines = out.decode(errors="replace").splitlines()
        printed = float(next(ln for ln in lines if ln.startswith("step 1 ")).rsplit(" at ", 1)[1])
        restarted = next(json.loads(ln) for ln in lines if '"process-restarted"' in ln)
        delays.append(restarted["time"] - printed)
    print(
        f"to action: last step line -> restartWorker {statistics.median(delays):.3f} s median"
        f" (max {max(delays):.3f} s; expectedRecurringSeconds 1)"
    )


if __name__ == "__main__":
    main()
