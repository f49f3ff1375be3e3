"""Benchmark: the operator at 1,000 jobs x 8 workers: creation, memory, CPU, reaction, API requests per job.

On a local control plane (`llmjob cluster`, fake nodes sized for it), with the operator as a subprocess
that authenticates as its own ServiceAccount, so kube-apiserver's audit log (policy: that user only,
``Metadata`` level) tells its requests apart from everyone else's:

1. throughput: J jobs x W CPU workers created by 8 concurrent clients onto big fake nodes; pod creation
   and job phases come from this process's watches (first ``ADDED`` per pod, first ``Running`` per job);
2. rest: R seconds with every job Running: the operator's requests (reads, writes) per job per minute,
   its CPU and RSS, where its memory goes (object counts by type, taken inside the operator on a signal);
3. reaction: N node losses (NotReady, grace 0) of a 4-worker GPU job while the J jobs run: node event ->
   replacement ``ADDED``, p50/p99; the operator's requests per loss (loss and node return);
4. resize: K jobs scaled from W to W-2: requests per resize.

With ``--baseline`` a step 0 runs first on the same cluster: the same J x W worker pods (the operator's own
``worker_pod()`` manifests, ownerless) posted with no operator by as many concurrent clients, timed to all
``ADDED``, all bound and all ``Running``, with each component's CPU over that window (this process's
recorder included); then they are deleted and step 1 runs. It prints
``created: operator X s, control plane alone Y s, ratio R``. ``--quiet-background`` runs the operator
with progress probes and index audits off, to price that background work against the reaction.

The recorder keeps a few fields per event (name, uid, job, phase, node readiness), never the objects,
and appends them to events.jsonl in the work folder (printed at the start, kept).

    .venv/bin/python bench/scale.py --jobs 1000 --workers 8 --failures 20 --rest 120 --resizes 20
    .venv/bin/python bench/scale.py --jobs 1000 --profile      # + py-spy (set PY_SPY) of the operator
    .venv/bin/python bench/scale.py --jobs 1000 --workers 8 --baseline   # the control plane alone first
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import concurrent.futures
import contextlib
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import IO, Any

import psutil
import yaml
from elasticity import job_doc, percentile  # bench/ is on sys.path when a bench script runs
from kubernetes_asyncio import client, config
from llm_operator import labels
from llm_operator.api.models import GROUP, PLURAL, VERSION, LLMTrainingJob
from llm_operator.builders.worker import worker_pod
from llm_operator.metrics import REACTION_STAGE_METRIC, REACTION_STAGE_NAMES
from llm_testbed import audit
from llm_testbed.localcluster import chaos, nodes, ports, tools
from llm_testbed.localcluster.cluster import LocalCluster
from llm_testbed.localcluster.kubectl import Kubectl
from llm_testbed.localcluster.waiting import WaitTimeout, poll
from prometheus_client.parser import text_string_to_metric_families

NS = "bench"
OP_NS = "llmjob-system"
OP_ACCOUNT = "llmjob-operator"
OP_USER = f"system:serviceaccount:{OP_NS}:{OP_ACCOUNT}"
REACT = "react"
REACT_WORKERS = 4

# Run inside the operator's process: on SIGUSR2 write what the heap holds, by type, to the file named by
# LLMJOB_BENCH_HEAP (no cost until the signal), then run the operator's CLI as `python -m` would.
OPERATOR_SHIM = r"""
import collections, gc, json, os, runpy, signal, sys
def heap(*_):
    counts, sizes = collections.Counter(), collections.Counter()
    frozen = gc.get_freeze_count()
    gc.unfreeze()  # frozen objects (llm_operator.loop_health.HeapFreeze) are not in gc.get_objects()
    found = gc.get_objects()
    if frozen:
        gc.freeze()
    for o in found:
        t = type(o)
        name = f"{getattr(t, '__module__', '?')}.{getattr(t, '__qualname__', t.__name__)}"
        counts[name] += 1
        sizes[name] += sys.getsizeof(o)
    top = [(n, counts[n], sizes[n]) for n, _ in sizes.most_common(40)]
    with open(os.environ["LLMJOB_BENCH_HEAP"], "w") as f:
        total = sum(sizes.values())
        json.dump({"objects": sum(counts.values()), "frozen": frozen, "bytes": total, "top": top}, f)
def safe_heap(*_):
    try:
        heap()
    except Exception as exc:
        with open(os.environ["LLMJOB_BENCH_HEAP"], "w") as f:
            json.dump({"error": repr(exc)}, f)
