"""The pure parts of the jobs' etcd credentials (issue 55): names and key ranges, derived passwords, what a
worker pod gets, the operator's settings, what a refusal means for a token, the credentials a worker reads,
and the client's token renewal (against a stand-in for the library's client).
The credentials against a real etcd: tests/integration/test_tenant_etcd.py."""

from __future__ import annotations

import base64
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from llm_elastic import contract
from llm_elastic.errors import ContractError
from llm_elastic.rendezvous.etcd_auth import (
    Credentials,
    Refusal,
    auth_disabled,
    connection_hint,
    credentials_from_env,
    refusal,
)
from llm_elastic.rendezvous.etcd_client import EtcdClient, EtcdError, parse_endpoints
from llm_operator.api.rules import TRAINER_CONTAINER
from llm_operator.builders import etcd_auth
from llm_operator.builders.worker import live_prefix, worker_pod
from llm_operator.control.etcd_access import EtcdRefused, TokenRefused, check_answer, job_calls
from llm_operator.settings import EtcdAuth, Settings

from .jobs import job

AUTH = EtcdAuth(b"k" * 32, "etcd.rendezvous.svc:2379", Credentials("root", "rootpw"))
SHARED = {"rendezvous": {"backend": "etcd-v3", "endpoint": AUTH.shared_endpoint}}


def test_a_role_covers_its_own_job_prefixes_and_no_other_job() -> None:
    mine, other = job(), job()
    other.metadata.uid = "uid-12345"  # a UID that extends mine: the ranges must not cover it
    ranges = etcd_auth.key_ranges(mine)
    assert ranges == [
        ("/llmjob/uid-1234/", "/llmjob/uid-12340"),
        ("/elasticllm/rendezvous/uid-1234/", "/elasticllm/rendezvous/uid-12340"),
    ]

    def inside(key: str) -> bool:
        return any(start <= key < end for start, end in ranges)

    assert inside(live_prefix(mine) + "members/a.0") and inside("/elasticllm/rendezvous/uid-1234/state")
    assert not inside(live_prefix(other) + "members/a.0") and not inside("/llmjob/uid-1234")
    assert etcd_auth.user_name(mine) == "llmjob/ml/llama/uid-1234"
    with pytest.raises(ValueError, match="empty prefix"):
        etcd_auth.prefix_range("")


def test_passwords_are_derived_per_job_and_per_user_and_stable() -> None:
    a, b = job(), job()
    b.metadata.uid = "uid-9"
    user = etcd_auth.job_credentials(a, AUTH)
    assert user == etcd_auth.job_credentials(a, AUTH), "a restarted operator derives the same"
    assert user.password != etcd_auth.job_credentials(b, AUTH).password
    assert user.password != etcd_auth.root_credentials(a, AUTH).password
    assert len(user.password) == 43 and "rootpw" not in repr(AUTH) and user.password not in repr(user)
    assert etcd_auth.root_credentials(job(**SHARED), AUTH) == AUTH.shared_root
    secret = etcd_auth.secret(a, AUTH)
    assert base64.b64decode(secret["data"]["password"]).decode() == user.password
    assert secret["metadata"]["ownerReferences"][0]["uid"] == "uid-1234", "deleted with its job"


def test_who_gets_credentials() -> None:
    assert etcd_auth.applies(job(), AUTH)
    assert not etcd_auth.applies(job(), None), "auth off"
    assert not etcd_auth.applies(job(rendezvous={"backend": "c10d"}), AUTH)
    assert etcd_auth.applies(job(**SHARED), AUTH)
    # The root credentials never go to an etcd the job chose.
    assert not etcd_auth.applies(job(rendezvous={"backend": "etcd-v3", "endpoint": "mine:2379"}), AUTH)
    assert not etcd_auth.applies(job(**SHARED), EtcdAuth(b"k" * 32))


