"""The launcher and process control on this machine (no cluster): namespaces, mounts, tree kill."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from llm_testbed.podrunner import launch, process
from llm_testbed.podrunner.plan import ContainerPlan, Mount


def _can_unshare() -> bool:
    probe = subprocess.run(["unshare", "--mount", "--uts", "true"], capture_output=True, check=False)
    return probe.returncode == 0


needs_namespaces = pytest.mark.skipif(not _can_unshare(), reason="mount/UTS namespaces not permitted here")


def _launch(plan: ContainerPlan, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Run the launcher on ``plan`` as the runner does (a plan file, a new interpreter)."""
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(plan.to_json()))
    return subprocess.run(
        [sys.executable, "-m", "llm_testbed.podrunner.launch", str(plan_file)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


@needs_namespaces
def test_launcher_gives_the_pod_its_hostname_hosts_mounts_and_workdir(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text(
        "127.1.9.9 p-0.sub.ns.svc.cluster.local p-0.sub.ns.svc p-0 localhost\n127.1.9.8 svc.ns.svc\n"
    )
    volume = tmp_path / "vol"
    target = tmp_path / "mnt" / "data"  # created by the launcher
    script = (
        "import os, socket, pathlib;"
        "pathlib.Path('data/out.txt').write_text(' '.join([socket.gethostname(), socket.getfqdn(),"
        " socket.gethostbyname('svc.ns.svc'), os.environ['ONLY_HERE']]))"
    )
    plan = ContainerPlan(
        name="c",
        argv=["python", "-c", script],
        env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "ONLY_HERE": "yes"},
        cwd=str(tmp_path / "mnt"),
        hostname="p-0",
        hosts_file=str(hosts),
        mounts=[Mount(str(volume), str(target))],
    )
    result = _launch(plan, tmp_path)
    assert result.returncode == 0, result.stderr
    assert (volume / "out.txt").read_text() == "p-0 p-0.sub.ns.svc.cluster.local 127.1.9.8 yes"
    assert os.uname().nodename != "p-0"  # the machine's hostname is untouched
    assert not (target / "out.txt").exists()  # the bind mount was private to the pod


@needs_namespaces
def test_a_volume_over_the_runners_environment_leaves_it_visible(tmp_path: Path) -> None:
    """A checkout under /tmp with the chart's emptyDir at /tmp: the container still finds its code."""
    code = tmp_path / "covered" / "checkout"
    (code / "mine").mkdir(parents=True)
    (code / "mine" / "__init__.py").write_text("WHERE = 'kept'\n")
    empty = tmp_path / "empty-dir-volume"
    script = "import mine, pathlib; pathlib.Path('/covered-out/out.txt').write_text(mine.WHERE)"
    out = tmp_path / "out"
    plan = ContainerPlan(
        name="c",
        argv=["python", "-c", script],
        env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "PYTHONPATH": str(code)},
        cwd=None,
        hostname="p-0",
        hosts_file=str(tmp_path / "hosts"),
        mounts=[Mount(str(empty), str(tmp_path / "covered")), Mount(str(out), "/covered-out")],
    )
    (tmp_path / "hosts").write_text("127.0.0.1 localhost\n")
    result = _launch(plan, tmp_path)
    assert result.returncode == 0, result.stderr
    assert (out / "out.txt").read_text() == "kept"
    assert launch.hidden_by(["/tmp"], ["/tmp/ci/.venv", "/tmpx/a", "/usr"]) == ["/tmp/ci/.venv"]


@needs_namespaces
def test_a_volume_over_the_runners_cache_leaves_the_pods_own_files_bound(tmp_path: Path) -> None:
    """The runner's cache (the pod's folder) under /tmp, the chart's emptyDir at /tmp mounted first: the
    pod's later sources (a volume's folder, the termination-message file, the hosts file) are still bound."""
    pod = tmp_path / "cache" / "pod"
    (pod / "data").mkdir(parents=True)
    (pod / "c.termination-log").touch()
    (pod / "hosts").write_text("127.1.9.7 p-0 localhost\n")
    inside = tmp_path / "inside"  # the container's paths (under tmp_path: nothing made on the machine)
    script = (
        "import pathlib, socket;"
        f"pathlib.Path({str(inside / 'data' / 'out.txt')!r}).write_text(socket.gethostbyname('p-0'));"
        f"pathlib.Path({str(inside / 'termination-log')!r}).write_text('bye')"
    )
    plan = ContainerPlan(
        name="c",
        argv=["python", "-c", script],
        env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"},
        cwd=None,
        hostname="p-0",
        hosts_file=str(pod / "hosts"),
        mounts=[
            Mount(str(tmp_path / "empty-dir-volume"), str(tmp_path / "cache")),
            Mount(str(pod / "data"), str(inside / "data")),
            Mount(str(pod / "c.termination-log"), str(inside / "termination-log")),
        ],
    )
    result = _launch(plan, tmp_path)
    assert result.returncode == 0, result.stderr
    assert (pod / "data" / "out.txt").read_text() == "127.1.9.7"
    assert (pod / "c.termination-log").read_text() == "bye"


def test_launch_failure_is_one_line_and_exit_127(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "llm_testbed.podrunner.launch", str(tmp_path / "missing.json")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 127
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("llmjob pod runner: cannot start container:")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@needs_namespaces
def test_kill_tree_also_kills_a_child_in_its_own_session(tmp_path: Path) -> None:
    base = process.cgroup_base(f"unit-{os.getpid()}")
    child_file = tmp_path / "child"
    script = (
        "import subprocess, time, pathlib;"
        "c = subprocess.Popen(['sleep', '600'], start_new_session=True);"
        f"pathlib.Path({str(child_file)!r}).write_text(str(c.pid)); time.sleep(600)"
    )
    path = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}
    cgroup = str(base / "k-0") if base else None
    plan = ContainerPlan(
        "c", ["python", "-c", script], path, None, "k-0", str(tmp_path / "hosts"), cgroup=cgroup
    )
    (tmp_path / "hosts").write_text("127.1.9.7 k-0\n")
    (tmp_path / "plan.json").write_text(json.dumps(plan.to_json()))

    async def scenario() -> tuple[int, int, int]:
        proc = process.ContainerProcess(
            tmp_path / "plan.json", tmp_path / "log", base / "k-0" if base else None
        )
        pid = await proc.start()
        deadline = time.monotonic() + 30
        while not child_file.is_file() or not child_file.read_text():
            assert time.monotonic() < deadline, (tmp_path / "log").read_text()
            await asyncio.sleep(0.05)
        child = int(child_file.read_text())
        proc.kill_tree()
        code = await proc.wait()
        return pid, child, code

    try:
        pid, child, code = asyncio.run(scenario())
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert code == -9 and not _alive(pid)
        assert not _alive(child), "a process that left the process group survived"
    finally:
        if base is not None:
            process.kill_cgroup(base / "k-0")
            base.rmdir()
            assert not base.exists()


@needs_namespaces
def test_namespace_check_passes_where_namespaces_work() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "llm_testbed.podrunner.launch", "--check"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr


def test_in_image_the_launcher_only_execs_the_podman_argv(tmp_path: Path) -> None:
    """Container mode: no namespaces or mounts of the launcher's own; the argv (podman run) runs with the
    plan's env and keeps the launcher's PID."""
    script = "import os, socket; print(os.getpid(), os.environ.get('ONLY_HERE'), socket.gethostname())"
    plan = ContainerPlan(
        name="c", argv=[sys.executable, "-c", script], env={"ONLY_HERE": "yes"}, cwd=None,
        hostname="never-set", hosts_file="/nonexistent", in_image=True,
    )  # fmt: skip
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(plan.to_json()))
    proc = subprocess.Popen(
        [sys.executable, "-m", "llm_testbed.podrunner.launch", str(plan_file)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    pid, only_here, host = out.split()
    assert (int(pid), only_here) == (proc.pid, "yes") and host != "never-set"
