"""The CLI fails with clear one-line errors and exit code 2, never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def _llmjob(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llm_operator.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_render_examples_prints_objects() -> None:
    result = _llmjob("render", "-f", str(ROOT / "deploy/examples/llama-8b-p5.yaml"))
    assert result.returncode == 0, result.stderr
    docs = list(yaml.safe_load_all(result.stdout))
    kinds = [d["kind"] for d in docs]
    assert kinds.count("Pod") == 8 and "Deployment" in kinds
    pod = next(d for d in docs if d["kind"] == "Pod")
    assert pod["spec"]["containers"][0]["resources"]["limits"]["vpc.amazonaws.com/efa"] == "32"


def test_render_invalid_manifest_exit_2_one_line_per_problem(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: elasticllm.dev/v1alpha1\nkind: LLMTrainingJob\nmetadata: {name: x}\n"
        "spec: {minReplicas: 5, maxReplicas: 2, image: i, env: [{name: RANK, value: '0'}]}\n"
    )
    result = _llmjob("render", "-f", str(bad))
    assert result.returncode == 2
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    assert f"{bad}: spec.minReplicas (5) must be <= spec.maxReplicas (2)" in result.stderr
    assert "spec.env RANK is reserved" in result.stderr


def test_render_missing_file_and_bad_yaml() -> None:
    missing = _llmjob("render", "-f", "/nonexistent/job.yaml")
    assert missing.returncode == 2 and "cannot read" in missing.stderr and "Traceback" not in missing.stderr
    bad_yaml = _llmjob("render", "-f", "-", stdin="spec: [unclosed\n")
    assert (
        bad_yaml.returncode == 2
        and "not valid YAML (line" in bad_yaml.stderr
        and "Traceback" not in bad_yaml.stderr
    )


def test_render_nothing_half_done_with_one_bad_document(tmp_path: Path) -> None:
    good = (ROOT / "deploy/examples/smoke-cpu.yaml").read_text()
    stream = tmp_path / "two.yaml"
    stream.write_text(
        good
        + "\n---\napiVersion: elasticllm.dev/v1alpha1\nkind: LLMTrainingJob\n"
        + "metadata: {name: y}\nspec: {minReplicas: 1}\n"
    )
    result = _llmjob("render", "-f", str(stream))
    assert result.returncode == 2 and result.stdout == ""
    assert "(document 2): spec.maxReplicas: required field is missing" in result.stderr


def test_usage_errors_exit_2() -> None:
    result = _llmjob("render")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    result = _llmjob("operator", "--log-level", "loud")
    assert result.returncode == 2 and "invalid choice" in result.stderr


def test_crd_command_matches_committed_file() -> None:
    result = _llmjob("crd")
    assert result.returncode == 0
    assert result.stdout == (ROOT / "crds/elasticllm.dev_llmtrainingjobs.yaml").read_text()


def test_crd_command_prints_the_runtime_crds() -> None:
    for kind, plural in (
        ("LLMTrainingRuntime", "llmtrainingruntimes"),
        ("ClusterLLMTrainingRuntime", "clusterllmtrainingruntimes"),
    ):
        result = _llmjob("crd", "--kind", kind)
        assert result.returncode == 0
        assert result.stdout == (ROOT / f"crds/elasticllm.dev_{plural}.yaml").read_text()


def test_render_shows_the_spares_the_operator_creates(tmp_path: Path) -> None:
    """maxReplicas 3 + spareReplicas 1 (inProcess): the operator creates 4 workers; render shows all 4,
    the spare marked in a comment."""
    job = tmp_path / "spares.yaml"
    job.write_text(
        "apiVersion: elasticllm.dev/v1alpha1\nkind: LLMTrainingJob\nmetadata: {name: s, namespace: ml}\n"
        "spec: {minReplicas: 2, maxReplicas: 3, spareReplicas: 1, image: i, command: [python, t.py],\n"
        "       failurePolicy: {recovery: inProcess}}\n"
    )
    result = _llmjob("render", "-f", str(job))
    assert result.returncode == 0, result.stderr
    pods = [d["metadata"]["name"] for d in yaml.safe_load_all(result.stdout) if d and d["kind"] == "Pod"]
    assert pods == ["s-worker-0", "s-worker-1", "s-worker-2", "s-worker-3"]
    spare_block = result.stdout.split("name: s-worker-3")[0].rsplit("---", 1)[-1]
    assert "# spare worker (spec.spareReplicas)" in spare_block
    assert result.stdout.count("# spare worker") == 1
