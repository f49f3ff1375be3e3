"""`llmjob chaos fault`: each node fault is real for the processes of a pod on that node.

What the runtime's health checks will meet on a bad node: a checkpoint volume that refuses writes
(EROFS), a CPU that gives a fraction of a core (cgroup quota, also applied to running pods), a /dev/shm
too small (a tmpfs of that size: ENOSPC). The faulty pods report like the runtime will: exit code 78 and
one line in the termination message, which the runner reports in the container's terminated state.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from llm_testbed.localcluster import chaos
from llm_testbed.localcluster.cluster import LocalCluster
from support.wait import wait_for

from .test_podrunner import _create, _log, _pod, _terminated

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

BAD, GOOD = "gpu-node-0", "gpu-node-1"

# Report like the runtime: one line to the termination message file, exit 78.
FAIL = """
def fail(line):
    with open("/dev/termination-log", "w") as f:
        f.write(line + "\\n")
    raise SystemExit(78)
"""


def _status(pod: dict[str, Any]) -> tuple[int, str]:
    term = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    return int(term["exitCode"]), str(term.get("message", ""))


def _both_done(c: LocalCluster, ns: str, names: tuple[str, str]) -> tuple[dict[str, Any], dict[str, Any]]:
    pods = wait_for(
        lambda: all(_terminated(c, ns, n) for n in names) and [_terminated(c, ns, n) for n in names],
        timeout=60,
        what=f"pods {', '.join(names)} to finish",
    )
    return pods[0], pods[1]


def test_readonly_volumes_fault_makes_checkpoint_writes_fail(
    process_cluster: LocalCluster, process_namespace: str
) -> None:
    c, ns = process_cluster, process_namespace
    pv_name = f"pv-{ns}"
    pv = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": pv_name},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"], "storageClassName": "",
                 "hostPath": {"path": "/unused"}, "claimRef": {"namespace": ns, "name": "fsx"}},
    }  # fmt: skip
    pvc = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "fsx"},
        "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": pv_name,
                 "resources": {"requests": {"storage": "1Gi"}}},
    }  # fmt: skip
    c.kubectl("create", "-f", "-", input=json.dumps(pv))
    try:
        chaos.node_fault(BAD, "readonly-volumes", kube=c.kube)
        script = (
            FAIL
            + """
import os
try:
    with open("/fsx/probe", "wb") as f:
        f.write(b"x" * (4 << 20)); f.flush(); os.fsync(f.fileno())
except OSError as exc:
    fail(f"preflight checkpoint-write: {exc}")
print("write ok")
"""
        )
        volume = {
            "container": {"volumeMounts": [{"name": "fsx", "mountPath": "/fsx"}]},
            "volumes": [{"name": "fsx", "persistentVolumeClaim": {"claimName": "fsx"}}],
        }
        pods = [_pod(name, script, node=node, **volume) for name, node in (("bad", BAD), ("good", GOOD))]
        _create(c, ns, pvc, *pods)
        bad, good = _both_done(c, ns, ("bad", "good"))
        assert _status(good)[0] == 0 and "write ok" in _log(c, ns, "good")
        code, message = _status(bad)
        assert code == 78, _log(c, ns, "bad")
        assert message.startswith("preflight checkpoint-write:") and "Read-only file system" in message
    finally:
        c.kubectl("delete", "pvc", "fsx", "-n", ns, "--wait=false", check=False)
        c.kubectl("delete", "pv", pv_name, "--wait=false", check=False)


def test_shm_fault_gives_a_small_dev_shm(process_cluster: LocalCluster, process_namespace: str) -> None:
    c, ns = process_cluster, process_namespace
    chaos.node_fault(BAD, "shm", "1Mi", kube=c.kube)
    script = (
        FAIL
        + """
import os
st = os.statvfs("/dev/shm")
size = st.f_blocks * st.f_frsize
try:
    with open("/dev/shm/probe", "wb") as f:
        f.write(b"x" * (4 << 20))
except OSError as exc:
    fail(f"preflight shared-memory: /dev/shm holds {size} bytes: {exc}")
print(f"shm ok {size}")
"""
    )
    shm = {
        "container": {"volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}]},
        "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}],
    }
    _create(c, ns, *(_pod(n, script, node=node, **shm) for n, node in (("bad", BAD), ("good", GOOD))))
    bad, good = _both_done(c, ns, ("bad", "good"))
    assert _status(good)[0] == 0 and "shm ok" in _log(c, ns, "good")
    code, message = _status(bad)
    assert code == 78, _log(c, ns, "bad")
    assert "holds 1048576 bytes" in message and "No space left on device" in message


def test_cpu_fault_throttles_running_and_new_pods(
    process_cluster: LocalCluster, process_namespace: str
) -> None:
    """The mark slows a pod that already runs (a node that degrades mid-run) within a second or two."""
    c, ns = process_cluster, process_namespace
    script = (
        FAIL
        + """
import time
# CPU time per wall second over 0.5 s windows of a busy loop: ~1 on a free core, the quota when throttled.
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    wall, cpu = time.monotonic(), time.process_time()
    while time.monotonic() - wall < 0.5:
        pass
    rate = (time.process_time() - cpu) / (time.monotonic() - wall)
    print(f"rate {rate:.3f}", flush=True)
    if rate < 0.2:
        fail(f"straggler: CPU rate {rate:.3f} of a core")
"""
    )
    _create(c, ns, _pod("slow", script, node=BAD))
    wait_for(lambda: "rate" in _log(c, ns, "slow"), timeout=30, what="the pod to measure its CPU rate")
    first = float(_log(c, ns, "slow").split("rate ")[1].split()[0])
    assert first > 0.2, f"unthrottled rate {first}: the machine is too busy for this test"
    chaos.node_fault(BAD, "cpu", "0.1", kube=c.kube)
    pod = wait_for(lambda: _terminated(c, ns, "slow"), timeout=30, what="the throttled pod to give up")
    code, message = _status(pod)
    assert code == 78 and message.startswith("straggler: CPU rate"), _log(c, ns, "slow")
    # A pod started on the node now is throttled from its first instruction.
    _create(c, ns, _pod("new", script, node=BAD))
    pod = wait_for(lambda: _terminated(c, ns, "new"), timeout=30, what="a new pod on the slow node")
    assert _status(pod)[0] == 78
    assert _log(c, ns, "new").count("rate ") == 1, "throttled in its first window"
