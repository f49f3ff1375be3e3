"""The local pod runner on a real control plane: pods run as processes, from their spec, for real.

Every test uses ``process_cluster`` (a cluster started with ``run_pods``) and its own namespace.
"""

from __future__ import annotations

import json
import os
import textwrap
import time
from typing import Any

import pytest
from llm_testbed.localcluster import chaos
from llm_testbed.localcluster.cluster import LocalCluster
from llm_testbed.podrunner import daemon as podrunner
from support.wait import wait_for

pytestmark = pytest.mark.timeout(240)

TOLERATE_GPU = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


def _pod(
    name: str,
    script: str,
    *,
    env: list[dict[str, Any]] | None = None,
    grace: int = 30,
    node: str | None = None,
    labels: dict[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "main",
        "image": "python:3.11",
        "command": ["python", "-u", "-c", textwrap.dedent(script)],
        "env": env or [],
    }
    container.update(spec.pop("container", {}))
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": grace,
        "tolerations": TOLERATE_GPU,
        "containers": [container],
        **spec,
    }
    if node:
        pod_spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    meta: dict[str, Any] = {"name": name}
    if labels:
        meta["labels"] = labels
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": pod_spec}


def _create(cluster: LocalCluster, ns: str, *objs: dict[str, Any]) -> None:
    doc = {"apiVersion": "v1", "kind": "List", "items": list(objs)}
    cluster.kubectl("create", "--namespace", ns, "-f", "-", input=json.dumps(doc))


def _pod_obj(cluster: LocalCluster, ns: str, name: str) -> dict[str, Any] | None:
    return cluster.kube.get("pod", name, ns)


def _terminated(cluster: LocalCluster, ns: str, name: str) -> dict[str, Any] | None:
    pod = _pod_obj(cluster, ns, name)
    if pod is None or pod["status"].get("phase") not in ("Succeeded", "Failed"):
        return None
    return pod


def _exit_code(pod: dict[str, Any]) -> int:
    code: int = pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"]
    return code


def _running_pid(cluster: LocalCluster, ns: str, name: str) -> int | None:
    pod = _pod_obj(cluster, ns, name)
    if pod is None or pod["status"].get("phase") != "Running":
        return None
    statuses = pod["status"].get("containerStatuses") or []
    if not statuses or "running" not in statuses[0]["state"]:
        return None
    return int(statuses[0]["containerID"].removeprefix("podrunner://"))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purposes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _log(cluster: LocalCluster, ns: str, pod: str) -> str:
    path = cluster.pod_log(ns, pod, "main")
    return path.read_text() if path.is_file() else ""


