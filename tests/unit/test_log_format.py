"""Log formats: the operator's (`llmjob operator --log-format`) and the runtime's (`LLMJOB_LOG_FORMAT`).

Every JSON line must parse on its own and carry the documented fields (docs/operations.md, "Logs").
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from typing import Any

import kopf
import pytest
from llm_elastic import ContractError, configure_logging
from llm_elastic.logs import set_context
from llm_operator import logs as operator_logs
from llm_operator.api.models import LLMTrainingJob
from llm_operator.api.rules import reserved_env
from llm_operator.api.runtime import merge
from llm_operator.api.validate import validate, validate_runtime
from llm_operator.builders.worker import container_env
from llm_operator.cli import build_parser

from .jobs import manifest


@pytest.fixture
def root_logger() -> Iterator[logging.Logger]:
    """The root logger's handlers and level as they were (pytest's capture handlers among them)."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield root
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)
    set_context(job=None, pod=None, generation=None, step=None)


def _json_lines(text: str) -> list[dict[str, Any]]:
    lines = text.splitlines()
    assert lines, "nothing was logged"
    return [json.loads(line) for line in lines]


# -- the operator ---------------------------------------------------------------------------------------


def test_operator_help_shows_the_log_format() -> None:
    parser = build_parser()
    args = parser.parse_args(["operator", "--log-format", "json"])
    assert args.log_format == "json"
    assert parser.parse_args(["operator"]).log_format == "text"
    with pytest.raises(SystemExit):
        parser.parse_args(["operator", "--log-format", "xml"])


def test_operator_json_lines(root_logger: logging.Logger, capsys: pytest.CaptureFixture[str]) -> None:
    operator_logs.configure_logging("info", "json")
    logging.getLogger("llm_operator.runner").info("starting kopf as %r", "op-a")
    logging.getLogger("llm_operator.runner").debug("not at info")
    body = {
        "apiVersion": "elasticllm.dev/v1alpha1",
        "kind": "LLMTrainingJob",
        "metadata": {"namespace": "ml", "name": "llama", "uid": "u-1"},
    }
    job_logger = kopf.LocalObjectLogger(body=kopf.Body(body), settings=kopf.OperatorSettings())
    job_logger.warning("WorkerReplaced: llama-worker-1 (node gone)")
    plain, job = _json_lines(capsys.readouterr().err)
    assert plain["message"] == "starting kopf as 'op-a'"
    assert plain["severity"] == "info" and plain["logger"] == "llm_operator.runner"
    assert plain["timestamp"].startswith("20")
    assert job["severity"] == "warn" and job["logger"] == "kopf.objects"
    assert job["object"]["namespace"] == "ml" and job["object"]["name"] == "llama"


def test_operator_text_lines(root_logger: logging.Logger, capsys: pytest.CaptureFixture[str]) -> None:
    operator_logs.configure_logging("warning", "text")
    logging.getLogger("llm_operator.readiness").info("hidden")
    logging.getLogger("llm_operator.readiness").warning("operator NOT serving (conflict)")
    (line,) = capsys.readouterr().err.splitlines()
    assert line.endswith("WARNING llm_operator.readiness: operator NOT serving (conflict)")
    with pytest.raises(json.JSONDecodeError):
        json.loads(line)


# -- the runtime ----------------------------------------------------------------------------------------

WORKER_ENV = {
    "LLMJOB_LOG_FORMAT": "json",
    "LLMJOB_JOB_NAME": "llama",
    "LLMJOB_POD_NAME": "llama-worker-0",
    "TORCHELASTIC_RESTART_COUNT": "2",
}


def test_runtime_json_lines_carry_job_pod_generation_and_step(root_logger: logging.Logger) -> None:
    out = io.StringIO()
    assert configure_logging("INFO", env=WORKER_ENV, stream=out) == "json"
    log = logging.getLogger("llm_elastic.checkpoint")
    log.info("saved step %d", 100)
    set_context(generation=3, step=120)
    try:
        raise OSError("read-only file system")
    except OSError:
        log.exception("checkpoint failed")
    first, second = _json_lines(out.getvalue())
    assert first["message"] == "saved step 100" and first["severity"] == "info"
    assert first["logger"] == "llm_elastic.checkpoint" and first["timestamp"].endswith("+00:00")
    assert (first["job"], first["pod"], first["generation"]) == ("llama", "llama-worker-0", 2)
    assert "step" not in first, "no step before the first one completes"
    assert (second["generation"], second["step"], second["severity"]) == (3, 120, "error")
    assert "OSError: read-only file system" in second["exception"]


def test_runtime_text_is_the_default(root_logger: logging.Logger) -> None:
    out = io.StringIO()
    assert (
        configure_logging("INFO", text_format="[trainer r0] %(levelname)s %(message)s", env={}, stream=out)
        == "text"
    )
    logging.getLogger("llm_trainer").info("step 1 loss 6.7")
    assert out.getvalue() == "[trainer r0] INFO step 1 loss 6.7\n"


def test_runtime_rejects_an_unknown_format(
    root_logger: logging.Logger, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ContractError):
        configure_logging(env={"LLMJOB_LOG_FORMAT": "yaml"}, stream=io.StringIO())
    assert "LLMJOB_LOG_FORMAT='yaml': must be one of text, json" in capsys.readouterr().err


# LLMJOB_LOG_FORMAT reaches the workers through a job's or a runtime's env (decision W4): the one name under
# the operator's LLMJOB_ prefix that is the user's.
FORMAT_ENV = [{"name": "LLMJOB_LOG_FORMAT", "value": "json"}]


def _runtime(**spec: Any) -> dict[str, Any]:
    meta = {"name": "p5"}
    return {
        "apiVersion": "elasticllm.dev/v1alpha1",
        "kind": "ClusterLLMTrainingRuntime",
        "metadata": meta,
        "spec": spec,
    }


def test_a_job_and_a_runtime_may_set_the_worker_log_format() -> None:
    assert validate(manifest(env=FORMAT_ENV)).problems == []
    assert validate_runtime(_runtime(env=FORMAT_ENV)) == []
    assert not reserved_env("LLMJOB_LOG_FORMAT")


def test_the_rest_of_the_llmjob_prefix_stays_the_operators() -> None:
    problems = validate(manifest(env=[{"name": "LLMJOB_JOB_NAME", "value": "x"}])).problems
    assert len(problems) == 1, problems
    assert "spec.env LLMJOB_JOB_NAME is reserved" in problems[0]
    assert "except LLMJOB_LOG_FORMAT" in problems[0], problems[0]
    assert reserved_env("LLMJOB_JOB_NAME") and reserved_env("RANK") and reserved_env("PET_NNODES")


def test_a_runtimes_log_format_is_in_every_workers_env() -> None:
    """The chart's defaultRuntime (or any runtime) sets it once; every job that names the runtime gets it."""
    spec = merge(
        _runtime(env=FORMAT_ENV)["spec"], manifest(env=[{"name": "A", "value": "1"}])["spec"], "rt"
    ).spec
    worker = LLMTrainingJob.model_validate({**manifest(), "spec": spec})
    env = {e["name"]: e.get("value") for e in container_env(worker, 0, 0)}
    assert env["LLMJOB_LOG_FORMAT"] == "json" and env["A"] == "1"
    assert env["LLMJOB_JOB_NAME"] == "llama", "the operator's own LLMJOB_ names are still set"
    assert configure_logging(env=env, stream=io.StringIO()) == "json"
