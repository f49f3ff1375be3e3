"""Container mode's pure parts: a pod container as a ``podman run`` command line, its security context."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from llm_testbed.podrunner import apiservice, containers, incontainer, probes, security
from llm_testbed.podrunner.plan import ContainerPlan, Mount, PlanError

PODMAN = ["podman", "--root", "/c/storage", "--runtime", "runc"]
API = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": "6443"}


def _pod(container: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    main = {"name": "main", "image": "localhost/img:1", **(container or {})}
    return {
        "metadata": {"name": "w-0", "namespace": "team", "uid": "uid-1"},
        "spec": {"nodeName": "gpu-node-1", "containers": [main], **spec},
    }


def _base(**kw: Any) -> ContainerPlan:
    fields: dict[str, Any] = {"name": "main", "argv": ["ignored"], "env": {"PATH": "/host/venv/bin"},
                              "cwd": None, "hostname": "w-0", "hosts_file": "/s/pods/uid-1/hosts",
                              "cgroup": "/sys/fs/cgroup/unified/llmjob-podrunner/c/uid-1-main"}  # fmt: skip
    return ContainerPlan(**{**fields, **kw})


def _argv(pod: dict[str, Any], base: ContainerPlan | None = None, image_user: str = "1000") -> list[str]:
    cplan = incontainer.container_run_plan(
        pod, pod["spec"]["containers"][0], base or _base(),
        podman=PODMAN, podman_env={"PATH": "/usr/bin:/bin"}, cluster="c", image_user=image_user,
        pod_ip="127.1.0.7", host_ip="10.0.0.1", api_env=API, site_dir="/s/site",
        cgroup_parent="/llmjob-podrunner/c/uid-1-main", extra=["--ulimit", "nofile=1024:1024"],
    )  # fmt: skip
    assert cplan.in_image and cplan.mounts == [] and cplan.env == {"PATH": "/usr/bin:/bin"}
    return cplan.argv


def _flag_values(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag]


def _tail(argv: list[str]) -> list[str]:
    """What follows the image reference: the container's arguments."""
    return argv[argv.index("localhost/img:1") + 1 :]


def test_the_run_is_podmans_own_with_the_pods_identity_network_and_cgroup() -> None:
    argv = _argv(_pod())
    assert argv[: len(PODMAN) + 1] == [*PODMAN, "run"]
    for flag, value in [("--network", "host"), ("--hostname", "w-0"),
                        ("--cgroup-parent", "/llmjob-podrunner/c/uid-1-main"),
                        ("--name", "llmjob-c-uid-1-main"), ("--ulimit", "nofile=1024:1024")]:  # fmt: skip
        assert value in _flag_values(argv, flag), flag
    assert {"--rm", "--replace", "--pull=never", "--no-hosts", "--http-proxy=false"} <= set(argv)
    volumes = _flag_values(argv, "-v")
    assert "/s/pods/uid-1/hosts:/etc/hosts:ro" in volumes
    assert f"/s/site:{incontainer.SITE_MOUNT}:ro" in volumes
    labels = _flag_values(argv, "--label")
    assert f"{incontainer.LABEL_CLUSTER}=c" in labels and f"{incontainer.LABEL_POD}=uid-1" in labels


@pytest.mark.parametrize(
    ("container", "entrypoint", "args"),
    [
        ({}, None, []),  # the image's ENTRYPOINT and CMD
        ({"args": ["--help"]}, None, ["--help"]),  # args replace CMD only
        ({"command": ["python", "-m", "x"]}, ["python", "-m", "x"], []),  # CMD dropped
        ({"command": ["torchrun"], "args": ["--nnodes", "2"]}, ["torchrun"], ["--nnodes", "2"]),
    ],
)
def test_command_replaces_the_entry_point_and_args_the_cmd(
    container: dict[str, Any], entrypoint: list[str] | None, args: list[str]
) -> None:
    argv = _argv(_pod(container))
    found = _flag_values(argv, "--entrypoint")
    assert [json.loads(f) for f in found] == ([entrypoint] if entrypoint is not None else [])
    assert _tail(argv) == args