def test_pod_spec_env_workdir_and_volumes(process_cluster: LocalCluster, process_namespace: str) -> None:
    c, ns = process_cluster, process_namespace
    pv_name = f"pv-{ns}"
    pv = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": pv_name},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteMany"],
            "storageClassName": "",
            "hostPath": {"path": "/unused-by-the-runner"},
            "claimRef": {"namespace": ns, "name": "fsx-claim"},
        },
    }
    c.kubectl("create", "-f", "-", input=json.dumps(pv))
    try:
        pvc = {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "fsx-claim"},
            "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": pv_name,
                     "resources": {"requests": {"storage": "1Gi"}}},
        }  # fmt: skip
        env = [
            {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "WHO", "value": "$(POD)@$(NODE)"},
        ]
        writer = _pod(
            "writer",
            """
            import json, os, pathlib
            pathlib.Path("/scratch/x").write_text("scratch")
            pathlib.Path("/dev/shm/y").write_text("shm")
            out = {k: os.environ[k] for k in ("POD", "NS", "NODE", "IP", "WHO")}
            out.update(cwd=os.getcwd(), arg=os.environ["WHO"], shm=sorted(os.listdir("/dev/shm")))
            pathlib.Path("/fsx/writer.json").write_text(json.dumps(out))
            print("wrote", out)
            """,
            env=env,
            container={
                "workingDir": "/tmp/podrunner-wd",
                "volumeMounts": [
                    {"name": "fsx", "mountPath": "/fsx"},
                    {"name": "scratch", "mountPath": "/scratch"},
                    {"name": "dshm", "mountPath": "/dev/shm"},
                ],
            },
            volumes=[
                {"name": "fsx", "persistentVolumeClaim": {"claimName": "fsx-claim"}},
                {"name": "scratch", "emptyDir": {}},
                {"name": "dshm", "emptyDir": {"medium": "Memory"}},
            ],
        )
        _create(c, ns, pvc, writer)
        pod = wait_for(lambda: _terminated(c, ns, "writer"), timeout=60, what="pod writer to finish")
        assert pod["status"]["phase"] == "Succeeded", _log(c, ns, "writer")
        assert _exit_code(pod) == 0
        ip = pod["status"]["podIP"]
        assert ip.startswith("127.1.")
        written = json.loads((c.podrunner_dir / "volumes" / "pv" / pv_name / "writer.json").read_text())
        assert written == {
            "POD": "writer", "NS": ns, "NODE": pod["spec"]["nodeName"], "IP": ip,
            "WHO": f"writer@{pod['spec']['nodeName']}", "cwd": "/tmp/podrunner-wd",
            "arg": f"writer@{pod['spec']['nodeName']}", "shm": ["y"],
        }  # fmt: skip
        assert "wrote" in _log(c, ns, "writer")
        assert not os.path.exists("/dev/shm/y")  # the pod's /dev/shm was its own

        # A second pod sees the same claim's data, and its exit code is reported as it is.
        reader = _pod(
            "reader",
            """
            import json, sys
            data = json.load(open("/fsx/writer.json"))
            print("read", data["POD"])
            sys.exit(3)
            """,
            container={"volumeMounts": [{"name": "fsx", "mountPath": "/fsx", "readOnly": True}]},
            volumes=[{"name": "fsx", "persistentVolumeClaim": {"claimName": "fsx-claim"}}],
        )
        _create(c, ns, reader)
        pod = wait_for(lambda: _terminated(c, ns, "reader"), timeout=60, what="pod reader to finish")
        assert pod["status"]["phase"] == "Failed"
        assert _exit_code(pod) == 3
        assert "read writer" in _log(c, ns, "reader")
    finally:
        c.kubectl("delete", "pvc", "fsx-claim", "-n", ns, "--wait=false", check=False)
        c.kubectl("delete", "pv", pv_name, "--wait=false", check=False)


def test_missing_command_is_reported_not_run(process_cluster: LocalCluster, process_namespace: str) -> None:
    c, ns = process_cluster, process_namespace
    pod = _pod("nocmd", "")
    del pod["spec"]["containers"][0]["command"]
    _create(c, ns, pod)

    def waiting_reason() -> str | None:
        obj = _pod_obj(c, ns, "nocmd")
        statuses = (obj or {}).get("status", {}).get("containerStatuses") or []
        waiting = statuses[0]["state"].get("waiting", {}) if statuses else {}
        return f"{waiting.get('reason')}: {waiting.get('message')}" if waiting.get("message") else None

    reason = wait_for(waiting_reason, timeout=30, what="pod nocmd to report why it cannot run")
    assert reason.startswith("CreateContainerConfigError") and "command is required" in reason


def test_delete_sends_sigterm_then_sigkill_after_grace(
    process_cluster: LocalCluster, process_namespace: str
) -> None:
    c, ns = process_cluster, process_namespace
    stubborn = _pod(
        "stubborn",
        """
        import signal, time
        signal.signal(signal.SIGTERM, lambda *a: print("got SIGTERM, ignoring it", flush=True))
        print("up", flush=True)
        while True:
            time.sleep(3600)
        """,
        grace=3,
    )
    polite = _pod(
        "polite",
        """
        import signal, sys, time
        def bye(*a):
            print("got SIGTERM, leaving", flush=True)
            sys.exit(0)
        signal.signal(signal.SIGTERM, bye)
        print("up", flush=True)
        while True:
            time.sleep(3600)
        """,
        grace=60,
    )
    _create(c, ns, stubborn, polite)
    pids = {
        name: wait_for(lambda n=name: _running_pid(c, ns, n), timeout=60, what=f"pod {name} running")
        for name in ("stubborn", "polite")
    }
    wait_for(
        lambda: "up" in _log(c, ns, "stubborn") and "up" in _log(c, ns, "polite"), 30, "pods to print up"
    )

    started = time.monotonic()
    c.kubectl("delete", "pod", "stubborn", "polite", "-n", ns, "--wait=false")
    wait_for(lambda: _pod_obj(c, ns, "polite") is None, timeout=30, what="pod polite to be gone")
    polite_s = time.monotonic() - started
    wait_for(lambda: _pod_obj(c, ns, "stubborn") is None, timeout=30, what="pod stubborn to be gone")
    stubborn_s = time.monotonic() - started
    assert "got SIGTERM, leaving" in _log(c, ns, "polite")
    assert "got SIGTERM, ignoring it" in _log(c, ns, "stubborn")
    assert polite_s < 30, f"a pod that exits on SIGTERM waited {polite_s:.1f}s (grace 60 s)"
    assert stubborn_s >= 3, f"SIGKILL came after {stubborn_s:.1f}s, before the 3 s grace period"
    assert not _alive(pids["stubborn"]) and not _alive(pids["polite"])