signal.signal(signal.SIGUSR2, safe_heap)
sys.argv = ["llmjob", *sys.argv[1:]]
runpy.run_module("llm_operator.cli", run_name="__main__")
"""


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


class Recorder:
    """Watches of nodes, pods and jobs that keep only what the benchmark asks about.

    Per event a short tuple is kept (and appended to ``sink``): pods by name -> first ``ADDED``, live
    pods per job, the ``react`` job's pod events; jobs -> first ``Running``; node readiness/taint changes.
    Events are parsed from the raw watch stream (no client model objects).
    """

    def __init__(self, sink: IO[str] | None = None) -> None:
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.sink = sink
        self.pod_added: dict[str, float] = {}
        self.pod_bound: dict[str, float] = {}
        self.pod_running: dict[str, float] = {}
        self.live: dict[str, set[str]] = collections.defaultdict(set)
        self.react: list[tuple[float, str, str, str]] = []  # (t, type, name, uid)
        self.running_at: dict[str, float] = {}
        self.phase: dict[str, str] = {}
        self.node_events: list[tuple[float, str, bool, tuple[str, ...]]] = []  # (t, name, ready, taints)
        self._node_last: dict[str, tuple[bool, tuple[str, ...]]] = {}
        self.counts: collections.Counter[str] = collections.Counter()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    def start(self) -> None:
        self.thread.start()

    async def _main(self) -> None:
        await config.load_kube_config(config_file=os.environ["KUBECONFIG"])
        async with client.ApiClient() as api:
            api.user_agent = "llmjob-bench-recorder"
            core = client.CoreV1Api(api)
            custom = client.CustomObjectsApi(api)
            await asyncio.gather(
                self._watch("node", lambda **kw: core.list_node(**kw)),
                self._watch("pod", lambda **kw: core.list_namespaced_pod(NS, **kw)),
                self._watch(
                    "job", lambda **kw: custom.list_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, **kw)
                ),
            )

    async def _watch(self, kind: str, call: Any) -> None:
        version = ""
        while not self.stop.is_set():
            try:
                kw: dict[str, Any] = {"watch": True, "timeout_seconds": 120, "_preload_content": False}
                kw["_request_timeout"] = 150
                if version:
                    kw["resource_version"] = version
                response = await call(**kw)
                try:
                    while not self.stop.is_set():
                        line = await response.content.readline()
                        if not line:
                            break
                        event = json.loads(line)
                        obj = event.get("object") or {}
                        if event.get("type") == "ERROR":
                            version = ""  # 410 Gone: start again from a fresh list
                            break
                        version = (obj.get("metadata") or {}).get("resourceVersion") or version
                        self._record(time.monotonic(), kind, str(event.get("type")), obj)
                finally:
                    response.release()
            except Exception:  # reconnect on any watch error
                await asyncio.sleep(0.05)

    def _record(self, at: float, kind: str, kind_of_event: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        name = str(meta.get("name"))
        row: tuple[Any, ...] | None = None
        with self.lock:
            self.counts[f"{kind}:{kind_of_event}"] += 1
            if kind == "pod":
                job = (meta.get("labels") or {}).get(labels.JOB_NAME, "")
                if kind_of_event == "ADDED":
                    self.pod_added.setdefault(name, at)
                if (obj.get("spec") or {}).get("nodeName"):
                    self.pod_bound.setdefault(name, at)
                if (obj.get("status") or {}).get("phase") == "Running":
                    self.pod_running.setdefault(name, at)
                if kind_of_event == "DELETED" or meta.get("deletionTimestamp"):
                    self.live[job].discard(name)
                else:
                    self.live[job].add(name)
                if job == REACT:
                    self.react.append((at, kind_of_event, name, str(meta.get("uid"))))
                    row = (at, kind, kind_of_event, name)
            elif kind == "job":
                phase = str((obj.get("status") or {}).get("phase") or "")
                self.phase[name] = phase
                if phase == "Running":
                    self.running_at.setdefault(name, at)
                row = (at, kind, kind_of_event, name, phase)
            else:
                conditions = (obj.get("status") or {}).get("conditions") or []
                ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
                taints = tuple(sorted(t.get("key", "") for t in (obj.get("spec") or {}).get("taints") or []))
                if self._node_last.get(name) != (ready, taints):
                    self._node_last[name] = (ready, taints)
                    self.node_events.append((at, name, ready, taints))
                    row = (at, kind, kind_of_event, name, ready, list(taints))
        if row is not None and self.sink is not None:
            self.sink.write(json.dumps(row) + "\n")

    def created(self, after: float, prefix: str, table: str = "pod_added") -> list[float]:
        """First times (``table``: pod_added, pod_bound or pod_running) of the pods named ``prefix*``."""
        with self.lock:
            times: dict[str, float] = getattr(self, table)
            return [t for n, t in times.items() if t >= after and n.startswith(prefix)]

    def live_with(self, prefix: str) -> int:
        with self.lock:
            return sum(len(names) for job, names in self.live.items() if job.startswith(prefix))

    def live_count(self, job: str) -> int:
        with self.lock:
            return len(self.live.get(job, ()))

    def node_not_ready_at(self, after: float, node: str) -> float | None:
        with self.lock:
            return next(
                (t for t, n, ready, _ in self.node_events if t >= after and n == node and not ready), None
            )

    def react_added(self, after: float, known: set[str]) -> float | None:
        with self.lock:
            return next(
                (t for t, kind, _, uid in self.react if t >= after and kind == "ADDED" and uid not in known),
                None,
            )


def big_cpu_nodes(count: int, pods: int) -> list[dict[str, Any]]:
    out = []
    for i in range(count):
        m = nodes.node_manifest(f"bench-node-{i}", "cpu", "us-west-2a")
        for key in ("capacity", "allocatable"):
            m["status"][key]["pods"] = str(pods)
            m["status"][key]["cpu"] = str(pods)
            m["status"][key]["memory"] = f"{pods}Gi"
        out.append(m)
    return out


def operator_kubeconfig(cluster: LocalCluster, path: Path) -> Path:
    """A kubeconfig with a token of the operator's own ServiceAccount (cluster-admin: we count, not
    authorize), so the audit log names it."""
    kube = cluster.kube
    kube.run("create", "namespace", OP_NS, check=False)
    kube.run("create", "serviceaccount", OP_ACCOUNT, "-n", OP_NS, check=False)
    kube.run(
        "create",
        "clusterrolebinding",
        "llmjob-bench-operator",
        "--clusterrole=cluster-admin",
        f"--serviceaccount={OP_NS}:{OP_ACCOUNT}",
        check=False,
    )
    token = kube.run("create", "token", OP_ACCOUNT, "-n", OP_NS, "--duration=24h").stdout.strip()
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    server = admin["clusters"][0]
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [server],
        "users": [{"name": OP_ACCOUNT, "user": {"token": token}}],
        "contexts": [{"name": OP_ACCOUNT, "context": {"cluster": server["name"], "user": OP_ACCOUNT}}],
        "current-context": OP_ACCOUNT,
    }
    path.write_text(yaml.safe_dump(doc))
    return path


QUIET_BACKGROUND = {"LLMJOB_PROGRESS_SECONDS": "0", "LLMJOB_INDEX_AUDIT_SECONDS": "0"}
"""``--quiet-background``: no progress probes, no periodic index audits (settings.py names both)."""


def start_operator(
    log: Path, kubeconfig: Path, metrics_port: int, heap_file: Path, quiet: bool = False
) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-c", OPERATOR_SHIM, "operator", "--standalone", "--namespace", NS]
    argv += ["--metrics-port", str(metrics_port), "--liveness-port", "0", "--log-level", "warning"]
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "LLMJOB_BENCH_HEAP": str(heap_file)}
    if quiet:
        env.update(QUIET_BACKGROUND)
    return subprocess.Popen(argv, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env)


def operator_metrics(port: int) -> dict[str, float]:
    """The operator's own counters we report (probes, passes)."""
    wanted = ("llmjob_progress_probes_total", "llmjob_reconcile_total", "llmjob_pods_created_total")
    out: dict[str, float] = {}
    with contextlib.suppress(OSError):
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        for line in text.splitlines():
            if line.startswith(wanted):
                key, _, value = line.rpartition(" ")
                out[key] = float(value)
    return out


