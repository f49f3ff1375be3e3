"""Fixtures shared by every test tier (see docs/CONTRACTS.md, "Test fixtures").

- ``cluster`` (session): one local control plane for the whole run, named ``pytest-<pid>``: tools are
  built if missing, CRDs from ``crds/`` installed, ``KUBECONFIG`` exported; torn down at the end. After
  each test that used it, the node set is restored (chaos leaves nothing behind). When a test fails, the
  tails of every component log are attached to its report; full logs are kept under pytest's temp dir.
- The phantom-failure guard (``nodewatch.NodeGuard``) watches the nodes of both clusters: a node that
  leaves Ready without a test having failed it fails the test it happened in, with a message of its own
  ("PHANTOM NODE FAILURE"), never as a timeout somewhere else.
- Each session cluster has a supervisor (``restart.Supervisor``) that starts a component which exited by
  itself again; the test it happened in fails ("CONTROL PLANE COMPONENT DIED"). Tests that fault the
  control plane on purpose take those restarts from ``control_plane_supervisor``.
- ``namespace`` (function): a fresh namespace per test, deleted afterwards (pods force-deleted first,
  so pods stuck Terminating on a NotReady node cannot hold it).
- ``process_cluster`` (session): a second local cluster, ``pytest-run-<pid>``, started with ``run_pods``:
  its pods run for real as local processes (the local pod runner). Only tests that ask for it start it.
  ``process_namespace`` (function): a fresh namespace there, with ``KUBECONFIG`` pointing at that
  cluster for the test's duration; the node set is restored afterwards.
- ``container_cluster`` / ``container_namespace``: the same in the pod runner's container mode,
  ``pytest-ctr-<pid>``: pods of images `make images` built run in containers of them (podman + runc).
- ``karpenter_cluster`` / ``karpenter_namespace``: a run-pods cluster, ``pytest-kpt-<pid>``, with real
  Karpenter (``LocalCluster.up(..., karpenter=True)``) and no static GPU nodes: GPU pods make Karpenter
  launch nodes. After each test its NodePools are reset to the defaults and its nodes removed.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import uuid
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # `import support.*` in every import mode

from llm_testbed.karpenter import control as karpenter_control
from llm_testbed.localcluster import chaos, nodes, paths, restart
from llm_testbed.localcluster.cluster import LocalCluster, cluster_names, pid_alive
from llm_testbed.localcluster.nodewatch import NodeGuard
from support.tier_times import TierTimes
from support.tools_first import ToolsFirst
from support.wait import wait_for

TEST_GPU_NODES = int(os.environ.get("LLMJOB_TEST_GPU_NODES", "4"))
TEST_CPU_NODES = int(os.environ.get("LLMJOB_TEST_CPU_NODES", "2"))
PROCESS_GPU_NODES = int(os.environ.get("LLMJOB_TEST_PROCESS_GPU_NODES", "2"))
PROCESS_CPU_NODES = int(os.environ.get("LLMJOB_TEST_PROCESS_CPU_NODES", "1"))
LOG_TAIL_LINES = 40

_session_cluster: LocalCluster | None = None  # set while the session cluster exists (even half-started)
_session_ready = False  # set once it is up: only then are nodes restored after each test
_session_logs: Path | None = None
_session_peak_memory: dict[str, int] = {}
_pod_clusters: dict[str, LocalCluster] = {}  # fixture name -> its run-pods cluster, while it exists
_guards: dict[str, NodeGuard] = {}  # fixture name -> the phantom-failure guard of its cluster
_supervisors: dict[str, restart.Supervisor] = {}  # fixture name -> what restarts its cluster's components


@pytest.fixture
def one_rank() -> Iterator[None]:
    """A one-process gloo group, destroyed after the test (torch imported only by the tests that ask)."""
    import torch.distributed as dist
    from torch._C._distributed_c10d import HashStore

    dist.init_process_group("gloo", store=HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """The session's local cluster (``LocalCluster``: .name, .kubeconfig, .kubectl(...), .tools)."""
    global _session_cluster, _session_ready, _session_logs
    _remove_clusters_of_dead_sessions()
    local = LocalCluster(f"pytest-{os.getpid()}")
    _session_logs = tmp_path_factory.mktemp("cluster-logs")
    previous = os.environ.get("KUBECONFIG")
    _session_cluster = local
    try:
        local.up(TEST_GPU_NODES, TEST_CPU_NODES, crds_dir=paths.crds_dir())
        os.environ["KUBECONFIG"] = str(local.kubeconfig)
        _session_ready = True
        _guards["cluster"] = NodeGuard(local.kube).start()
        _supervisors["cluster"] = restart.Supervisor.of(local).start()
        yield local
    finally:
        _stop_supervisor("cluster")
        _stop_guard("cluster")
        _session_ready = False
        _session_cluster = None
        _session_peak_memory.update(local.peak_memory_bytes())
        local.collect_logs(_session_logs)
        local.forget_failed_logs()
        local.down()
        if previous is None:
            os.environ.pop("KUBECONFIG", None)
        else:
            os.environ["KUBECONFIG"] = previous