def test_restart_policy_on_failure_restarts(process_cluster: LocalCluster, process_namespace: str) -> None:
    c, ns = process_cluster, process_namespace
    flaky = _pod(
        "flaky",
        """
        import os, pathlib, sys
        marker = pathlib.Path("/data/ran")
        if not marker.exists():
            marker.write_text("once")
            print("first run fails", flush=True)
            sys.exit(5)
        print("second run succeeds", flush=True)
        """,
        restartPolicy="OnFailure",
        container={"volumeMounts": [{"name": "data", "mountPath": "/data"}]},
        volumes=[{"name": "data", "emptyDir": {}}],
    )
    _create(c, ns, flaky)
    pod = wait_for(lambda: _terminated(c, ns, "flaky"), timeout=60, what="pod flaky to finish")
    assert pod["status"]["phase"] == "Succeeded"
    assert pod["status"]["containerStatuses"][0]["restartCount"] == 1
    log = _log(c, ns, "flaky")
    assert "first run fails" in log and "second run succeeds" in log


def test_node_not_ready_kills_the_nodes_processes(
    process_cluster: LocalCluster, process_namespace: str
) -> None:
    c, ns = process_cluster, process_namespace
    sleeper = """
        import subprocess, time
        child = subprocess.Popen(["sleep", "3600"], start_new_session=True)  # escapes the process group
        print("child", child.pid, flush=True)
        time.sleep(3600)
    """
    _create(c, ns, _pod("victim", sleeper, node="gpu-node-0"), _pod("bystander", sleeper, node="gpu-node-1"))
    victim = wait_for(lambda: _running_pid(c, ns, "victim"), timeout=60, what="pod victim running")
    bystander = wait_for(lambda: _running_pid(c, ns, "bystander"), timeout=60, what="pod bystander running")
    child_line = wait_for(
        lambda: next((ln for ln in _log(c, ns, "victim").splitlines() if ln.startswith("child")), None),
        timeout=30,
        what="victim to print its child's pid",
    )
    child = int(child_line.split()[1])
    assert _alive(victim) and _alive(child)

    chaos.node_not_ready("gpu-node-0", kube=c.kube)
    wait_for(lambda: not _alive(victim) and not _alive(child), timeout=10, what="victim's processes to die")
    assert _alive(bystander), "a pod on another node was killed"
    assert _pod_obj(c, ns, "victim")["status"]["phase"] == "Running"  # a dead kubelet reports nothing

    chaos.node_ready("gpu-node-0", kube=c.kube)
    pod = wait_for(
        lambda: _terminated(c, ns, "victim"), timeout=30, what="victim reported after the node returns"
    )
    assert pod["status"]["phase"] == "Failed" and _exit_code(pod) == 137


def test_delete_node_kills_the_nodes_processes(process_cluster: LocalCluster, process_namespace: str) -> None:
    c, ns = process_cluster, process_namespace
    _create(c, ns, _pod("doomed", "import time; time.sleep(3600)", node="gpu-node-1"))
    pid = wait_for(lambda: _running_pid(c, ns, "doomed"), timeout=60, what="pod doomed running")
    chaos.delete_node("gpu-node-1", kube=c.kube, wait=False)
    wait_for(lambda: not _alive(pid), timeout=10, what="doomed's process to die with its node")


