"""The local pod runner's pure parts: $(VAR) expansion, pod spec -> launch plan, volumes."""

from __future__ import annotations

from pathlib import PurePath
from typing import Any

import pytest
from llm_testbed.podrunner import plan, volumes
from llm_testbed.podrunner.expand import expand


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("$(A)", "1"),
        ("x-$(A)-$(B)", "x-1-two"),
        ("$(MISSING)", "$(MISSING)"),
        ("$$(A)", "$(A)"),
        ("$$", "$"),
        ("a$b", "a$b"),
        ("$(A", "$(A"),
        ("trailing $", "trailing $"),
        ("", ""),
    ],
)
def test_expand_like_kubelet(text: str, expected: str) -> None:
    assert expand(text, {"A": "1", "B": "two"}) == expected


def _pod(**spec: Any) -> dict[str, Any]:
    container = {"name": "main", "image": "img", "command": ["python", "-c"], "args": ["print(1)"]}
    container.update(spec.pop("container", {}))
    return {
        "metadata": {"name": "w-0", "namespace": "team", "uid": "u1", "labels": {"app": "x"}},
        "spec": {"nodeName": "gpu-node-1", "containers": [container], **spec},
    }


def _env(pod: dict[str, Any]) -> dict[str, str]:
    return plan.container_env(
        pod, pod["spec"]["containers"][0], pod_ip="127.1.0.5", host_ip="10.1.0.1", base={"PATH": "/venv/bin"}
    )


def test_env_literals_field_refs_and_references_in_order() -> None:
    pod = _pod(
        container={
            "env": [
                {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
                {"name": "WHO", "value": "$(POD).$(NS)@$(IP) $(LATER)"},
                {"name": "LATER", "value": "late"},
                {"name": "PATH", "value": "/extra:$(PATH)"},
            ]
        }
    )
    env = _env(pod)
    assert env["POD"] == "w-0" and env["NS"] == "team" and env["NODE"] == "gpu-node-1"
    assert env["IP"] == "127.1.0.5" and env["APP"] == "x"
    assert env["WHO"] == "w-0.team@127.1.0.5 $(LATER)"  # only variables defined before expand
    assert env["PATH"] == "/extra:/venv/bin"


@pytest.mark.parametrize(
    ("env_item", "message"),
    [
        (
            {"name": "S", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
            "env S: valueFrom.secretKeyRef",
        ),
        ({"name": "F", "valueFrom": {"fieldRef": {"fieldPath": "spec.nope"}}}, "fieldPath 'spec.nope'"),
    ],
)
def test_env_sources_we_cannot_provide_are_named(env_item: dict[str, Any], message: str) -> None:
    with pytest.raises(plan.PlanError, match=message.replace("(", r"\(").replace("'", "'")):
        _env(_pod(container={"env": [env_item]}))


def test_optional_unsupported_sources_are_skipped() -> None:
    item = {"name": "S", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k", "optional": True}}}
    assert "S" not in _env(_pod(container={"env": [item]}))


def test_argv_expands_maps_programs_and_rewrites_loopback() -> None:
    container = {
        "name": "etcd",
        "command": ["etcd"],
        "args": ["--listen=http://0.0.0.0:2379", "--peer=http://127.0.0.1:2380", "--name=$(N)", "$$(N)"],
    }
    argv = plan.container_argv(container, {"N": "rdzv"}, pod_ip="127.1.0.9", programs={"etcd": "/bin/etcd"})
    assert argv == [
        "/bin/etcd",
        "--listen=http://127.1.0.9:2379",
        "--peer=http://127.1.0.9:2380",
        "--name=rdzv",
        "$(N)",
    ]


def test_no_command_is_a_clear_error() -> None:
    with pytest.raises(plan.PlanError, match="command is required"):
        plan.container_argv({"name": "c", "image": "busybox"}, {}, pod_ip="127.1.0.2", programs={})


def test_container_plan_has_hostname_workdir_and_mounts() -> None:
    pod = _pod(
        hostname="job-worker-0",
        subdomain="job-workers",
        container={
            "workingDir": "/work",
            "volumeMounts": [
                {"name": "fsx", "mountPath": "/fsx"},
                {"name": "dshm", "mountPath": "/dev/shm"},
                {"name": "token", "mountPath": "/var/run/secrets"},
                {"name": "fsx", "mountPath": "/ro", "readOnly": True, "subPath": "sub"},
            ],
        },
    )
    cp = plan.container_plan(
        pod,
        pod["spec"]["containers"][0],
        pod_ip="127.1.0.3",
        host_ip="",
        base_env={},
        programs={},
        volume_dirs={"fsx": "/s/pv/a", "dshm": "/dev/shm/x/u1/dshm", "token": None},
        hosts_file="/s/hosts",
    )
    assert cp.hostname == "job-worker-0" and cp.env["HOSTNAME"] == "job-worker-0"
    assert cp.cwd == "/work"
    assert [(m.source, m.target, m.read_only) for m in cp.mounts] == [
        ("/s/pv/a", "/fsx", False),
        ("/dev/shm/x/u1/dshm", "/dev/shm", False),
        ("/s/pv/a/sub", "/ro", True),
    ]


def test_unknown_volume_mount_and_other_init_restart_policies_are_rejected() -> None:
    with pytest.raises(plan.PlanError, match="names no volume"):
        plan.mounts_for({"name": "c", "volumeMounts": [{"name": "x", "mountPath": "/x"}]}, {})
    plan.check_pod(_pod(initContainers=[{"name": "i"}, {"name": "s", "restartPolicy": "Always"}]))
    with pytest.raises(plan.PlanError, match=r"spec.initContainers\[0\].restartPolicy"):
        plan.check_pod(_pod(initContainers=[{"name": "i", "restartPolicy": "OnFailure"}]))


def test_volume_dirs_map_claims_to_shared_pv_dirs_and_empty_dirs_per_pod() -> None:
    pod = _pod(
        volumes=[
            {"name": "fsx", "persistentVolumeClaim": {"claimName": "fsx-claim"}},
            {"name": "dshm", "emptyDir": {"medium": "Memory"}},
            {"name": "scratch", "emptyDir": {}},
            {"name": "token", "projected": {"sources": []}},
            {"name": "s3", "csi": {"driver": "s3.csi.aws.com"}},
        ]
    )
    dirs = volumes.volume_dirs(
        pod, state_dir=PurePath("/st"), shm_dir=PurePath("/dev/shm/r/c"), claim_volumes={"fsx-claim": "pv-1"}
    )
    assert dirs == {
        "fsx": "/st/volumes/pv/pv-1",
        "dshm": "/dev/shm/r/c/u1/dshm",
        "scratch": "/st/pods/u1/volumes/scratch",
        "token": "/st/pods/u1/volumes/token",
        "s3": None,
    }
    assert volumes.claims(pod) == ["fsx-claim"]
    with pytest.raises(volumes.VolumeNotReady, match="fsx-claim is not bound"):
        volumes.volume_dirs(pod, state_dir=PurePath("/st"), shm_dir=PurePath("/x"), claim_volumes={})
