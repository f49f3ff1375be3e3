"""Every rule of what a job becomes, on the pure builders."""

from __future__ import annotations

from typing import Any

from llm_operator import labels
from llm_operator.builders.desired import desired_objects
from llm_operator.builders.rendezvous import endpoint, rendezvous_objects
from llm_operator.builders.worker import container_env, rdzv_conf, worker_pod, workers_service
from llm_operator.settings import Settings

from .jobs import job


def _env(pod: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in pod["spec"]["containers"][0]["env"]}


def test_worker_identity_owner_and_restart_policy() -> None:
    pod = worker_pod(job(), 2, 5)
    meta = pod["metadata"]
    assert meta["name"] == "llama-worker-2" and meta["namespace"] == "ml"
    assert meta["labels"][labels.JOB_NAME] == "llama"
    assert meta["labels"][labels.REPLICA_INDEX] == "2" and meta["labels"][labels.ATTEMPT] == "5"
    owner = meta["ownerReferences"][0]
    assert owner["uid"] == "uid-1234" and owner["controller"] is True and owner["kind"] == "LLMTrainingJob"
    spec = pod["spec"]
    assert spec["restartPolicy"] == "Never"
    assert spec["hostname"] == "llama-worker-2" and spec["subdomain"] == "llama-workers"


def test_torchrun_contract() -> None:
    pod = worker_pod(job(), 0, 0)
    c = pod["spec"]["containers"][0]
    assert c["command"] == ["torchrun", "--no-python"]
    assert c["args"] == ["python", "-m", "llm_trainer"]
    env = _env(pod)
    assert env["PET_NNODES"] == "2:4"
    assert env["PET_NPROC_PER_NODE"] == "8"
    assert env["PET_RDZV_BACKEND"] == "etcd-v3"
    assert env["PET_RDZV_ENDPOINT"] == "llama-rdzv.ml.svc:2379"
    assert env["PET_RDZV_ID"] == "uid-1234", "the rendezvous id must be the job's UID"
    assert env["PET_MAX_RESTARTS"] == "20"
    assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    ports = [(p["name"], p["containerPort"]) for p in c["ports"]]
    assert ports[0] == ("metrics", 9400) and ports[-1] == ("metrics-7", 9407) and len(ports) == 8
    assert (
        "join_timeout=900,last_call_timeout=2,close_timeout=10,heartbeat_timeout=5,keep_alive_interval=1"
        in env["PET_RDZV_CONF"]
    )


def test_user_args_and_checkpoint_dir() -> None:
    pod = worker_pod(job(command=["python", "train.py"], args=["--lr", "3e-4"], checkpointDir="/ck"), 0, 0)
    assert pod["spec"]["containers"][0]["args"] == ["python", "train.py", "--lr", "3e-4"]
    assert _env(pod)["LLMJOB_CHECKPOINT_DIR"] == "/ck"


