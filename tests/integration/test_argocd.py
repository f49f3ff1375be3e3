"""GitOps through a real Argo CD: the chart and a job synced from git, health computed by Argo CD.

Argo CD core (application controller, repo server, Redis: :mod:`llm_testbed.argocd`) runs against the
process-mode cluster, whose pods run for real, and syncs from a git repository in the test's folder. The
real Kueue manager (:mod:`llm_testbed.kueue`) runs beside it with a ClusterQueue that has no GPUs, so a
job on its LocalQueue stays queued. Two Applications, with the sync options and ignoreDifferences of the
ones the project ships (deploy/argocd/operator-application.yaml and jobs-application.yaml):

1. ``jobs``: a training job and a Kueue-queued job from git, synced before any operator runs. Argo CD's
   health for them, computed by deploy/argocd/health.lua in the controller's own Lua VM, is Progressing.
2. ``operator``: the chart from git; the operator pod runs, the Application is Synced and Healthy, and the
   job's health goes Healthy while it trains.
3. The queued job: Kueue keeps it queued, and Argo CD shows it Suspended (or Progressing) with the
   operator's "Queued" message, never Unknown; then it leaves git and the cluster.
4. The jobs Application stays Synced while the job trains: no diff from the API server's defaults or
   the operator's writes, over 4 comparisons by Argo CD each after a write (sampled through steps 5 to 7,
   so the operator's rollout, the CRD prune and the node loss may not make one either).
5. A new release in git (the chart's version and appVersion): Argo CD rolls the operator, and the job
   trains on in the same worker pods.
6. With ``prune: true``, a CRD removed from git and then the chart's Application deleted leave every CRD
   and the running job in place.
7. A node loss shows in Argo CD's health and clears once the job is whole again on a new node.
8. A short job committed to git finishes: Argo CD shows it Healthy with the operator's message.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from llm_testbed import argocd, training
from llm_testbed import kueue as local_kueue
from llm_testbed.argocd import apps
from llm_testbed.localcluster import chaos
from llm_testbed.localcluster.cluster import LocalCluster
from llm_testbed.localcluster.paths import repo_root
from llm_testbed.localcluster.waiting import WaitTimeout, poll
from support.sampling import sampled
from support.wait import wait_for

from .e2e_support import JOB, STEP_TIMEOUT, Training

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.trainer,
    pytest.mark.tools("kueue", "argocd"),
    pytest.mark.timeout(900),
]

ROOT = repo_root()
CHART = "charts/elastic-llm-operator"
OPERATOR_APP, JOBS_APP = "operator", "jobs"
SYNC_TIMEOUT = 240.0
COMPARISONS = 4
"""Step 4's window: Argo CD's comparisons with git (``reconciledAt``), each with a job the operator wrote
since the one before. Status-only writes do not make Argo CD compare; it compares every ``--app-resync``
(5 s here, :data:`llm_testbed.argocd.daemon.APP_RESYNC_S`), so 4 take about 20 s, where 2 minutes of
training saw 3 at the 30 s resync with its jitter."""
WINDOW_TIMEOUT = 120.0
SHORT_JOB = "short"
QUEUED_JOB = "queued"
NEW_VERSION = "0.1.1-argocd"
CRD_REMOVED = "elasticllm.dev_llmtrainingruntimes.yaml"
T = TypeVar("T")
CRD_NAMES = ("llmtrainingjobs.elasticllm.dev", "llmtrainingruntimes.elasticllm.dev")


def _shipped(name: str) -> dict[str, Any]:
    """The spec of an Application the project ships (deploy/argocd/<name>)."""
    spec: dict[str, Any] = yaml.safe_load((ROOT / "deploy" / "argocd" / name).read_text())["spec"]
    return spec


def _like_shipped(app: dict[str, Any], shipped: str) -> dict[str, Any]:
    """``app`` with the sync policy and ignoreDifferences of the shipped Application."""
    spec = _shipped(shipped)
    app["spec"]["syncPolicy"] = spec["syncPolicy"]
    app["spec"]["ignoreDifferences"] = spec.get("ignoreDifferences", [])
    return app


class ArgoWorld:
    """Argo CD on the process cluster, the git repository it syncs from, and the job's world."""

    def __init__(self, cluster: LocalCluster, namespace: str, folder: Path) -> None:
        self.cluster, self.ns = cluster, namespace
        self.git = argocd.GitRepo(folder / "git").init()
        self.t = Training(cluster, namespace, self)  # type: ignore[arg-type]

    def logs(self) -> str:
        """The operator pods' logs and Argo CD's, for a failure's diagnostics."""
        text = []
        for pod in self.cluster.kube.items("pods", labels=f"app.kubernetes.io/instance={OPERATOR_APP}",
                                           namespace=self.ns):  # fmt: skip
            path = self.cluster.pod_log(self.ns, pod["metadata"]["name"])
            if path.is_file():
                text.append(f"--- {pod['metadata']['name']} ---\n{path.read_text(errors='replace')[-2000:]}")
        folder = argocd.daemon.state_dir(self.cluster.workdir)
        for process in ("controller", "repo-server"):
            text.append(f"--- argocd {process} ---\n{argocd.daemon.log_tail(folder / f'{process}.log', 20)}")
        return "\n".join(text)

    def app(self, name: str) -> dict[str, Any] | None:
        return apps.get(self.cluster.kube, name)

    def commit(self, message: str, *names: str) -> str:
        sha = self.git.commit(message)
        for name in names:
            apps.refresh(self.cluster.kube, name)
        return sha

    def wait(
        self, fn: Callable[[], T | None], what: str, details: Callable[[], str], timeout: float = SYNC_TIMEOUT
    ) -> T:
        """``fn``'s first truthy value; else fail naming ``what``, with ``details()`` and Argo CD's logs."""
        try:
            found = poll(fn, timeout=timeout, what=what, interval=1.0)
        except WaitTimeout as exc:
            pytest.fail(f"{exc}\n{details()}\n{self.logs()}", pytrace=False)
        assert found is not None  # poll returns a truthy value
        return found

    def wait_synced_healthy(self, name: str, revision: str, what: str) -> dict[str, Any]:
        def done() -> dict[str, Any] | None:
            app = self.app(name)
            s = apps.state(app)
            return app if s.synced_healthy and s.revision == revision and s.operation != "Running" else None

        return self.wait(done, what, lambda: str(apps.state(self.app(name))))

    def job_health(self, job: str = JOB) -> tuple[str, str]:
        return apps.resource_health(self.app(JOBS_APP), "LLMTrainingJob", job)