class Usage:
    """CPU seconds and RSS of the operator and the control plane's components between two marks."""

    def __init__(self, procs: dict[str, psutil.Process]) -> None:
        self.procs = procs
        self.cpu0 = self._cpu()
        self.t0 = time.monotonic()

    def _cpu(self) -> dict[str, float]:
        out = {}
        for name, p in self.procs.items():
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                out[name] = t.user + t.system
        return out

    def since(self) -> dict[str, Any]:
        cpu, wall = self._cpu(), time.monotonic() - self.t0
        return {
            "wall_s": round(wall, 1),
            "cpu_s": {n: round(cpu[n] - self.cpu0.get(n, 0.0), 1) for n in cpu},
            "cores": {n: round((cpu[n] - self.cpu0.get(n, 0.0)) / wall, 3) for n in cpu},
        }


class PeakRss:
    def __init__(self, proc: psutil.Process) -> None:
        self.proc, self.peak, self.done = proc, 0, threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while not self.done.is_set():
            with contextlib.suppress(psutil.Error):
                self.peak = max(self.peak, self.proc.memory_info().rss)
            self.done.wait(0.25)


class Profiler:
    """py-spy (``$PY_SPY`` or on PATH) sampling the operator, non-blocking, collapsed stacks."""

    def __init__(self, pid: int, out: Path) -> None:
        binary = os.environ.get("PY_SPY") or shutil.which("py-spy")
        self.proc: subprocess.Popen[bytes] | None = None
        self.out = out
        if binary:
            argv = [binary, "record", "--pid", str(pid), "--rate", "25", "--nonblocking", "--format", "raw"]
            argv += ["--output", str(out)]
            self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self) -> dict[str, Any]:
        if self.proc is None:
            return {}
        self.proc.send_signal(signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=60)
        return summarize_collapsed(self.out)


