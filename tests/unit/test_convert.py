"""`llmjob convert`: each source kind into a job that `llmjob render` accepts, keeping the source's pod
settings, one warning per field without an equivalent, and clear errors (exit 2) for invalid input."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from llm_operator.api.validate import validate
from llm_operator.builders.desired import desired_objects
from llm_operator.convert import ConvertError, convert_documents, launcher
from llm_operator.settings import Settings

from .test_cli import _llmjob  # one way to run the CLI in tests

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "convert"


def _convert(name: str) -> tuple[dict[str, Any], list[str]]:
    docs = [d for d in yaml.safe_load_all((FIXTURES / name).read_text()) if d]
    (converted,) = convert_documents(docs)
    return converted.job, converted.warnings


def _pods(job: dict[str, Any]) -> list[dict[str, Any]]:
    result = validate(job)
    assert result.job is not None, result.problems
    return [o for o in desired_objects(result.job, Settings()) if o["kind"] == "Pod"]


def _warned(warnings: list[str], *fragments: str) -> None:
    for fragment in fragments:
        assert any(fragment in w for w in warnings), f"no warning with {fragment!r}: {warnings}"


SOURCES = sorted(p.name for p in FIXTURES.glob("*.yaml") if not p.name.startswith("invalid"))


@pytest.mark.parametrize("name", SOURCES)
def test_every_source_round_trips_through_render(name: str, tmp_path: Path) -> None:
    result = _llmjob("convert", "-f", str(FIXTURES / name))
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    out = tmp_path / "job.yaml"
    out.write_text(result.stdout)
    rendered = _llmjob("render", "-f", str(out))
    assert rendered.returncode == 0, rendered.stderr


def test_pytorchjob_elastic() -> None:
    job, warnings = _convert("pytorchjob-elastic.yaml")
    spec = job["spec"]
    assert job["metadata"] == {"name": "elastic-llama", "namespace": "ml", "labels": {"team": "nlp"}}
    assert (spec["minReplicas"], spec["maxReplicas"], spec["replicas"]) == (2, 4, 4)
    assert (spec["gpusPerNode"], spec["efaPerNode"], spec["nprocPerNode"]) == (8, 32, 8)
    assert spec["resources"] == {"cpu": "180", "memory": "1800Gi"} and spec["sharedMemory"] == "64Gi"
    assert spec["command"] == ["python", "/workspace/train.py"] and spec["args"] == ["--model", "8b"]
    assert spec["env"] == [{"name": "NCCL_DEBUG", "value": "INFO"}]
    assert spec["rendezvous"] == {"backend": "c10d", "timeoutSeconds": 600}
    assert spec["failurePolicy"] == {"maxRestarts": 100} and spec["ttlSecondsAfterFinished"] == 3600
    assert spec["scheduling"]["nodeSelector"] == {"node.kubernetes.io/instance-type": "p5.48xlarge"}
    template = spec["podTemplate"]
    assert template["metadata"] == {
        "labels": {"cost-center": "research"},
        "annotations": {"sidecar.istio.io/inject": "false"},
    }
    pod = template["spec"]
    assert pod["serviceAccountName"] == "llama-s3" and pod["imagePullSecrets"] == [{"name": "ecr-pull"}]
    assert [v["name"] for v in pod["volumes"]] == ["dataset", "logs"]
    assert (
        pod["initContainers"][0]["name"] == "log-shipper"
        and pod["initContainers"][0]["restartPolicy"] == "Always"
    )
    assert pod["containers"] == [
        {
            "name": "trainer",
            "envFrom": [{"configMapRef": {"name": "llama-config"}}],
            "volumeMounts": [{"name": "dataset", "mountPath": "/data", "readOnly": True}],
        }
    ]
    _warned(
        warnings,
        "spec.elasticPolicy.rdzvConf (is_host)",
        "spec.runPolicy.backoffLimit: no equivalent",
        "spec.pytorchReplicaSpecs.Worker.restartPolicy",
        "containers[0].ports",
        "containers[0].env[1] (MASTER_PORT): set by the operator",
        "(torchrun --nnodes=2:4)",
        "(torchrun --rdzv_backend=c10d)",
        "containers[1] (log-shipper): a second container: now a native sidecar",
    )
    pods = _pods(job)
    assert len(pods) == 4 and pods[0]["spec"]["serviceAccountName"] == "llama-s3"


def test_pytorchjob_without_elastic_policy_is_a_fixed_size_job() -> None:
    job, warnings = _convert("pytorchjob-static.yaml")
    spec = job["spec"]
    assert (spec["minReplicas"], spec["maxReplicas"]) == (2, 2) and "replicas" not in spec
    assert spec["command"] == ["python3", "/opt/pytorch-mnist/mnist.py"] and spec["args"] == ["--epochs=1"]
    assert spec["gpusPerNode"] == 0 and spec["imagePullPolicy"] == "Always"
    _warned(warnings, "spec.pytorchReplicaSpecs.Master.restartPolicy")
    assert not any("Master.template" in w for w in warnings)  # same as the Worker's


def test_elasticjob() -> None:
    job, warnings = _convert("elasticjob.yaml")
    spec = job["spec"]
    assert (spec["minReplicas"], spec["maxReplicas"], spec["replicas"]) == (1, 3, 2)
    assert spec["rendezvous"] == {"backend": "etcd-v3", "endpoint": "etcd-service:2379"}
    assert spec["nprocPerNode"] == 1 and spec["gpusPerNode"] == 1
    assert spec["command"] == ["python", "/workspace/examples/imagenet/main.py"]
    assert spec["args"][0] == "--arch=resnet18" and spec["args"][-1] == "/data/tiny-imagenet-200"
    pod = spec["podTemplate"]["spec"]
    assert pod["serviceAccountName"] == "imagenet-reader"
    assert pod["volumes"] == [{"name": "data", "configMap": {"name": "imagenet-index"}}]
    assert pod["containers"][0]["volumeMounts"] == [{"name": "data", "mountPath": "/data"}]
    _warned(warnings, "spec.rdzvEndpoint: kept as spec.rendezvous.endpoint", "Worker.restartPolicy")


def test_trainjob_with_its_runtime_in_kubeflows_order() -> None:
    job, warnings = _convert("trainjob.yaml")
    spec = job["spec"]
    assert (spec["minReplicas"], spec["maxReplicas"], spec["nprocPerNode"], spec["gpusPerNode"]) == (
        3,
        3,
        4,
        4,
    )
    assert spec["image"].endswith("fine-tune:2")  # the TrainJob's over the runtime's
    assert spec["command"] == ["python", "/workspace/train.py"] and spec["args"] == ["--lr", "3e-5"]
    assert spec["env"] == [{"name": "NCCL_DEBUG", "value": "WARN"}, {"name": "HF_HOME", "value": "/cache"}]
    assert spec["resources"] == {"memory": "400Gi"}
    assert spec["scheduling"] == {"nodeSelector": {"karpenter.sh/capacity-type": "on-demand"}}
    template = spec["podTemplate"]
    assert template["metadata"] == {"labels": {"cost-center": "tuning"}}
    assert template["spec"]["serviceAccountName"] == "fine-tune-s3"
    assert template["spec"]["volumes"] == [
        {"name": "cache", "persistentVolumeClaim": {"claimName": "hf-cache"}}
    ]
    assert template["spec"]["containers"][0]["volumeMounts"] == [{"name": "cache", "mountPath": "/cache"}]
    _warned(
        warnings,
        "spec.podTemplateOverrides[0].spec.schedulingGates: no equivalent",
        "spec.podTemplateOverrides[0].spec.initContainers[0] (warm-cache): names no container",
    )


def test_trainjob_without_its_runtime_converts_its_own_fields_and_says_so() -> None:
    docs = [d for d in yaml.safe_load_all((FIXTURES / "trainjob.yaml").read_text()) if d]
    (converted,) = convert_documents(docs[1:])
    assert converted.job["spec"]["image"].endswith("fine-tune:2")
    _warned(
        converted.warnings, "spec.runtimeRef: ClusterTrainingRuntime torch-distributed is not in the file"
    )


# (case, document, the line that names the field)
INVALID: list[tuple[str, Any, str]] = [
    ("not a mapping", ["a"], "document 1: must be a mapping"),
    (
        "unsupported kind",
        {"apiVersion": "batch/v1", "kind": "Job"},
        "apiVersion/kind batch/v1/Job is not one of",
    ),
    (
        "wrong type",
        yaml.safe_load((FIXTURES / "invalid-pytorchjob.yaml").read_text()),
        "spec.elasticPolicy.minReplicas: must be an integer, got 'two'",
    ),
    (
        "no containers",
        {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "metadata": {"name": "j"},
            "spec": {"pytorchReplicaSpecs": {"Worker": {"template": {"spec": {}}}}},
        },
        "spec.pytorchReplicaSpecs.Worker.template.spec.containers: required",
    ),
    (
        "no image",
        {
            "apiVersion": "elastic.pytorch.org/v1alpha1",
            "kind": "ElasticJob",
            "metadata": {"name": "j"},
            "spec": {
                "minReplicas": 1,
                "maxReplicas": 2,
                "replicaSpecs": {"Worker": {"template": {"spec": {"containers": [{"name": "w"}]}}}},
            },
        },
        "has no image",
    ),
    (
        "elasticjob without max",
        {
            "apiVersion": "elastic.pytorch.org/v1alpha1",
            "kind": "ElasticJob",
            "metadata": {"name": "j"},
            "spec": {"minReplicas": 1},
        },
        "spec.maxReplicas: required",
    ),
    (
        "no name",
        {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "spec": {}},
        "metadata.name: required",
    ),
]


@pytest.mark.parametrize(("case", "doc", "line"), INVALID, ids=[c[0] for c in INVALID])
def test_invalid_input_names_the_field(case: str, doc: Any, line: str) -> None:
    with pytest.raises(ConvertError) as caught:
        convert_documents([doc])
    assert any(line in p for p in caught.value.problems), caught.value.problems


def test_cli_invalid_input_exit_2_without_traceback() -> None:
    result = _llmjob("convert", "-f", str(FIXTURES / "invalid-pytorchjob.yaml"))
    assert result.returncode == 2 and result.stdout == ""
    assert "spec.elasticPolicy.minReplicas: must be an integer" in result.stderr
    assert "Traceback" not in result.stderr
    for stdin in ("a: [", "apiVersion: v1\nkind: Pod\n", ""):
        result = _llmjob("convert", "-f", "-", stdin=stdin)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert _llmjob("convert", "-f", "/nonexistent.yaml").returncode == 2


def test_cli_reads_stdin_and_prints_one_warning_line_per_field() -> None:
    text = (FIXTURES / "elasticjob.yaml").read_text()
    result = _llmjob("convert", "-f", "-", stdin=text)
    assert result.returncode == 0, result.stderr
    (job,) = list(yaml.safe_load_all(result.stdout))
    assert job["kind"] == "LLMTrainingJob" and job["metadata"]["name"] == "imagenet"
    lines = result.stderr.splitlines()
    assert lines and all(line.startswith("llmjob convert: warning: ElasticJob imagenet: ") for line in lines)


@pytest.mark.parametrize(
    ("argv", "assume", "program", "nproc", "dropped"),
    [
        (
            ["torchrun", "--nnodes", "2", "--nproc-per-node=4", "t.py", "-x"],
            False,
            ["python", "t.py", "-x"],
            "4",
            ["--nnodes 2"],
        ),
        (
            ["python", "-m", "torch.distributed.run", "--standalone", "-m", "pkg.train"],
            False,
            ["python", "-m", "pkg.train"],
            None,
            ["--standalone"],
        ),
        (["torchrun", "--no-python", "./bin/train"], False, ["./bin/train"], None, []),
        (["--nproc_per_node=1", "main.py", "--lr=1"], True, ["python", "main.py", "--lr=1"], "1", []),
        (["python", "train.py"], False, ["python", "train.py"], None, []),
    ],
)
def test_launcher_is_taken_off(
    argv: list[str], assume: bool, program: list[str], nproc: str | None, dropped: list[str]
) -> None:
    found = launcher.split(argv, assume_launcher=assume)
    assert (found.argv, found.nproc, found.dropped) == (program, nproc, dropped)


def test_a_container_without_command_keeps_its_args_and_says_so() -> None:
    doc = yaml.safe_load((FIXTURES / "pytorchjob-static.yaml").read_text())
    for role in ("Master", "Worker"):
        container = doc["spec"]["pytorchReplicaSpecs"][role]["template"]["spec"]["containers"][0]
        container.pop("command")
        container["args"] = ["--epochs=1"]
    (converted,) = convert_documents([doc])
    assert "command" not in converted.job["spec"] and converted.job["spec"]["args"] == ["--epochs=1"]
    _warned(converted.warnings, "containers[0].command: not set: the image's entrypoint cannot run")
