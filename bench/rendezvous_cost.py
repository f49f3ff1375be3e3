"""Benchmark: what the managed rendezvous costs per job (one etcd per job), and what a shared one would.

Runs the test bed's etcd binary with the flags of the operator's managed rendezvous Deployment
(``llm_operator.builders.rendezvous``, only the addresses changed for a local process) and drives it with
the runtime's own live membership (``llm_elastic.live.membership.Membership``: a lease per member kept
alive every ttl/3 s, two watches per member, rank 0 writes the job's step after every step):

1. idle: the etcd with no client;
2. one job at rest: M members registered in one generation, rank 0 putting the step every S seconds;
3. one job recovering: R rounds of "the operator evicts a member, a replacement registers, every member
   agrees on the next generation" (the burst a node loss causes), back to back;
4. shared: one etcd serving N jobs at rest (each its own key prefix), the cost per added job; with
   ``--auth`` every job gets its own etcd user and role confined to its prefix (``/llmjob/<uid>/``), and
   the isolation is checked for real: a job's credentials cannot read, write, delete or watch another's keys.

CPU and RSS of the etcd process come from /proc (psutil), sampled every 0.5 s.

    .venv/bin/python bench/rendezvous_cost.py --members 8 --shared-jobs 20 --auth
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
from llm_elastic.live.membership import Membership, evict
from llm_elastic.rendezvous.etcd_client import Endpoint, EtcdClient
from llm_operator.api.models import LLMTrainingJob
from llm_operator.builders.rendezvous import rendezvous_objects
from llm_operator.settings import Settings
from llm_testbed.localcluster import tools


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def managed_etcd_args() -> list[str]:
    """The args of the operator's managed etcd container for a job without an endpoint."""
    job = LLMTrainingJob.model_validate(
        {
            "apiVersion": "elasticllm.dev/v1alpha1",
            "kind": "LLMTrainingJob",
            "metadata": {"name": "bench", "namespace": "bench", "uid": "u", "generation": 1},
            "spec": {"minReplicas": 1, "maxReplicas": 8, "image": "x", "gpusPerNode": 0},
        }
    )
    deployment = next(o for o in rendezvous_objects(job, Settings()) if o["kind"] == "Deployment")
    args: list[str] = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


class Etcd:
    """One etcd process with the managed flags, on local ports, with its own data dir."""

    def __init__(self, work: Path, name: str) -> None:
        self.dir = work / name
        self.dir.mkdir(parents=True)
        self.port, peer = free_port(), free_port()
        local = {
            "--data-dir": str(self.dir / "data"),
            "--listen-client-urls": f"http://127.0.0.1:{self.port}",
            "--advertise-client-urls": f"http://127.0.0.1:{self.port}",
            "--listen-peer-urls": f"http://127.0.0.1:{peer}",
            "--initial-advertise-peer-urls": f"http://127.0.0.1:{peer}",
            "--initial-cluster": f"rdzv=http://127.0.0.1:{peer}",
        }
        args = [
            a if a.split("=", 1)[0] not in local else f"{a.split('=', 1)[0]}={local[a.split('=', 1)[0]]}"
            for a in managed_etcd_args()
        ]
        self.args = args
        self.proc = subprocess.Popen(
            [str(tools.ensure(["etcd"])["etcd"]), *args],
            stdout=(self.dir / "etcd.log").open("wb"),
            stderr=subprocess.STDOUT,
        )
        self.ps = psutil.Process(self.proc.pid)
        deadline = time.monotonic() + 30
        while True:
            try:
                EtcdClient([Endpoint("127.0.0.1", self.port)], timeout=2).check()
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def client(self) -> EtcdClient:
        return EtcdClient([Endpoint("127.0.0.1", self.port)])

    def stop(self) -> None:
        self.proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)