def summarize_collapsed(path: Path, top: int = 15) -> dict[str, Any]:
    """Self and inclusive sample shares by function from py-spy's collapsed stacks."""
    own: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    total = 0
    if not path.exists():
        return {}
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        count = int(n)
        frames = []
        for frame in stack.split(";"):
            fn, _, where = frame.partition(" (")
            frames.append(f"{fn} ({where.rstrip(')').rsplit('/', 1)[-1]})")
        total += count
        own[frames[-1]] += count
        for f in set(frames):
            incl[f] += count
    share = lambda c: {k: round(v / max(total, 1), 3) for k, v in c.most_common(top)}  # noqa: E731
    return {"samples": total, "self": share(own), "inclusive": share(incl)}


def heap_snapshot(op: subprocess.Popen[bytes], heap_file: Path) -> dict[str, Any]:
    heap_file.unlink(missing_ok=True)
    op.send_signal(signal.SIGUSR2)
    poll(heap_file.exists, timeout=120, what="the operator's heap summary", interval=0.5)
    time.sleep(0.5)  # the file is written in one go; give the write a moment to finish
    data: dict[str, Any] = json.loads(heap_file.read_text())
    data["top"] = [[n, c, round(b / 2**20, 1)] for n, c, b in data["top"][:20]]
    data["mb"] = round(data.pop("bytes") / 2**20, 1)
    return data


def requests_of(tail: audit.AuditTail, per: float) -> dict[str, Any]:
    counts = audit.count(tail.since_mark(), OP_USER)
    return {
        "reads": counts.reads,
        "writes": counts.writes,
        "reads_per": round(counts.reads / per, 3),
        "writes_per": round(counts.writes / per, 3),
        "by_request": counts.table(),
    }


WRITE_KINDS = {
    "create pods": "pods",
    "patch llmtrainingjobs/status": "status",
    "create events": "events",
    "create services": "services",
}
"""How ``writes_line`` names the operator's writes; leases by resource, everything else is "other"."""


def writes_line(table: dict[str, int], per: float) -> str:
    """``writes per job: 15.0 (pods 8.0, status 4.0, ...)`` from ``requests_of``'s by_request table."""
    kinds: collections.Counter[str] = collections.Counter()
    for request, n in table.items():
        verb, _, resource = request.partition(" ")
        if verb not in audit.WRITE_VERBS:
            continue
        kinds[WRITE_KINDS.get(request, "leases" if resource.startswith("leases") else "other")] += n
    parts = ", ".join(f"{kind} {n / per:.2f}" for kind, n in kinds.most_common())
    return f"writes per job: {sum(kinds.values()) / per:.2f} ({parts})"


CLIENTS = 8
"""Concurrent clients that post the jobs (and, for the baseline, the pods), like a busy platform."""


def bench_job(name: str, per_job: int) -> dict[str, Any]:
    """The job both cases make: J of them, W CPU workers each."""
    return job_doc(name, per_job, per_job, gpusPerNode=0, rendezvous={"endpoint": "etcd.bench:2379"})


def submit_all(kube: Kubectl, docs: list[dict[str, Any]]) -> float:
    """Create ``docs`` by ``CLIENTS`` concurrent kubectl clients; the seconds it took."""
    start = time.monotonic()

    def submit(chunk: list[dict[str, Any]]) -> None:
        kube.run("create", "-f", "-", input=yaml.safe_dump_all(chunk), timeout=900)

    with concurrent.futures.ThreadPoolExecutor(max_workers=CLIENTS) as pool:
        list(pool.map(submit, [chunk for i in range(CLIENTS) if (chunk := docs[i::CLIENTS])]))
    return time.monotonic() - start


