"""Every shipped example job is one the trainer accepts, with data and checkpoints on a shared volume.

For each LLMTrainingJob in deploy/examples/, the worker pod is built by the operator's own pure builder;
its container argv and literal env are what a real worker would get. The shared volumes of that pod are
"mounted" as temporary folders (each claim's mountPath maps to one folder), the data is prepared there
as the example's comments say (`python -m llm_trainer prepare`), and the trainer's own argument parser
reads argv and env exactly as it would in the pod. Checked: the parser accepts them, the data folder and
the checkpoint folder lie on a ReadWriteMany claim that a shipped manifest provides, and the batch fits
the largest world size the job can reach.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml
from llm_operator.api.models import CLUSTER_RUNTIME_KIND, LLMTrainingJob
from llm_operator.api.runtime import describe, is_runtime, merge, ref_of, runtime_key
from llm_operator.builders.worker import worker_pod
from llm_trainer.cli import parse_train_args
from llm_trainer.config import TrainConfig, model_config
from llm_trainer.data.prepare import main as prepare

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "deploy" / "examples"
TRAINER_ENTRY = ["python", "-m", "llm_trainer"]
# Manifests that create the claims the examples name (the FSx ones and the smoke job's volume).
VOLUME_MANIFESTS = sorted((ROOT / "deploy" / "fsx").glob("*.yaml")) + sorted(EXAMPLES.glob("*/*.yaml"))


def _docs(path: Path) -> list[Any]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


BYO_EXAMPLES = {"plain-pytorch-inprocess.yaml": ROOT / "examples" / "plain-pytorch" / "train.py"}
"""Examples that run a user's own script instead of the trainer, and the script they run."""


def example_files() -> list[Path]:
    """Every example job of the trainer (runtimes are examples too, checked through the jobs that use them;
    the user-script examples have their own test)."""
    files = [
        p
        for p in sorted(EXAMPLES.glob("*.yaml"))
        if not all(is_runtime(d) for d in _docs(p)) and p.name not in BYO_EXAMPLES
    ]
    assert files, "deploy/examples holds no example"
    return files


@pytest.mark.parametrize("name", sorted(BYO_EXAMPLES))
def test_a_user_script_example_runs_a_shipped_script_from_its_shared_volume_in_process(name: str) -> None:
    """The job's worker runs the script under the in-pod supervisor, in process, from the shared volume
    where the example's comments say to copy it (the same file as the one shipped under examples/)."""
    manifest = load_job(EXAMPLES / name)
    worker = worker_of(manifest)
    assert worker.live and worker.argv, worker
    script = worker.argv[0]
    mount = mount_of(script, worker.shared_mounts)
    assert mount is not None, f"{script} is not on a shared volume"
    assert PurePosixPath(script).name == BYO_EXAMPLES[name].name and BYO_EXAMPLES[name].is_file()
    assert worker.env["LLMJOB_RECOVERY"] == "inProcess"


def shipped_runtimes() -> dict[tuple[str, str, str], dict[str, Any]]:
    return {runtime_key(d): d for p in sorted(EXAMPLES.glob("*.yaml")) for d in _docs(p) if is_runtime(d)}


def load_job(path: Path) -> dict[str, Any]:
    """The example's job, merged over the shipped runtime it names (what the operator runs)."""
    (doc,) = _docs(path)
    assert isinstance(doc, dict) and doc["kind"] == "LLMTrainingJob"
    ref = ref_of(doc["spec"])
    if ref is not None:
        kind, name = ref
        ns = "" if kind == CLUSTER_RUNTIME_KIND else doc["metadata"]["namespace"]
        runtime = shipped_runtimes().get((kind, ns, name))
        assert runtime is not None, f"{path.name} names {describe(kind, name)}, which no example ships"
        doc["spec"] = merge(runtime["spec"], doc["spec"], describe(kind, name)).spec
    return doc


def shipped_claims() -> dict[str, dict[str, Any]]:
    """Every PersistentVolumeClaim in the shipped manifests, by name."""
    claims: dict[str, dict[str, Any]] = {}
    for path in VOLUME_MANIFESTS:
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "PersistentVolumeClaim":
                claims[doc["metadata"]["name"]] = doc
    return claims


@dataclass
class Worker:
    """What the trainer sees in a worker pod: its argv, literal env and shared mounts (path -> claim)."""

    argv: list[str]
    env: dict[str, str]
    shared_mounts: dict[str, str]
    live: bool = False
    """failurePolicy.recovery inProcess: the trainer runs directly instead of under torchrun."""


