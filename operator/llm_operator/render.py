"""`llmjob render`: print every object the operator would create, without a cluster."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, TextIO

import yaml

from llm_operator.api.validate import validate
from llm_operator.builders.desired import desired_objects
from llm_operator.policy.storage import checkpoint_warning
from llm_operator.settings import Settings


class RenderError(Exception):
    """Problems found in the input; each line names a file and a field."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


def load_documents(path: str) -> list[Any]:
    """Parse a YAML stream from a file ('-' is standard input); empty documents are skipped."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as exc:
        raise RenderError([f"{path}: cannot read: {exc.strerror or exc}"]) from None
    try:
        return [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise RenderError([f"{path}: not valid YAML{where}: {problem}"]) from None


def render(
    paths: list[str], settings: Settings, namespace: str | None = None, warnings: TextIO | None = None
) -> list[dict[str, Any]]:
    """Validate every job in the files and return all objects, in file order.

    Jobs the API accepts but that will not behave as users expect (checkpoints not on a shared volume)
    get one ``llmjob render: warning: ...`` line each on ``warnings`` (standard error by default).
    """
    out = warnings if warnings is not None else sys.stderr
    problems: list[str] = []
    objects: list[dict[str, Any]] = []
    for path in paths:
        for number, doc in enumerate(load_documents(path), start=1):
            if isinstance(doc, dict) and namespace and not doc.get("metadata", {}).get("namespace"):
                doc.setdefault("metadata", {})["namespace"] = namespace
            result = validate(doc)
            prefix = f"{path}" + (f" (document {number})" if number > 1 else "")
            problems += [f"{prefix}: {p}" for p in result.problems]
            if result.job is not None:
                objects += desired_objects(result.job, settings)
                warning = checkpoint_warning(result.job)
                if warning is not None:
                    print(f"llmjob render: warning: {prefix}: {warning}", file=out)
    if problems:
        raise RenderError(problems)
    return objects


def write_stream(objects: list[dict[str, Any]], out: TextIO) -> None:
    """Write objects as a YAML stream."""
    yaml.safe_dump_all(objects, out, sort_keys=False, width=120, explicit_start=True)