@pytest.fixture
def world(process_cluster: LocalCluster, process_namespace: str, tmp_path: Path) -> Iterator[ArgoWorld]:
    try:
        with local_kueue.running(process_cluster.kube, tmp_path / "kueue") as kueue:
            try:
                # Before Argo CD: its first look at the cluster's APIs sees Kueue's, so the chart's
                # kueue.enabled "auto" renders on. No GPUs in the queue: Kueue holds every job sent to it.
                kueue.set_up_queues(process_namespace, gpu_nodes=0)
                yield from _argo_world(process_cluster, process_namespace, tmp_path)
            finally:
                _remove_queues(process_cluster, process_namespace)  # while Kueue runs: it lifts finalizers
    finally:
        # The process cluster as it was for the tests after this one: no Kueue APIs (its webhooks are gone).
        _remove_kueue_crds(process_cluster)


def _argo_world(process_cluster: LocalCluster, process_namespace: str, tmp_path: Path) -> Iterator[ArgoWorld]:
    kube = process_cluster.kube
    argocd.start(kube, process_cluster.workdir)
    w = ArgoWorld(process_cluster, process_namespace, tmp_path)
    w.t.setup_volume()
    try:
        yield w
    finally:
        for name in (JOBS_APP, OPERATOR_APP):  # without the resources finalizer: nothing is cascaded
            kube.run("delete", "applications.argoproj.io", name, "-n", argocd.NAMESPACE, "--wait=true",
                     "--timeout=60s", "--ignore-not-found", check=False)  # fmt: skip
        argocd.stop(process_cluster.workdir)
        # The jobs while their operator runs (kopf's finalizer), then the operator and its cluster objects.
        kube.run("delete", "llmtrainingjob", "--all", "-n", process_namespace, "--wait=true", "--timeout=60s",
                 check=False)  # fmt: skip
        kube.run("delete", "deployment", "--all", "-n", process_namespace, "--wait=false", check=False)
        instance = f"app.kubernetes.io/instance={OPERATOR_APP}"
        kube.run("delete", "clusterrole,clusterrolebinding", "-l", instance, check=False)
        kube.run("delete", "pv", w.t.pv, "--wait=false", check=False)
        # Whatever happened, the cluster's CRDs are the working tree's again for the tests after this one.
        process_cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))