def test_termination_taint_leaves_pods_running(process_cluster: LocalCluster, process_namespace: str) -> None:
    c, ns = process_cluster, process_namespace
    _create(c, ns, _pod("spot", "import time; time.sleep(3600)", node="gpu-node-0"))
    pid = wait_for(lambda: _running_pid(c, ns, "spot"), timeout=60, what="pod spot running")
    chaos.taint_for_termination("gpu-node-0", "spot", kube=c.kube)
    wait_for(lambda: "aws-node-termination-handler/spot-itn" in json.dumps(c.kube.get("node", "gpu-node-0")),
             timeout=10, what="the taint")  # fmt: skip
    assert _alive(pid) and _running_pid(c, ns, "spot") == pid


def test_pods_resolve_each_other_and_services(process_cluster: LocalCluster, process_namespace: str) -> None:
    c, ns = process_cluster, process_namespace
    server = """
        import http.server, os, socket
        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = os.environ["NAME"].encode()
                self.send_response(200); self.end_headers(); self.wfile.write(body)
        http.server.HTTPServer(("0.0.0.0", 8080), H).serve_forever()  # same port in both pods
    """
    name_env = [{"name": "NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
    peers = [
        _pod(f"peer-{i}", server, env=name_env, labels={"app": "peer", "idx": str(i)},
             hostname=f"peer-{i}", subdomain="peers",
             container={"readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1}})
        for i in range(2)
    ]  # fmt: skip
    headless = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "peers"},
        "spec": {"clusterIP": "None", "selector": {"app": "peer"}, "ports": [{"port": 8080}]},
    }
    front = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "front"},
             "spec": {"selector": {"app": "peer", "idx": "1"}, "ports": [{"port": 8080}]}}  # fmt: skip
    _create(c, ns, headless, front, *peers)
    for i in range(2):
        wait_for(lambda i=i: _ready(c, ns, f"peer-{i}"), timeout=60, what=f"peer-{i} ready")
    client = _pod(
        "client",
        f"""
        import socket, urllib.request
        def get(host):
            return urllib.request.urlopen(f"http://{{host}}:8080/", timeout=5).read().decode()
        print("fqdn", socket.getfqdn())
        print("peer-0", get("peer-0.peers.{ns}.svc.cluster.local"))
        print("peer-1", get("peer-1.peers.{ns}.svc"))
        print("front", get("front.{ns}.svc"), get("front"))
        """,
        hostname="client",
        subdomain="peers",
    )
    _create(c, ns, client)
    pod = wait_for(lambda: _terminated(c, ns, "client"), timeout=60, what="client to finish")
    log = _log(c, ns, "client")
    assert pod["status"]["phase"] == "Succeeded", log
    assert f"fqdn client.peers.{ns}.svc.cluster.local" in log
    assert "peer-0 peer-0" in log and "peer-1 peer-1" in log and "front peer-1 peer-1" in log


def _ready(cluster: LocalCluster, ns: str, name: str) -> bool:
    pod = _pod_obj(cluster, ns, name)
    conds = {x["type"]: x["status"] for x in (pod or {}).get("status", {}).get("conditions", [])}
    return conds.get("Ready") == "True"


def test_etcd_pod_runs_the_pinned_etcd(process_cluster: LocalCluster, process_namespace: str) -> None:
    """The operator's etcd rendezvous pod, as it builds it: `etcd` maps to our pinned binary."""
    c, ns = process_cluster, process_namespace
    etcd = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "rdzv", "labels": {"app": "rdzv"}},
        "spec": {
            "restartPolicy": "Always",
            "containers": [{
                "name": "main",
                "image": "quay.io/coreos/etcd:v3.6.16",
                "command": ["etcd"],
                "args": ["--name=rdzv", "--data-dir=/var/run/etcd/data",
                         "--listen-client-urls=http://0.0.0.0:2379",
                         f"--advertise-client-urls=http://rdzv.{ns}.svc:2379",
                         "--listen-peer-urls=http://127.0.0.1:2380",
                         "--initial-advertise-peer-urls=http://127.0.0.1:2380",
                         "--initial-cluster=rdzv=http://127.0.0.1:2380"],
                "readinessProbe": {"httpGet": {"path": "/health", "port": 2379}, "periodSeconds": 1},
                "volumeMounts": [{"name": "data", "mountPath": "/var/run/etcd"}],
            }],
            "volumes": [{"name": "data", "emptyDir": {}}],
        },
    }  # fmt: skip
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "rdzv"},
           "spec": {"selector": {"app": "rdzv"}, "ports": [{"port": 2379}]}}  # fmt: skip
    _create(c, ns, svc, etcd)
    wait_for(lambda: _ready(c, ns, "rdzv"), timeout=60, what="etcd pod ready (its /health answers)")
    probe = _pod(
        "probe",
        f"""
        import urllib.request
        print(urllib.request.urlopen("http://rdzv.{ns}.svc:2379/health", timeout=5).read().decode())
        """,
    )
    _create(c, ns, probe)
    pod = wait_for(lambda: _terminated(c, ns, "probe"), timeout=60, what="probe to finish")
    assert pod["status"]["phase"] == "Succeeded", _log(c, ns, "probe")
    assert '"health":"true"' in _log(c, ns, "probe").replace(" ", "")


