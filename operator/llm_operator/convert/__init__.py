"""`llmjob convert`: a Kubeflow PyTorchJob, a TorchElastic ElasticJob or a Kubeflow Trainer TrainJob as an
LLMTrainingJob, with one warning per source field that has no equivalent (docs/platform.md, "Migration").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from llm_operator.convert import elasticjob, pytorchjob, trainjob
from llm_operator.convert.source import ConvertError, Report

__all__ = ["SOURCES", "ConvertError", "Converted", "convert_documents"]

Converter = Callable[[dict[str, Any], Report, list[Any]], dict[str, Any]]

SOURCES: dict[tuple[str, str], Converter] = {
    (pytorchjob.API_VERSION, pytorchjob.KIND): lambda doc, report, _: pytorchjob.convert(doc, report),
    (elasticjob.API_VERSION, elasticjob.KIND): lambda doc, report, _: elasticjob.convert(doc, report),
    (trainjob.API_VERSION, trainjob.KIND): trainjob.convert,
}
"""(apiVersion, kind) of each source kind -> its converter."""
COMPANIONS = {(trainjob.API_VERSION, kind) for kind in trainjob.RUNTIME_KINDS}
"""Documents read by a source's converter, not converted themselves."""


@dataclass(frozen=True)
class Converted:
    """One LLMTrainingJob and the warnings of its conversion."""

    job: dict[str, Any]
    warnings: list[str]
    source: str
    """Which document it came from: ``<kind> <name>``."""


def _supported() -> str:
    return ", ".join(f"{kind} ({api})" for api, kind in SOURCES)


def convert_documents(documents: list[Any]) -> list[Converted]:
    """Convert every source job in ``documents`` (runtimes a TrainJob names may be among them)."""
    out: list[Converted] = []
    problems: list[str] = []
    for number, doc in enumerate(documents, start=1):
        where = f"document {number}"
        if not isinstance(doc, dict):
            problems.append(f"{where}: must be a mapping (a Kubernetes object)")
            continue
        key = (str(doc.get("apiVersion")), str(doc.get("kind")))
        if key in COMPANIONS:
            continue
        converter = SOURCES.get(key)
        if converter is None:
            problems.append(f"{where}: apiVersion/kind {key[0]}/{key[1]} is not one of {_supported()}")
            continue
        name = str((doc.get("metadata") or {}).get("name") or "")
        report = Report()
        try:
            job = converter(doc, report, documents)
        except ConvertError as exc:
            problems += [f"{key[1]} {name or where}: {p}" for p in exc.problems]
            continue
        out.append(Converted(job, report.lines, f"{key[1]} {name}"))
    if problems:
        raise ConvertError(problems)
    if not out:
        raise ConvertError([f"no job to convert: the input holds none of {_supported()}"])
    return out