@contextlib.contextmanager
def measured(etcd: Etcd, out: dict[str, Any]) -> Iterator[None]:
    """CPU (cores) and RSS (MB, mean and peak) of the etcd process while the block runs."""
    samples: list[int] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            with contextlib.suppress(psutil.Error):
                samples.append(etcd.ps.memory_info().rss)
            done.wait(0.5)

    thread = threading.Thread(target=sample, daemon=True)
    t0, c0 = time.monotonic(), etcd.ps.cpu_times()
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        wall, c1 = time.monotonic() - t0, etcd.ps.cpu_times()
        cpu = (c1.user + c1.system) - (c0.user + c0.system)
        out.update(
            wall_s=round(wall, 1),
            cpu_s=round(cpu, 2),
            cores=round(cpu / wall, 4),
            rss_mb=round(sum(samples) / max(len(samples), 1) / 2**20, 1),
            rss_peak_mb=round(max(samples, default=0) / 2**20, 1),
            load=load(),
        )


class Job:
    """M members of one job's live membership, as the runtime runs them, on one etcd prefix."""

    def __init__(self, etcd: Etcd, members: int, step_seconds: float, ttl: int = 3) -> None:
        self.etcd, self.ttl, self.step_seconds = etcd, ttl, step_seconds
        self.prefix = f"/llmjob/{uuid.uuid4()}/live/"
        self.members: list[Membership] = []
        self.serial = 0
        for _ in range(members):
            self._add()
        self.form()
        self.stop = threading.Event()
        self.steps = 0
        self.stepper = threading.Thread(target=self._step, daemon=True)
        self.stepper.start()

    def _add(self) -> Membership:
        m = Membership(self.etcd.client(), self.prefix, f"worker-{self.serial}.0", self.ttl)
        self.serial += 1
        m.register()
        self.members.append(m)
        return m

    def form(self) -> float:
        """Every member agrees on the next generation (concurrently, as the processes would)."""
        started = time.monotonic()
        errors: list[BaseException] = []
        left = max((m.current.number if m.current else 0) for m in self.members)

        def run(m: Membership) -> None:
            try:
                m.current = m.next_generation(left, len(self.members), timeout=60)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(m,)) for m in self.members]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return time.monotonic() - started

    def _step(self) -> None:
        while not self.stop.wait(self.step_seconds):
            self.steps += 1
            self.members[0].set_job_step(self.steps)

    def recover(self, operator: EtcdClient) -> float:
        """A node loss: the operator evicts a member (not rank 0), a replacement registers, all re-form."""
        victim = self.members.pop(-1)
        started = time.monotonic()
        evict(operator, self.prefix, victim.member)
        victim.lease.close(revoke=False)
        victim.client.close()
        self._add()
        self.form()
        return time.monotonic() - started

    def close(self) -> None:
        self.stop.set()
        for m in self.members:
            with contextlib.suppress(Exception):
                m.leave()
            with contextlib.suppress(Exception):
                m.client.close()