def worker_of(manifest: dict[str, Any]) -> Worker:
    job = LLMTrainingJob.model_validate(copy.deepcopy(manifest))
    pod = worker_pod(job, 0, 0)
    (container,) = pod["spec"]["containers"]
    live = job.spec.failurePolicy.recovery == "inProcess"
    if live:
        program = [*container["command"], *container["args"]]
        supervisor = ["python", "-m", "llm_elastic.supervise"]
        if program[: len(supervisor)] == supervisor:  # the in-pod supervisor (recovery layer 2)
            program = program[program.index("--") + 1 :]
        entry = TRAINER_ENTRY if program[: len(TRAINER_ENTRY)] == TRAINER_ENTRY else ["python"]
        assert program[: len(entry)] == entry, f"not a python program: {program}"
        argv = program[len(entry) :]
    else:
        assert container["command"] == ["torchrun", "--no-python"], container["command"]
        program = container["args"]
        assert program[: len(TRAINER_ENTRY)] == TRAINER_ENTRY, f"not the trainer: {program}"
        argv = program[len(TRAINER_ENTRY) :]
        if argv[:1] == ["train"]:
            argv = argv[1:]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    claims = {
        v["name"]: v["persistentVolumeClaim"]["claimName"]
        for v in pod["spec"]["volumes"]
        if "persistentVolumeClaim" in v
    }
    shared = {m["mountPath"]: claims[m["name"]] for m in container["volumeMounts"] if m["name"] in claims}
    return Worker(argv, env, shared, live)


def mount_of(path: str, mounts: dict[str, str]) -> str | None:
    """The mount path that holds ``path`` (absolute), if any."""
    pure = PurePosixPath(path)
    for mount in mounts:
        if pure.is_absolute() and pure.is_relative_to(mount) and pure != PurePosixPath(mount):
            return mount
    return None


def on_host(path: str, mounts: dict[str, str], root: Path) -> str:
    """Where a path inside a mounted volume lies in the test's stand-in folders."""
    mount = mount_of(path, mounts)
    if mount is None:
        return path
    return str(root / mounts[mount] / PurePosixPath(path).relative_to(mount))


