"""A benchmark run side by side with a baseline commit: the guard against a slide that nobody sees.

``bench/e2e_recovery.py --baseline REF`` runs the bench of commit ``REF`` (its whole tree from git history,
first on ``PYTHONPATH``, so the operator, the runtime and the trainer in the pods are REF's) and then the
working tree's, one after the other on the same machine, and compares the rows of their figure tables
(``| label | n | p50 s | p99 s |``): a row whose p99 is more than :data:`WORSE_BY` above the baseline's is
named as worse. Pure parts (parsing, comparing) are unit-tested; ``run_tree`` runs a process.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from llm_testbed.release.previous import export_tree

WORSE_BY = 0.20
"""A p99 this much above the baseline's (a share) is reported as a slide."""
_ROW = re.compile(r"^\| (?P<label>[^|]+?) \| (?P<n>\d+) \| (?P<p50>[0-9.]+) s \| (?P<p99>[0-9.]+) s \|$")
PACKAGES = ("operator", "runtime", "trainer", "testbed")


@dataclass(frozen=True)
class Row:
    label: str
    n: int
    p50: float
    p99: float


def parse_rows(output: str) -> dict[str, Row]:
    """The figure rows a bench printed, by label (rows without figures are left out)."""
    rows: dict[str, Row] = {}
    for line in output.splitlines():
        match = _ROW.match(line.strip())
        if match is not None:
            label = match["label"].strip()
            rows[label] = Row(label, int(match["n"]), float(match["p50"]), float(match["p99"]))
    return rows


def compare(baseline: dict[str, Row], tree: dict[str, Row], worse_by: float = WORSE_BY) -> list[str]:
    """One line per row both runs have: both figures and, where the tree's p99 is worse by more than
    ``worse_by``, the word WORSE. A row only one side has is said too."""
    lines = []
    for label in sorted(set(baseline) | set(tree)):
        old, new = baseline.get(label), tree.get(label)
        if old is None or new is None:
            lines.append(f"{label}: only in the {'working tree' if old is None else 'baseline'}")
            continue
        verdict = "WORSE" if new.p99 > old.p99 * (1 + worse_by) else "no worse"
        lines.append(
            f"{label}: baseline {old.p50:.1f} / {old.p99:.1f} s, working tree {new.p50:.1f} / {new.p99:.1f} s"
            f" (p50 / p99): {verdict}"
        )
    return lines


def run_tree(root: Path, script: str, args: list[str]) -> str:
    """Run ``root``'s ``script`` with ``root``'s packages first on ``PYTHONPATH``; its output, echoed."""
    path = os.pathsep.join(str(root / p) for p in PACKAGES)
    env = {**os.environ, "PYTHONPATH": path, "LLMJOB_REPO_ROOT": str(root)}
    proc = subprocess.run([sys.executable, str(root / script), *args], env=env, capture_output=True,
                          text=True, check=False)  # fmt: skip
    sys.stdout.write(proc.stdout)
    sys.stderr.write(proc.stderr[-4000:])
    if proc.returncode != 0:
        print(f">> {root}: {script} exited {proc.returncode}", flush=True)
    return proc.stdout


def side_by_side(repo: Path, ref: str, script: str, args: list[str]) -> int:
    """The baseline's run, then the working tree's, then the comparison; 1 when a row is worse."""
    with tempfile.TemporaryDirectory(prefix="bench-baseline-") as tmp:
        old_root = export_tree(repo, ref, ["."], Path(tmp) / ref)
        print(f">> baseline {ref}: {script} {' '.join(args)}", flush=True)
        baseline = parse_rows(run_tree(old_root, script, args))
    print(f">> working tree: {script} {' '.join(args)}", flush=True)
    tree = parse_rows(run_tree(repo, script, args))
    print(f"\nside by side, one run ({os.cpu_count()} CPUs); p99 worse by more than {WORSE_BY:.0%} is WORSE:")
    lines = compare(baseline, tree)
    for line in lines:
        print(f"  {line}")
    return 1 if any(line.endswith("WORSE") for line in lines) else 0