def _remove_queues(cluster: LocalCluster, namespace: str) -> None:
    """The test's Kueue objects, Workloads first (the jobs that owned them are gone by now)."""
    for args in (
        ("workloads.kueue.x-k8s.io", "--all", "-n", namespace),
        ("localqueues.kueue.x-k8s.io", "--all", "-n", namespace),
        ("clusterqueues.kueue.x-k8s.io", local_kueue.CLUSTER_QUEUE),
        ("resourceflavors.kueue.x-k8s.io", local_kueue.FLAVOR),
    ):
        cluster.kube.run("delete", *args, "--wait=true", "--timeout=60s", "--ignore-not-found", check=False)


def _remove_kueue_crds(cluster: LocalCluster) -> None:
    names = [
        c["metadata"]["name"] for c in cluster.kube.items("crd") if c["spec"]["group"] == "kueue.x-k8s.io"
    ]
    if names:
        cluster.kube.run("delete", "crd", *names, "--wait=true", "--timeout=60s", check=False)


def _queued_job(namespace: str) -> dict[str, Any]:
    """A one-worker job on the LocalQueue whose ClusterQueue has no GPUs: Kueue never admits it."""
    job = training.training_job(QUEUED_JOB, namespace, minimum=1, maximum=1, steps=3)
    job["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": local_kueue.LOCAL_QUEUE}
    job["spec"]["checkpointDir"] = "/shared/checkpoints/queued"
    return job


def _operator_values(namespace: str) -> dict[str, Any]:
    return {
        "replicaCount": 1,
        "watch": {"allNamespaces": False, "namespaces": [namespace]},
        "extraEnv": [{"name": "LLMJOB_PROGRESS_SECONDS", "value": "5"}],
    }


def _operator_pod(w: ArgoWorld) -> dict[str, Any] | None:
    """The one Ready operator pod (none while a rollout has two)."""
    pods = [p for p in w.cluster.kube.items("pods", labels=f"app.kubernetes.io/instance={OPERATOR_APP}",
                                             namespace=w.ns)
            if not p["metadata"].get("deletionTimestamp")]  # fmt: skip
    statuses = (pods[0].get("status", {}).get("containerStatuses") or []) if len(pods) == 1 else []
    return pods[0] if any(s.get("ready") for s in statuses) else None


def _worker_uids(t: Training) -> dict[str, str]:
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in t.workers()}


@dataclass(frozen=True)
class _Sample:
    """One reading of the jobs Application and the job it syncs."""

    sync: str
    reconciled: str  # the Application's reconciledAt
    job_version: str  # the job's resourceVersion: each operator write moves it
    at: float  # time.monotonic() of the reading


def _at_comparisons(samples: list[_Sample]) -> list[_Sample]:
    """The first sample after each of Argo CD's comparisons (a new ``reconciledAt``), and the first one."""
    return [s for i, s in enumerate(samples) if i == 0 or s.reconciled != samples[i - 1].reconciled]