def test_in_process_recovery_runs_the_program_under_the_in_pod_supervisor_with_the_live_contract() -> None:
    spec = {"failurePolicy": {"recovery": "inProcess", "maxRestarts": 4}, "gpusPerNode": 0, "nprocPerNode": 1}
    spec |= {"command": ["python", "-m", "llm_trainer"], "args": ["--data", "/d"]}
    spec["checkpointDir"] = "/ck"
    pod = worker_pod(job(**spec), 1, 0)
    c = pod["spec"]["containers"][0]
    assert c["command"] == ["python", "-m", "llm_elastic.supervise", "--max-restarts=4", "--"]
    assert c["args"] == ["python", "-m", "llm_trainer", "--data", "/d"]
    env = _env(pod)
    assert env["LLMJOB_RECOVERY"] == "inProcess"
    assert not [name for name in env if name.startswith("PET_")], "no torchrun rendezvous across nodes"
    assert env["LLMJOB_LIVE_ETCD"] == "llama-rdzv.ml.svc:2379"
    assert env["LLMJOB_LIVE_PREFIX"] == "/llmjob/uid-1234/live/"
    assert env["LLMJOB_LIVE_MIN_MEMBERS"] == "2"
    assert env["LLMJOB_POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["LLMJOB_CHECKPOINT_DIR"] == "/ck"


def test_in_process_recovery_with_several_processes_uses_torchrun_only_locally() -> None:
    spec = {"failurePolicy": {"recovery": "inProcess", "maxRestarts": 7}, "gpusPerNode": 8}
    pod = worker_pod(job(**spec), 0, 0)
    c = pod["spec"]["containers"][0]
    assert c["command"] == [
        "torchrun", "--standalone", "--nproc-per-node=8", "--max-restarts=7", "--no-python"
    ]  # fmt: skip
    assert c["args"] == ["python", "-m", "llm_trainer"]
    assert _env(pod)["LLMJOB_LIVE_MIN_MEMBERS"] == "16"


def test_rdzv_ids_differ_between_jobs() -> None:
    a = job()
    b = job()
    b.metadata.uid = "uid-other"
    assert _env(worker_pod(a, 0, 0))["PET_RDZV_ID"] != _env(worker_pod(b, 0, 0))["PET_RDZV_ID"]


def test_nproc_defaults() -> None:
    assert _env(worker_pod(job(gpusPerNode=0), 0, 0))["PET_NPROC_PER_NODE"] == "1"
    assert _env(worker_pod(job(gpusPerNode=8, nprocPerNode=4), 0, 0))["PET_NPROC_PER_NODE"] == "4"


def test_gpu_efa_resources_and_tolerations() -> None:
    pod = worker_pod(job(efaPerNode=32, resources={"cpu": "180", "memory": "1800Gi"}), 0, 0)
    c = pod["spec"]["containers"][0]
    assert c["resources"]["limits"] == {
        "cpu": "180",
        "memory": "1800Gi",
        "nvidia.com/gpu": "8",
        "vpc.amazonaws.com/efa": "32",
    }
    assert c["resources"]["requests"] == {"cpu": "180", "memory": "1800Gi"}
    assert c["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
    keys = {t["key"] for t in pod["spec"]["tolerations"]}
    assert keys == {"nvidia.com/gpu", "vpc.amazonaws.com/efa"}
    env = _env(pod)
    assert (
        env["FI_PROVIDER"] == "efa"
        and env["FI_EFA_USE_DEVICE_RDMA"] == "1"
        and env["FI_EFA_FORK_SAFE"] == "1"
    )


def test_no_gpu_no_efa_omits_limits_and_tolerations() -> None:
    pod = worker_pod(job(gpusPerNode=0), 0, 0)
    c = pod["spec"]["containers"][0]
    assert "resources" not in c and "securityContext" not in c
    assert pod["spec"]["tolerations"] == []
    assert "FI_PROVIDER" not in _env(pod)


def test_user_env_overrides_efa_defaults_only() -> None:
    j = job(
        efaPerNode=4,
        env=[{"name": "FI_EFA_FORK_SAFE", "value": "0"}, {"name": "HF_HOME", "value": "/fsx/hf"}],
    )
    env = container_env(j, 0, 0)
    names = [e["name"] for e in env]
    assert names.count("FI_EFA_FORK_SAFE") == 1
    assert {e["name"]: e.get("value") for e in env}["FI_EFA_FORK_SAFE"] == "0"
    assert "HF_HOME" in names


def test_volumes_fsx_and_shm() -> None:
    pod = worker_pod(job(fsx={"claimName": "fsx-claim", "mountPath": "/fsx"}, sharedMemory="64Gi"), 0, 0)
    vols = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert vols["fsx"]["persistentVolumeClaim"]["claimName"] == "fsx-claim"
    assert vols["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "64Gi"}
    mounts = {m["name"]: m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert mounts == {"fsx": "/fsx", "dshm": "/dev/shm"}


def test_scheduling_fields() -> None:
    user_affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                ]
            }
        }
    }
    j = job(
        scheduling={
            "nodeSelector": {"pool": "gpu"},
            "tolerations": [{"key": "dedicated", "operator": "Exists"}],
            "affinity": user_affinity,
            "instanceTypes": ["p5.48xlarge"],
            "priorityClassName": "high",
            "schedulerName": "volcano",
        },
        terminationGracePeriodSeconds=600,
    )
    spec = worker_pod(j, 0, 0)["spec"]
    assert spec["nodeSelector"] == {"pool": "gpu"} and spec["priorityClassName"] == "high"
    assert spec["schedulerName"] == "volcano" and spec["terminationGracePeriodSeconds"] == 600
    assert {"key": "dedicated", "operator": "Exists"} in spec["tolerations"]
    term = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ][0]
    keys = [e["key"] for e in term["matchExpressions"]]
    assert keys == ["zone", "node.kubernetes.io/instance-type"], (
        "instance types are ANDed into the user's term"
    )
    assert j.spec.scheduling.affinity == user_affinity, "the builder must not mutate the job"


def test_kueue_label_passthrough_and_gang() -> None:
    j = job(scheduling={"gangScheduling": True})
    j.metadata.labels[labels.KUEUE_QUEUE_NAME] = "gpu-queue"
    objs = desired_objects(j, Settings())
    pod = next(o for o in objs if o["kind"] == "Pod")
    assert pod["metadata"]["labels"][labels.KUEUE_QUEUE_NAME] == "gpu-queue"
    assert pod["metadata"]["labels"][labels.POD_GROUP_LABEL] == "llama"
    group = next(o for o in objs if o["kind"] == "PodGroup")
    assert group["spec"]["minMember"] == 2


def test_headless_service() -> None:
    svc = workers_service(job())
    assert svc["metadata"]["name"] == "llama-workers"
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["selector"] == labels.selector("llama")