def parse_in_pod(
    worker: Worker, root: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> TrainConfig:
    """Run the trainer's parser on the pod's argv and env, with the shared volumes mounted under ``root``."""
    for name, value in worker.env.items():
        monkeypatch.setenv(name, on_host(value, worker.shared_mounts, root))
    argv = [on_host(arg, worker.shared_mounts, root) for arg in worker.argv]
    try:
        return parse_train_args(argv)
    except SystemExit as exit_:
        pytest.fail(f"the trainer rejects the example (exit {exit_.code}): {capsys.readouterr().err.strip()}")


def data_arg(worker: Worker) -> str:
    return worker.argv[worker.argv.index("--data") + 1] if "--data" in worker.argv else ""


def prepare_data(worker: Worker, root: Path) -> None:
    """Token shards where the example's --data points, made as its comments say (prepare)."""
    data = data_arg(worker)
    if mount_of(data, worker.shared_mounts) is None:
        return  # nothing to prepare: the checks below report the missing or unshared data
    corpus = root / "corpus.txt"
    corpus.write_text("elastic training on a shared volume\n" * 200)
    assert prepare([str(corpus), "--output", on_host(data, worker.shared_mounts, root)]) == 0


def problems_of(
    manifest: dict[str, Any], root: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> tuple[TrainConfig, list[str]]:
    worker = worker_of(manifest)
    prepare_data(worker, root)
    config = parse_in_pod(worker, root, monkeypatch, capsys)
    data = data_arg(worker)
    checkpoints = manifest["spec"].get("checkpointDir", "")
    problems: list[str] = []
    claims = shipped_claims()
    for what, path in (("--data", data), ("checkpointDir", checkpoints)):
        mount = mount_of(path, worker.shared_mounts)
        if mount is None:
            problems.append(f"{what} {path!r} is not on a mounted claim {sorted(worker.shared_mounts)}")
            continue
        claim = claims.get(worker.shared_mounts[mount])
        if claim is None:
            problems.append(f"claim {worker.shared_mounts[mount]!r} is made by no shipped manifest")
        elif "ReadWriteMany" not in claim["spec"]["accessModes"]:
            problems.append(f"claim {worker.shared_mounts[mount]!r} is not ReadWriteMany")
    # The pod's env (LLMJOB_CHECKPOINT_DIR) is where the trainer really writes.
    if config.checkpoint_dir != on_host(checkpoints, worker.shared_mounts, root):
        problems.append(f"the trainer writes to {config.checkpoint_dir}, not to checkpointDir {checkpoints}")
    job = LLMTrainingJob.model_validate(copy.deepcopy(manifest))
    largest_world = job.spec.maxReplicas * job.nproc_per_node
    if config.global_batch < largest_world:
        problems.append(f"--global-batch {config.global_batch} < the largest world size {largest_world}")
    return config, problems


@pytest.mark.parametrize("path", example_files(), ids=lambda p: p.name)
def test_example_is_accepted_by_the_trainer_with_shared_data_and_checkpoints(
    path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _, problems = problems_of(load_job(path), tmp_path, monkeypatch, capsys)
    assert not problems, f"{path.name}: " + "; ".join(problems)


@pytest.mark.parametrize("path", example_files(), ids=lambda p: p.name)
def test_gpu_examples_use_realistic_shapes(
    path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """GPU jobs train long samples of a real model shape, sharded; CPU examples stay laptop-sized."""
    manifest = load_job(path)
    config, _ = problems_of(manifest, tmp_path, monkeypatch, capsys)
    shape = model_config(config.model)
    if manifest["spec"].get("gpusPerNode", 0) > 0:
        assert config.seq_len >= 2048, (
            f"--seq-len {config.seq_len}: a GPU job of real shape trains long samples"
        )
        assert config.parallel == "fsdp" and config.precision == "bf16"
        assert config.global_batch * config.seq_len >= 2**20, "at least 1M tokens per optimizer step"
    else:
        assert shape.num_params() < 10_000_000, "a CPU example must train on a laptop"


def test_smoke_claim_and_layout_match_its_volume_manifests() -> None:
    """The smoke job's claim is made by smoke-volume/volume.yaml, and prepare-data.yaml fills its layout."""
    job = load_job(EXAMPLES / "smoke-cpu.yaml")
    claim = job["spec"]["fsx"]["claimName"]
    volume = [d for d in yaml.safe_load_all((EXAMPLES / "smoke-volume" / "volume.yaml").read_text()) if d]
    pv = next(d for d in volume if d["kind"] == "PersistentVolume")
    pvc = next(d for d in volume if d["kind"] == "PersistentVolumeClaim")
    assert pvc["metadata"]["name"] == claim and pvc["spec"]["volumeName"] == pv["metadata"]["name"]
    assert pv["spec"]["accessModes"] == pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    docs = [d for d in yaml.safe_load_all((EXAMPLES / "smoke-volume" / "prepare-data.yaml").read_text()) if d]
    prepare_job = next(d for d in docs if d["kind"] == "Job")
    pod = prepare_job["spec"]["template"]["spec"]
    assert {"persistentVolumeClaim": {"claimName": claim}}.items() <= pod["volumes"][0].items()
    (container,) = pod["containers"]
    mount = next(m["mountPath"] for m in container["volumeMounts"] if m["name"] == "shared")
    command = container["command"]
    output = command[command.index("--output") + 1]
    args = job["spec"]["args"]
    data = args[args.index("--data") + 1]
    job_mount = job["spec"]["fsx"]["mountPath"]
    # Same folder of the volume, seen through each pod's own mount path.
    assert PurePosixPath(output).relative_to(mount) == PurePosixPath(data).relative_to(job_mount)
    corpus = next(d for d in docs if d["kind"] == "ConfigMap")
    assert command[:4] == [*TRAINER_ENTRY, "prepare"]
    assert PurePosixPath(command[4]).name in corpus["data"]


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"args": ["--model", "tiny", "--steps", "200"]}, "--data"),
        ({"checkpointDir": "/tmp/checkpoints"}, "is not on a mounted claim"),
        ({"fsx": {"claimName": "nobody-makes-this", "mountPath": "/shared"}}, "no shipped manifest"),
        ({"maxReplicas": 32}, "--global-batch 16 < the largest world size 32"),
    ],
    ids=["no-data", "local-checkpoints", "unknown-claim", "batch-below-world"],
)
def test_the_check_catches_broken_examples(
    change: dict[str, Any],
    expected: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The check can fail: copies of the smoke example broken the ways shipped examples once were."""
    manifest = load_job(EXAMPLES / "smoke-cpu.yaml")
    manifest["spec"].update(change)
    try:
        _, problems = problems_of(manifest, tmp_path, monkeypatch, capsys)
    except pytest.fail.Exception as failure:
        problems = [str(failure)]
    assert any(expected in p for p in problems), problems


def test_short_job_with_the_p5_runtime_runs_the_same_workers_as_the_long_one() -> None:
    """The runtime example carries everything the 8B job repeats: the short job's workers match it."""
    long_job = load_job(EXAMPLES / "llama-8b-p5.yaml")
    short_job = load_job(EXAMPLES / "llama-8b-p5-runtime.yaml")
    (long_c,) = worker_pod(LLMTrainingJob.model_validate(long_job), 0, 0)["spec"]["containers"]
    (short_c,) = worker_pod(LLMTrainingJob.model_validate(short_job), 0, 0)["spec"]["containers"]
    for key in ("image", "resources", "volumeMounts", "securityContext"):
        assert short_c.get(key) == long_c.get(key), key
    assert short_c["args"] == long_c["args"]
