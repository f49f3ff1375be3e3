"""Claims of the docs that code can check, checked against the code (issue 58).

- The README's `kubectl get llmjob` excerpt and its column comment show the CRD's printer columns.
- docs/operations.md's metrics table is what `llmjob doc-tables` generates from the metrics the operator
  and a worker export (the RBAC and alert tables need helm: tests/chart/test_chart_doc_tables.py).
- The CRDs are far below the 256 KiB that client-side apply's annotation may hold, as the docs now say.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml
from llm_testbed import doctables
from llm_testbed.doctables import metrics

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
CRDS = sorted((ROOT / "crds").glob("elasticllm.dev_*.yaml"))
ANNOTATION_LIMIT = 256 * 1024
"""What the annotations of one object may hold in total (kube-apiserver), client-side apply's included."""


def _printer_columns(priority: int) -> list[str]:
    crd = yaml.safe_load((ROOT / "crds" / "elasticllm.dev_llmtrainingjobs.yaml").read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["served"]]
    columns: list[dict[str, Any]] = version["additionalPrinterColumns"]
    return [c["name"].upper() for c in columns if c.get("priority", 0) == priority]


def test_readme_kubectl_get_excerpt_has_the_crds_printer_columns() -> None:
    found = re.search(r"^\$ kubectl get llmjob[^\n]*\n(NAME [^\n]*)\n(\S[^\n]*)\n", README, re.MULTILINE)
    assert found, "README.md: no `$ kubectl get llmjob` excerpt with a header line"
    header, row = found.group(1).split(), found.group(2).split()
    assert header == ["NAME", *_printer_columns(0)], "the excerpt is not from this CRD's printer columns"
    assert len(row) == len(header), f"a row of {len(row)} cells under {len(header)} columns: {row}"


def test_readme_column_comment_names_the_default_and_wide_columns() -> None:
    found = re.search(r"kubectl get llmjob -n \S+ +# ([A-Z ]+) \(-o wide: ([A-Z ]+)\)", README)
    assert found, "README.md: no `kubectl get llmjob  # COLUMNS (-o wide: COLUMNS)` line"
    assert found.group(1).split() == _printer_columns(0)
    assert found.group(2).split() == _printer_columns(1)


def test_the_metrics_table_is_generated_from_the_exported_metrics() -> None:
    text = (ROOT / doctables.DOC).read_text()
    assert doctables.committed(text, "metrics") == metrics.table(), (
        "docs/operations.md: the metrics table is stale: run `llmjob doc-tables`"
    )


def test_every_exported_metric_is_in_the_table_once() -> None:
    """The generator itself: a metric defined in the operator or served by a worker gets a row."""
    table = metrics.table()
    names = [n for n, *_ in metrics.operator_metrics()] + [n for n, *_ in metrics.worker_metrics()]
    assert {
        "llmjob_rule_fired_total",
        "llm_trainer_tokens_per_second",
        "llm_trainer_rule_fired_total",
    } <= set(names)
    for name in names:
        assert table.count(f"| `{name}` |") == 1, name
    assert "`kind` = desired, target, ready, members, waiting" in table


def test_crds_are_far_below_the_client_side_apply_annotation_limit() -> None:
    """The docs no longer say server-side apply is needed for size; keep it true with room to grow."""
    for path in CRDS:
        size = len(json.dumps(yaml.safe_load(path.read_text()), separators=(",", ":")))
        assert size < ANNOTATION_LIMIT // 2, f"{path.name}: {size} bytes as JSON"