def test_managed_etcd_rendezvous_off_workers() -> None:
    objs = rendezvous_objects(
        job(scheduling={"instanceTypes": ["p5.48xlarge"]}),
        Settings(rendezvous_image="etcd:test", rendezvous_node_selector={"pool": "cpu"}),
    )
    deploy, svc = objs
    assert deploy["kind"] == "Deployment" and svc["kind"] == "Service"
    pod = deploy["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == "etcd:test"
    assert pod["nodeSelector"] == {"pool": "cpu"}
    prefs = pod["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert any(e["operator"] == "NotIn" for p in prefs for e in p["preference"]["matchExpressions"])
    assert deploy["spec"]["template"]["metadata"]["labels"][labels.ROLE] == "rendezvous"
    assert svc["spec"]["ports"][0]["port"] == 2379


def test_rendezvous_server_leaves_a_lost_node_after_the_jobs_grace() -> None:
    deploy = rendezvous_objects(job(failurePolicy={"nodeFailureGraceSeconds": 7}), Settings())[0]
    tolerations = deploy["spec"]["template"]["spec"]["tolerations"]
    lost = {t["key"]: t["tolerationSeconds"] for t in tolerations if t["effect"] == "NoExecute"}
    assert lost == {"node.kubernetes.io/not-ready": 7, "node.kubernetes.io/unreachable": 7}


def test_c10d_rendezvous_pod() -> None:
    j = job(rendezvous={"backend": "c10d"})
    deploy, svc = rendezvous_objects(j, Settings())
    assert svc["spec"]["ports"][0]["port"] == 29400
    container = deploy["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "trainer:1"
    assert container["command"][:3] == ["python", "-m", "llm_elastic.rendezvous.tcpstore_server"]
    assert endpoint(j) == "llama-rdzv.ml.svc:29400"
    assert "is_host=false" in rdzv_conf(j)


def test_external_endpoint_creates_no_server() -> None:
    j = job(rendezvous={"endpoint": "etcd.shared:2379"})
    assert rendezvous_objects(j, Settings()) == []
    assert _env(worker_pod(j, 0, 0))["PET_RDZV_ENDPOINT"] == "etcd.shared:2379"


def test_desired_objects_size_and_suspend() -> None:
    kinds = [o["kind"] for o in desired_objects(job(), Settings())]
    assert kinds.count("Pod") == 4 and kinds.count("Service") == 2 and kinds.count("Deployment") == 1
    assert [o["kind"] for o in desired_objects(job(replicas=3), Settings())].count("Pod") == 3
    assert [o["kind"] for o in desired_objects(job(suspend=True), Settings())].count("Pod") == 0


def test_settings_from_env() -> None:
    s = Settings.from_env({"LLMJOB_RENDEZVOUS_IMAGE": "img", "LLMJOB_DEFAULT_NODE_SELECTOR": '{"a": "b"}'})
    assert s.rendezvous_image == "img" and s.rendezvous_node_selector == {"a": "b"}
    import pytest

    with pytest.raises(ValueError, match="LLMJOB_DEFAULT_NODE_SELECTOR"):
        Settings.from_env({"LLMJOB_DEFAULT_NODE_SELECTOR": "[1]"})


def _required_terms(pod: dict[str, Any]) -> list[dict[str, Any]]:
    terms: list[dict[str, Any]] = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    return terms


def test_avoid_nodes_anded_into_every_user_term() -> None:
    user_affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]},
                ]
            }
        }
    }
    j = job(scheduling={"affinity": user_affinity, "instanceTypes": ["p5.48xlarge"]})
    terms = _required_terms(worker_pod(j, 0, 1, avoid_nodes=["gpu-2", "gpu-0", "gpu-2"]))
    # The API accepts one value per metadata.name requirement: one NotIn per node.
    avoid = [{"key": "metadata.name", "operator": "NotIn", "values": [n]} for n in ("gpu-0", "gpu-2")]
    assert len(terms) == 2, "the user's ORed terms stay two terms"
    assert [e["key"] for e in terms[0]["matchExpressions"]] == ["zone", "node.kubernetes.io/instance-type"]
    assert terms[0]["matchFields"] == avoid
    assert terms[1]["matchFields"] == [
        {"key": "metadata.name", "operator": "In", "values": ["n1"]},
        *avoid,
    ]
    assert [e["key"] for e in terms[1]["matchExpressions"]] == ["node.kubernetes.io/instance-type"]
    assert j.spec.scheduling.affinity == user_affinity, "the builder must not mutate the job"


def test_avoid_nodes_without_user_affinity_makes_one_term() -> None:
    terms = _required_terms(worker_pod(job(), 0, 0, avoid_nodes=("gpu-1",)))
    assert terms == [{"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["gpu-1"]}]}]


def test_no_avoid_nodes_adds_no_required_term() -> None:
    pod = worker_pod(job(), 0, 0)
    assert "nodeAffinity" not in pod["spec"]["affinity"]
