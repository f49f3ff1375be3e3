"""The local pod runner's pure parts: pod IPs, hosts files, pod status, kwok config, in-place writes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from llm_testbed.localcluster import kwokconfig
from llm_testbed.podrunner import files, ipclaims, network, status


def test_ip_pool_round_robin_reuses_late_and_honours_wanted() -> None:
    pool = network.IpPool()
    a, b = pool.take(), pool.take()
    assert (a, b) == ("127.1.0.1", "127.1.0.2")
    pool.release(a)
    assert pool.take() == "127.1.0.3"  # a freed address is not handed out again at once
    assert pool.take("127.1.0.1") == "127.1.0.1"
    assert pool.take("127.1.0.1") != "127.1.0.1"  # taken: another one
    assert pool.take("10.0.0.1").startswith("127.1.")


def _entry(
    name: str, ip: str, *, ready: bool = True, sub: str = "job-workers", app: str = "w"
) -> network.PodEntry:
    return network.PodEntry("ns", name, ip, name, sub, {"app": app}, ready)


def _svc(name: str, app: str, headless: bool = False, ns: str = "ns") -> dict[str, Any]:
    spec: dict[str, Any] = {"selector": {"app": app}}
    if headless:
        spec["clusterIP"] = "None"
    return {"metadata": {"name": name, "namespace": ns}, "spec": spec}


def test_hosts_file_names_the_pod_its_peers_and_services() -> None:
    me, peer = _entry("job-worker-0", "127.1.0.1"), _entry("job-worker-1", "127.1.0.2")
    rdzv = _entry("job-rdzv-abc", "127.1.0.3", sub="", app="rdzv")
    unready = _entry("job-rdzv-old", "127.1.0.4", sub="", app="rdzv", ready=False)
    text = network.hosts_text(
        me,
        [me, peer, rdzv, unready],
        [
            _svc("job-rdzv", "rdzv"),
            _svc("job-workers", "w", headless=True),
            _svc("other", "rdzv", ns="elsewhere"),
        ],
    )
    lines = text.splitlines()
    assert (
        "127.1.0.1 job-worker-0.job-workers.ns.svc.cluster.local job-worker-0.job-workers.ns.svc "
        "job-worker-0 localhost" in lines
    )
    assert "127.1.0.2 job-worker-1.job-workers.ns.svc.cluster.local job-worker-1.job-workers.ns.svc" in lines
    assert "127.1.0.3 job-rdzv.ns.svc.cluster.local job-rdzv.ns.svc job-rdzv.ns job-rdzv" in lines
    assert not any(line.startswith("127.1.0.4") for line in lines)  # not ready: not behind a Service
    headless = [
        line
        for line in lines
        if "job-workers.ns.svc.cluster.local job-workers.ns.svc" in line
        and line.split()[1].startswith("job-workers.")
    ]
    assert sorted(line.split()[0] for line in headless) == ["127.1.0.1", "127.1.0.2"]
    assert not any("other." in line for line in lines)  # selects pods of its own namespace only


def _c(**kw: Any) -> status.ContainerState:
    return status.ContainerState(name="c", image="img", **kw)


@pytest.mark.parametrize(
    ("policy", "containers", "phase"),
    [
        ("Never", [_c()], "Pending"),
        ("Never", [_c(started_at="t")], "Running"),
        ("Never", [_c(started_at="t", exit_code=0)], "Succeeded"),
        ("Never", [_c(started_at="t", exit_code=3)], "Failed"),
        ("Never", [_c(started_at="t", exit_code=3), _c(started_at="t")], "Running"),
        ("OnFailure", [_c(started_at="t", exit_code=3, waiting_reason="CrashLoopBackOff")], "Running"),
        ("OnFailure", [_c(started_at="t", exit_code=0)], "Succeeded"),
    ],
)
def test_pod_phase(policy: str, containers: list[status.ContainerState], phase: str) -> None:
    assert status.pod_phase(policy, containers) == phase


@pytest.mark.parametrize(("returncode", "code"), [(0, 0), (3, 3), (-9, 137), (-15, 143)])
def test_exit_codes_like_kubernetes(returncode: int, code: int) -> None:
    assert status.exit_code_of(returncode) == code


@pytest.mark.parametrize(
    ("policy", "code", "restart"),
    [("Never", 1, False), ("OnFailure", 1, True), ("OnFailure", 0, False), ("Always", 0, True)],
)
def test_restart_policy(policy: str, code: int, restart: bool) -> None:
    assert status.should_restart(policy, code) is restart


def test_pod_status_reports_terminated_container_with_signal() -> None:
    pod = {"spec": {"restartPolicy": "Never", "containers": [{"name": "c"}]}}
    doc = status.pod_status(
        pod,
        [_c(started_at="t0", finished_at="t1", exit_code=137)],
        pod_ip="127.1.0.7",
        host_ip="10.0.0.1",
        start_time="t0",
        at="t1",
    )
    assert doc["phase"] == "Failed" and doc["podIP"] == "127.1.0.7"
    term = doc["containerStatuses"][0]["state"]["terminated"]
    assert term["exitCode"] == 137 and term["signal"] == 9 and term["reason"] == "Error"
    ready = {c["type"]: c["status"] for c in doc["conditions"]}
    assert ready["Ready"] == "False" and ready["PodScheduled"] == "True"


def test_pod_status_running_ready() -> None:
    pod = {"spec": {"containers": [{"name": "c"}]}}
    doc = status.pod_status(
        pod,
        [_c(started_at="t0", ready=True, pid=42)],
        pod_ip="127.1.0.7",
        host_ip="",
        start_time="t0",
        at="t0",
    )
    assert doc["phase"] == "Running"
    assert doc["containerStatuses"][0]["state"] == {"running": {"startedAt": "t0"}}
    assert {c["type"]: c["status"] for c in doc["conditions"]}["Ready"] == "True"


def test_run_pods_config_keeps_only_node_stages() -> None:
    docs = [d for d in yaml.safe_load_all(kwokconfig.render(kwokconfig.KwokctlSettings(run_pods=True))) if d]
    kinds = {d["spec"]["resourceRef"]["kind"] for d in docs if d["kind"] == "Stage"}
    assert kinds == {"Node"}
    default = [d for d in yaml.safe_load_all(kwokconfig.render(kwokconfig.KwokctlSettings())) if d]
    assert {d["spec"]["resourceRef"]["kind"] for d in default if d["kind"] == "Stage"} == {"Node", "Pod"}


def test_write_in_place_keeps_the_inode_and_pads_shorter_content(tmp_path: Path) -> None:
    path = tmp_path / "hosts"
    assert files.write_in_place(path, "127.1.0.1 a-long-name\n")
    inode = path.stat().st_ino
    assert files.write_in_place(path, "127.1.0.2 b\n")
    assert path.stat().st_ino == inode
    assert path.read_text().split() == ["127.1.0.2", "b"]
    assert not files.write_in_place(path, "127.1.0.2 b\n")


def test_each_cluster_runner_starts_in_a_24_of_its_own() -> None:
    names = ("pytest-run-7", "pytest-kpt-7")
    firsts = [network.IpPool(start=network.first_address(name)).take() for name in names]
    assert firsts[0] != firsts[1]
    assert all(ip.startswith("127.1.") and ip.endswith(".1") for ip in firsts)


def test_two_runners_never_hand_out_the_same_address_at_once(tmp_path: Path) -> None:
    """Two pools starting at the same place (two clusters whose names hash alike), each claiming machine-wide:
    the second skips what the first holds, and may take it once it is released."""
    first = network.IpPool(start=5, claims=ipclaims.FileClaims(tmp_path))
    second = network.IpPool(start=5, claims=ipclaims.FileClaims(tmp_path))
    a = first.take()
    b = second.take()
    assert a != b and second.take(a) not in (a, b)  # wanted, but claimed by the other runner
    first.release(a)
    assert second.take(a) == a
    assert not ipclaims.FileClaims(tmp_path).take(b)
    assert network.IpPool(start=5).take() == a  # without claims, nothing else is consulted


def test_a_runner_that_dies_leaves_no_claim(tmp_path: Path) -> None:
    claim = "import sys; from llm_testbed.podrunner import ipclaims; from pathlib import Path; "
    claim += "sys.exit(0 if ipclaims.FileClaims(Path(sys.argv[1])).take('127.1.0.9') else 3)"
    held = ipclaims.FileClaims(tmp_path)
    assert held.take("127.1.0.9")
    assert subprocess.run([sys.executable, "-c", claim, str(tmp_path)]).returncode == 3  # held here
    held.release("127.1.0.9")
    assert subprocess.run([sys.executable, "-c", claim, str(tmp_path)]).returncode == 0  # it exits holding it
    assert ipclaims.FileClaims(tmp_path).take("127.1.0.9")