def test_only_the_trainer_container_gets_the_secret() -> None:
    j = job()
    built = worker_pod(j, 0, 0)
    built["spec"]["containers"].append({"name": "sidecar", "image": "s:1"})  # a sidecar of the user's
    pod = etcd_auth.dress(built, j)
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == etcd_auth.VOLUME)
    assert volume["secret"]["secretName"] == "llama-etcd-auth"
    by_name = {c["name"]: c for c in pod["spec"]["containers"]}
    trainer, sidecar = by_name[TRAINER_CONTAINER], by_name["sidecar"]
    env = {e["name"]: e.get("value") for e in trainer["env"]}
    assert env[contract.ETCD_USER_ENV] == "llmjob/ml/llama/uid-1234"
    assert env[contract.ETCD_PASSWORD_FILE_ENV] == f"{etcd_auth.MOUNT_DIR}/password"
    assert all(m["name"] != etcd_auth.VOLUME for m in sidecar.get("volumeMounts", []))
    assert contract.ETCD_USER_ENV not in {e["name"] for e in sidecar.get("env", [])}


def test_settings_turn_auth_on_with_a_key_and_the_shared_etcd_all_or_nothing() -> None:
    assert Settings.from_env({}).etcd_auth is None
    on = Settings.from_env({"LLMJOB_ETCD_AUTH_KEY": "x" * 16}).etcd_auth
    assert on is not None and on.shared_root is None
    shared = Settings.from_env(
        {
            "LLMJOB_ETCD_AUTH_KEY": "x" * 16,
            "LLMJOB_SHARED_ETCD_ENDPOINT": "etcd:2379",
            "LLMJOB_SHARED_ETCD_ROOT_USER": "root",
            "LLMJOB_SHARED_ETCD_ROOT_PASSWORD": "pw",
        }
    ).etcd_auth
    assert shared is not None and shared.shared_root == Credentials("root", "pw")
    with pytest.raises(ValueError, match="at least 16"):
        Settings.from_env({"LLMJOB_ETCD_AUTH_KEY": "short"})
    with pytest.raises(ValueError, match="go together; only LLMJOB_SHARED_ETCD_ENDPOINT"):
        Settings.from_env({"LLMJOB_ETCD_AUTH_KEY": "x" * 16, "LLMJOB_SHARED_ETCD_ENDPOINT": "etcd:2379"})
    with pytest.raises(ValueError, match="need LLMJOB_ETCD_AUTH_KEY"):
        Settings.from_env({"LLMJOB_SHARED_ETCD_ROOT_USER": "root"})


@pytest.mark.parametrize(
    ("details", "expected"),
    [
        ("etcdserver: invalid auth token", Refusal.REAUTHENTICATE),  # a restarted etcd, an idle token
        ("etcdserver: user name is empty", Refusal.REAUTHENTICATE),  # auth turned on since
        ("etcdserver: permission denied", Refusal.FINAL),
        ("etcdserver: authentication failed, invalid user ID or password", Refusal.FINAL),
        ("failed to connect to all addresses", Refusal.FINAL),
    ],
)
def test_what_a_refusal_means_for_the_token(details: str, expected: Refusal) -> None:
    assert refusal(details) is expected


@pytest.mark.parametrize(
    ("error", "names_the_credentials"),
    [
        ("etcdserver: user name is empty", True),  # an agent without the job's credentials
        ("etcdserver: authentication failed, invalid user ID or password", True),
        ("etcdserver: permission denied", True),
        ("failed to connect to all addresses", False),
    ],
)
def test_torchrun_agents_are_told_what_to_check(error: str, names_the_credentials: bool) -> None:
    hint = connection_hint(error)
    assert (contract.ETCD_USER_ENV in hint) is names_the_credentials, hint
    assert ("--rdzv-endpoint" in hint) is not names_the_credentials, hint


def test_the_gateway_answers_are_sorted_the_same_way() -> None:
    assert check_answer("/v3/kv/range", 200, '{"kvs": []}') == {"kvs": []}
    with pytest.raises(TokenRefused):
        check_answer("/v3/kv/range", 401, '{"code":16,"message":"etcdserver: invalid auth token"}')
    with pytest.raises(EtcdRefused, match="permission denied") as refused:
        check_answer("/v3/kv/range", 400, '{"code":7,"message":"etcdserver: permission denied"}')
    assert not isinstance(refused.value, TokenRefused)
    assert auth_disabled("etcdserver: authentication is not enabled")
    calls = job_calls(Credentials("u", "p"), [("/a/", "/a0")])
    assert [path for path, _ in calls] == [
        "/v3/auth/role/add", "/v3/auth/role/grant", "/v3/auth/user/add", "/v3/auth/user/grant"
    ]  # fmt: skip
    assert calls[1][1]["perm"] == {"permType": "READWRITE", "key": "L2Ev", "range_end": "L2Ew"}


