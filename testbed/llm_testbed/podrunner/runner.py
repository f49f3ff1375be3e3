"""The watch loop: pods bound to the cluster's nodes run as local processes; their state goes back.

One asyncio loop, three watch streams (nodes, services, pods) and one task per running container
(it awaits the process's exit: no polling). What happens, and what a kubelet would do:

- a bound pod appears: claims resolved, pod IP taken, hosts file and volumes made, every container
  started through :mod:`.launch`; status Running/Ready (after the readiness probe, when the container
  has a ``tcpSocket``/``httpGet`` one), then the real exit codes, Succeeded/Failed, restarts per
  ``restartPolicy`` (back-off 1 s doubling to 20 s);
- the pod is deleted: SIGTERM to each main process, up to the deletion's grace period, then SIGKILL
  of the whole tree; the final status is written and the pod object removed (grace 0);
- its node is lost (``llmjob chaos node-not-ready``: the node carries the not-ready mark) or deleted:
  every process of its pods is SIGKILLed at once and nothing more is written (a dead kubelet); once
  the node is back, those containers report exit 137 and pods waiting for deletion are removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import sys
import traceback
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from llm_testbed.localcluster import marks
from llm_testbed.podrunner import (
    apiservice,
    apivolumes,
    faults,
    files,
    initcontainers,
    ipclaims,
    network,
    plan,
    probes,
    process,
    projected,
    serviceenv,
    status,
    volumes,
)
from llm_testbed.podrunner.containermode import ContainerMode
from llm_testbed.podrunner.kube import ApiError, Kube

RESTART_BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 16.0, 20.0)
VOLUME_RETRY_S = 1.0
DEFAULT_GRACE_S = 30
LOST_EXIT_CODE = 137  # SIGKILL
START_TASK = ":start"  # the task that runs the init containers, then starts the main ones


def say(message: str) -> None:
    print(f"[podrunner] {message}", file=sys.stderr, flush=True)


@dataclass
class PodRun:
    """A pod the runner acts for."""

    pod: dict[str, Any]
    ip: str
    host_ip: str
    start_time: str
    containers: list[status.ContainerState]
    inits: list[status.ContainerState] = field(default_factory=list)  # spec.initContainers, in order
    started: dict[str, asyncio.Event] = field(default_factory=dict)  # set at each start of a container
    procs: dict[str, process.ContainerProcess] = field(default_factory=dict)
    tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    deleting: bool = False
    lost: bool = False
    finished: bool = False
    injected_exit: int | None = None  # set by the fake-exit-code annotation (chaos fail-pod)
    cpu_cores: float | None = None  # the CPU quota of its node's cpu fault (None: no limit)
    write_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def every_container(self) -> list[status.ContainerState]:
        return [*self.inits, *self.containers]

    @property
    def sidecars(self) -> list[status.ContainerState]:
        return [c for c in self.inits if c.sidecar]

    @property
    def uid(self) -> str:
        return str(self.pod["metadata"]["uid"])

    @property
    def key(self) -> str:
        return f"{self.pod['metadata']['namespace']}/{self.pod['metadata']['name']}"

    @property
    def node(self) -> str:
        return str(self.pod["spec"].get("nodeName", ""))

    @property
    def policy(self) -> str:
        return str(self.pod["spec"].get("restartPolicy", "Always"))


def node_lost(node: Mapping[str, Any]) -> bool:
    return marks.NODE_NOT_READY_LABEL in (node.get("metadata", {}).get("labels") or {})


def node_ip(node: Mapping[str, Any]) -> str:
    for addr in node.get("status", {}).get("addresses", []) or []:
        if addr.get("type") == "InternalIP":
            return str(addr.get("address", ""))
    return ""


class Runner:
    def __init__(
        self,
        kube: Kube,
        state_dir: Path,
        cluster: str,
        programs: Mapping[str, str],
        base_env: Mapping[str, str],
        containers: ContainerMode | None = None,
    ) -> None:
        self.kube = kube
        self.containers = containers  # container mode: pods whose images we have run in them
        self.api_ip: str | None = None  # where kubernetes.default.svc:443 answers (apiservice)
        self.state_dir = state_dir
        self.cluster = cluster
        self.programs = dict(programs)
        self.base_env = dict(base_env)
        self.shm_dir = files.shm_dir(cluster)
        self.cgroups = process.cgroup_base(cluster)
        self.cpu = process.cpu_groups(cluster, self.cgroups)
        self.pool = network.IpPool(start=network.first_address(cluster), claims=ipclaims.FileClaims())
        self.nodes: dict[str, dict[str, Any]] = {}
        self.services: dict[str, dict[str, Any]] = {}
        self.bound: dict[str, dict[str, Any]] = {}  # uid -> latest object of every bound pod
        self.runs: dict[str, PodRun] = {}
        self.starting: set[str] = set()
        self._background: set[asyncio.Task[Any]] = set()
        self.site_dir = state_dir / "site"

    # ------------------------------------------------------------------ main loop
    async def run(self, ready: Callable[[], None]) -> None:
        self.site_dir.mkdir(parents=True, exist_ok=True)
        (self.site_dir / "sitecustomize.py").write_text(files.SITECUSTOMIZE)
        nodes, node_rv = await self.kube.list("/api/v1/nodes")
        for n in nodes:
            self.nodes[n["metadata"]["name"]] = n
        services, svc_rv = await self.kube.list("/api/v1/services")
        for s in services:
            self.services[_key(s)] = s
        pods, pod_rv = await self.kube.list("/api/v1/pods")
        kill = self.cgroups or "off (process groups)"
        say(f"acting for the pods of {len(self.nodes)} node(s); cgroups: {kill}")
        for p in pods:
            self.on_pod("ADDED", p)
        ready()
        await asyncio.gather(
            self._watch("/api/v1/nodes", node_rv, self.on_node),
            self._watch("/api/v1/services", svc_rv, self.on_service),
            self._watch("/api/v1/pods", pod_rv, self.on_pod),
        )

    async def _watch(self, path: str, rv: str, handle: Callable[[str, dict[str, Any]], None]) -> None:
        """Follow ``path`` for ever: re-watch when the server ends a watch, list again when told to."""
        version: str | None = rv
        while True:
            try:
                if version is None:
                    items, version = await self.kube.list(path)
                    for item in items:
                        self._handle(handle, "MODIFIED", item)
                    self._forget_missing(path, {i["metadata"]["uid"] for i in items})
                async for event in self.kube.watch(path, version):
                    kind, obj = event["type"], event["object"]
                    if kind == "ERROR":
                        raise ApiError(int(obj.get("code", 500)), str(obj.get("message")))
                    version = obj["metadata"]["resourceVersion"]
                    if kind != "BOOKMARK":
                        self._handle(handle, kind, obj)
            except ApiError as exc:
                if exc.status != 410:  # 410 Gone: our resourceVersion is too old, list again
                    say(f"watch {path}: {exc}; listing again")
                    await asyncio.sleep(1.0)
                version = None
            except (TimeoutError, OSError, aiohttp.ClientError, ValueError) as exc:
                say(f"watch {path}: {exc!r}; retrying in 1 s")
                await asyncio.sleep(1.0)

    @staticmethod
    def _handle(handle: Callable[[str, dict[str, Any]], None], kind: str, obj: dict[str, Any]) -> None:
        """One event; a bug in handling it is logged, and the runner (with every pod) lives on."""
        try:
            handle(kind, obj)
        except Exception:  # keep serving the other pods
            name = obj.get("metadata", {}).get("name")
            say(f"{kind} {name}: handling failed:\n{traceback.format_exc()}")

    def _forget_missing(self, path: str, uids: set[str]) -> None:
        if path.endswith("/pods"):
            for uid, pod in list(self.bound.items()):
                if uid not in uids:
                    self.on_pod("DELETED", pod)
        elif path.endswith("/nodes"):
            for node in list(self.nodes.values()):
                if node["metadata"]["uid"] not in uids:
                    self.on_node("DELETED", node)
        else:
            for svc in list(self.services.values()):
                if svc["metadata"]["uid"] not in uids:
                    self.on_service("DELETED", svc)

    def spawn(self, coro: Awaitable[Any], what: str) -> None:
        async def guarded() -> None:
            try:
                await coro
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                say(f"{what}: {exc!r}")

        task = asyncio.ensure_future(guarded())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # ------------------------------------------------------------------ nodes and services
    def on_node(self, kind: str, node: dict[str, Any]) -> None:
        name = node["metadata"]["name"]
        before = self.nodes.get(name)
        if kind == "DELETED":
            self.nodes.pop(name, None)
            self._lose_node(name, "deleted")
            return
        self.nodes[name] = node
        if node_lost(node):
            self._lose_node(name, "lost (not ready)")
            return
        if before is None or node_lost(before):
            self._node_back(name)
        self._apply_cpu_fault(name)

    def _lose_node(self, name: str, why: str) -> None:
        victims = [r for r in self.runs.values() if r.node == name and not r.lost]
        for run in victims:
            run.lost = True
            for proc in run.procs.values():
                proc.kill_tree()
        if victims:
            say(f"node {name} {why}: SIGKILLed the processes of {len(victims)} pod(s): "
                f"{', '.join(r.key for r in victims)}")  # fmt: skip
        self.refresh_hosts()

    def _node_faults(self, name: str) -> faults.NodeFaults:
        try:
            return faults.node_faults(self.nodes.get(name))
        except plan.PlanError as exc:
            say(f"node {name}: ignoring a fault mark: {exc}")
            return faults.NodeFaults()

    def _set_cpu(self, run: PodRun, container: str, cores: float | None) -> None:
        if self.cpu is None:
            return
        try:
            process.set_cpu(self.cpu, f"{run.uid}-{container}", cores)
        except OSError as exc:
            say(f"{run.key}: cannot set the CPU quota of {container}: {exc}")

    def _apply_cpu_fault(self, name: str) -> None:
        """A node's cpu fault mark changed: its running containers get the new quota at once."""
        cores = self._node_faults(name).cpu_cores
        for run in self.runs.values():
            if run.node == name and not run.lost and run.cpu_cores != cores:
                run.cpu_cores = cores
                for c in run.every_container:
                    self._set_cpu(run, c.name, cores)
                say(f"{run.key}: CPU quota {'none' if cores is None else f'{cores:g} cores'} (node {name})")

    def _node_back(self, name: str) -> None:
        """The node's kubelet is back: report what happened to its pods while it was away."""
        for uid, pod in list(self.bound.items()):
            if pod["spec"].get("nodeName") != name:
                continue
            run = self.runs.get(uid)
            if run is None:
                self.on_pod("MODIFIED", pod)
                continue
            if run.lost:
                self.spawn(self._recover(run), f"{run.key}: after node {name} came back")

    async def _recover(self, run: PodRun) -> None:
        await _finish(run.tasks.values())
        run.lost = False
        if run.pod["metadata"].get("deletionTimestamp"):
            await self._finish_delete(run)
            return
        stamp = status.now()
        for c in run.every_container:
            if c.started_at is not None and c.exit_code is None:
                c.exit_code, c.finished_at, c.ready = LOST_EXIT_CODE, stamp, False
        if any(status.should_restart(run.policy, c.exit_code or 0) for c in run.containers):
            run.tasks[START_TASK] = asyncio.ensure_future(self._run_containers(run, restart=True))
        else:
            run.finished = True
            await self.write_status(run)
        self.refresh_hosts()

    def on_service(self, kind: str, svc: dict[str, Any]) -> None:
        if kind == "DELETED":
            self.services.pop(_key(svc), None)
        else:
            self.services[_key(svc)] = svc
        self.refresh_hosts()

    # ------------------------------------------------------------------ pods
    def on_pod(self, kind: str, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        uid = meta["uid"]
        node_name = pod.get("spec", {}).get("nodeName")
        if not node_name:
            return
        if kind == "DELETED":
            self.bound.pop(uid, None)
            run = self.runs.pop(uid, None)
            if run is not None:
                for proc in run.procs.values():
                    proc.kill_tree()
                for task in run.tasks.values():
                    task.cancel()
                self._cleanup(run)
                if self.containers is not None:
                    self.spawn(self.containers.forget(uid), f"{run.key}: removing its containers")
                say(f"{run.key}: pod object removed")
            self.refresh_hosts()
            return
        self.bound[uid] = pod
        node = self.nodes.get(node_name)
        run = self.runs.get(uid)
        if run is not None:
            run.pod = pod
            if meta.get("deletionTimestamp") and not run.deleting and not run.lost:
                run.deleting = True
                self.spawn(self._delete(run), f"{run.key}: deleting")
            elif not run.deleting and not run.lost:
                self._inject_exit(run)
            return
        if node is None or node_lost(node) or uid in self.starting:
            return
        if meta.get("deletionTimestamp"):
            if pod.get("status", {}).get("phase") not in ("Succeeded", "Failed"):
                self.spawn(self.kube.delete_pod_now(meta["namespace"], meta["name"], uid), "delete")
            return
        if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            return
        self.starting.add(uid)
        self.spawn(self._start(pod, node), f"{meta['namespace']}/{meta['name']}: start")

    async def _start(self, pod: dict[str, Any], node: dict[str, Any]) -> None:
        meta = pod["metadata"]
        uid, ns = meta["uid"], meta["namespace"]
        try:
            claim_volumes: dict[str, str | None] = {}
            for claim in volumes.claims(pod):
                pvc = await self.kube.get(f"/api/v1/namespaces/{ns}/persistentvolumeclaims/{claim}")
                bound = pvc is not None and pvc.get("status", {}).get("phase") == "Bound"
                claim_volumes[claim] = pvc["spec"].get("volumeName") if bound and pvc else None
            while True:
                current = self.bound.get(uid)
                if current is None or current["metadata"].get("deletionTimestamp"):
                    return
                try:
                    vols = volumes.volume_dirs(
                        current, state_dir=self.state_dir, shm_dir=self.shm_dir, claim_volumes=claim_volumes
                    )
                    await apivolumes.write(self.kube, current, vols)
                    break
                except (volumes.VolumeNotReady, projected.SourceMissing) as exc:
                    say(f"{ns}/{meta['name']}: waiting: {exc}")
                    await asyncio.sleep(VOLUME_RETRY_S)
                    for claim in volumes.claims(pod):
                        pvc = await self.kube.get(f"/api/v1/namespaces/{ns}/persistentvolumeclaims/{claim}")
                        ok = pvc is not None and pvc.get("status", {}).get("phase") == "Bound"
                        claim_volumes[claim] = pvc["spec"].get("volumeName") if ok and pvc else None
            pod = self.bound.get(uid, pod)
            containers = [
                status.ContainerState(name=c["name"], image=str(c.get("image", "")))
                for c in pod["spec"].get("containers", [])
            ]
            old_ip = pod.get("status", {}).get("podIP")
            ip = self.pool.take(old_ip if old_ip and old_ip.startswith("127.") else None)
            run = PodRun(
                pod=pod, ip=ip, host_ip=node_ip(node), start_time=status.now(), containers=containers,
                inits=initcontainers.init_states(pod),
            )  # fmt: skip
            self.runs[uid] = run
        finally:
            self.starting.discard(uid)
        pod_dir = self._pod_dir(uid)
        try:
            plan.check_pod(pod)
            node_faults = faults.node_faults(self.nodes.get(run.node, node))
            run.cpu_cores = node_faults.cpu_cores
            pod_dir.mkdir(parents=True, exist_ok=True)
            hosts = pod_dir / "hosts"
            self.refresh_hosts()
            specs = {c.name: initcontainers.spec_of(pod, c.name) for c in run.every_container}
            read_only = volumes.read_only(pod)
            plans: dict[str, plan.ContainerPlan] = {}
            for c in run.every_container:
                cg = self.cgroups / f"{uid}-{c.name}" if self.cgroups else None
                cplan = plan.container_plan(
                    pod, specs[c.name], pod_ip=ip, host_ip=run.host_ip, base_env=self._base_env(ip),
                    programs=self.programs, volume_dirs=vols, hosts_file=str(hosts),
                    cgroup=str(cg) if cg else None, read_only=read_only,
                )  # fmt: skip
                # The termination message file: a host file of the pod bound where the container writes it.
                message_file = pod_dir / f"{c.name}.termination-log"
                message_file.touch()
                target = str(specs[c.name].get("terminationMessagePath") or faults.TERMINATION_MESSAGE_PATH)
                cplan = dataclasses.replace(
                    cplan,
                    mounts=[
                        *faults.apply_faults(pod, specs[c.name], cplan.mounts, node_faults),
                        plan.Mount(str(message_file), target),
                    ],
                    cpu_cgroup=None
                    if self.cpu is None or self.cpu.v2
                    else str(self.cpu.base / f"{uid}-{c.name}"),
                )
                if node_faults.any:
                    say(f"{run.key}: node {run.node} faults for {c.name}: {node_faults}")
                plans[c.name] = cplan
            if self.containers is not None:
                plans = await self.containers.plans(pod, plans, specs, volume_dirs=vols, pod_dir=pod_dir,
                                                    pod_ip=ip, host_ip=run.host_ip, say=say)  # fmt: skip
            for name, cplan in plans.items():
                (pod_dir / f"{name}.json").write_text(json.dumps(cplan.to_json()))
        except plan.PlanError as exc:
            for c in run.every_container:
                c.waiting_reason, c.waiting_message = "CreateContainerConfigError", str(exc)
            say(f"{run.key}: cannot run: {exc}")
            await self.write_status(run)
            return
        before = {s["name"]: s for s in pod.get("status", {}).get("containerStatuses") or []}
        if any("running" in (st.get("state") or {}) for st in before.values()):
            # Started by an earlier runner, whose processes died with it: they exited, as far as we know.
            stamp = status.now()
            for c in containers:
                c.started_at = (before.get(c.name, {}).get("state", {}).get("running") or {}).get("startedAt")
                c.started_at = c.started_at or stamp
                c.exit_code, c.finished_at = LOST_EXIT_CODE, stamp
                c.restart_count = int(before.get(c.name, {}).get("restartCount", 0))
            if not status.should_restart(run.policy, LOST_EXIT_CODE):
                say(f"{run.key}: its processes were gone when the runner started: reported exit 137")
                run.finished = True
                await self.write_status(run)
                return
        restart = any(c.exit_code is not None for c in containers)
        say(f"{run.key}: starting on node {run.node} with IP {ip}")
        run.tasks[START_TASK] = asyncio.ensure_future(self._run_containers(run, restart=restart))
        # Events of this pod that came while it was starting (deleted, deletion requested) count now.
        latest = self.bound.get(uid)
        self.on_pod("DELETED" if latest is None else "MODIFIED", latest or pod)

    def _pod_dir(self, uid: str) -> Path:
        return Path(volumes.pod_dir(self.state_dir, uid))

    def _inject_exit(self, run: PodRun) -> None:
        """``llmjob chaos fail-pod``: the containers are killed and report the annotated exit code."""
        text = (run.pod["metadata"].get("annotations") or {}).get(marks.POD_EXIT_CODE_ANNOTATION)
        if text is None or run.injected_exit is not None:
            return
        try:
            run.injected_exit = int(text)
        except ValueError:
            say(f"{run.key}: ignoring {marks.POD_EXIT_CODE_ANNOTATION}={text!r}: not an integer")
            return
        say(f"{run.key}: {marks.POD_EXIT_CODE_ANNOTATION}={text}: killing its containers")
        for proc in run.procs.values():
            proc.kill_tree()

    def _base_env(self, ip: str) -> dict[str, str]:
        return {**self.base_env, "LLMJOB_PODRUNNER_POD_IP": ip}

    async def _supervise(self, run: PodRun, c: status.ContainerState, restart: bool = False) -> None:
        """Run one container until it is done for good (restarts per restartPolicy; a sidecar's rule)."""
        spec = initcontainers.spec_of(run.pod, c.name)
        pod_dir = self._pod_dir(run.uid)
        meta = run.pod["metadata"]
        log = files.log_path(self.state_dir, meta["namespace"], meta["name"], c.name)
        while True:
            if restart:
                c.restart_count += 1
                delay = RESTART_BACKOFF_S[min(c.restart_count - 1, len(RESTART_BACKOFF_S) - 1)]
                c.waiting_reason = "CrashLoopBackOff"
                c.waiting_message = f"back-off {delay:g}s restarting failed container"
                await self.write_status(run)
                await asyncio.sleep(delay)
                if run.deleting or run.lost or run.uid not in self.runs:
                    return
            cg = self.cgroups / f"{run.uid}-{c.name}" if self.cgroups else None
            self._set_cpu(run, c.name, run.cpu_cores)  # before the start: the launcher joins it
            proc = process.ContainerProcess(pod_dir / f"{c.name}.json", log, cg)
            if run.deleting or run.lost or run.uid not in self.runs:
                return
            run.procs[c.name] = proc
            pid = await proc.start()
            if run.deleting or run.lost or run.uid not in self.runs or run.injected_exit is not None:
                proc.kill_tree()  # deleted, lost or failed on purpose while it was being started
            c.pid, c.started_at, c.exit_code, c.finished_at = pid, status.now(), None, None
            c.waiting_reason, c.waiting_message = None, ""
            probe = probes.numbered(spec.get("readinessProbe") or {}, spec)
            c.ready = not ("tcpSocket" in probe or "httpGet" in probe)
            say(f"{run.key}: container {c.name} started, pid {pid}, log {log}")
            run.started.setdefault(c.name, asyncio.Event()).set()
            await self.write_status(run)
            if not c.ready:
                self.spawn(self._probe(run, c, proc, probe), f"{run.key}: readiness probe")
            code = status.exit_code_of(await proc.wait())
            if run.injected_exit is not None:
                code = run.injected_exit
            proc.kill_tree()  # whatever the main process left behind
            if self.containers is not None:
                await self.containers.release(run.uid, c.name)
            c.message = self._termination_message(run, spec, code, log)
            c.exit_code, c.finished_at, c.ready = code, status.now(), False
            say(f"{run.key}: container {c.name} exited with code {code}")
            if run.deleting or run.lost or run.uid not in self.runs:
                return
            injected = run.injected_exit is not None
            if initcontainers.should_restart(run.policy, c, code, main_done=run.finished, injected=injected):
                restart = True
                continue
            if c.sidecar:
                return  # stopped after the main containers: their last exit writes the status
            if not c.init and all(x.exit_code is not None for x in run.containers):
                run.finished = True
                await self._stop_sidecars(run)
            elif status.init_failed(run.policy, run.inits):
                run.finished = True
            await self.write_status(run)
            self.refresh_hosts()
            return

    def _termination_message(self, run: PodRun, spec: Mapping[str, Any], code: int, log: Path) -> str:
        """The file the container wrote at terminationMessagePath (emptied for a restart), or the log's
        tail (FallbackToLogsOnError after a failure)."""
        path = self._pod_dir(run.uid) / f"{spec['name']}.termination-log"
        written = ""
        with contextlib.suppress(OSError):
            written = path.read_text(errors="replace")
            path.write_text("")
        tail = ""
        if not written.strip() and spec.get("terminationMessagePolicy") == "FallbackToLogsOnError" and code:
            with contextlib.suppress(OSError), log.open("rb") as f:
                f.seek(max(0, log.stat().st_size - 8192))
                tail = f.read().decode(errors="replace")
        return faults.termination_message(
            written, str(spec.get("terminationMessagePolicy") or "File"), code, tail
        )

    async def _probe(
        self, run: PodRun, c: status.ContainerState, proc: process.ContainerProcess, probe: dict[str, Any]
    ) -> None:
        """Readiness: until the first success (tcpSocket connect or httpGet 2xx/3xx on the pod IP)."""
        period = float(probe.get("periodSeconds", 10))
        await asyncio.sleep(float(probe.get("initialDelaySeconds", 0)))
        while run.procs.get(c.name) is proc and c.exit_code is None and not run.deleting and not run.lost:
            if await probes.probe_once(run.ip, probe):
                c.ready = True
                say(f"{run.key}: container {c.name} ready")
                await self.write_status(run)
                self.refresh_hosts()
                return
            await asyncio.sleep(min(period, 1.0))

    async def _delete(self, run: PodRun) -> None:
        """Graceful deletion: SIGTERM, the grace period, SIGKILL of every process, then the object goes."""
        meta = run.pod["metadata"]
        grace = meta.get("deletionGracePeriodSeconds")
        if grace is None:
            grace = run.pod["spec"].get("terminationGracePeriodSeconds", DEFAULT_GRACE_S)
        deadline = asyncio.get_running_loop().time() + float(grace)
        say(f"{run.key}: deleting: SIGTERM, grace period {grace}s")
        # The main (and a running init) containers first, then the sidecars in reverse order (a kubelet's).
        await self._terminate(run, [c.name for c in run.every_container if not c.sidecar], deadline)
        for c in reversed(run.sidecars):
            await self._terminate(run, [c.name], deadline)
        for p in run.procs.values():
            p.kill_tree()
        await _finish(run.tasks.values())
        await self._finish_delete(run)

    async def _terminate(self, run: PodRun, names: list[str], deadline: float) -> None:
        """SIGTERM these containers' main processes; SIGKILL what still runs at ``deadline``."""
        procs = [run.procs[n] for n in names if n in run.procs]
        alive = [p for p in procs if p.proc is not None and p.proc.returncode is None]
        for p in alive:
            p.terminate()
        waits = [asyncio.ensure_future(p.wait()) for p in alive]
        if waits:
            left = max(0.0, deadline - asyncio.get_running_loop().time())
            _, pending = await asyncio.wait(waits, timeout=left)
            if pending:
                say(f"{run.key}: {', '.join(names)} still running after the grace period: SIGKILL")
        for p in procs:
            p.kill_tree()
        if waits:
            await asyncio.wait(waits)

    async def _stop_sidecars(self, run: PodRun) -> None:
        """The main containers are done: stop the sidecars (reverse order, the pod's grace period)."""
        if not run.sidecars:
            return
        grace = float(run.pod["spec"].get("terminationGracePeriodSeconds", DEFAULT_GRACE_S))
        deadline = asyncio.get_running_loop().time() + grace
        for c in reversed(run.sidecars):
            await self._terminate(run, [c.name], deadline)
            task = run.tasks.get(c.name)
            if task is not None:
                await asyncio.wait([task])
        say(f"{run.key}: main containers done: sidecars stopped")

    async def _run_containers(self, run: PodRun, restart: bool) -> None:
        """Init containers in order (a sidecar: until it started), then every main container."""
        for c in run.inits:
            if run.deleting or run.lost or run.uid not in self.runs:
                return
            if c.sidecar:
                event = run.started.setdefault(c.name, asyncio.Event())
                event.clear()
                run.tasks[c.name] = asyncio.ensure_future(
                    self._supervise(run, c, restart=c.exit_code is not None)
                )
                await asyncio.wait(
                    [asyncio.ensure_future(event.wait()), run.tasks[c.name]],
                    return_when=asyncio.FIRST_COMPLETED,
                )
            elif c.exit_code != 0:
                await self._supervise(run, c, restart=c.exit_code is not None)
                if c.exit_code != 0:
                    return  # failed for good (restartPolicy Never), or the pod went away
        if run.deleting or run.lost or run.uid not in self.runs:
            return
        for c in run.containers:
            run.tasks[c.name] = asyncio.ensure_future(self._supervise(run, c, restart=restart))

    async def _finish_delete(self, run: PodRun) -> None:
        stamp = status.now()
        for c in run.every_container:
            if c.started_at is not None and c.exit_code is None:
                c.exit_code, c.finished_at = LOST_EXIT_CODE, stamp
            c.ready = False
            c.waiting_reason = None
        run.finished = True
        with contextlib.suppress(ApiError):
            await self.write_status(run)
        meta = run.pod["metadata"]
        await self.kube.delete_pod_now(meta["namespace"], meta["name"], run.uid)

    async def write_status(self, run: PodRun) -> None:
        if run.lost:
            return  # a dead kubelet writes nothing
        meta = run.pod["metadata"]
        async with run.write_lock:
            doc = status.pod_status(
                run.pod, run.containers, pod_ip=run.ip, host_ip=run.host_ip,
                start_time=run.start_time, at=status.now(), inits=run.inits,
            )  # fmt: skip
            try:
                await self.kube.patch_pod_status(meta["namespace"], meta["name"], run.uid, doc)
            except ApiError as exc:
                if exc.status not in (404, 409, 422):  # gone, or a new pod took the name
                    raise

    def _cleanup(self, run: PodRun) -> None:
        self.pool.release(run.ip)
        shutil.rmtree(self._pod_dir(run.uid), ignore_errors=True)
        shutil.rmtree(self.shm_dir / run.uid, ignore_errors=True)
        if self.cgroups is not None:
            for c in run.every_container:
                process.kill_cgroup(self.cgroups / f"{run.uid}-{c.name}")
        for c in run.every_container:
            process.remove_cpu(self.cpu, f"{run.uid}-{c.name}")

    # ------------------------------------------------------------------ DNS
    def refresh_hosts(self) -> None:
        live = [r for r in self.runs.values() if not r.finished and not r.lost]
        entries = {
            r.uid: network.pod_entry(r.pod, r.ip, ready=status.all_ready(r.containers, r.inits)) for r in live
        }
        services = list(self.services.values())
        for run in live:
            hosts = self._pod_dir(run.uid) / "hosts"
            if hosts.parent.is_dir():
                api = (
                    [apiservice.hosts_line(self.api_ip, run.pod["metadata"]["namespace"])]
                    if self.api_ip
                    else []
                )
                text = network.hosts_text(entries[run.uid], entries.values(), services, api)
                files.write_in_place(hosts, text)

    # ------------------------------------------------------------------ shutdown
    def stop_all(self) -> None:
        for run in self.runs.values():
            for proc in run.procs.values():
                proc.kill_tree()
            self._cleanup(run)
        if self.containers is not None:
            self.containers.remove_all()
        if self.cgroups is not None:
            for child in self.cgroups.iterdir() if self.cgroups.is_dir() else []:
                if child.is_dir():
                    process.kill_cgroup(child)
            process.remove_cgroup(self.cgroups)
        if self.cpu is not None and not self.cpu.v2 and self.cpu.base.is_dir():
            for child in self.cpu.base.iterdir():
                if child.is_dir():
                    with contextlib.suppress(OSError):
                        child.rmdir()
            with contextlib.suppress(OSError):
                self.cpu.base.rmdir()


async def _finish(tasks: Iterable[asyncio.Task[None]]) -> None:
    """Stop container tasks whose processes are dead (one may sit in a restart back-off)."""
    pending = [t for t in tasks if not t.done()]
    for task in pending:
        task.cancel()
    for task in pending:
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _key(obj: Mapping[str, Any]) -> str:
    return f"{obj['metadata'].get('namespace', '')}/{obj['metadata']['name']}"


async def serve(
    kubeconfig: Path, state_dir: Path, cluster: str, programs: Mapping[str, str], containers: bool = False
) -> None:
    """Act for the cluster's pods until SIGTERM; ``containers``: container mode (:mod:`.containermode`)."""
    kube = await Kube.connect(kubeconfig)
    api = serviceenv.api_service_env(kube.server)
    mode = ContainerMode(cluster, api, state_dir / "site") if containers else None
    env = serviceenv.base_env()
    site = str(state_dir / "site")
    pythonpath = os.environ.get("PYTHONPATH")
    env["PYTHONPATH"] = f"{site}:{pythonpath}" if pythonpath else site
    env.update(api)
    runner = Runner(kube, state_dir, cluster, programs, env, mode)
    service = apiservice.ApiService(api["KUBERNETES_SERVICE_HOST"], int(api["KUBERNETES_SERVICE_PORT"]))
    runner.api_ip = await service.start(say)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    def ready() -> None:
        (state_dir / "ready").write_text(str(os.getpid()))
        say("ready")

    main = asyncio.ensure_future(runner.run(ready))
    stopper = asyncio.ensure_future(stop.wait())
    try:
        done, _ = await asyncio.wait({main, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if main in done:
            main.result()  # raise what stopped it
    finally:
        main.cancel()
        stopper.cancel()
        runner.stop_all()
        service.close()
        say("stopped: every pod process killed")
        await kube.close()