def _remove_clusters_of_dead_sessions() -> None:
    """A killed test run cannot tear down its cluster: the next run does (live sessions are left alone)."""
    for name in cluster_names():
        match = re.fullmatch(r"pytest-(?:cli-|run-|ctr-|kpt-|kubelet-)?(\d+)", name)
        if match and not pid_alive(int(match.group(1))):
            LocalCluster(name).down()


def _stop_guard(name: str) -> None:
    guard = _guards.pop(name, None)
    if guard is not None:
        guard.stop()


@pytest.fixture(autouse=True)
def _no_phantom_node_failures() -> Iterator[None]:
    """Fail the test during which a node left Ready without any test having failed it."""
    yield
    found = [p for guard in list(_guards.values()) for p in guard.take()]
    _fail_listing(
        f"PHANTOM NODE FAILURE: the local cluster failed {len(found)} node(s) by itself while this test ran;"
        " the test bed is broken, not (necessarily) the test",
        [p.describe() for p in found],
    )


def _fail_listing(headline: str, items: list[str]) -> None:
    """Fail the current test (no traceback) with ``headline`` and one line per item; nothing if none."""
    if items:
        lines = "\n".join(f"  - {item}" for item in items)
        pytest.fail(f"{headline}:\n{lines}", pytrace=False)


