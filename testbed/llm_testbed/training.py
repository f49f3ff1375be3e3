"""Real training on the local cluster: a shared volume, token shards on it, a tiny job, its metrics.

Used by the end-to-end tests and by ``llmjob demo``. The job is the shipped CPU smoke example
(deploy/examples/smoke-cpu.yaml) placed on the fake p5.48xlarge nodes (8 fake GPUs each, so one worker per
node and a lost node really shrinks the job); its pods run as local processes (the pod runner), and the
claim's volume is one host folder (``LocalCluster.volume_dir``) shared by every worker, like FSx.
"""

from __future__ import annotations

import copy
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from llm_testbed.localcluster import paths

EXAMPLE = "deploy/examples/smoke-cpu.yaml"
LIVE_EXAMPLE = "deploy/examples/smoke-cpu-inprocess.yaml"
PLAIN_EXAMPLE = "deploy/examples/plain-pytorch-inprocess.yaml"
PLAIN_SCRIPT = "examples/plain-pytorch/train.py"
PLAIN_SAMPLES, PLAIN_SAMPLER_SEED = 4096, 1
"""The plain script's data set size and sampler seed (its sample order, for the audit)."""
"""The same job recovering in process (failurePolicy.recovery inProcess, the live driver)."""
CLAIM = "smoke-shared"
DATA_SUBDIR = "data/smoke"
CHECKPOINT_SUBDIR = "checkpoints/smoke"
SEQ_LEN = 128  # the example's --seq-len
SEED = 1234  # the trainer's default --seed
_WORDS = (
    *("the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "seven", "wizards"),
    *("quietly", "hex", "jolly", "fat", "zebras", "and", "many", "nodes", "fail", "but", "training"),
    *("goes", "on", "from", "the", "newest", "step", "with", "every", "sample", "seen", "exactly", "once"),
)


def host_volume(pv_name: str) -> Path:
    """The hostPath folder of the shared PersistentVolume: where real kubelets mount it (every node of the
    kubelet tier is this machine, so it is shared like FSx); the pod runner keeps a folder of its own."""
    return Path("/var/lib/elasticllm") / pv_name


def share_with_group(folder: Path, gid: int) -> None:
    """Make ``folder`` writable by the group ``gid`` (group-owned, group-writable, set-group-ID folders), as
    a storage administrator prepares a share for non-root pods: a real kubelet does not apply a pod's
    ``fsGroup`` to a hostPath volume (the pod runner does it for its own folders)."""
    for path in [folder, *folder.rglob("*")]:
        os.chown(path, -1, gid)
        path.chmod(path.stat().st_mode | (0o2070 if path.is_dir() else 0o060))


def shared_volume(pv_name: str, namespace: str) -> list[dict[str, Any]]:
    """A PersistentVolume and the example's claim bound to it (the pod runner maps it to one folder)."""
    pv = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": pv_name},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteMany"],
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": "",
            "hostPath": {"path": str(host_volume(pv_name)), "type": "DirectoryOrCreate"},
            "claimRef": {"namespace": namespace, "name": CLAIM},
        },
    }
    pvc = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": CLAIM, "namespace": namespace},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": "",
            "volumeName": pv_name,
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }
    return [pv, pvc]


def write_corpus(folder: Path, documents: int = 4, words: int = 6000, seed: int = 7) -> list[Path]:
    """Deterministic plain-text documents (enough tokens for a few thousand samples of 128)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)  # noqa: S311 (a reproducible corpus, not a secret)
    files = []
    for i in range(documents):
        path = folder / f"doc-{i}.txt"
        path.write_text(" ".join(rng.choice(_WORDS) for _ in range(words)) + "\n")
        files.append(path)
    return files


def prepare_data(volume: Path) -> Path:
    """Token shards at ``<volume>/data/smoke`` made with the trainer's own ``prepare`` command."""
    corpus = write_corpus(volume / "corpus")
    out = volume / DATA_SUBDIR
    argv = [sys.executable, "-m", "llm_trainer", "prepare", *map(str, corpus), "--output", str(out)]
    subprocess.run(argv, check=True, capture_output=True, text=True)
    return out


def example_job(example: str = EXAMPLE) -> dict[str, Any]:
    """A shipped CPU smoke example, as a user applies it."""
    text = (paths.repo_root() / example).read_text()
    job: dict[str, Any] = yaml.safe_load(text)
    return job


