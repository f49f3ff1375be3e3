"""`llmjob render` with runtimes: merged objects, clear one-line errors (exit 2), Kueue's Workload."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "deploy" / "examples"

RUNTIME = """\
apiVersion: elasticllm.dev/v1alpha1
kind: LLMTrainingRuntime
metadata: {name: cpu, namespace: team-a}
spec:
  image: trainer:rt
  gpusPerNode: 0
  maxReplicas: 3
  env: [{name: A, value: runtime}, {name: B, value: runtime}]
  failurePolicy: {maxRestarts: 7}
"""
JOB = """\
apiVersion: elasticllm.dev/v1alpha1
kind: LLMTrainingJob
metadata: {name: short, namespace: team-a}
spec:
  runtimeRef: {name: cpu}
  minReplicas: 1
  replicas: 2
  env: [{name: B, value: job}]
"""


def llmjob(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llm_operator.cli", *args], capture_output=True, text=True, timeout=60
    )


def test_runtime_and_job_in_one_file_render_the_merged_objects(tmp_path: Path) -> None:
    both = tmp_path / "both.yaml"
    both.write_text(JOB + "---\n" + RUNTIME)  # the runtime may come after the job
    result = llmjob("render", "-f", str(both))
    assert result.returncode == 0, result.stderr
    docs = list(yaml.safe_load_all(result.stdout))
    merged = docs[0]
    assert merged["kind"] == "LLMTrainingJob"
    assert "# the job as the operator runs it: its spec merged over LLMTrainingRuntime cpu" in result.stdout
    assert merged["spec"]["image"] == "trainer:rt" and merged["spec"]["maxReplicas"] == 3
    assert merged["spec"]["failurePolicy"]["maxRestarts"] == 7
    pods = [d for d in docs if d["kind"] == "Pod"]
    assert len(pods) == 2
    (container,) = pods[0]["spec"]["containers"]
    assert container["image"] == "trainer:rt"
    user_env = [(e["name"], e.get("value")) for e in container["env"] if e["name"] in ("A", "B")]
    assert user_env == [("A", "runtime"), ("B", "job")]
    assert not [d for d in docs if d["kind"] == "LLMTrainingRuntime"], "runtimes are inputs, not outputs"


def test_runtime_in_another_file(tmp_path: Path) -> None:
    (tmp_path / "rt.yaml").write_text(RUNTIME)
    (tmp_path / "job.yaml").write_text(JOB)
    result = llmjob("render", "-f", str(tmp_path / "job.yaml"), "-f", str(tmp_path / "rt.yaml"))
    assert result.returncode == 0, result.stderr


def test_missing_runtime_is_one_clear_line(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(JOB)
    result = llmjob("render", "-f", str(job))
    assert result.returncode == 2 and result.stdout == "" and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[0] == (
        f"{job}: spec.runtimeRef names LLMTrainingRuntime cpu in namespace team-a, which none of the files"
        " given holds (render needs the runtime in a -f file)"
    )
    assert lines[1] == "llmjob render: 1 problem(s); nothing rendered"


def test_runtime_in_another_namespace_is_not_found(tmp_path: Path) -> None:
    both = tmp_path / "both.yaml"
    both.write_text(RUNTIME.replace("team-a", "team-b") + "---\n" + JOB)
    result = llmjob("render", "-f", str(both))
    assert result.returncode == 2 and "LLMTrainingRuntime cpu in namespace team-a" in result.stderr


def test_invalid_merged_spec_names_field_and_source(tmp_path: Path) -> None:
    both = tmp_path / "both.yaml"
    both.write_text(RUNTIME + "---\n" + JOB.replace("minReplicas: 1", "minReplicas: 5"))
    result = llmjob("render", "-f", str(both))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert (
        f"{both} (document 2): spec.minReplicas (5) must be <= spec.maxReplicas (3)"
        " (spec.minReplicas from the job; spec.maxReplicas from LLMTrainingRuntime cpu)"
    ) in result.stderr


def test_invalid_runtime_is_reported_with_its_document(tmp_path: Path) -> None:
    both = tmp_path / "both.yaml"
    both.write_text(RUNTIME.replace("gpusPerNode: 0", "gpusPerNode: -1") + "---\n" + JOB)
    result = llmjob("render", "-f", str(both))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"{both}: spec.gpusPerNode: Input should be greater than or equal to 0" in result.stderr


def test_shipped_runtime_example_renders_the_short_job() -> None:
    result = llmjob(
        "render", "-f", str(EXAMPLES / "runtime-p5.yaml"), "-f", str(EXAMPLES / "llama-8b-p5-runtime.yaml")
    )
    assert result.returncode == 0, result.stderr
    docs = list(yaml.safe_load_all(result.stdout))
    pods = [d for d in docs if d["kind"] == "Pod"]
    assert len(pods) == 8
    limits = pods[0]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == "8" and limits["vpc.amazonaws.com/efa"] == "32"


def test_kueue_job_shows_its_workload_and_marks_pods_that_wait(tmp_path: Path) -> None:
    job = tmp_path / "queued.yaml"
    job.write_text(
        "apiVersion: elasticllm.dev/v1alpha1\nkind: LLMTrainingJob\n"
        "metadata: {name: q, namespace: ml, labels: {kueue.x-k8s.io/queue-name: gpu-queue}}\n"
        "spec: {minReplicas: 1, maxReplicas: 2, image: i, gpusPerNode: 0}\n"
    )
    result = llmjob("render", "-f", str(job))
    assert result.returncode == 0, result.stderr
    docs = list(yaml.safe_load_all(result.stdout))
    kinds = [d["kind"] for d in docs]
    assert kinds.count("Workload") == 1 and kinds.index("Workload") < kinds.index("Pod")
    (workload,) = [d for d in docs if d["kind"] == "Workload"]
    assert workload["spec"]["queueName"] == "gpu-queue"
    assert workload["spec"]["podSets"][0]["count"] == 2 and workload["spec"]["podSets"][0]["minCount"] == 1
    assert result.stdout.count("# created only once Kueue admits Workload") == kinds.count("Pod") == 2
    # Without the label: no Workload, no note.
    job.write_text(job.read_text().replace(", labels: {kueue.x-k8s.io/queue-name: gpu-queue}", ""))
    plain = llmjob("render", "-f", str(job))
    assert "Workload" not in plain.stdout and "Kueue" not in plain.stdout
