"""`llmjob render`: print every object the operator would create, without a cluster.

Runtimes (LLMTrainingRuntime, ClusterLLMTrainingRuntime) in the files are checked and used by the jobs
that name them (from any file given, in any order); the output then starts each such job with its
merged spec, the job the operator runs. A job with a Kueue queue label gets its Workload, and its
worker pods carry a comment: the operator creates them only once Kueue admits the Workload.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, TextIO

import yaml

from llm_operator.api.models import CLUSTER_RUNTIME_KIND, LLMTrainingJob
from llm_operator.api.runtime import describe, is_runtime, ref_of, runtime_key
from llm_operator.api.validate import validate, validate_runtime
from llm_operator.builders.desired import desired_objects, is_spare
from llm_operator.builders.workload import queue_name, requested_count, workload, workload_name
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


Rendered = tuple[dict[str, Any], str]
"""An object and a note about it ('' when none), written as a comment above the object."""


def _job_objects(job: LLMTrainingJob, settings: Settings, merged_from: str) -> list[Rendered]:
    out: list[Rendered] = []
    if merged_from:
        effective = job.model_dump(by_alias=True, exclude_none=True, exclude={"status"}, mode="json")
        out.append((effective, f"the job as the operator runs it: its spec merged over {merged_from}"))
    objects = desired_objects(job, settings)
    pods = [obj for obj in objects if obj["kind"] == "Pod"]
    out += [(obj, "") for obj in objects if obj["kind"] != "Pod"]
    waits = ""
    if queue_name(job) is not None:
        waits = f"created only once Kueue admits Workload {workload_name(job)} (with its flavor's placement)"
        out.append((workload(job, requested_count(job)), "Kueue admits this Workload before any worker runs"))
    return out + [(pod, _pod_note(job, pod, waits)) for pod in pods]


SPARE_NOTE = (
    "spare worker (spec.spareReplicas): holds the model and optimizer, runs no step, and takes a lost"
    " member's place at the next step boundary"
)


def _pod_note(job: LLMTrainingJob, pod: dict[str, Any], waits: str) -> str:
    notes = [SPARE_NOTE] if is_spare(job, pod) else []
    return "; ".join([*notes, *([waits] if waits else [])])


def render_documents(
    paths: list[str], settings: Settings, namespace: str | None = None, warnings: TextIO | None = None
) -> list[Rendered]:
    """Validate every job and runtime in the files; return all objects with their notes, in file order.

    Jobs the API accepts but that will not behave as users expect (checkpoints not on a shared volume)
    get one ``llmjob render: warning: ...`` line each on ``warnings`` (standard error by default).
    """
    out = warnings if warnings is not None else sys.stderr
    problems: list[str] = []
    documents: list[tuple[str, Any]] = []
    for path in paths:
        for number, doc in enumerate(load_documents(path), start=1):
            scoped = isinstance(doc, dict) and doc.get("kind") != CLUSTER_RUNTIME_KIND
            if scoped and namespace and not (doc.get("metadata") or {}).get("namespace"):
                doc.setdefault("metadata", {})["namespace"] = namespace
            documents.append((f"{path}" + (f" (document {number})" if number > 1 else ""), doc))
    runtimes: dict[tuple[str, str, str], dict[str, Any]] = {}
    for prefix, doc in documents:
        if is_runtime(doc):
            problems += [f"{prefix}: {p}" for p in validate_runtime(doc)]
            runtimes[runtime_key(doc)] = doc
    objects: list[Rendered] = []
    for prefix, doc in documents:
        if is_runtime(doc):
            continue
        ref = ref_of(doc.get("spec")) if isinstance(doc, dict) else None
        runtime = None
        if ref is not None:
            kind, name = ref
            ns = "" if kind == CLUSTER_RUNTIME_KIND else str(doc["metadata"].get("namespace") or "default")
            runtime = runtimes.get((kind, ns, name))
            if runtime is None:
                where = "" if kind == CLUSTER_RUNTIME_KIND else f" in namespace {ns}"
                problems.append(
                    f"{prefix}: spec.runtimeRef names {describe(kind, name)}{where}, which none of the"
                    " files given holds (render needs the runtime in a -f file)"
                )
                continue
        result = validate(doc, runtime)
        problems += [f"{prefix}: {p}" for p in result.problems]
        if result.job is not None:
            objects += _job_objects(result.job, settings, result.merged.source if result.merged else "")
            warning = checkpoint_warning(result.job)
            if warning is not None:
                print(f"llmjob render: warning: {prefix}: {warning}", file=out)
    if problems:
        raise RenderError(problems)
    return objects


def render(
    paths: list[str], settings: Settings, namespace: str | None = None, warnings: TextIO | None = None
) -> list[dict[str, Any]]:
    """The objects of ``render_documents`` without their notes."""
    return [obj for obj, _ in render_documents(paths, settings, namespace, warnings)]


def write_stream(objects: list[dict[str, Any]], out: TextIO) -> None:
    """Write objects as a YAML stream."""
    yaml.safe_dump_all(objects, out, sort_keys=False, width=120, explicit_start=True)


def write_documents(documents: list[Rendered], out: TextIO) -> None:
    """Write objects as a YAML stream, each note as a comment line above its object."""
    for obj, note in documents:
        out.write("---\n")
        if note:
            out.write(f"# {note}\n")
        yaml.safe_dump(obj, out, sort_keys=False, width=120)