def _compared_after_writes(samples: list[_Sample]) -> int:
    """How many of Argo CD's comparisons saw a job the operator had written since the comparison before."""
    compared = _at_comparisons(samples)
    return sum(after.job_version != before.job_version for before, after in itertools.pairwise(compared))


def _comparisons(samples: list[_Sample], since: float) -> str:
    """The samples at each new comparison, for a failure's message."""
    shown = _at_comparisons(samples)
    readings = [(round(s.at - since, 1), s.reconciled, s.job_version, s.sync) for s in shown]
    return (
        f"{len(samples)} samples; (s, reconciledAt, the job's version, sync) at each comparison: {readings}"
    )


def test_argocd_syncs_the_chart_and_a_training_job(world: ArgoWorld) -> None:
    w, kube = world, world.cluster.kube
    t = w.t

    # 1. Both Applications at once, as a platform repository would hold them: the job's Application syncs
    # first, and Argo CD shows the job Progressing (no operator has picked it up yet), never Unknown.
    w.git.copy_tree(ROOT / CHART, "chart")
    w.git.write("jobs/train.yaml", yaml.safe_dump(training.training_job(JOB, w.ns, minimum=1, maximum=2,
                                                                        steps=100000)))  # fmt: skip
    w.git.write(f"jobs/{QUEUED_JOB}.yaml", yaml.safe_dump(_queued_job(w.ns)))
    first = w.commit("the chart, a training job and a job for Kueue")
    jobs = argocd.application(JOBS_APP, w.git.url, "jobs", w.ns)
    kube.apply([_like_shipped(jobs, "jobs-application.yaml")])
    seen: list[str] = []

    def job_health_is(wanted: str, text: str) -> bool:
        status, message = w.job_health()
        if status and (not seen or seen[-1] != status):
            seen.append(status)
        return status == wanted and text in message

    wait_for(lambda: job_health_is("Progressing", "Waiting for the operator"), SYNC_TIMEOUT,
             "Argo CD to show the job Progressing before an operator runs", interval=0.5)  # fmt: skip

    # 2. The chart from git: Argo CD renders it, the operator runs and trains the job; the job goes Healthy.
    app = argocd.application(OPERATOR_APP, w.git.url, "chart", w.ns, helm_values=_operator_values(w.ns))
    kube.apply([_like_shipped(app, "operator-application.yaml")])
    w.wait_synced_healthy(OPERATOR_APP, first, "the operator's Application Synced and Healthy")
    operator_before = wait_for(lambda: _operator_pod(w), STEP_TIMEOUT, "the operator pod Ready")
    assert operator_before is not None  # wait_for returns a truthy value
    wait_for(lambda: job_health_is("Healthy", "2/2 workers ready"), STEP_TIMEOUT,
             "Argo CD to show the job Healthy at 2/2", interval=0.5)  # fmt: skip
    # Missing until the first sync creates it; never Unknown (what a health script error reads as).
    assert set(seen) <= {"Missing", "Progressing", "Healthy"}, seen

    # 3. A job queued by Kueue (the chart's kueue.enabled "auto" rendered on through Argo CD): Argo CD shows
    # it Suspended or Progressing with a message that says it is queued, never Unknown. It then leaves git,
    # and, once Argo CD compares with that commit (self-heal would bring it back before), the cluster.
    readings: list[tuple[float, str, str, str]] = []  # (s, Argo CD's health, its message, the job's phase)

    def shown_queued() -> tuple[str, str] | None:
        status, message = w.job_health(QUEUED_JOB)
        job_status = (kube.get("llmtrainingjob", QUEUED_JOB, w.ns) or {}).get("status") or {}
        admitted: dict[str, Any] = next(
            (c for c in job_status.get("conditions") or [] if c.get("type") == "Admitted"), {}
        )
        reading = (status, message, str(job_status.get("phase")))
        if not readings or readings[-1][1:] != reading:
            readings.append((round(time.monotonic() - queued_from, 1), *reading))
        held = job_status.get("phase") == "Queued" and admitted.get("reason") == "Queued"
        return (
            (status, message)
            if held and status in ("Suspended", "Progressing") and message.startswith("Queued: ")
            else None
        )

    queued_from = time.monotonic()
    shown = w.wait(shown_queued, "Kueue to hold the queued job and Argo CD to show it queued",
           lambda: f"{(kube.get('llmtrainingjob', QUEUED_JOB, w.ns) or {}).get('status')}; "
                   f"{w.job_health(QUEUED_JOB)}", timeout=STEP_TIMEOUT)  # fmt: skip
    assert {r[1] for r in readings if r[1]} <= {"Missing", "Progressing", "Suspended"}, readings
    print(f"queued job in Argo CD: {shown}, after {time.monotonic() - queued_from:.1f}s; readings {readings}")
    w.git.remove(f"jobs/{QUEUED_JOB}.yaml")
    unqueued = w.commit("the queued job leaves git", JOBS_APP)
    w.wait(lambda: apps.state(w.app(JOBS_APP)).revision == unqueued, "Argo CD to compare with the commit",
           lambda: str(apps.state(w.app(JOBS_APP))))  # fmt: skip
    kube.run("delete", "llmtrainingjob", QUEUED_JOB, "-n", w.ns, "--wait=true", "--timeout=120s")
    print(f"step 3 (the queued job) took {time.monotonic() - queued_from:.1f}s")
    t.wait_steps("5 steps at world size 2", world=2, count=5)
    w.wait_synced_healthy(JOBS_APP, unqueued, "the jobs Application Synced and Healthy")

    # 4. Synced while it trains: the API server's defaults and the operator's writes make no diff. Sampled in
    # the background through steps 5 to 7 (an operator rollout, a CRD pruned, a node lost: none of them may
    # make a diff either) until Argo CD has compared the Application COMPARISONS times, each time with a job
    # the operator had written since the comparison before; step 8 then changes the jobs in git.
    workers = _worker_uids(t)
    step_then = (t.status().get("progress") or {}).get("step", 0)

    def sample() -> _Sample:
        job = kube.get("llmtrainingjob", JOB, w.ns) or {}
        state = apps.state(w.app(JOBS_APP))
        version = str(job.get("metadata", {}).get("resourceVersion"))
        return _Sample(state.sync, state.reconciled, version, time.monotonic())

    window_from = time.monotonic()

    def failed_read(exc: Exception) -> _Sample:  # recorded: every sample must read Synced
        return _Sample(f"error: {exc}", "", "", time.monotonic())

    with sampled(sample, 1.0, failed_read) as states:
        # 5. A new release in git (the chart's version and appVersion, as `make release` bumps both): Argo CD
        # rolls the operator to the new image tag, and the job trains on in the same worker pods.
        chart_yaml = yaml.safe_load((w.git.path / "chart" / "Chart.yaml").read_text())
        chart_yaml["version"] = chart_yaml["appVersion"] = NEW_VERSION
        w.git.write("chart/Chart.yaml", yaml.safe_dump(chart_yaml, sort_keys=False))
        bumped = w.commit("a new release of the chart", OPERATOR_APP)
        w.wait_synced_healthy(OPERATOR_APP, bumped, "Argo CD to sync the new release")
        new_pod = wait_for(
            lambda: (p := _operator_pod(w)) and p["metadata"]["uid"] != operator_before["metadata"]["uid"]
            and p, STEP_TIMEOUT, "the new operator pod alone and Ready",
        )  # fmt: skip
        assert isinstance(new_pod, dict), new_pod
        assert new_pod["spec"]["containers"][0]["image"].endswith(f":{NEW_VERSION}"), new_pod["spec"]
        serving_at = time.time()
        t.wait_steps("5 steps at world size 2 after the upgrade", world=2, count=5, after=serving_at)
        assert _worker_uids(t) == workers, "workers restarted"

        # 6. prune: true, yet a CRD removed from git and the chart's Application deleted leave the CRDs and
        # the jobs.
        w.git.remove(f"chart/crds/{CRD_REMOVED}")
        pruned = w.commit("a CRD removed from git", OPERATOR_APP)
        wait_for(lambda: apps.state(w.app(OPERATOR_APP)).revision == pruned
                 and apps.state(w.app(OPERATOR_APP)).operation == "Succeeded", SYNC_TIMEOUT,
                 "Argo CD to sync the chart without the CRD")  # fmt: skip
        kube.run("delete", "applications.argoproj.io", OPERATOR_APP, "-n", argocd.NAMESPACE, "--wait=true",
                 "--timeout=60s")  # fmt: skip
        for crd in CRD_NAMES:
            assert kube.get("crd", crd) is not None, f"{crd} was deleted"
        assert kube.get("llmtrainingjob", JOB, w.ns) is not None
        t.wait_steps("5 steps after the chart's Application was deleted", world=2, count=5, after=time.time())
        assert _worker_uids(t) == workers, "workers restarted"

        # 7. A node loss shows in Argo CD (below the desired size, or rescheduling) and clears on a new node.
        victim = t.worker_on(1)["spec"]["nodeName"]
        chaos.node_not_ready(victim, kube=kube, wait=False)
        lost = ("Degraded", "Progressing")
        w.wait(
            lambda: any(job_health_is(s, "") for s in lost),
            "Argo CD to show the loss",
            lambda: str(w.job_health()),
        )
        chaos.add_node(kind="gpu", kube=kube)
        w.wait(lambda: job_health_is("Healthy", "2/2 workers ready"), "Argo CD to show the job whole again",
               lambda: str(w.job_health()), timeout=STEP_TIMEOUT)  # fmt: skip
        assert "Unknown" not in seen, seen
        w.wait(lambda: _compared_after_writes(states) >= COMPARISONS,
               f"{COMPARISONS} comparisons by Argo CD, each after an operator write",
               lambda: _comparisons(states, window_from), timeout=WINDOW_TIMEOUT)  # fmt: skip
    assert {s.sync for s in states} == {"Synced"}, states
    print(
        f"step 4: Synced over {_compared_after_writes(states)} comparisons after operator writes, "
        f"{len(states)} samples in {time.monotonic() - window_from:.1f}s (steps 5 to 7 inside)"
    )
    assert (t.status().get("progress") or {}).get("step", 0) > step_then, t.status()

    # 8. A finished job shows Healthy with the operator's message. The long job leaves git and the cluster
    # (the shipped jobs Application does not prune) to free the nodes.
    short = training.training_job(SHORT_JOB, w.ns, minimum=1, maximum=1, steps=3)
    short["spec"]["checkpointDir"] = "/shared/checkpoints/short"
    w.git.remove("jobs/train.yaml")
    w.git.write(f"jobs/{SHORT_JOB}.yaml", yaml.safe_dump(short))
    w.commit("the long job replaced by a short one", JOBS_APP)
    kube.run("delete", "llmtrainingjob", JOB, "-n", w.ns, "--wait=true", "--timeout=120s")

    def shown_finished() -> tuple[str, str, str] | None:
        """(phase, Complete's message, Argo CD's health: message) once Argo CD shows the job finished."""
        job_status = (kube.get("llmtrainingjob", SHORT_JOB, w.ns) or {}).get("status") or {}
        complete: dict[str, Any] = next(
            (c for c in job_status.get("conditions") or [] if c.get("type") == "Complete"), {}
        )
        status, message = w.job_health(SHORT_JOB)
        seen = (str(job_status.get("phase")), str(complete.get("message", "")), f"{status}: {message}")
        done = seen[0] == "Succeeded" and seen[1] and seen[2].startswith(f"Healthy: {seen[1]}")
        return seen if done else None

    w.wait(shown_finished, "the short job Succeeded, Healthy in Argo CD with its Complete message",
           lambda: f"{(kube.get('llmtrainingjob', SHORT_JOB, w.ns) or {}).get('status')}; "
                   f"{w.job_health(SHORT_JOB)}")  # fmt: skip
