"""The local pod runner's pure parts for init containers, native sidecars and API-backed volumes."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from llm_testbed.podrunner import initcontainers, plan, projected, status

POD: dict[str, Any] = {
    "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "labels": {"app": "a"}},
    "spec": {
        "serviceAccountName": "trainer",
        "restartPolicy": "Never",
        "initContainers": [
            {"name": "fetch", "image": "aws-cli"},
            {"name": "shipper", "image": "fluent-bit", "restartPolicy": "Always"},
        ],
        "containers": [{"name": "main", "image": "python"}],
    },
}


def _c(name: str = "i", **kw: Any) -> status.ContainerState:
    return status.ContainerState(name=name, image="img", **kw)


def test_init_states_and_specs_in_order() -> None:
    states = initcontainers.init_states(POD)
    assert [(c.name, c.init, c.sidecar) for c in states] == [("fetch", True, False), ("shipper", True, True)]
    assert initcontainers.spec_of(POD, "shipper")["image"] == "fluent-bit"
    assert initcontainers.spec_of(POD, "main")["image"] == "python"
    with pytest.raises(plan.PlanError, match="no container named 'x'"):
        initcontainers.spec_of(POD, "x")


@pytest.mark.parametrize(
    ("policy", "c", "code", "main_done", "restart"),
    [
        ("Never", _c(init=True), 1, False, False),  # a failed init container fails the pod
        ("OnFailure", _c(init=True), 1, False, True),
        ("Always", _c(init=True), 0, False, False),  # a completed one never runs again
        ("Never", _c(init=True, sidecar=True), 0, False, True),  # a sidecar is restarted whatever exit
        ("Never", _c(init=True, sidecar=True), 143, True, False),  # ... until the main containers are done
        ("OnFailure", _c(), 1, False, True),
        ("Never", _c(), 1, False, False),
    ],
)
def test_restart_rules(
    policy: str, c: status.ContainerState, code: int, main_done: bool, restart: bool
) -> None:
    assert initcontainers.should_restart(policy, c, code, main_done=main_done, injected=False) is restart
    assert not initcontainers.should_restart(policy, c, code, main_done=main_done, injected=True)


def test_phase_and_conditions_through_init() -> None:
    fetch, shipper, main = _c("fetch", init=True), _c("shipper", init=True, sidecar=True), _c("main")
    inits = [fetch, shipper]

    def doc() -> dict[str, Any]:
        return status.pod_status(
            POD, [main], pod_ip="127.1.0.1", host_ip="", start_time="t", at="t", inits=inits
        )

    def conditions() -> dict[str, str]:
        return {c["type"]: c["status"] for c in doc()["conditions"]}

    fetch.started_at = "t"
    assert doc()["phase"] == "Pending" and conditions()["Initialized"] == "False"
    assert doc()["initContainerStatuses"][0]["state"] == {"running": {"startedAt": "t"}}
    fetch.exit_code, fetch.finished_at = 0, "t"
    shipper.started_at, shipper.ready = "t", True
    main.started_at, main.ready = "t", True
    d = doc()
    assert d["phase"] == "Running" and conditions() == {
        "PodScheduled": "True", "Initialized": "True", "ContainersReady": "True", "Ready": "True"
    }  # fmt: skip
    fetch_st, shipper_st = d["initContainerStatuses"]
    assert fetch_st["state"]["terminated"]["reason"] == "Completed" and fetch_st["ready"] is True
    assert shipper_st["state"] == {"running": {"startedAt": "t"}} and shipper_st["started"] is True
    main.exit_code, main.finished_at = 0, "t"
    assert doc()["phase"] == "Succeeded", "the main container decides, not the running sidecar"
    shipper.exit_code = 143
    assert doc()["phase"] == "Succeeded"


def test_failed_init_container_fails_a_never_pod_before_main_starts() -> None:
    fetch = _c("fetch", init=True, started_at="t", exit_code=2, finished_at="t")
    assert (
        status.init_failed("Never", [fetch]) and status.pod_phase("Never", [_c("main")], [fetch]) == "Failed"
    )
    assert not status.init_failed("OnFailure", [fetch])
    assert status.pod_phase("OnFailure", [_c("main")], [fetch]) == "Pending"


def _api_pod(*volumes: dict[str, Any]) -> dict[str, Any]:
    return {**POD, "spec": {**POD["spec"], "volumes": list(volumes)}}


KUBE_API_ACCESS = {
    "name": "kube-api-access-x1",
    "projected": {
        "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {
                "downwardAPI": {
                    "items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]
                }
            },
        ]
    },
}


def test_kube_api_access_volume_files() -> None:
    pod = _api_pod(KUBE_API_ACCESS)
    (vs,) = projected.sources(pod)
    token = projected.TokenRef("token", None, 3607)
    assert vs.tokens == [token]
    objects = {("configMap", "kube-root-ca.crt"): {"ca.crt": b"PEM"}}
    assert projected.files(pod, vs, objects, {token: "jwt"}) == {
        "token": b"jwt", "ca.crt": b"PEM", "namespace": b"ns"
    }  # fmt: skip
    with pytest.raises(projected.SourceMissing, match=r"configMap kube-root-ca\.crt not found"):
        projected.files(pod, vs, {}, {token: "jwt"})


def test_config_map_secret_and_downward_api_volumes() -> None:
    pod = _api_pod(
        {"name": "settings", "configMap": {"name": "cm"}},
        {"name": "picked", "configMap": {"name": "cm", "items": [{"key": "a", "path": "sub/a.txt"}]}},
        {"name": "creds", "secret": {"secretName": "s", "optional": True}},
        {
            "name": "labels",
            "downwardAPI": {"items": [{"path": "app", "fieldRef": {"fieldPath": "metadata.labels['app']"}}]},
        },
        {"name": "scratch", "emptyDir": {}},
    )
    cm = {"data": {"a": "1"}, "binaryData": {"b": base64.b64encode(b"\x00").decode()}}
    objects = {("configMap", "cm"): projected.object_data("configMap", cm), ("secret", "s"): None}
    by_name = {vs.name: projected.files(pod, vs, objects, {}) for vs in projected.sources(pod)}
    assert by_name == {
        "settings": {"a": b"1", "b": b"\x00"},
        "picked": {"sub/a.txt": b"1"},
        "creds": {},  # optional and missing: an empty volume
        "labels": {"app": b"a"},
    }
    secret = {"data": {"k": base64.b64encode(b"v").decode()}}
    assert projected.object_data("secret", secret) == {"k": b"v"}


@pytest.mark.parametrize(
    ("volume", "message"),
    [
        (
            {"name": "v", "projected": {"sources": [{"clusterTrustBundle": {}}]}},
            "clusterTrustBundle is not supported",
        ),
        ({"name": "v", "downwardAPI": {"items": [{"path": "c", "resourceFieldRef": {}}]}}, "only fieldRef"),
        ({"name": "v", "configMap": {"name": "cm", "items": [{"key": "a", "path": "../a"}]}}, "without '..'"),
    ],
)
def test_unsupported_or_unsafe_sources_name_the_volume(volume: dict[str, Any], message: str) -> None:
    pod = _api_pod(volume)
    with pytest.raises(plan.PlanError, match=message):
        for vs in projected.sources(pod):
            projected.files(pod, vs, {("configMap", "cm"): {"a": b"1"}}, {})


def test_api_volumes_mount_read_only() -> None:
    mounts = plan.mounts_for(
        {
            "name": "c",
            "volumeMounts": [{"name": "settings", "mountPath": "/etc/s"}, {"name": "d", "mountPath": "/d"}],
        },
        {"settings": "/st/settings", "d": "/st/d"},
        read_only={"settings"},
    )
    assert [(m.target, m.read_only) for m in mounts] == [("/etc/s", True), ("/d", False)]