def baseline_pods(jobs: int, per_job: int) -> list[dict[str, Any]]:
    """The worker pods the operator would create for the jobs (its own ``worker_pod()``), without their
    owner: the garbage collector would delete pods of a job that does not exist."""
    pods = []
    for i in range(jobs):
        doc = bench_job(f"bl-{i}", per_job)
        doc["metadata"]["uid"] = f"baseline-{i}"
        job = LLMTrainingJob.model_validate(doc)
        for index in range(per_job):
            pod = worker_pod(job, index, 0)
            pod["metadata"].pop("ownerReferences", None)
            pods.append(pod)
    return pods


def baseline(kube: Kubectl, rec: Recorder, jobs: int, per_job: int, limit: float) -> dict[str, Any]:
    """Step 0: the control plane alone posts, binds and runs the J x W pods; then they are deleted."""
    pods = baseline_pods(jobs, per_job)
    start = time.monotonic()
    t_apply = submit_all(kube, pods)
    print(f"  {len(pods)} pods submitted in {t_apply:.1f}s (load {load()})", flush=True)
    out: dict[str, Any] = {"apply_s": round(t_apply, 1)}
    for table, what in (("pod_added", "added"), ("pod_bound", "bound"), ("pod_running", "running")):
        with contextlib.suppress(WaitTimeout):  # record how far it got rather than nothing
            poll(lambda t=table: len(rec.created(start, "bl-", t)) >= len(pods), timeout=limit,
                 what=f"all baseline pods {what}", interval=1)  # fmt: skip
        times = rec.created(start, "bl-", table)
        out[f"all_{what}_s"] = round(max(times) - start, 1) if len(times) >= len(pods) else float("nan")
        out[f"{what}_count"] = len(times)
        print(f"  all {what}: {out[f'all_{what}_s']}s ({len(times)} pods, load {load()})", flush=True)
    return out


def remove_baseline(kube: Kubectl, rec: Recorder) -> None:
    """Delete the baseline's pods (no grace: kwok's pods run nothing) and wait until they are gone."""
    kube.run("delete", "pods", "-n", NS, "--selector", f"{labels.ROLE}=worker", "--grace-period=0",
             "--force", "--wait=false", timeout=900)  # fmt: skip
    poll(lambda: rec.live_with("bl-") == 0, timeout=900, what="the baseline's pods gone", interval=1)


def throughput(kube: Kubectl, rec: Recorder, jobs: int, per_job: int, limit: float) -> dict[str, float]:
    docs = [bench_job(f"tp-{i}", per_job) for i in range(jobs)]
    start = time.monotonic()
    t_apply = submit_all(kube, docs)
    print(f"  submitted in {t_apply:.1f}s (load {load()})", flush=True)
    poll(lambda: len(rec.created(start, "tp-")) >= jobs * per_job, timeout=1800, what="all pods", interval=1)
    created = rec.created(start, "tp-")
    print(f"  {len(created)} pods created by {max(created) - start:.1f}s (load {load()})", flush=True)

    def all_running() -> bool:
        with rec.lock:
            return sum(1 for n in rec.running_at if n.startswith("tp-")) >= jobs

    with contextlib.suppress(WaitTimeout):  # record how far it got rather than nothing
        poll(all_running, timeout=limit, what="all jobs Running", interval=1.0)
    with rec.lock:
        running = [t for n, t in rec.running_at.items() if n.startswith("tp-")]
        phases = collections.Counter(p for n, p in rec.phase.items() if n.startswith("tp-"))
    return {
        "apply_s": t_apply,
        "first_pod_s": min(created) - start,
        "all_pods_s": max(created) - start,
        "all_running_s": max(running) - start if len(running) >= jobs else float("nan"),
        "jobs_running": len(running),
        "phases_now": dict(phases),
    }


def histogram_totals(text: str, name: str, label: str) -> dict[str, tuple[float, float]]:
    """(count, sum) of histogram ``name`` in the metrics page ``text`` by the value of ``label`` ("" for a
    histogram without it)."""
    out: dict[str, tuple[float, float]] = {}
    for family in text_string_to_metric_families(text):
        if family.name != name:
            continue
        for sample in family.samples:
            value = sample.labels.get(label, "")
            count, total = out.get(value, (0.0, 0.0))
            if sample.name.endswith("_count"):
                out[value] = (sample.value, total)
            elif sample.name.endswith("_sum"):
                out[value] = (count, sample.value)
    return out


def operator_stages(port: int) -> dict[str, tuple[float, float]]:
    """The reaction's stages (``llmjob_reaction_stage_seconds``), and as stages "lag" and "gc" the event
    loop's lateness and the garbage collections' pauses (all generations) over the same window, from one
    read of the operator's metrics (empty when they cannot be read)."""
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    except OSError:
        return {}
    stages = histogram_totals(text, REACTION_STAGE_METRIC, "stage")
    lag = histogram_totals(text, "llmjob_operator_loop_lag_seconds", "")
    pauses = histogram_totals(text, "llmjob_operator_gc_pause_seconds", "generation")
    stages["lag"] = lag.get("", (0.0, 0.0))
    stages["gc"] = (sum(c for c, _ in pauses.values()), sum(t for _, t in pauses.values()))
    return stages