def training_job(
    name: str,
    namespace: str,
    *,
    minimum: int,
    maximum: int,
    steps: int,
    backend: str = "etcd-v3",
    checkpoint_every: int = 10,
    failure_policy: dict[str, Any] | None = None,
    recovery: str = "restart",
) -> dict[str, Any]:
    """The smoke example on the fake p5 nodes: one worker per node, ``steps`` steps, the given backend.

    ``recovery="inProcess"`` starts from the in-process example instead; its metrics go to the same place
    (:func:`metrics_path`)."""
    job = copy.deepcopy(example_job(LIVE_EXAMPLE if recovery == "inProcess" else EXAMPLE))
    job["metadata"] = {"name": name, "namespace": namespace}
    spec = job["spec"]
    args: list[str] = spec["args"]
    args[args.index("--steps") + 1] = str(steps)
    args[args.index("--checkpoint-every") + 1] = str(checkpoint_every)
    spec.update(
        minReplicas=minimum,
        maxReplicas=maximum,
        gpusPerNode=8,  # a whole fake p5 per worker: a lost node cannot be replaced on a busy one
        nprocPerNode=1,  # the trainer runs on CPU here: one process per node
        efaPerNode=0,
        resources={"cpu": "1", "memory": "2Gi"},
        rendezvous={"backend": backend},
        scheduling={"instanceTypes": ["p5.48xlarge"]},
        env=[{"name": "OMP_NUM_THREADS", "value": "1"}],
        # Every fake node's pods share this machine's two cores: one worker's step is slower than the
        # others' because of its neighbours, not its node. Straggler tests set a window of their own.
        healthCheck={"stragglerWindowSteps": 0},
    )
    spec["checkpointDir"] = f"/shared/{CHECKPOINT_SUBDIR}"
    policy: dict[str, Any] = {"nodeFailureGraceSeconds": 0, "pendingTimeoutSeconds": 10}
    policy |= {"resizeCooldownSeconds": 5, "recovery": recovery}
    spec["failurePolicy"] = {**policy, **(failure_policy or {})}
    return job


def in_image(job: dict[str, Any], image: str, fs_group: int) -> dict[str, Any]:
    """``job`` with its workers in containers of ``image`` (the pod runner's container mode runs a pod
    whose image `make images` built in a container of it). The shared volume goes to the group
    ``fs_group`` (the pod's ``securityContext.fsGroup``), so the image's non-root user can write it."""
    out = copy.deepcopy(job)
    out["spec"]["image"] = image
    template = out["spec"].setdefault("podTemplate", {}).setdefault("spec", {})
    template.setdefault("securityContext", {})["fsGroup"] = fs_group
    return out


def metrics_path(volume: Path) -> Path:
    """Rank 0's ``metrics.jsonl`` of the example job (its checkpoint directory)."""
    return volume / CHECKPOINT_SUBDIR / "metrics.jsonl"


def records(volume: Path) -> list[dict[str, Any]]:
    """Every complete step record so far (empty before the first step)."""
    from llm_elastic.metrics import read_records

    path = metrics_path(volume)
    return read_records(path) if path.is_file() else []


def sample_order(volume: Path) -> Any:
    """The global sample order of the prepared data (for ``llm_elastic.accounting.audit``)."""
    from llm_elastic.order import GlobalOrder
    from llm_trainer.data.shards import TokenShards

    return GlobalOrder(TokenShards(volume / DATA_SUBDIR, SEQ_LEN).num_samples, SEED)


def spare_job(
    name: str,
    namespace: str,
    *,
    replicas: int = 1,
    spares: int = 1,
    steps: int = 100000,
    health_check: dict[str, Any] | None = None,
    failure_policy: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The in-process smoke job at ``replicas`` training workers plus ``spares`` warm spares, one per fake
    p5 node (``replicas + spares`` nodes: the process cluster has 2 GPU nodes; ``chaos.add_node`` adds
    more). ``health_check`` is spec.healthCheck (the runtime's checks; ``chaos.node_fault`` makes a node
    fail one for real). Pods beyond the first ``replicas`` registered wait as spares."""
    job = training_job(
        name,
        namespace,
        minimum=1,
        maximum=replicas,
        steps=steps,
        recovery="inProcess",
        failure_policy=failure_policy,
    )
    job["spec"]["spareReplicas"] = spares
    if health_check is not None:
        job["spec"]["healthCheck"] = health_check
    return job


def plain_script_job(
    name: str, namespace: str, volume: Path, *, minimum: int, maximum: int, steps: int, step_seconds: float
) -> dict[str, Any]:
    """deploy/examples/plain-pytorch-inprocess.yaml on the fake p5 nodes (one worker per node), its script
    copied to the shared volume as the example's comments say; metrics where :func:`metrics_path` looks."""
    code = volume / "code" / "plain-pytorch"
    code.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(paths.repo_root() / PLAIN_SCRIPT, code / "train.py")
    job = copy.deepcopy(example_job(PLAIN_EXAMPLE))
    job["metadata"] = {"name": name, "namespace": namespace}
    spec = job["spec"]
    spec["args"] = ["--steps", str(steps), "--checkpoint-every", "0", "--step-seconds", str(step_seconds)]
    spec.update(
        minReplicas=minimum,
        maxReplicas=maximum,
        gpusPerNode=8,
        nprocPerNode=1,
        efaPerNode=0,
        scheduling={"instanceTypes": ["p5.48xlarge"]},
        env=[{"name": "OMP_NUM_THREADS", "value": "1"}],
        healthCheck={"stragglerWindowSteps": 0},  # one machine's cores shared by every fake node
    )
    spec["checkpointDir"] = f"/shared/{CHECKPOINT_SUBDIR}"
    spec["failurePolicy"] = {
        "recovery": "inProcess",
        "nodeFailureGraceSeconds": 0,
        "pendingTimeoutSeconds": 10,
        "resizeCooldownSeconds": 5,
    }
    return job


def plain_script_order() -> Any:
    """The plain script's global sample order (its ElasticSampler's)."""
    from llm_elastic.order import GlobalOrder

    return GlobalOrder(PLAIN_SAMPLES, PLAIN_SAMPLER_SEED)