def test_a_worker_reads_its_credentials_from_the_env_and_the_file(tmp_path: Path) -> None:
    assert credentials_from_env({}) is None
    secret = tmp_path / "password"
    secret.write_text("s3cret\n")
    env = {contract.ETCD_USER_ENV: "llmjob/ml/llama/u", contract.ETCD_PASSWORD_FILE_ENV: str(secret)}
    assert credentials_from_env(env) == Credentials("llmjob/ml/llama/u", "s3cret")
    with pytest.raises(ContractError, match="LLMJOB_ETCD_PASSWORD_FILE must be set"):
        credentials_from_env({contract.ETCD_USER_ENV: "u"})
    with pytest.raises(ContractError, match="cannot be read"):
        credentials_from_env({**env, contract.ETCD_PASSWORD_FILE_ENV: str(tmp_path / "missing")})


class _Refused(grpc.RpcError):  # type: ignore[misc]
    def __init__(self, details: str) -> None:
        self._details = details

    def details(self) -> str:
        return self._details


class _Etcd:
    """The library's client as EtcdClient uses it: ``authstub.Authenticate``, ``get``, ``metadata``."""

    def __init__(self, auth_on: bool = True) -> None:
        self.auth_on = auth_on
        self.issued = 0
        self.valid: str | None = None
        self.metadata: Any = None
        self.authstub = self
        self._stubs: dict[str, Any] = {"watcher": SimpleNamespace(_metadata=None)}
        self.denied: set[str] = set()

    def Authenticate(self, request: Any, timeout: float) -> Any:
        if not self.auth_on:
            raise _Refused("etcdserver: authentication is not enabled")
        self.issued += 1
        self.valid = f"token-{self.issued}"
        return SimpleNamespace(token=self.valid)

    def restart(self) -> None:
        """A fresh etcd: tokens it never issued are refused."""
        self.valid = "nobody's"

    def get(self, key: str) -> tuple[bytes | None, Any]:
        if self.auth_on:
            if self.metadata is None:
                raise _Refused("etcdserver: user name is empty")
            if self.metadata != (("token", self.valid),):
                raise _Refused("etcdserver: invalid auth token")
            if key in self.denied:
                raise _Refused("etcdserver: permission denied")
        return None, None


USER = Credentials("u", "p")


def _client(etcd: _Etcd, credentials: Credentials | None = USER) -> EtcdClient:
    client = EtcdClient(parse_endpoints("127.0.0.1:1"), timeout=1, credentials=credentials)
    client._client = etcd
    return client


def test_the_client_authenticates_once_and_again_when_its_token_is_refused() -> None:
    etcd = _Etcd()
    client = _client(etcd)
    client.get("/k")
    client.get("/k")
    assert client.requests["authenticate"] == 1 and etcd.metadata == (("token", "token-1"),)
    assert "watcher" not in etcd._stubs, "new watches go to a stream opened with the token"
    etcd._stubs["watcher"] = SimpleNamespace(_metadata=etcd.metadata)
    client.get("/k")
    assert "watcher" in etcd._stubs, "the same token keeps its stream"
    etcd.restart()  # a restarted etcd, or a token idle for 5 minutes
    client.get("/k")
    assert client.requests["authenticate"] == 2 and client.requests["get"] == 5, "one retry, fresh token"
    assert "watcher" not in etcd._stubs, "etcd cancels a new watch on a stream of a stale token: a new stream"
    etcd.denied.add("/other")
    with pytest.raises(EtcdError, match="permission denied"):
        client.get("/other")
    assert client.requests["authenticate"] == 2, "a refusal of the key is final, no new token"


def test_the_client_sends_no_token_until_auth_is_turned_on() -> None:
    etcd = _Etcd(auth_on=False)  # a per-job etcd the operator has not set up yet
    client = _client(etcd)
    client.get("/k")
    assert etcd.metadata is None and client.requests["authenticate"] == 1
    etcd.auth_on = True  # the operator turns auth on: the next call is refused, authenticates, goes through
    client.get("/k")
    assert etcd.metadata == (("token", "token-1"),) and client.requests["authenticate"] == 2
    anonymous = _client(_Etcd(), credentials=None)
    with pytest.raises(EtcdError, match="user name is empty"):
        anonymous.get("/k")
    assert anonymous.requests["authenticate"] == 0