ETCD_ARGS = [
    "--name=rdzv",
    "--data-dir=/var/run/etcd/data",
    "--listen-client-urls=http://0.0.0.0:2379",
    "--advertise-client-urls=http://0.0.0.0:2379",
    "--listen-peer-urls=http://127.0.0.1:2380",
    "--initial-advertise-peer-urls=http://127.0.0.1:2380",
    "--initial-cluster=rdzv=http://127.0.0.1:2380",
]


def _rendezvous_pod(backend: str) -> dict[str, Any]:
    """The rendezvous server pod as the operator builds it (argv, probe, volume)."""
    pod = _pod("rdzv-server", "", labels={"app": "rdzv"}, restartPolicy="Always")
    container = pod["spec"]["containers"][0]
    if backend == "c10d":
        container.update(
            command=["python", "-m", "llm_elastic.rendezvous.tcpstore_server", "--port", "29400"],
            readinessProbe={"tcpSocket": {"port": 29400}, "periodSeconds": 1},
        )
    else:
        container.update(
            image="quay.io/coreos/etcd:v3.6.16",
            command=["etcd"],
            args=ETCD_ARGS,
            readinessProbe={"httpGet": {"path": "/health", "port": 2379}, "periodSeconds": 1},
            volumeMounts=[{"name": "data", "mountPath": "/var/run/etcd"}],
        )
        pod["spec"]["volumes"] = [{"name": "data", "emptyDir": {}}]
    return pod


