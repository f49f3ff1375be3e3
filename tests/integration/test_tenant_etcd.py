"""The rendezvous keys belong to their job alone (issue 55, docs/security.md "The etcd credentials").

The operator runs with etcd auth on (``LLMJOB_ETCD_AUTH_KEY``) and holds the root credentials of a shared
etcd that runs with auth, as a platform team sets one up (``deploy/etcd``). Job ``train`` trains in process
on its own per-job etcd, where the operator turned auth on itself; jobs ``tenant-a`` and ``tenant-c`` name
the shared etcd (suspended: their users and Secrets are made all the same). One walk, in named steps:

1. each job has a Secret owned by it, and a user in its etcd;
2. on the shared etcd, ``tenant-a``'s credentials read and write its own keys and neither read, list nor
   write ``tenant-c``'s; a client without credentials is refused everything;
3. on ``train``'s own etcd, neither a client without credentials nor ``tenant-a``'s gets in; ``train``'s own
   credentials read its generation;
4. ``train`` trains through a node loss in process: the survivor keeps its process, the replacement joins
   with the same credentials, no step is replayed;
5. deleting ``tenant-c`` deletes its user and role from the shared etcd.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from llm_elastic.rendezvous.etcd_auth import Credentials
from llm_elastic.rendezvous.etcd_client import EtcdClient, EtcdError, parse_endpoints
from llm_operator import labels
from llm_testbed import training
from llm_testbed.local_etcd import LocalEtcd, etcd_binary
from llm_testbed.localcluster.cluster import LocalCluster
from support.wait import wait_for

from .conftest import _training
from .e2e_support import JOB, Training

pytestmark = [pytest.mark.cluster, pytest.mark.trainer, pytest.mark.timeout(600)]

ROOT = Credentials("root", "platform-root-password")
KEY = "tenant-etcd-test-key-0123456789"


def _gateway(address: str, path: str, body: dict[str, Any], token: str = "") -> dict[str, Any]:
    request = urllib.request.Request(
        f"http://{address}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **({"Authorization": token} if token else {})},
    )
    with urllib.request.urlopen(request, timeout=5) as answer:
        result: dict[str, Any] = json.loads(answer.read())
        return result


def _root_token(address: str) -> str:
    return str(
        _gateway(address, "/v3/auth/authenticate", {"name": ROOT.user, "password": ROOT.password})["token"]
    )


def _users(address: str) -> list[str]:
    return list(_gateway(address, "/v3/auth/user/list", {}, _root_token(address)).get("users") or [])


@pytest.fixture
def shared_etcd(tmp_path: Path) -> Iterator[LocalEtcd]:
    """A shared etcd with auth on and a root user, as the platform team runs it."""
    etcd = LocalEtcd(etcd_binary(), tmp_path / "shared-etcd").start()
    try:
        for path, body in (
            ("/v3/auth/user/add", {"name": ROOT.user, "password": ROOT.password}),
            ("/v3/auth/role/add", {"name": "root"}),
            ("/v3/auth/user/grant", {"user": ROOT.user, "role": "root"}),
            ("/v3/auth/enable", {}),
        ):
            _gateway(etcd.endpoint, path, body)
        yield etcd
    finally:
        etcd.stop()


@pytest.fixture
def tenant_train(
    process_cluster: LocalCluster, process_namespace: str, tmp_path: Path, shared_etcd: LocalEtcd
) -> Iterator[Training]:
    """``train``'s world with the operator holding an auth key and the shared etcd's root credentials."""
    env = {
        "LLMJOB_ETCD_AUTH_KEY": KEY,
        "LLMJOB_SHARED_ETCD_ENDPOINT": shared_etcd.endpoint,
        "LLMJOB_SHARED_ETCD_ROOT_USER": ROOT.user,
        "LLMJOB_SHARED_ETCD_ROOT_PASSWORD": ROOT.password,
    }
    yield from _training(process_cluster, process_namespace, tmp_path, extra_env=env)


def _credentials(train: Training, job: str) -> Credentials:
    secret = wait_for(
        lambda: train.cluster.kube.get("secret", f"{job}-etcd-auth", train.ns), 60, f"{job}'s Secret"
    )
    owners = secret["metadata"].get("ownerReferences") or []
    assert [o["name"] for o in owners] == [job], f"{job}'s Secret is owned by {job} alone: {owners}"
    uid = (train.cluster.kube.get("llmtrainingjob", job, train.ns) or {})["metadata"]["uid"]
    return Credentials(
        f"llmjob/{train.ns}/{job}/{uid}", base64.b64decode(secret["data"]["password"]).decode()
    )


def _refused(client: EtcdClient, what: str, call: Any) -> str:
    with pytest.raises(EtcdError) as refused:
        call()
    text = str(refused.value)
    assert any(w in text for w in ("permission denied", "user name is empty", "authentication failed")), (
        f"{what}: refused for another reason: {text}"
    )
    return text


def _shared_job(name: str, namespace: str, endpoint: str) -> dict[str, Any]:
    job = training.training_job(name, namespace, minimum=1, maximum=1, steps=10, recovery="inProcess")
    job["spec"]["rendezvous"] = {"backend": "etcd-v3", "endpoint": endpoint}
    job["spec"]["suspend"] = True
    return job


def test_tenant_etcd_keys_belong_to_their_job_on_shared_and_per_job_etcd(
    tenant_train: Training, shared_etcd: LocalEtcd
) -> None:
    train, shared = tenant_train, shared_etcd.endpoint
    job = training.training_job(JOB, train.ns, minimum=1, maximum=2, steps=100000, recovery="inProcess")
    train.apply(job)
    for name in ("tenant-a", "tenant-c"):
        train.apply(_shared_job(name, train.ns, shared))
    first = train.wait_steps("5 steps at world size 2 with etcd auth on", world=2, count=5)
    pids_before = set(first[-1]["pids"])

    # 1. Each job has its Secret, owned by it, and a user in its etcd.
    mine, other, b = (_credentials(train, name) for name in ("tenant-a", "tenant-c", JOB))
    wait_for(lambda: {mine.user, other.user} <= set(_users(shared)), 60, "the shared etcd users of the jobs")

    # 2. The shared etcd: tenant-a's credentials cover tenant-a's keys only.
    a_prefix, c_prefix = (f"/llmjob/{c.user.rsplit('/', 1)[1]}/live/" for c in (mine, other))
    as_a = EtcdClient(parse_endpoints(shared), timeout=5, credentials=mine)
    as_c = EtcdClient(parse_endpoints(shared), timeout=5, credentials=other)
    anonymous = EtcdClient(parse_endpoints(shared), timeout=5)
    try:
        as_a.put(a_prefix + "mine", b"a")
        assert as_a.get(a_prefix + "mine") is not None, "a job reads and writes its own keys"
        as_c.put(c_prefix + "generation", b"c's")
        _refused(as_a, "read another job's key", lambda: as_a.get(c_prefix + "generation"))
        _refused(as_a, "list another job's keys", lambda: as_a.read_prefix(c_prefix))
        _refused(as_a, "write another job's key", lambda: as_a.put(c_prefix + "generation", b"forged"))
        _refused(as_a, "delete another job's keys", lambda: as_a.delete_prefix(c_prefix))
        _refused(as_a, "read outside any job", lambda: as_a.get("/"))
        _refused(anonymous, "read without credentials", lambda: anonymous.get(c_prefix + "generation"))
        _refused(anonymous, "write without credentials", lambda: anonymous.put(c_prefix + "x", b"x"))
        stored = as_c.get(c_prefix + "generation")
        assert stored is not None and stored.value == b"c's", "tenant-c's key is untouched"
    finally:
        for client in (as_a, as_c, anonymous):
            client.close()

    # 3. train's own etcd: auth on, its own credentials only.
    rdzv = train.cluster.kube.items(
        "pods",
        labels=f"{labels.JOB_NAME}={JOB},{labels.ROLE}={labels.ROLE_RENDEZVOUS}",
        namespace=train.ns,
    )
    own = f"{rdzv[0]['status']['podIP']}:2379"
    b_prefix = f"/llmjob/{b.user.rsplit('/', 1)[1]}/live/"
    anonymous, as_a, as_b = (
        EtcdClient(parse_endpoints(own), timeout=5, credentials=c) for c in (None, mine, b)
    )
    try:
        _refused(anonymous, "read train's keys without credentials", lambda: anonymous.read_prefix(b_prefix))
        _refused(
            anonymous, "write train's keys without credentials", lambda: anonymous.put(b_prefix + "x", b"x")
        )
        _refused(as_a, "tenant-a at train's etcd", lambda: as_a.get(b_prefix + "generation"))
        assert as_b.get(b_prefix + "generation") is not None, "train's credentials read its generation"
    finally:
        for client in (anonymous, as_a, as_b):
            client.close()

    # 4. train trains through a node loss in process.
    loss = train.lose_node_in_process(pids_before)
    result = train.audit()
    assert all(i.replayed == 0 for i in result.interruptions), result.interruptions
    assert {r.get("restart") for r in train.records()} == {0}, "no fallback to a checkpoint"

    # 5. Deleting a job deletes its user and role in the shared etcd.
    train.cluster.kubectl("delete", "llmtrainingjob", "tenant-c", "-n", train.ns, "--wait=true")
    wait_for(lambda: other.user not in _users(shared), 60, "tenant-c's etcd user to go with the job")
    roles = _gateway(shared, "/v3/auth/role/list", {}, _root_token(shared)).get("roles") or []
    assert other.user not in roles and mine.user in roles, roles
    took = loss.alone[0]["time"] - loss.lost_at
    print(f"tenant etcd: lost node -> survivor's step {took:.2f} s; {result.summary()}")