def test_image_argv_expands_references_and_moves_loopback_to_the_pod_ip() -> None:
    container = {"command": ["serve", "--listen=0.0.0.0:80"], "args": ["--peer=127.0.0.1:1", "$(WHO)"]}
    got = incontainer.image_argv(container, {"WHO": "me"}, "127.1.0.9")
    assert got == incontainer.ImageArgv(["serve", "--listen=127.1.0.9:80"], ["--peer=127.1.0.9:1", "me"])


def test_env_is_the_pods_over_the_service_env_never_the_hosts() -> None:
    pod = _pod({"env": [{"name": "A", "value": "1"}, {"name": "B", "value": "$(A)-$(HOSTNAME)"},
                        {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                        {"name": "PYTHONPATH", "value": "/app"}]})  # fmt: skip
    env = dict(e.split("=", 1) for e in _flag_values(_argv(pod), "--env"))
    assert env == {
        **API,
        "HOSTNAME": "w-0",
        "LLMJOB_PODRUNNER_POD_IP": "127.1.0.7",
        "PYTHONPATH": "/app",  # the pod's own value wins over the bind shim's
        "A": "1",
        "B": "1-w-0",
        "POD": "w-0",
    }
    assert "PATH" not in env and "/host/venv/bin" not in " ".join(_argv(pod))


def test_without_its_own_pythonpath_a_container_gets_the_bind_shim() -> None:
    env = dict(e.split("=", 1) for e in _flag_values(_argv(_pod()), "--env"))
    assert env["PYTHONPATH"] == incontainer.SITE_MOUNT


def _shm_pod(size: str | None, memory: str | None = None) -> dict[str, Any]:
    empty: dict[str, Any] = {"medium": "Memory", **({"sizeLimit": size} if size else {})}
    container: dict[str, Any] = {"volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}]}
    if memory:
        container["resources"] = {"limits": {"memory": memory}}
    return _pod(container, volumes=[{"name": "shm", "emptyDir": empty}])


@pytest.mark.parametrize(
    ("size", "memory", "expected"),
    [
        ("256Mi", None, 256 * 2**20),
        ("1Gi", "512Mi", 512 * 2**20),
        (None, "2G", 2 * 10**9),
        (None, None, None),
    ],
)
def test_shm_size_is_the_emptydir_size_limit_capped_by_the_memory_limit(
    size: str | None, memory: str | None, expected: int | None
) -> None:
    pod = _shm_pod(size, memory)
    assert incontainer.shm_limit(pod, pod["spec"]["containers"][0]) == expected


def test_shm_with_a_limit_is_shm_size_not_a_bind() -> None:
    base = _base(mounts=[Mount("/dev/shm/llmjob-podrunner/c/uid-1/shm", "/dev/shm"), Mount("/pv/a", "/data")])
    argv = _argv(_shm_pod("256Mi"), base)
    assert _flag_values(argv, "--shm-size") == [str(256 * 2**20)]
    assert _flag_values(argv, "-v")[2:] == ["/pv/a:/data:rw"]


def test_shm_without_a_limit_stays_the_shared_memory_folder() -> None:
    base = _base(mounts=[Mount("/dev/shm/llmjob-podrunner/c/uid-1/shm", "/dev/shm")])
    argv = _argv(_shm_pod(None), base)
    assert _flag_values(argv, "--shm-size") == []
    assert "/dev/shm/llmjob-podrunner/c/uid-1/shm:/dev/shm:rw" in _flag_values(argv, "-v")


def test_a_nodes_shm_fault_sets_the_size_and_other_tmpfs_mounts_are_tmpfs() -> None:
    base = _base(
        mounts=[Mount("/x", "/dev/shm", tmpfs_bytes=1 << 20), Mount("/y", "/scratch", tmpfs_bytes=4096)]
    )
    argv = _argv(_shm_pod("1Gi"), base)
    assert _flag_values(argv, "--shm-size") == [str(1 << 20)]
    assert _flag_values(argv, "--mount") == ["type=tmpfs,destination=/scratch,tmpfs-size=4096"]


def test_mounts_keep_read_only_and_files() -> None:
    message = Mount("/s/pods/uid-1/main.termination-log", "/dev/termination-log")
    base = _base(mounts=[Mount("/pv/fsx", "/fsx", read_only=True), message])
    volumes = _flag_values(_argv(_pod(), base), "-v")
    assert volumes[2:] == ["/pv/fsx:/fsx:ro", "/s/pods/uid-1/main.termination-log:/dev/termination-log:rw"]


def test_a_path_podman_cannot_bind_is_refused_by_name() -> None:
    with pytest.raises(PlanError, match="mount /data"):
        incontainer.mount_flags([Mount("/a:b", "/data")], shm_target=False)


def test_working_dir() -> None:
    assert _flag_values(_argv(_pod(), _base(cwd="/work")), "--workdir") == ["/work"]


CHART_POD = {
    "runAsNonRoot": True,
    "runAsUser": 65532,
    "runAsGroup": 65532,
    "seccompProfile": {"type": "RuntimeDefault"},
}
CHART_CONTAINER = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True,
                   "capabilities": {"drop": ["ALL"]}}  # fmt: skip


def test_the_charts_security_context_as_flags() -> None:
    pod = _pod({"securityContext": CHART_CONTAINER}, securityContext=CHART_POD)
    argv = _argv(pod, image_user="65532:65532")
    assert _flag_values(argv, "--user") == ["65532:65532"]
    assert {"--read-only", "--read-only-tmpfs=false"} <= set(argv)
    assert _flag_values(argv, "--cap-drop") == ["ALL"]
    assert _flag_values(argv, "--security-opt") == ["no-new-privileges"]


def test_a_workers_ipc_lock_fs_group_and_groups() -> None:
    pod = _pod({"securityContext": {"capabilities": {"add": ["IPC_LOCK"]}}},
               securityContext={"fsGroup": 1000, "supplementalGroups": [5, 6]})  # fmt: skip
    argv = _argv(pod)
    assert _flag_values(argv, "--cap-add") == ["IPC_LOCK"]
    assert _flag_values(argv, "--group-add") == ["1000", "5", "6"]
    assert _flag_values(argv, "--user") == []  # the image's own user


def test_the_containers_context_wins_over_the_pods() -> None:
    pod = _pod({"securityContext": {"runAsUser": 7}}, securityContext={"runAsUser": 1, "runAsGroup": 2})
    sec = security.security_of(pod, pod["spec"]["containers"][0])
    assert (sec.user, sec.group) == (7, 2)
    assert security.user_flag(sec, "", "main") == ["--user", "7:2"]


@pytest.mark.parametrize(
    ("image_user", "run_as", "message"),
    [
        ("", None, "would run as root"),
        ("0:0", None, "would run as root"),
        ("trainer", None, "not numeric"),
        ("1000", 0, "would run as root"),
    ],
)
def test_run_as_non_root_is_checked_like_a_kubelet(image_user: str, run_as: int | None, message: str) -> None:
    ctx: dict[str, Any] = {"runAsNonRoot": True, **({"runAsUser": run_as} if run_as is not None else {})}
    pod = _pod({"securityContext": ctx})
    with pytest.raises(PlanError, match=message):
        _argv(pod, image_user=image_user)


def test_run_as_non_root_passes_for_the_images_numeric_user() -> None:
    assert (
        _flag_values(_argv(_pod({"securityContext": {"runAsNonRoot": True}}), image_user="1000"), "--user")
        == []
    )


def test_run_as_group_alone_takes_the_images_user() -> None:
    pod = _pod({"securityContext": {"runAsGroup": 9}})
    assert _flag_values(_argv(pod, image_user="1000:1000"), "--user") == ["1000:9"]


@pytest.mark.parametrize(
    ("pod_ctx", "ctx", "message"),
    [
        ({}, {"runAsUser": -1}, r"securityContext.runAsUser: -1"),
        ({}, {"runAsUser": "1000"}, r"securityContext.runAsUser"),
        ({"fsGroup": True}, {}, r"spec.securityContext.fsGroup"),
        ({}, {"seLinuxOptions": {"level": "s0"}}, r"securityContext.seLinuxOptions: not supported"),
        ({"sysctls": [{"name": "a", "value": "1"}]}, {}, r"spec.securityContext.sysctls"),
        ({}, {"seccompProfile": {"type": "Localhost"}}, r"seccompProfile.type: 'Localhost'"),
        ({}, {"capabilities": {"add": ["IPC LOCK"]}}, r"capabilities.add: 'IPC LOCK'"),
    ],
)
def test_what_cannot_be_honoured_is_refused_naming_the_field(
    pod_ctx: dict[str, Any], ctx: dict[str, Any], message: str
) -> None:
    pod = _pod({"securityContext": ctx}, securityContext=pod_ctx)
    with pytest.raises(PlanError, match=message):
        security.security_of(pod, pod["spec"]["containers"][0])


def test_privileged_and_unconfined_seccomp() -> None:
    pod = _pod(
        {"securityContext": {"privileged": True}}, securityContext={"seccompProfile": {"type": "Unconfined"}}
    )
    argv = _argv(pod)
    assert "--privileged" in argv and "seccomp=unconfined" in _flag_values(argv, "--security-opt")


@pytest.mark.parametrize(
    ("text", "expected"), [("64Mi", 64 << 20), ("1G", 10**9), ("512", 512), ("2Ki", 2048), ("1.5Gi", 3 << 29)]
)
def test_byte_sizes(text: str, expected: int) -> None:
    assert incontainer.byte_size("x", text) == expected


def test_a_bad_size_names_the_volume() -> None:
    with pytest.raises(PlanError, match=r"volume shm: emptyDir\.sizeLimit"):
        incontainer.shm_limit(_shm_pod("lots"), _shm_pod("lots")["spec"]["containers"][0])


def test_a_probe_on_a_named_port_uses_the_containers_port_number() -> None:
    container = {"ports": [{"name": "health", "containerPort": 8080}]}
    probe = {"httpGet": {"path": "/readyz", "port": "health"}, "periodSeconds": 10}
    assert probes.numbered(probe, container)["httpGet"] == {"path": "/readyz", "port": 8080}
    assert probes.numbered({"tcpSocket": {"port": "other"}}, container) == {"tcpSocket": {"port": "other"}}


def test_the_bind_shim_comes_after_the_images_own_pythonpath() -> None:
    env = incontainer.service_env(API, "127.1.0.2", "w-0", image_pythonpath="/app")
    assert env["PYTHONPATH"] == f"/app:{incontainer.SITE_MOUNT}"


def test_the_kubernetes_service_names_in_a_pods_hosts_file() -> None:
    assert apiservice.hosts_line("127.2.0.1", "team") == (
        "127.2.0.1 kubernetes.default.svc.cluster.local kubernetes.default.svc kubernetes.default"
    )
    assert apiservice.hosts_line("127.2.0.1", "default").endswith(" kubernetes.default kubernetes")


def test_volumes_are_handed_over_as_a_kubelet_does(tmp_path: Path) -> None:
    """emptyDir: anyone may write; with fsGroup every volume folder is the group's, group-writable and
    set-group-ID (new files keep the group); a file keeps its own mode plus group read/write."""
    empty, claim = tmp_path / "empty", tmp_path / "pv"
    (claim / "data").mkdir(parents=True)
    (claim / "data" / "shard").write_bytes(b"x")
    (claim / "data" / "shard").chmod(0o644)
    group = os.getgid()
    pod = _pod(volumes=[{"name": "scratch", "emptyDir": {}}, {"name": "fsx", "persistentVolumeClaim": {}},
                        {"name": "host", "hostPath": {"path": str(tmp_path / "host")}}])  # fmt: skip
    containers.volume_owners(
        pod, {"scratch": str(empty), "fsx": str(claim), "host": str(tmp_path / "host")}, group
    )
    assert stat.S_IMODE(empty.stat().st_mode) & 0o777 == 0o777
    for folder in (claim, claim / "data"):
        mode = folder.stat().st_mode
        assert folder.stat().st_gid == group and mode & stat.S_ISGID and mode & 0o070 == 0o070
    assert stat.S_IMODE((claim / "data" / "shard").stat().st_mode) == 0o664
    assert not (tmp_path / "host").exists(), "hostPath is the machine's own: left alone"