@pytest.mark.parametrize(("backend", "port"), [("c10d", 29400), ("etcd-v3", 2379)])
def test_two_pod_torchrun_through_a_rendezvous_pod(
    process_cluster: LocalCluster, process_namespace: str, backend: str, port: int
) -> None:
    """torchrun in two pods, rendezvous through a server pod by Service name, then a gloo all_reduce."""
    c, ns = process_cluster, process_namespace
    rdzv = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "rdzv"},
            "spec": {"selector": {"app": "rdzv"}, "ports": [{"port": port}]}}  # fmt: skip
    workers_svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "workers"},
                   "spec": {"clusterIP": "None", "selector": {"app": "worker"}}}  # fmt: skip
    script = """
        import os, torch, torch.distributed as dist
        dist.init_process_group("gloo")
        t = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(t)
        print("rank", dist.get_rank(), "of", dist.get_world_size(), "sum", t.item(), flush=True)
        dist.destroy_process_group()
    """
    env = [
        {"name": "PET_NNODES", "value": "2:2"},
        {"name": "PET_NPROC_PER_NODE", "value": "1"},
        {"name": "PET_RDZV_BACKEND", "value": backend},
        {"name": "PET_RDZV_ENDPOINT", "value": f"rdzv.{ns}.svc:{port}"},
        {"name": "PET_RDZV_ID", "value": ns},
        {"name": "PET_MAX_RESTARTS", "value": "0"},
        {"name": "TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "value": "1"},
        {"name": "OMP_NUM_THREADS", "value": "1"},
    ]
    workers = []
    for i in range(2):
        w = _pod(f"worker-{i}", "", env=env, labels={"app": "worker"}, hostname=f"worker-{i}",
                 subdomain="workers", node=f"gpu-node-{i}")  # fmt: skip
        w["spec"]["containers"][0].update(
            command=["torchrun", "--no-python"], args=["python", "-u", "-c", textwrap.dedent(script)]
        )
        workers.append(w)
    _create(c, ns, rdzv, workers_svc, _rendezvous_pod(backend))
    wait_for(lambda: _ready(c, ns, "rdzv-server"), timeout=90, what=f"{backend} rendezvous pod ready")
    _create(c, ns, *workers)
    for i in range(2):
        pod = wait_for(lambda i=i: _terminated(c, ns, f"worker-{i}"), timeout=180, what=f"worker-{i} done")
        log = _log(c, ns, f"worker-{i}")
        assert pod["status"]["phase"] == "Succeeded", log[-3000:]
        assert "of 2 sum 3.0" in log, log[-3000:]  # ranks follow join order, not pod names


def test_chaos_fail_pod_kills_and_reports_the_code(
    process_cluster: LocalCluster, process_namespace: str
) -> None:
    c, ns = process_cluster, process_namespace
    _create(c, ns, _pod("failing", "import time; time.sleep(3600)"))
    pid = wait_for(lambda: _running_pid(c, ns, "failing"), timeout=60, what="pod failing running")
    chaos.fail_pod(ns, "failing", 42, kube=c.kube)  # waits for Failed with exit code 42
    assert not _alive(pid)


def test_deletion_on_a_lost_node_waits_for_the_node(
    process_cluster: LocalCluster, process_namespace: str
) -> None:
    """A pod deleted while its node is lost stays Terminating; it goes once the node's kubelet is back."""
    c, ns = process_cluster, process_namespace
    _create(c, ns, _pod("stranded", "import time; time.sleep(3600)", node="gpu-node-1"))
    pid = wait_for(lambda: _running_pid(c, ns, "stranded"), timeout=60, what="pod stranded running")
    chaos.node_not_ready("gpu-node-1", kube=c.kube)
    wait_for(lambda: not _alive(pid), timeout=10, what="stranded's process to die with its node")
    c.kubectl("delete", "pod", "stranded", "-n", ns, "--wait=false")
    pod = _pod_obj(c, ns, "stranded")
    assert pod is not None and pod["metadata"].get("deletionTimestamp"), "removed without a kubelet"
    chaos.node_ready("gpu-node-1", kube=c.kube)  # waits until the pending deletion completed
    assert _pod_obj(c, ns, "stranded") is None


def test_runner_restart_reports_lost_processes(process_cluster: LocalCluster, process_namespace: str) -> None:
    """Stopping the runner kills every pod process; a new runner reports them and applies restartPolicy."""
    c, ns = process_cluster, process_namespace
    _create(c, ns, _pod("once", "import time; time.sleep(3600)"))
    _create(c, ns, _pod("always", "import time; time.sleep(3600)", restartPolicy="Always"))
    once = wait_for(lambda: _running_pid(c, ns, "once"), timeout=60, what="pod once running")
    always = wait_for(lambda: _running_pid(c, ns, "always"), timeout=60, what="pod always running")
    assert podrunner.stop(c.name, c.podrunner_dir)
    assert not _alive(once) and not _alive(always)
    podrunner.start(c.name, c.kubeconfig, c.podrunner_dir, {"etcd": c.tools["etcd"]})
    pod = wait_for(lambda: _terminated(c, ns, "once"), timeout=30, what="pod once reported after the restart")
    assert pod["status"]["phase"] == "Failed" and _exit_code(pod) == 137

    def restarted() -> dict[str, Any] | None:
        obj = _pod_obj(c, ns, "always")
        st = ((obj or {}).get("status", {}).get("containerStatuses") or [{}])[0]
        return st if "running" in st.get("state", {}) and st.get("restartCount") == 1 else None

    wait_for(restarted, timeout=30, what="pod always running again with restartCount 1")


def _sleeper(name: str, script: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "image": "python:3.11", "command": ["python", "-u", "-c", textwrap.dedent(script)],
            "volumeMounts": [{"name": "work", "mountPath": "/shared-dir"}], **extra}  # fmt: skip


def test_init_container_then_sidecar_then_main_and_the_sidecar_stops_after(
    process_cluster: LocalCluster, process_namespace: str
) -> None:
    """A regular init container runs to completion first, a native sidecar starts next and stays up while
    the main container runs, and is stopped once it is done: the pod Succeeds whatever the sidecar does."""
    c, ns = process_cluster, process_namespace
    prepare = _sleeper("prepare", 'open("/shared-dir/prepared", "w").write("ok")')
    shipper = _sleeper(
        "shipper",
        """
        import os, time
        assert os.path.exists("/shared-dir/prepared"), "the init container ran first"
        while True:
            open("/shared-dir/shipper", "w").write(str(os.getpid()))
            time.sleep(0.2)
        """,
        restartPolicy="Always",
    )
    main = """
        import os, time
        assert open("/shared-dir/prepared").read() == "ok"
        while not os.path.exists("/shared-dir/shipper"):
            time.sleep(0.1)
        print("sidecar up while main runs")
        """
    pod = _pod(
        "with-init",
        main,
        container={"volumeMounts": [{"name": "work", "mountPath": "/shared-dir"}]},
        volumes=[{"name": "work", "emptyDir": {}}],
        initContainers=[prepare, shipper],
    )
    _create(c, ns, pod)
    done = wait_for(lambda: _terminated(c, ns, "with-init"), timeout=60, what="pod with-init to finish")
    logs = {n: c.pod_log(ns, "with-init", n) for n in ("prepare", "shipper", "main")}
    text = {n: p.read_text() if p.is_file() else "" for n, p in logs.items()}
    assert done["status"]["phase"] == "Succeeded", (text, done["status"])
    assert "sidecar up while main runs" in _log(c, ns, "with-init")
    inits = {s["name"]: s for s in done["status"]["initContainerStatuses"]}
    assert inits["prepare"]["state"]["terminated"]["exitCode"] == 0
    stopped = inits["shipper"]["state"]["terminated"]
    assert stopped["exitCode"] == 143 and inits["shipper"]["restartCount"] == 0, "stopped by SIGTERM, once"
    main_end = done["status"]["containerStatuses"][0]["state"]["terminated"]["finishedAt"]
    assert stopped["finishedAt"] >= main_end, "the sidecar is stopped after the main container"
    conditions = {x["type"]: x["status"] for x in done["status"]["conditions"]}
    assert conditions["Initialized"] == "True"


def test_service_account_token_reaches_the_api_and_config_map_files(
    process_cluster: LocalCluster, process_namespace: str
) -> None:
    """The apiserver's kube-api-access volume gets a real token (TokenRequest), ca.crt and the namespace:
    the container authenticates as its ServiceAccount; a configMap volume has the ConfigMap's files."""
    c, ns = process_cluster, process_namespace
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "reader"}}
    settings = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"},
                "data": {"optimizer": "adamw"}}  # fmt: skip
    script = """
        import json, os, ssl, urllib.request
        sa = "/var/run/secrets/kubernetes.io/serviceaccount"
        token = open(f"{sa}/token").read()
        ctx = ssl.create_default_context(cafile=f"{sa}/ca.crt")
        url = "https://{}:{}/apis/authentication.k8s.io/v1/selfsubjectreviews".format(
            os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"])
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
        req = urllib.request.Request(url, json.dumps(body).encode(), method="POST",
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        review = json.load(urllib.request.urlopen(req, context=ctx))
        print("user", review["status"]["userInfo"]["username"], "namespace", open(f"{sa}/namespace").read())
        print("optimizer", open("/etc/settings/optimizer").read())
        try:
            open("/etc/settings/optimizer", "w")
        except OSError:
            print("settings read-only")
        """
    pod = _pod(
        "api-user",
        script,
        serviceAccountName="reader",
        container={"volumeMounts": [{"name": "settings", "mountPath": "/etc/settings"}]},
        volumes=[{"name": "settings", "configMap": {"name": "settings"}}],
    )
    _create(c, ns, account, settings, pod)
    done = wait_for(lambda: _terminated(c, ns, "api-user"), timeout=60, what="pod api-user to finish")
    log = _log(c, ns, "api-user")
    assert done["status"]["phase"] == "Succeeded", log
    assert f"user system:serviceaccount:{ns}:reader namespace {ns}" in log
    assert "optimizer adamw" in log and "settings read-only" in log
