"""The world of one end-to-end training job: cluster, namespace, shared volume, operator, metrics."""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from llm_elastic.accounting import Audit, audit
from llm_operator import labels
from llm_testbed import training
from llm_testbed.localcluster import chaos
from llm_testbed.localcluster.cluster import LocalCluster
from support.wait import wait_for

if TYPE_CHECKING:
    from .conftest import PeeredOperatorProcess

JOB = "train"
STEP_TIMEOUT = 240.0  # first steps include process start, torch import and rendezvous on a loaded 2-core box
EVERY = 10  # checkpoint interval of the test jobs
# A loss while checkpoint N is still persisting (async) resumes from N - EVERY; the next save waits for that
# persist (at most one in flight), so the newest complete checkpoint is never two intervals behind.
MAX_REPLAY = 2 * EVERY - 1
SMOKE_STEPS = 60
PROGRESS_SECONDS = 10.0
"""The e2e operators update status.progress every 10 s (LLMJOB_PROGRESS_SECONDS; default 30) so a
few-minute story sees several updates."""


class Training:
    """One job's world: the cluster, the namespace, its shared volume, its operator."""

    def __init__(self, cluster: LocalCluster, namespace: str, operator: PeeredOperatorProcess) -> None:
        self.cluster, self.ns, self.operator = cluster, namespace, operator
        self.pv = f"pv-{namespace}"
        self.volume = cluster.volume_dir(self.pv)

    def setup_volume(self) -> None:
        training.prepare_data(self.volume)
        self.cluster.kube.apply(training.shared_volume(self.pv, self.ns))

    def apply(self, job: dict[str, Any]) -> None:
        self.cluster.kubectl("apply", "-n", self.ns, "-f", "-", input=yaml.safe_dump(job))

    def status(self) -> dict[str, Any]:
        obj = self.cluster.kube.get("llmtrainingjob", JOB, self.ns) or {}
        s: dict[str, Any] = obj.get("status") or {}
        return s

    def workers(self) -> list[dict[str, Any]]:
        return self.cluster.kube.items(
            "pods", labels=f"{labels.JOB_NAME}={JOB},{labels.ROLE}=worker", namespace=self.ns
        )

    def records(self) -> list[dict[str, Any]]:
        return training.records(self.volume)

    def wait_steps(
        self,
        what: str,
        *,
        world: int,
        count: int,
        after: float = 0.0,
        without: Collection[str] = (),
        timeout: float = STEP_TIMEOUT,
    ) -> list[dict[str, Any]]:
        """Wait until ``count`` steps at world size ``world`` completed after wall time ``after``, by
        members none of which is in ``without`` (a lost member may still complete a step or two after
        the loss was injected: its processes are killed when the node runner sees the node go)."""

        def done() -> list[dict[str, Any]] | None:
            hits = [
                r
                for r in self.records()
                if r["world_size"] == world
                and r["time"] > after
                and not set(r.get("members") or []) & set(without)
            ]
            return hits if len(hits) >= count else None

        try:
            found: list[dict[str, Any]] = wait_for(done, timeout, what, interval=0.5)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.diagnostics()}") from None
        return found

    def audit(self) -> Audit:
        result = audit(self.records(), training.sample_order(self.volume))
        assert result.ok, f"{result.problems}\n{self.diagnostics()}"
        return result

    def diagnostics(self) -> str:
        tail = [f"{r['step']}@{r['world_size']}/r{r['restart']}" for r in self.records()[-12:]]
        logs = []
        for pod in self.workers():
            name = pod["metadata"]["name"]
            path = self.cluster.pod_log(self.ns, name)
            if path.is_file():
                logs.append(f"--- {name} ---\n{path.read_text(errors='replace')[-2500:]}")
        return (
            f"status: {self.status()}\nlast records: {tail}\n"
            + "\n".join(logs)
            + f"\n--- operator ---\n{self.operator.logs()[-3000:]}"
        )

    def worker_on(self, index: int) -> dict[str, Any]:
        pod = next(p for p in self.workers() if p["metadata"]["name"] == f"{JOB}-worker-{index}")
        return pod

    def lose_node_in_process(self, pids_before: set[int]) -> NodeLoss:
        """Worker 1's node goes NotReady and comes back: the survivor (worker 0) keeps its pod and its
        training process at world size 1, then a replacement of worker 1 joins at world size 2 beside it."""
        survivor, victim = self.worker_on(0), self.worker_on(1)
        node = victim["spec"]["nodeName"]
        lost_at = time.time()
        chaos.node_not_ready(node, kube=self.cluster.kube, wait=False)
        alone = self.wait_steps("the survivor to go on at world size 1", world=1, count=3, after=lost_at)
        assert self.worker_on(0)["metadata"]["uid"] == survivor["metadata"]["uid"], "the survivor's pod stays"
        survivor_pids = {pid for r in alone for pid in (r["pids"] or [])}
        assert survivor_pids and survivor_pids < pids_before, (
            "the survivor's training process is the same one"
        )
        chaos.node_ready(node, kube=self.cluster.kube)
        back_at = time.time()
        both = self.wait_steps("the replacement to join at world size 2", world=2, count=3, after=back_at)
        assert survivor_pids < set(both[-1]["pids"]), "the survivor still trains, beside a new process"
        replacement = self.worker_on(1)
        assert replacement["metadata"]["uid"] != victim["metadata"]["uid"], "worker 1 was replaced"
        return NodeLoss(lost_at, alone, replacement)


@dataclass(frozen=True)
class NodeLoss:
    """What :meth:`Training.lose_node_in_process` saw."""

    lost_at: float
    alone: list[dict[str, Any]]
    """The survivor's first steps at world size 1."""
    replacement: dict[str, Any]
    """Worker 1's replacement pod."""


class StatusWatch:
    """Every version of the job the apiserver sends to a watch (`kubectl get -w -o json`): each status
    write is one, so the test sees the real write rate, not samples of it."""

    def __init__(self, t: Training) -> None:
        self.out = Path(tempfile.mkstemp(prefix="llmjob-watch-", suffix=".json")[1])
        argv = t.cluster.kube.argv(
            "get", "llmtrainingjobs", "-n", t.ns, f"--field-selector=metadata.name={JOB}", "-w", "-o", "json"
        )
        self.proc = subprocess.Popen(argv, stdout=self.out.open("wb"), stderr=subprocess.DEVNULL)

    def versions(self) -> list[dict[str, Any]]:
        """The job objects seen so far, in order, one per resourceVersion."""
        text, decoder, at = self.out.read_text(errors="replace"), json.JSONDecoder(), 0
        found: list[dict[str, Any]] = []
        while True:
            while at < len(text) and text[at].isspace():
                at += 1
            try:
                value, at = decoder.raw_decode(text, at)
            except ValueError:  # the end, or an object still being written
                break
            items = value.get("items", []) if value.get("kind", "").endswith("List") else [value]
            found += [i for i in items if i.get("kind") == "LLMTrainingJob"]
        seen, out = set(), []
        for obj in found:
            rv = obj["metadata"]["resourceVersion"]
            if rv not in seen:
                seen.add(rv)
                out.append(obj)
        return out

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)
        self.out.unlink(missing_ok=True)