@pytest.fixture(autouse=True)
def _restore_cluster_nodes(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a test that used the cluster, undo whatever it did to the nodes."""
    yield
    if "cluster" in request.fixturenames and _session_ready and _session_cluster is not None:
        baseline = nodes.cluster_nodes(TEST_GPU_NODES, TEST_CPU_NODES)
        chaos.restore_nodes(baseline, kube=_session_cluster.kube, timeout=60)


def _stop_supervisor(name: str) -> None:
    supervisor = _supervisors.pop(name, None)
    if supervisor is not None:
        supervisor.stop()


@pytest.fixture
def control_plane_supervisor(cluster: LocalCluster) -> restart.Supervisor:
    """For a test that faults the control plane on purpose: the session cluster's supervisor, whose
    restarts (``take()``) are the test's to report, not a broken test bed."""
    return _supervisors["cluster"]


@pytest.fixture(autouse=True)
def _control_plane_whole(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail the test during which a component of a session cluster exited by itself. The supervisor has
    started it again, so the tests after it run on a whole control plane (before it, one kube-scheduler
    that exited left every later cluster test to time out on Pending pods)."""
    yield
    for fixture, supervisor in list(_supervisors.items()):
        if fixture not in request.fixturenames:
            continue
        _fail_listing(
            f"CONTROL PLANE COMPONENT DIED while this test ran ({fixture}; started again for the tests"
            " after it)",
            [r.describe() for r in supervisor.take()],
        )


def _pods_running_cluster(
    fixture: str, name: str, logs: Path, containers: bool = False, karpenter: bool = False
) -> Iterator[LocalCluster]:
    """A run-pods cluster for a session fixture: up, guarded and supervised, its logs kept, then down."""
    _remove_clusters_of_dead_sessions()
    local = LocalCluster(name)
    _pod_clusters[fixture] = local
    try:
        gpu_nodes = 0 if karpenter else PROCESS_GPU_NODES
        local.up(gpu_nodes, PROCESS_CPU_NODES, crds_dir=paths.crds_dir(), run_pods=True,
                 containers=containers, karpenter=karpenter)  # fmt: skip
        _guards[fixture] = NodeGuard(local.kube).start()
        _supervisors[fixture] = restart.Supervisor.of(local).start()
        yield local
    finally:
        _stop_supervisor(fixture)
        _stop_guard(fixture)
        _pod_clusters.pop(fixture, None)
        local.collect_logs(logs)
        if local.podrunner_dir.is_dir():  # container logs and the runner's own, kept after `down`
            if (local.podrunner_dir / "logs").is_dir():  # absent when no pod ran (or set-up failed first)
                shutil.copytree(local.podrunner_dir / "logs", logs / "pods", dirs_exist_ok=True)
            runner_log = local.podrunner_dir / "runner.log"
            if runner_log.is_file():
                shutil.copyfile(runner_log, logs / "podrunner.log")
        if local.karpenter_log.is_file():
            shutil.copyfile(local.karpenter_log, logs / "karpenter.log")
        local.down()


@pytest.fixture(scope="session")
def process_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A local cluster whose pods run as real processes (``LocalCluster.up(..., run_pods=True)``)."""
    logs = tmp_path_factory.mktemp("process-cluster-logs")
    yield from _pods_running_cluster("process_cluster", f"pytest-run-{os.getpid()}", logs)


@pytest.fixture(scope="session")
def container_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A run-pods cluster in container mode (``containers=True``): pods whose images `make images` built
    run in containers of them (podman + runc); the others, like the rendezvous etcd, as processes."""
    logs = tmp_path_factory.mktemp("container-cluster-logs")
    yield from _pods_running_cluster("container_cluster", f"pytest-ctr-{os.getpid()}", logs, containers=True)


@pytest.fixture(scope="session")
def karpenter_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A run-pods cluster with real Karpenter (its kwok provider) and no static GPU nodes."""
    logs = tmp_path_factory.mktemp("karpenter-cluster-logs")
    yield from _pods_running_cluster("karpenter_cluster", f"pytest-kpt-{os.getpid()}", logs, karpenter=True)


def _pods_namespace(cluster: LocalCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    name = _namespace_name(request.node.name)
    cluster.kubectl("create", "namespace", name)
    wait_for(lambda: cluster.kube.get("serviceaccount", "default", name), timeout=30,
             what=f"ServiceAccount {name}/default")  # fmt: skip
    yield name
    cluster.kubectl("delete", "pods", "--all", "--namespace", name, "--force", "--grace-period=0",
                    "--wait=false", check=False)  # fmt: skip
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
    if cluster.runs_karpenter:
        karpenter_control.reset_pools(cluster.kube)
    baseline = nodes.cluster_nodes(0 if cluster.runs_karpenter else PROCESS_GPU_NODES, PROCESS_CPU_NODES)
    chaos.restore_nodes(baseline, kube=cluster.kube, timeout=60)


@pytest.fixture
def process_namespace(
    process_cluster: LocalCluster, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """A fresh namespace on ``process_cluster``; ``KUBECONFIG`` points there during the test."""
    monkeypatch.setenv("KUBECONFIG", str(process_cluster.kubeconfig))
    yield from _pods_namespace(process_cluster, request)


@pytest.fixture
def container_namespace(
    container_cluster: LocalCluster, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """A fresh namespace on ``container_cluster``; ``KUBECONFIG`` points there during the test."""
    monkeypatch.setenv("KUBECONFIG", str(container_cluster.kubeconfig))
    yield from _pods_namespace(container_cluster, request)


@pytest.fixture
def karpenter_namespace(
    karpenter_cluster: LocalCluster, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """A fresh namespace on ``karpenter_cluster``; ``KUBECONFIG`` points there during the test."""
    monkeypatch.setenv("KUBECONFIG", str(karpenter_cluster.kubeconfig))
    yield from _pods_namespace(karpenter_cluster, request)


def _namespace_name(test_name: str) -> str:
    slug = re.sub(r"[^a-z0-9-]+", "-", test_name.lower()).strip("-")[:40].rstrip("-")
    return f"t-{slug}-{uuid.uuid4().hex[:6]}"


@pytest.fixture
def namespace(cluster: LocalCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace (``t-<test>-<random>``) whose default ServiceAccount exists."""
    name = _namespace_name(request.node.name)
    cluster.kubectl("create", "namespace", name)
    wait_for(
        lambda: cluster.kube.get("serviceaccount", "default", name),
        timeout=30,
        what=f"ServiceAccount {name}/default",
    )
    yield name
    cluster.kubectl("delete", "pods", "--all", "--namespace", name, "--force", "--grace-period=0",
                    "--wait=false", check=False)  # fmt: skip
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def _tail(path: Path, lines: int) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError as exc:
        return f"(cannot read {path}: {exc})"
    return "\n".join(text[-lines:])


JOB_LOG_LINES = 15
"""Lines of each container log a failed cluster test's report shows (its operator's: ``LOG_TAIL_LINES``)."""


def _job_logs(item: pytest.Item, pod_logs: Path) -> list[tuple[str, str]]:
    """The tails of the failed test's own logs: its operator's (``operator-*.log`` in its tmp_path) and
    each container's in its namespace, where a flake seen only in CI can be read."""
    sections = []
    tmp = getattr(item, "funcargs", {}).get("tmp_path")
    for log in sorted(tmp.glob("operator-*.log")) if isinstance(tmp, Path) else []:
        lines = [ln for ln in _tail(log, 400).splitlines() if "Handler '" not in ln]
        sections.append(
            (f"{log.name} of the test (last {LOG_TAIL_LINES} lines)", "\n".join(lines[-LOG_TAIL_LINES:]))
        )
    for ns in _namespaces(item):
        for log in sorted((pod_logs / ns).glob("*/*.log")):
            title = f"{log.parent.name}/{log.name} (last {JOB_LOG_LINES} lines)"
            sections.append((title, _tail(log, JOB_LOG_LINES)))
    return sections


def _namespaces(item: pytest.Item) -> list[str]:
    """The namespaces the test's fixtures made (their names end in ``namespace``)."""
    args = getattr(item, "funcargs", {})
    return [v for k, v in args.items() if k.endswith("namespace") and isinstance(v, str)]


def _job_objects(item: pytest.Item, pod_cluster: LocalCluster) -> list[tuple[str, str]]:
    """What the failed test's namespaces hold as it failed: the jobs and their status, each pod's node, phase
    and readiness (a wait that timed out on the status shows here what the operator last wrote)."""
    sections = []
    for ns in _namespaces(item):
        status = 'jsonpath={range .items[*]}{.metadata.name}: {.status}{"\\n"}{end}'
        try:
            listed = pod_cluster.kubectl("get", "llmtrainingjobs,pods", "-n", ns, "-o", "wide", check=False)
            jobs = pod_cluster.kubectl("get", "llmtrainingjobs", "-n", ns, "-o", status, check=False)
            text = listed.stdout + listed.stderr + jobs.stdout
        except Exception as exc:  # the report must not fail for what it could not read
            text = f"(cannot list {ns}: {exc})"
        sections.append((f"objects in {ns} as the test failed", text.strip()))
    return sections


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, None, None]:
    """Attach the tails of the control plane's logs to the report of a failed cluster test."""
    outcome = yield
    report = outcome.get_result()
    failed = not (report.passed or report.skipped)
    for fixture, pod_cluster in list(_pod_clusters.items()) if failed else []:
        if fixture in getattr(item, "fixturenames", ()):
            runner_log = pod_cluster.podrunner_dir / "runner.log"  # starts, exits, deletions, node loss
            report.sections.append(
                (f"pod runner of {fixture} (last {LOG_TAIL_LINES} lines)", _tail(runner_log, LOG_TAIL_LINES))
            )
            if pod_cluster.runs_karpenter:
                report.sections.append(
                    (f"karpenter of {fixture} (last {LOG_TAIL_LINES} lines)",
                     _tail(pod_cluster.karpenter_log, LOG_TAIL_LINES))
                )  # fmt: skip
            report.sections.extend(_job_logs(item, pod_cluster.podrunner_dir / "logs"))
            report.sections.extend(_job_objects(item, pod_cluster))
    if report.passed or report.skipped or "cluster" not in getattr(item, "fixturenames", ()):
        return
    if _session_cluster is not None:
        logs = _session_cluster.log_files()
    elif _session_logs is not None:  # the cluster failed to start and is gone: use the kept copies
        logs = sorted(_session_logs.glob("*.log"))
    else:
        return
    for log in logs:
        report.sections.append((f"{log.stem} (last {LOG_TAIL_LINES} lines)", _tail(log, LOG_TAIL_LINES)))


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(TierTimes(), "tier-times")
    config.pluginmanager.register(ToolsFirst(), "tools-first")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _session_peak_memory:
        parts = ", ".join(f"{name} {size / 2**20:.0f}" for name, size in sorted(_session_peak_memory.items()))
        total = sum(_session_peak_memory.values()) / 2**20
        terminalreporter.write_line(f"local control plane peak RSS: {total:.0f} MiB ({parts})")
    if _session_logs is not None and _session_logs.is_dir() and any(_session_logs.iterdir()):
        terminalreporter.write_line(f"local cluster logs kept in {_session_logs}")
