"""One local control plane: kwokctl's binary runtime running our pinned binaries, plus fake nodes.

Layout (all under the per-machine cache, see :mod:`paths`)::

    kwok/                       KWOK_WORKDIR of every cluster we start
      clusters/<name>/          kwokctl's own folder: kubeconfig.yaml, logs/<component>.log, pids/, etcd/
      configs/<name>.yaml       the --config we gave kwokctl (options + our Stages), kept for debugging
      configs/<name>.kwokctl.log       kwokctl's output of the last start/stop
      configs/<name>.failed-logs/      component logs of a cluster that failed to start
      .start.lock               clusters start one at a time (ports are picked under it)

A cluster started with ``run_pods`` keeps ``clusters/<name>/podrunner/`` (see
:mod:`llm_testbed.podrunner.files`): its pods run as local processes. One started with ``karpenter``
keeps ``clusters/<name>/karpenter/`` (see :mod:`llm_testbed.karpenter`): Karpenter launches its nodes.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llm_testbed import argocd as argocd_
from llm_testbed import karpenter as karpenter_
from llm_testbed.localcluster import chaos, kwokconfig, kwokctl, marks, nodes, paths, ports, progress, tools
from llm_testbed.localcluster.errors import LocalClusterError
from llm_testbed.localcluster.filelock import locked
from llm_testbed.localcluster.kubectl import Kubectl
from llm_testbed.localcluster.kwokctl import Kwokctl
from llm_testbed.localcluster.status import ClusterStatus, summarize_node
from llm_testbed.localcluster.waiting import poll
from llm_testbed.podrunner import daemon as podrunner
from llm_testbed.podrunner import files as podrunner_files

if TYPE_CHECKING:
    from llm_testbed.kubeletnodes.tier import KubeletTier

DEFAULT_NAME = "llmjob"
DEFAULT_GPU_NODES = 4
DEFAULT_CPU_NODES = 2
CLUSTER_TOOLS = (
    "kwokctl",
    "kwok",
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
)
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok-controller")
READY_TIMEOUT_S = 60.0  # after kwokctl create: /readyz (admission, RBAC bootstrap)
RUN_PODS_MARK = "run-pods"  # file in the cluster's folder: created with run_pods
ZONE_LABEL = "topology.kubernetes.io/zone"


def say(message: str) -> None:
    progress.say("cluster", message)


def cluster_names() -> list[str]:
    """Clusters that kwokctl knows of under our work dir (running or stopped)."""
    root = kwokctl.workdir() / "clusters"
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if (p / "kwok.yaml").is_file())


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's
        return True
    return True


def validate_name(name: str) -> str:
    ok = name and len(name) <= 40 and name[0].isalnum() and all(c.isalnum() or c in "-_" for c in name)
    if not ok:
        raise LocalClusterError(f"invalid cluster name {name!r}: use letters, digits, '-' or '_' (max 40)")
    return name


class LocalCluster:
    """A named local cluster. Cheap to construct; nothing starts until :meth:`up`."""

    def __init__(self, name: str = DEFAULT_NAME, tool_paths: dict[str, Path] | None = None) -> None:
        self.name = validate_name(name)
        self._tools = tool_paths
        # Where it lives is fixed when it is named: a thread that watches it (the control-plane supervisor)
        # must not follow a later change of LLMJOB_CACHE_DIR (a test's monkeypatch) to another folder.
        self._kwok_root = kwokctl.workdir()

    # ------------------------------------------------------------------ where things are
    @property
    def tools(self) -> dict[str, Path]:
        """Paths of the binaries this cluster runs (built on first access when missing)."""
        if self._tools is None:
            self._tools = tools.ensure(CLUSTER_TOOLS)
        return self._tools

    @property
    def workdir(self) -> Path:
        return self._kwok_root / "clusters" / self.name

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "kubeconfig.yaml"

    @property
    def logs_dir(self) -> Path:
        return self.workdir / "logs"

    @property
    def audit_log(self) -> Path:
        """kube-apiserver's audit log (written only when the cluster was created with an audit policy)."""
        return self.logs_dir / "audit.log"

    @property
    def config_path(self) -> Path:
        return self._kwok_root / "configs" / f"{self.name}.yaml"

    @property
    def failed_logs_dir(self) -> Path:
        """Where the logs of a cluster that failed to start are kept (its own folder is removed)."""
        return self._kwok_root / "configs" / f"{self.name}.failed-logs"

    @property
    def _kwokctl(self) -> Kwokctl:
        return Kwokctl(self.name, self.tools, self._kwok_root)

    @property
    def kube(self) -> Kubectl:
        return Kubectl(self.tools["kubectl"], self.kubeconfig)

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        """Run our kubectl against this cluster (see :meth:`Kubectl.run`)."""
        return self.kube.run(*args, input=input, check=check, timeout=timeout)

    @property
    def podrunner_dir(self) -> Path:
        """State of the local pod runner: logs, volumes, hosts files (clusters started with run_pods)."""
        return self.workdir / "podrunner"

    @property
    def runs_pods(self) -> bool:
        """True when this cluster was created with ``run_pods``: its pods run as local processes."""
        return (self.workdir / RUN_PODS_MARK).is_file()

    @property
    def karpenter_log(self) -> Path:
        """Karpenter's log (clusters started with ``karpenter``)."""
        return karpenter_.daemon.log_path(karpenter_.daemon.state_dir(self.workdir))

    def volume_dir(self, pv_name: str) -> Path:
        """The host folder of a bound PersistentVolume (shared by every pod): the pod runner's, or on
        kubelet nodes the hostPath of the test bed's shared volume (``training.shared_volume``)."""
        from llm_testbed.podrunner.volumes import pv_dir

        if self.runs_kubelets:
            from llm_testbed.training import host_volume

            return host_volume(pv_name)

        return Path(pv_dir(self.podrunner_dir, pv_name))

    def pod_log(self, namespace: str, pod: str, container: str | None = None) -> Path:
        """The log file (stdout + stderr, restarts appended) of a container run by the pod runner.

        ``container`` defaults to the pod's first container (read from the API).
        """
        if container is None:
            obj = self.kube.get("pod", pod, namespace)
            if obj is None:
                raise LocalClusterError(f"pod {namespace}/{pod} does not exist: name the container")
            container = obj["spec"]["containers"][0]["name"]
        return podrunner_files.log_path(self.podrunner_dir, namespace, pod, container)

    def exists(self) -> bool:
        return (self.workdir / "kwok.yaml").is_file()

    def log_files(self) -> list[Path]:
        """Component logs: the live ones, or those kept when the cluster failed to start."""
        for folder in (self.logs_dir, self.failed_logs_dir):
            if folder.is_dir():
                return sorted(folder.glob("*.log"))
        return []

    # ------------------------------------------------------------------ lifecycle
    def is_running(self) -> bool:
        """The apiserver answers /readyz (the other components are checked by :meth:`status`)."""
        if not self.kubeconfig.is_file():
            return False
        result = self.kubectl("get", "--raw", "/readyz", check=False, timeout=10)
        return result.returncode == 0 and result.stdout.strip() == "ok"

    @property
    def runs_karpenter(self) -> bool:
        """True when this cluster was created with ``karpenter``: Karpenter launches its GPU nodes."""
        return karpenter_.enabled(self.workdir)

    def up(
        self,
        gpu_nodes: int | None = None,
        cpu_nodes: int = DEFAULT_CPU_NODES,
        *,
        port: int = 0,
        crds_dir: Path | None = None,
        run_pods: bool = False,
        audit_policy: Path | None = None,
        containers: bool = False,
        karpenter: bool | karpenter_.KarpenterSetup = False,
        kubelet: bool = False,
        argocd: bool = False,
    ) -> bool:
        """Start (or resume) the cluster, add the nodes if it has none, install CRDs.

        ``gpu_nodes``: static GPU nodes (default 4, or 0 with ``karpenter``). ``karpenter``: real
        Karpenter (its kwok provider) launches and removes nodes for Pending pods; ``True`` for the
        default NodePools, or a :class:`~llm_testbed.karpenter.KarpenterSetup`. A cluster keeps it.

        With ``run_pods`` the cluster's pods run for real as local processes (the local pod runner,
        started here and stopped by :meth:`down`); a cluster keeps the mode it was created with.
        ``audit_policy``: kube-apiserver audits by this policy into :attr:`audit_log` (new clusters only).
        ``containers``: the runner's container mode (pods of locally built images run in containers).
        ``kubelet``: the nodes are real kubelets and containerd on this machine (``llm_testbed.kubeletnodes``)
        instead of kwok's fake nodes; a cluster keeps it.
        ``argocd``: Argo CD core (application controller, repo server, Redis) runs against the cluster, with
        a local git repository to sync from (:mod:`llm_testbed.argocd`); stopped by :meth:`down`.
        Returns ``False`` when the cluster was already running (nothing restarted, nodes untouched).
        """
        started = time.monotonic()
        self.tools  # noqa: B018 - builds first, with its own progress
        if self.exists() and run_pods and not self.runs_pods:
            raise LocalClusterError(
                f"cluster {self.name} was created without --run-pods (its pods are fake): "
                f"`llmjob cluster down --name {self.name}` first to change that"
            )
        run_pods = run_pods or (self.exists() and self.runs_pods)  # a cluster keeps its mode
        if kubelet and run_pods:
            raise LocalClusterError("--kubelet nodes run their pods themselves: it cannot go with --run-pods")
        kubelet = kubelet or (self.exists() and self.runs_kubelets)
        if self.exists() and self.runs_karpenter and not karpenter:
            karpenter = True
        if gpu_nodes is None:
            gpu_nodes = 0 if karpenter else DEFAULT_GPU_NODES
        if self.exists() and self.is_running():
            say(f"cluster {self.name} is already running")
            fresh = False
        else:
            with locked(self._kwok_root / ".start.lock", lambda: say("another cluster is starting; waiting")):
                self._start(port, run_pods, audit_policy, kubelet)
            fresh = True
        if kubelet and (fresh or not self.kubelet_tier.node_names()):
            self.kubelet_tier.up(self._kubelet_nodes(gpu_nodes, cpu_nodes))
        elif not kubelet and not self.kube.items("nodes"):
            self.add_nodes(nodes.cluster_nodes(gpu_nodes, cpu_nodes))
        elif fresh is False:
            say("nodes already present: --nodes/--cpu-nodes ignored (use `llmjob chaos add-node` to add)")
        self.install_crds(crds_dir if crds_dir is not None else paths.crds_dir())
        self.wait_default_service_account()
        if karpenter:
            setup = karpenter if isinstance(karpenter, karpenter_.KarpenterSetup) else None
            pid = karpenter_.start(self.kube, self.workdir, setup)
            say(f"karpenter (pid {pid}) launches nodes for Pending pods; log {self.karpenter_log}")
        if run_pods:
            pid = podrunner.start(
                self.name, self.kubeconfig, self.podrunner_dir, {"etcd": self.tools["etcd"]}, containers
            )
            say(f"local pod runner (pid {pid}) runs the pods; container logs under {self.podrunner_dir}/logs")
        if argocd:
            argocd_.start(self.kube, self.workdir)
            repo = argocd_.GitRepo(argocd_.repo_dir(self.workdir)).init()
            say(f"argocd core runs in namespace {argocd_.NAMESPACE}; commit manifests to {repo.url}")
        say(f"cluster {self.name} ready in {time.monotonic() - started:.1f}s")
        return fresh

    def _start(
        self, port: int, run_pods: bool = False, audit_policy: Path | None = None, kubelet: bool = False
    ) -> None:
        """Create (or resume) the cluster with kwokctl; the caller holds the start lock."""
        audit = str(audit_policy.resolve()) if audit_policy is not None else ""
        pki = str(self.workdir / "pki") if kubelet else ""
        # Real kubelets renew their Lease every 2.5 s (tier.LEASE_DURATION_S / 4): a lost one shows in 10 s.
        grace = 10_000 if kubelet else kwokconfig.KwokctlSettings.node_monitor_grace_period_ms
        settings = kwokconfig.KwokctlSettings(
            run_pods=run_pods, audit_policy=audit, kubelet_client_pki=pki, node_monitor_grace_period_ms=grace
        )
        if not self.exists():  # a stopped cluster keeps the ports of its saved config
            if port and not ports.is_free(port):
                raise LocalClusterError(
                    f"port {port} on 127.0.0.1 is not free for kube-apiserver: "
                    "pick another with --port, or leave it out for a free one"
                )
            others = [self._kwok_root / "clusters" / n for n in cluster_names() if n != self.name]
            chosen = ports.pick(
                ports.PORT_OPTIONS,
                taken=ports.claimed_ports(others),
                fixed={"kubeApiserverPort": port} if port else None,
            )
            settings = kwokconfig.KwokctlSettings(
                ports=chosen,
                run_pods=run_pods,
                audit_policy=audit,
                kubelet_client_pki=pki,
                node_monitor_grace_period_ms=grace,
            )
        fresh = not self.exists()
        say(f"starting cluster {self.name}: {', '.join(COMPONENTS)} (kwokctl binary runtime)")
        self.config_path.parent.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(kwokconfig.render(settings))
        try:
            self._kwokctl.create(self.config_path)
            if run_pods:
                (self.workdir / RUN_PODS_MARK).write_text("pods run as local processes\n")
            poll(
                self.is_running,
                timeout=READY_TIMEOUT_S,
                what=f"kube-apiserver of cluster {self.name} to answer /readyz",
                interval=0.2,
            )
        except LocalClusterError as exc:
            if not fresh:
                raise LocalClusterError(
                    f"{exc}; the existing cluster {self.name} could not be resumed: "
                    f"`llmjob cluster down --name {self.name}` and start it again"
                ) from exc
            # A half-started new cluster would be resumed with the same (bad) ports: keep its logs, drop it.
            kept = self.collect_logs(self.failed_logs_dir)
            self.down()
            where = f"; component logs in {self.failed_logs_dir}" if kept else ""
            raise LocalClusterError(f"{exc}{where}") from exc
        self.forget_failed_logs()

    @property
    def runs_kubelets(self) -> bool:
        """True when this cluster's nodes are real kubelets (created with ``kubelet``)."""
        from llm_testbed.kubeletnodes.tier import is_kubelet_cluster

        return is_kubelet_cluster(self.workdir)

    @property
    def kubelet_tier(self) -> KubeletTier:
        """The kubelet nodes of this cluster and what they share (registry, CoreDNS, kube-proxy)."""
        from llm_testbed.kubeletnodes.tier import KubeletTier

        return KubeletTier(self.workdir, self.kube)

    def _kubelet_nodes(self, gpu_nodes: int, cpu_nodes: int) -> list[tuple[str, nodes.NodeKind, str]]:
        """The kubelet nodes ``up`` starts: the fake nodes' names and shapes, those not running yet."""
        tier = self.kubelet_tier
        present = set(tier.node_names())
        wanted = []
        for manifest in nodes.cluster_nodes(gpu_nodes, cpu_nodes):
            meta = manifest["metadata"]
            name = meta["name"]
            if name in present:
                continue
            wanted.append((name, meta["labels"][marks.NODE_ROLE_LABEL], meta["labels"][ZONE_LABEL]))
        return wanted

    def add_nodes(self, manifests: Iterable[dict[str, Any]], *, timeout: float = 60.0) -> list[str]:
        """Create nodes (existing ones are left alone) and wait until kwok reports them Ready."""
        names = []
        for manifest in manifests:
            self.kube.create(manifest)
            names.append(manifest["metadata"]["name"])
        if names:
            say(f"waiting for {len(names)} node(s) to be Ready: {', '.join(names)}")
            poll(
                lambda: self._all_ready(names), timeout=timeout, what=f"nodes {', '.join(names)} to be Ready"
            )
        return names

    def _all_ready(self, names: list[str]) -> bool:
        ready = {n["metadata"]["name"] for n in self.kube.items("nodes") if chaos.is_ready(n)}
        return set(names) <= ready

    def install_crds(self, crds_dir: Path | None) -> list[str]:
        """Apply every YAML file of ``crds_dir`` (if it exists) and wait until each CRD is Established."""
        if crds_dir is None or not crds_dir.is_dir():
            return []
        files = sorted([*crds_dir.glob("*.yaml"), *crds_dir.glob("*.yml")])
        if not files:
            return []
        say(f"installing {len(files)} CRD file(s) from {crds_dir}")
        args: list[str] = []
        for f in files:
            args += ["-f", str(f)]
        out = self.kubectl(
            "apply", "--server-side", "--field-manager=llmjob", "--force-conflicts", *args, "-o", "name"
        ).stdout
        crds = [line.strip() for line in out.splitlines() if "customresourcedefinition" in line]
        if crds:
            self.kubectl("wait", "--for=condition=Established", "--timeout=60s", *crds, timeout=70)
        return crds

    def wait_default_service_account(self, namespace: str = "default", timeout: float = 30.0) -> None:
        """Pods are refused until the namespace's ``default`` ServiceAccount exists: wait for it."""
        poll(
            lambda: self.kube.get("serviceaccount", "default", namespace) is not None,
            timeout=timeout,
            what=f"ServiceAccount {namespace}/default",
        )

    def down(self) -> bool:
        """Stop every component and delete the cluster's files; ``False`` when it did not exist."""
        if not self.exists():
            return False
        say(f"deleting cluster {self.name}")
        if self.runs_kubelets:
            self.kubelet_tier.down()
            say("kubelet nodes stopped: kubelet, containerd and containers killed, their files removed")
        if karpenter_.stop(self.workdir):
            say("karpenter stopped")
        if argocd_.stop(self.workdir):
            say("argocd stopped")
        if podrunner.stop(self.name, self.podrunner_dir):
            say("local pod runner stopped, pod processes killed")
        pids = self.component_pids()
        self._kwokctl.delete()
        for component, pid in pids.items():  # a component kwokctl could not stop must not outlive its files
            if self._runs_here(pid):
                os.kill(pid, signal.SIGKILL)
                say(f"{component} (pid {pid}) outlived kwokctl's delete: killed")
        shutil.rmtree(self.workdir, ignore_errors=True)
        self.config_path.unlink(missing_ok=True)
        self._kwokctl.log_path.unlink(missing_ok=True)
        return True

    def _runs_here(self, pid: int) -> bool:
        """``pid`` is a live process started from this cluster's folder (not a reused pid)."""
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            argv = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, IndexError):
            return False
        return state != "Z" and str(self.workdir).encode() in argv

    def forget_failed_logs(self) -> None:
        shutil.rmtree(self.failed_logs_dir, ignore_errors=True)

    def status(self) -> ClusterStatus:
        if not self.exists():
            return ClusterStatus(self.name, exists=False, running=False, kubeconfig=self.kubeconfig)
        running = self.is_running()
        components = {c: ("running" if self._component_alive(c) else "stopped") for c in COMPONENTS}
        if self.runs_pods:
            components["podrunner"] = "running" if podrunner.alive(self.podrunner_dir) else "stopped"
        if self.runs_karpenter:
            components["karpenter"] = "running" if karpenter_.alive(self.workdir) else "stopped"
        if self.runs_kubelets:
            components.update(self.kubelet_tier.process_states())
        node_list = [summarize_node(n) for n in self.kube.items("nodes")] if running else []
        return ClusterStatus(self.name, True, running, self.kubeconfig, components, node_list)

    def _component_alive(self, component: str) -> bool:
        pid = self.component_pids().get(component)
        return pid is not None and pid_alive(pid)

    def component_pids(self) -> dict[str, int]:
        """PIDs of the running components (for memory accounting)."""
        pids = {}
        for component in COMPONENTS:
            try:
                pids[component] = int((self.workdir / "pids" / f"{component}.pid").read_text().strip())
            except (OSError, ValueError):
                continue
        return pids

    def peak_memory_bytes(self) -> dict[str, int]:
        """Peak resident memory (VmHWM) of each running component so far (Linux /proc)."""
        peaks = {}
        for component, pid in self.component_pids().items():
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            for line in status.splitlines():
                if line.startswith("VmHWM:"):
                    peaks[component] = int(line.split()[1]) * 1024
        return peaks

    def collect_logs(self, dest: Path) -> list[Path]:
        """Copy every component log into ``dest`` (call before :meth:`down`, which deletes them)."""
        dest.mkdir(parents=True, exist_ok=True)
        copied = []
        for log in self.log_files():
            target = dest / log.name
            if target.resolve() == log.resolve():
                copied.append(target)
                continue
            shutil.copyfile(log, target)
            copied.append(target)
        return copied