def per_job(args: argparse.Namespace, work: Path, results: dict[str, Any]) -> None:
    etcd = Etcd(work, "per-job")
    results["etcd_args"] = etcd.args
    try:
        with measured(etcd, results.setdefault("idle", {})):
            time.sleep(args.seconds)
        print("idle", results["idle"], flush=True)
        job = Job(etcd, args.members, args.step_seconds)
        time.sleep(5)
        with measured(etcd, results.setdefault("job_at_rest", {})):
            time.sleep(args.seconds)
        results["job_at_rest"]["members"] = args.members
        results["job_at_rest"]["step_seconds"] = args.step_seconds
        print("job at rest", results["job_at_rest"], flush=True)
        operator = etcd.client()
        took: list[float] = []
        with measured(etcd, results.setdefault("job_recovering", {})):
            for _ in range(args.recoveries):
                took.append(job.recover(operator))
        results["job_recovering"].update(
            rounds=len(took), round_s_median=round(sorted(took)[len(took) // 2], 3)
        )
        results["job_recovering"]["cpu_s_per_round"] = round(
            results["job_recovering"]["cpu_s"] / len(took), 3
        )
        print("job recovering", results["job_recovering"], flush=True)
        job.close()
    finally:
        etcd.stop()


def root_client(etcd: Etcd, user: str | None = None, password: str | None = None) -> Any:
    import etcd3  # python3-etcd3, the runtime's library; used directly for its auth API

    client = etcd3.client("127.0.0.1", etcd.port, user=user, password=password, timeout=10)
    # gRPC sends call credentials only over TLS; locally the token goes as plain metadata (a shared
    # rendezvous would serve TLS: the token is a password equivalent).
    client.call_credentials = None
    return client


def enable_auth(etcd: Etcd) -> Any:
    """root user + role, then auth on; returns a client authenticated as root."""
    from etcd3.etcdrpc import rpc_pb2

    c = root_client(etcd)
    c.authstub.UserAdd(rpc_pb2.AuthUserAddRequest(name="root", password="rootpw"))
    c.authstub.UserGrantRole(rpc_pb2.AuthUserGrantRoleRequest(user="root", role="root"))
    c.authstub.AuthEnable(rpc_pb2.AuthEnableRequest())
    c.close()
    return root_client(etcd, "root", "rootpw")


def add_job_user(root: Any, name: str, prefix: str) -> None:
    """User ``name`` with role ``name``: read and write on keys under ``prefix`` only."""
    from etcd3.etcdrpc import auth_pb2, rpc_pb2

    end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
    root.authstub.RoleAdd(rpc_pb2.AuthRoleAddRequest(name=name), metadata=root.metadata)
    perm = auth_pb2.Permission(
        permType=auth_pb2.Permission.READWRITE, key=prefix.encode(), range_end=end.encode()
    )
    root.authstub.RoleGrantPermission(
        rpc_pb2.AuthRoleGrantPermissionRequest(name=name, perm=perm), metadata=root.metadata
    )
    root.authstub.UserAdd(
        rpc_pb2.AuthUserAddRequest(name=name, password=name + "-pw"), metadata=root.metadata
    )
    root.authstub.UserGrantRole(
        rpc_pb2.AuthUserGrantRoleRequest(user=name, role=name), metadata=root.metadata
    )


def isolation(etcd: Etcd, root: Any) -> dict[str, bool]:
    """Two jobs' users: each reads/writes its own prefix; every access to the other's is refused."""
    import grpc

    a, b = "/llmjob/job-a/", "/llmjob/job-b/"
    add_job_user(root, "job-a", a)
    add_job_user(root, "job-b", b)
    ca, cb = root_client(etcd, "job-a", "job-a-pw"), root_client(etcd, "job-b", "job-b-pw")
    cb.put(b + "live/members/x", "b's")

    def refused(fn: Any) -> bool:
        try:
            fn()
        except grpc.RpcError as exc:
            return exc.code() == grpc.StatusCode.PERMISSION_DENIED
        except Exception as exc:  # the library maps some codes to its own exceptions
            return "permission denied" in str(exc).lower()
        return False

    def watch_delivers(prefix: str, writer: Any) -> bool:
        """Whether A's watch on ``prefix`` delivers a write made there (etcd cancels a watch that A's
        role does not allow: permission denied)."""
        seen: list[Any] = []
        try:
            watch_id = ca.add_watch_prefix_callback(prefix, lambda response: seen.append(response))
        except Exception as exc:
            if "permission" in str(exc).lower():
                return False
            raise
        writer.put(prefix + "live/step", "2")
        time.sleep(3)
        with contextlib.suppress(Exception):
            ca.cancel_watch(watch_id)
        return any(getattr(r, "events", None) for r in seen)

    ca.put(a + "live/members/y", "a's")
    out = {
        "own_read_write": ca.get(a + "live/members/y")[0] == b"a's",
        "other_read_refused": refused(lambda: ca.get(b + "live/members/x")),
        "other_prefix_read_refused": refused(lambda: list(ca.get_prefix(b))),
        "other_write_refused": refused(lambda: ca.put(b + "live/step", "1")),
        "other_delete_refused": refused(lambda: ca.delete(b + "live/members/x")),
        "root_range_refused": refused(lambda: list(ca.get_prefix("/"))),
        "other_intact": cb.get(b + "live/members/x")[0] == b"b's",
    }
    out["own_watch_delivers"] = watch_delivers(a, ca)  # the control: the same watch on its own prefix
    out["other_watch_refused"] = not watch_delivers(b, cb)
    ca.close()
    cb.close()
    return out


def shared(args: argparse.Namespace, work: Path, results: dict[str, Any]) -> None:
    """N jobs' membership traffic on one etcd (no auth: the runtime's client has no credentials yet)."""
    etcd = Etcd(work, "shared")
    out: dict[str, Any] = {"jobs": args.shared_jobs, "members": args.members}
    jobs: list[Job] = []
    try:
        for _ in range(args.shared_jobs):
            jobs.append(Job(etcd, args.members, args.step_seconds))
        time.sleep(5)
        with measured(etcd, out):
            time.sleep(args.seconds)
    finally:
        for job in jobs:
            job.close()
        etcd.stop()
    results["shared"] = out
    print("shared", out, flush=True)


def auth(work: Path, results: dict[str, Any]) -> None:
    """etcd auth as a shared rendezvous would use it: isolation between two jobs' users, cost per put."""
    etcd = Etcd(work, "auth")
    try:
        root = enable_auth(etcd)
        out: dict[str, Any] = {"isolation": isolation(etcd, root)}
        out.update(auth_put_cost(etcd, root, work))
        root.close()
    finally:
        etcd.stop()
    results["auth"] = out
    print("auth", out, flush=True)


def auth_put_cost(etcd: Etcd, root: Any, work: Path, count: int = 2000) -> dict[str, float]:
    """Seconds per put and etcd CPU per put, as a job user (auth on) vs root-less etcd (auth off)."""
    add_job_user(root, "job-c", "/llmjob/job-c/")
    client = root_client(etcd, "job-c", "job-c-pw")
    m: dict[str, Any] = {}
    with measured(etcd, m):
        for i in range(count):
            client.put("/llmjob/job-c/live/step", str(i))
    client.close()
    plain = Etcd(work, "plain")
    n: dict[str, Any] = {}
    try:
        c2 = root_client(plain)
        with measured(plain, n):
            for i in range(count):
                c2.put("/llmjob/job-c/live/step", str(i))
        c2.close()
    finally:
        plain.stop()
    return {
        "auth_ms_per_put": round(1000 * m["wall_s"] / count, 3),
        "auth_etcd_cpu_ms_per_put": round(1000 * m["cpu_s"] / count, 3),
        "plain_ms_per_put": round(1000 * n["wall_s"] / count, 3),
        "plain_etcd_cpu_ms_per_put": round(1000 * n["cpu_s"] / count, 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--members", type=int, default=8, help="members per job (processes: nodes x nproc)")
    parser.add_argument("--step-seconds", type=float, default=1.0)
    parser.add_argument("--seconds", type=float, default=60.0, help="length of each at-rest window")
    parser.add_argument("--recoveries", type=int, default=20)
    parser.add_argument("--shared-jobs", type=int, default=20)
    parser.add_argument("--auth", action="store_true", help="etcd users/roles per job: isolation and cost")
    parser.add_argument("--skip-per-job", action="store_true")
    args = parser.parse_args()
    print(
        f"machine: {platform.platform()}, {os.cpu_count()} cores,"
        f" Python {platform.python_version()}; load {load()}"
    )
    print(f"etcd {tools.ETCD_VERSION}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="llmjob-rdzv-"))
    results: dict[str, Any] = {"members": args.members, "step_seconds": args.step_seconds}
    try:
        if not args.skip_per_job:
            per_job(args, work, results)
        if args.shared_jobs:
            shared(args, work, results)
        if args.auth:
            auth(work, results)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