def stage_deltas(
    before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]
) -> dict[str, float]:
    """Seconds per stage between two reads, for the stages observed in between."""
    out = {}
    for stage, (count, total) in after.items():
        count0, total0 = before.get(stage, (0.0, 0.0))
        if count > count0:
            out[stage] = total - total0
    return out


def replaced_stages(
    before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]
) -> dict[str, float]:
    """The stages between two reads once the replacement's creation was observed ({}: not yet)."""
    deltas = stage_deltas(before, after)
    return deltas if "created" in deltas else {}


def reaction_trials(
    kube: Kubectl, rec: Recorder, count: int, port: int
) -> tuple[list[float], list[float], list[dict[str, float]]]:
    """Fail one node of the react job's workers `count` times (NotReady, grace 0), then restore it.
    Returns the latencies, the wall-clock times of the signals (for the audit log's split) and each
    trial's stages on the operator's own clock (its ``llmjob_reaction_stage_seconds``, read at ``port``)."""
    out: list[float] = []
    signals: list[float] = []
    stages: list[dict[str, float]] = []
    wall = time.time() - time.monotonic()
    for i in range(count):
        poll(
            lambda: rec.phase.get(REACT) == "Running" and rec.live_count(REACT) == REACT_WORKERS,
            timeout=120,
            what="react job Running at full size",
        )
        pods = kube.items("pods", "--selector", f"{labels.JOB_NAME}={REACT}", namespace=NS)
        pods = [p for p in pods if not p["metadata"].get("deletionTimestamp") and p["spec"].get("nodeName")]
        victim = pods[i % len(pods)]
        node = victim["spec"]["nodeName"]
        known = {p["metadata"]["uid"] for p in pods}
        stages_before = operator_stages(port)
        before = time.monotonic()
        chaos.node_not_ready(node, kube=kube, wait=False)
        t_signal = poll(
            lambda b=before, n=node: rec.node_not_ready_at(b, n), timeout=60, what="NotReady event"
        )
        t_new = poll(lambda t=t_signal, k=known: rec.react_added(t, k), timeout=60, what="replacement ADDED")
        out.append(t_new - t_signal)
        signals.append(wall + t_signal)
        seen = poll(
            lambda b=stages_before: replaced_stages(b, operator_stages(port)),
            timeout=30,
            what="the reaction's stages in the operator's metrics",
        )
        stages.append(seen)
        print(
            f"  loss #{i + 1}: {node} replaced in {1000 * (t_new - t_signal):.0f} ms "
            f"({', '.join(f'{k} {1000 * v:.0f}' for k, v in seen.items())} ms; load {load()})",
            flush=True,
        )
        chaos.node_ready(node, kube=kube)
    return out, signals, stages


def stage_split(trials: list[dict[str, float]]) -> dict[str, Any]:
    """p50/max of each stage of the reactions on the operator's clock (``metrics.REACTION_STAGE_NAMES``),
    and of the loop's lateness and the collections' pauses in each trial."""
    out: dict[str, Any] = {"n": len(trials)}
    for stage in (*REACTION_STAGE_NAMES, "lag", "gc"):
        values = [1000 * t[stage] for t in trials if stage in t]
        if values:
            out[stage] = {"p50_ms": round(statistics.median(values)), "max_ms": round(max(values))}
    return out


def reaction_split(lines: list[bytes], signals: list[float]) -> dict[str, Any]:
    """p50/max of each part of the reactions, from the operator's own requests in the audit log."""
    writes = audit.pod_writes(lines, OP_USER, f"{REACT}-worker-")
    parts = [p for p in (audit.split_reaction(s, writes) for s in signals) if p is not None]
    out: dict[str, Any] = {"n": len(parts)}
    for key in ("decide", "delete", "gap", "create"):
        values = [1000 * p[key] for p in parts]
        if values:
            out[key] = {"p50_ms": round(statistics.median(values)), "max_ms": round(max(values))}
    out["each_ms"] = [{k: round(1000 * v) for k, v in p.items()} for p in parts]
    return out


