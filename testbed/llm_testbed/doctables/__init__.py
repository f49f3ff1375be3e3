"""Tables of the docs that are generated from their source, and kept in sync by a test.

docs/operations.md holds each between two markers::

    <!-- generated: metrics (llmjob doc-tables) -->
    | ... |
    <!-- end generated: metrics -->

``llmjob doc-tables`` rewrites them; ``llmjob doc-tables --check`` (and tests/unit/test_docs_in_sync.py,
tests/chart/test_chart_doc_tables.py) fails when one is stale. The sources: :mod:`.metrics` (the metrics the
operator and a worker export), :mod:`.chart` (the RBAC and the alerts of the rendered chart).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

DOC = Path("docs") / "operations.md"
CHART = Path("charts") / "elastic-llm-operator"


def generators(root: Path) -> dict[str, Callable[[], str]]:
    """Table name -> the function that writes it from this checkout."""
    from llm_testbed.doctables import chart, metrics

    return {
        "metrics": metrics.table,
        "rbac": lambda: chart.rbac_table(root / CHART),
        "alerts": lambda: chart.alerts_table(root / CHART),
    }


def _block(name: str) -> re.Pattern[str]:
    return re.compile(
        rf"(<!-- generated: {name} \(llmjob doc-tables\) -->\n)(.*?)(<!-- end generated: {name} -->)", re.S
    )


def committed(text: str, name: str) -> str:
    """The table between the markers of ``name`` in ``text``."""
    found = _block(name).search(text)
    if found is None:
        raise ValueError(f"{DOC}: no block '<!-- generated: {name} (llmjob doc-tables) -->' ... end")
    return found.group(2)


def replaced(text: str, name: str, table: str) -> str:
    """``text`` with the block of ``name`` holding ``table``."""
    committed(text, name)
    return _block(name).sub(lambda m: m.group(1) + table + m.group(3), text)


def repo_root() -> Path:
    """The checkout to read and write (``LLMJOB_REPO_ROOT``, else the one this package lies in)."""
    return Path(os.environ.get("LLMJOB_REPO_ROOT") or Path(__file__).resolve().parents[3])


def run(args: argparse.Namespace) -> int:
    root = repo_root()
    doc = root / DOC
    text = doc.read_text()
    stale = []
    for name, make in generators(root).items():
        if args.only and name not in args.only:
            continue
        table = make()
        if committed(text, name) != table:
            stale.append(name)
            text = replaced(text, name, table)
    if args.check:
        for name in stale:
            print(f"{DOC}: table '{name}' is stale: run `llmjob doc-tables`", file=sys.stderr)
        return 1 if stale else 0
    doc.write_text(text)
    print(f"{DOC}: " + (f"rewrote {', '.join(stale)}" if stale else "every table current"))
    return 0


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "doc-tables",
        help="regenerate the metrics, RBAC and alert tables of docs/operations.md from their source",
    )
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 when a table is stale")
    p.add_argument("--only", action="append", choices=["metrics", "rbac", "alerts"], help="just this table")
    p.set_defaults(func=run)
