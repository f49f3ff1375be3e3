"""Checkpoints not on a shared volume: the warning, in `llmjob render` and on the job."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from llm_operator.api.validate import validate
from llm_operator.observe import format_time
from llm_operator.policy.storage import checkpoint_warning
from llm_operator.reconcile import plan
from llm_operator.render import render
from llm_operator.settings import Settings

from .jobs import job, manifest
from .views import NOW, node, pod

FSX = {"claimName": "fsx-claim", "mountPath": "/fsx"}


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ({"checkpointDir": "/tmp/ckpt"}, "not on a shared volume (no spec.fsx)"),
        ({"checkpointDir": "/fsx/ckpt", "fsx": {**FSX, "readOnly": True}}, "mounted readOnly"),
        ({"checkpointDir": "/fsx/ckpt", "fsx": FSX}, None),
        ({"checkpointDir": "/fsx", "fsx": FSX}, None),
        ({"checkpointDir": "/tmp/ckpt", "minReplicas": 1, "maxReplicas": 1}, None),
        ({}, None),
    ],
)
def test_checkpoint_warning(spec: dict[str, Any], fragment: str | None) -> None:
    assert validate(manifest(**spec)).problems == [], "only cases the API accepts"
    warning = checkpoint_warning(job(**spec))
    if fragment is None:
        assert warning is None
    else:
        assert warning is not None and fragment in warning and "spec.checkpointDir" in warning


def test_not_under_mount_path_is_rejected_by_the_api_already() -> None:
    problems = validate(manifest(checkpointDir="/tmp/ckpt", fsx=FSX)).problems
    assert any("spec.checkpointDir" in p for p in problems)


def test_render_prints_the_warning_on_the_warning_stream(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest(checkpointDir="/tmp/ckpt")))
    warnings = io.StringIO()
    objects = render([str(path)], Settings(), warnings=warnings)
    assert objects
    lines = warnings.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"llmjob render: warning: {path}: spec.checkpointDir")


def test_llmjob_render_warns_on_stderr_exit_0(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest(checkpointDir="/tmp/ckpt")))
    result = subprocess.run(
        [sys.executable, "-m", "llm_operator.cli", "render", "-f", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "warning" in result.stderr and "spec.checkpointDir (/tmp/ckpt)" in result.stderr
    assert "warning" not in result.stdout and list(yaml.safe_load_all(result.stdout))


def _status(**kw: Any) -> dict[str, Any]:
    base = {"phase": "Running", "targetReplicas": 2, "desiredReplicas": 2, "startTime": format_time(NOW - 9)}
    return {**base, **kw}


def test_job_condition_and_one_warning_event() -> None:
    pods = [pod(0), pod(1)]
    nodes = {f"node-{i}": node(f"node-{i}") for i in range(2)}
    first = plan(job(status=_status(), replicas=2, checkpointDir="/tmp/ckpt"), pods, nodes, pods, NOW)
    cond = next(c for c in first.status["conditions"] if c["type"] == "CheckpointNotShared")
    assert cond["status"] == "True" and "spec.checkpointDir" in cond["message"]
    assert next(e for e in first.events if e[1] == "CheckpointNotShared")[0] == "Warning"
    again = plan(job(status=first.status, replicas=2, checkpointDir="/tmp/ckpt"), pods, nodes, pods, NOW + 1)
    assert not [e for e in again.events if e[1] == "CheckpointNotShared"], "the Event is sent once"
    fixed = plan(
        job(status=again.status, replicas=2, checkpointDir="/fsx/c", fsx=FSX), pods, nodes, pods, NOW + 2
    )
    cond = next(c for c in fixed.status["conditions"] if c["type"] == "CheckpointNotShared")
    assert cond["status"] == "False"


def test_no_condition_for_a_shared_checkpoint_dir() -> None:
    p = plan(job(checkpointDir="/fsx/c", fsx=FSX), [], {}, [], NOW)
    assert "CheckpointNotShared" not in {c["type"] for c in p.status["conditions"]}