def resize(kube: Kubectl, rec: Recorder, jobs: list[str], to: int) -> float:
    start = time.monotonic()
    for name in jobs:
        kube.run(
            "patch",
            "llmtrainingjob",
            name,
            "-n",
            NS,
            "--type=merge",
            "-p",
            json.dumps({"spec": {"replicas": to}}),
        )
    poll(lambda: all(rec.live_count(n) == to for n in jobs), timeout=300, what="resized jobs", interval=0.5)
    return time.monotonic() - start


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--failures", type=int, default=20)
    parser.add_argument("--rest", type=float, default=120.0, help="seconds of the at-rest window")
    parser.add_argument("--resizes", type=int, default=20)
    parser.add_argument("--node-pods", type=int, default=1000, help="pods per big fake CPU node")
    parser.add_argument("--profile", action="store_true", help="py-spy the operator ($PY_SPY or on PATH)")
    parser.add_argument("--running-timeout", type=float, default=900.0, help="give up on all Running after")
    parser.add_argument("--baseline", action="store_true", help="first the same pods with no operator")
    parser.add_argument(
        "--quiet-background", action="store_true", help="operator without progress probes and index audits"
    )
    parser.add_argument("--keep", action="store_true", help="leave the cluster running")
    parser.add_argument("--name", default="llmjob-scale")
    args = parser.parse_args()
    print(
        f"machine: {platform.platform()}, {os.cpu_count()} cores,"
        f" {psutil.virtual_memory().total / 2**30:.0f} GiB, Python {platform.python_version()}; load {load()}"
    )
    print(f"versions: kubernetes {tools.KUBE_VERSION}, etcd {tools.ETCD_VERSION}, kwok {tools.KWOK_VERSION}")
    work = Path(tempfile.mkdtemp(prefix="llmjob-scale-"))
    policy = work / "audit-policy.yaml"
    policy.write_text(yaml.safe_dump(audit.policy([OP_USER])))
    cluster = LocalCluster(args.name)
    cluster.up(gpu_nodes=6, cpu_nodes=1, audit_policy=policy)
    os.environ["KUBECONFIG"] = str(cluster.kubeconfig)
    kube = cluster.kube
    kube.run("create", "namespace", NS, check=False)
    node_count = -(-args.jobs * args.workers * 11 // 10 // args.node_pods)  # 10 % headroom
    cluster.add_nodes(big_cpu_nodes(node_count, args.node_pods), timeout=300)
    print(
        f"cluster {cluster.name}: 6 GPU + 1 CPU + {node_count} CPU nodes of {args.node_pods} pods; logs in"
        f" {cluster.logs_dir}; work files in {work}",
        flush=True,
    )
    heap_file = work / "heap.json"
    metrics_port = ports.pick(["metrics"], taken=set())["metrics"]
    procs = {"bench (recorder)": psutil.Process()}
    for component, pid in cluster.component_pids().items():
        with contextlib.suppress(psutil.Error):
            procs[component] = psutil.Process(pid)
    sink = (work / "events.jsonl").open("w")
    rec = Recorder(sink)
    rec.start()
    results: dict[str, Any] = {"jobs": args.jobs, "workers": args.workers}
    if args.baseline:
        print(f"baseline: {args.jobs} x {args.workers} worker pods, no operator (load {load()})", flush=True)
        usage = Usage(procs)
        results["baseline"] = baseline(kube, rec, args.jobs, args.workers, args.running_timeout)
        results["baseline"]["usage"] = usage.since()
        print(json.dumps(results["baseline"], indent=1), flush=True)
        remove_baseline(kube, rec)
    op = start_operator(
        work / "operator.log",
        operator_kubeconfig(cluster, work / "op.kubeconfig"),
        metrics_port,
        heap_file,
        quiet=args.quiet_background,
    )
    op_proc = psutil.Process(op.pid)
    procs["operator"] = op_proc
    tail = audit.AuditTail(cluster.audit_log)
    rss = PeakRss(op_proc)
    try:
        poll(
            lambda: operator_metrics(metrics_port) != {} or op.poll() is not None, timeout=60, what="operator"
        )
        print(f"throughput: {args.jobs} jobs x {args.workers} workers (load {load()})", flush=True)
        prof = Profiler(op.pid, work / "profile-throughput.txt") if args.profile else None
        usage, rss.peak = Usage(procs), 0
        tail.mark()
        results["throughput"] = throughput(kube, rec, args.jobs, args.workers, args.running_timeout)
        results["throughput"]["operator_peak_rss_mb"] = round(rss.peak / 2**20, 1)
        results["throughput"]["usage"] = usage.since()
        results["throughput"]["requests"] = requests_of(tail, args.jobs)
        results["throughput"]["load"] = load()
        if prof is not None:
            results["throughput"]["profile"] = prof.stop()
        print(json.dumps(results["throughput"], indent=1), flush=True)
        print(writes_line(results["throughput"]["requests"]["by_request"], args.jobs), flush=True)
        if args.baseline:
            mine, alone = results["throughput"]["all_pods_s"], results["baseline"]["all_added_s"]
            ratio = mine / alone
            print(f"created: operator {mine:.1f} s, control plane alone {alone:.1f} s, ratio {ratio:.2f}")

        settle = 20.0
        print(f"rest: {settle:.0f}s to settle, then {args.rest:.0f}s measured (load {load()})", flush=True)
        time.sleep(settle)  # the last status writes and events of the creation land
        prof = Profiler(op.pid, work / "profile-rest.txt") if args.profile else None
        before, usage = operator_metrics(metrics_port), Usage(procs)
        tail.mark()
        time.sleep(args.rest)
        minutes = args.rest / 60
        results["rest"] = {
            "requests": requests_of(tail, args.jobs * minutes),
            "usage": usage.since(),
            "operator_rss_mb": round(op_proc.memory_info().rss / 2**20, 1),
            "operator_metrics_delta": {
                k: v - before.get(k, 0.0) for k, v in operator_metrics(metrics_port).items()
            },
            "load": load(),
        }
        if prof is not None:
            results["rest"]["profile"] = prof.stop()
        results["rest"]["heap"] = heap_snapshot(op, heap_file)
        print(json.dumps(results["rest"], indent=1), flush=True)

        if args.failures:
            kube.run(
                "apply",
                "-f",
                "-",
                input=yaml.safe_dump(
                    job_doc(
                        REACT,
                        REACT_WORKERS,
                        REACT_WORKERS,
                        gpusPerNode=8,
                        rendezvous={"endpoint": "etcd.bench:2379"},
                    )
                ),
            )
            poll(lambda: rec.phase.get(REACT) == "Running", timeout=120, what="react job Running")
            print(
                f"reaction: {args.failures} node losses with {args.jobs} jobs running (load {load()})",
                flush=True,
            )
            prof = Profiler(op.pid, work / "profile-reaction.txt") if args.profile else None
            usage = Usage(procs)
            tail.mark()
            lat, signals, stages = reaction_trials(kube, rec, args.failures, metrics_port)
            poll(
                lambda: rec.phase.get(REACT) == "Running" and rec.live_count(REACT) == REACT_WORKERS,
                timeout=120,
                what="react job back at full size",
            )
            time.sleep(2)
            results["reaction"] = {
                "n": len(lat),
                "p50_ms": round(1000 * statistics.median(lat)),
                "p99_ms": round(1000 * percentile(lat, 0.99)),
                "max_ms": round(1000 * max(lat)),
                "split": reaction_split(tail.since_mark(), signals),
                "operator_stages": stage_split(stages),
                "requests": requests_of(tail, len(lat)),
                "usage": usage.since(),
                "load": load(),
            }
            if prof is not None:
                results["reaction"]["profile"] = prof.stop()
            print(json.dumps(results["reaction"], indent=1), flush=True)
            reaction = results["reaction"]
            print(f"reaction p50 {reaction['p50_ms']} ms p99 {reaction['p99_ms']} ms", flush=True)
            split = reaction["operator_stages"]
            print(
                "operator stages p50/max: "
                + ", ".join(f"{k} {v['p50_ms']}/{v['max_ms']} ms" for k, v in split.items() if k != "n"),
                flush=True,
            )

        if args.resizes:
            names = [f"tp-{i}" for i in range(min(args.resizes, args.jobs))]
            print(
                f"resize: {len(names)} jobs {args.workers} -> {args.workers - 2} (load {load()})", flush=True
            )
            time.sleep(5)
            tail.mark()
            took = resize(kube, rec, names, args.workers - 2)
            time.sleep(5)
            results["resize"] = {
                "n": len(names),
                "took_s": round(took, 1),
                "requests": requests_of(tail, len(names)),
                "load": load(),
            }
            print(json.dumps(results["resize"], indent=1), flush=True)
        results["operator_peak_rss_mb"] = round(rss.peak / 2**20, 1)
        with rec.lock:
            results["recorder"] = {
                "events": dict(rec.counts),
                "rss_mb": round(psutil.Process().memory_info().rss / 2**20, 1),
            }
        results["audit_log_mb"] = (
            round(cluster.audit_log.stat().st_size / 2**20, 1) if cluster.audit_log.exists() else 0
        )
    finally:
        if cluster.audit_log.exists():
            shutil.copy(cluster.audit_log, work / "audit.log")
        rss.done.set()
        rec.stop.set()
        op.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            op.wait(timeout=60)
        sink.close()
        if not args.keep:
            cluster.down()
    print(json.dumps(results, indent=2))
    (work / "results.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
