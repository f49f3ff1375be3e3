"""Contract of the etcd-v3 rendezvous backend and its c10d store, against a real etcd 3.6."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest
import torch.distributed as dist
from llm_elastic.rendezvous.etcd_backend import EtcdV3RendezvousBackend
from llm_elastic.rendezvous.etcd_client import EtcdClient, WatchCallback, parse_endpoints
from llm_elastic.rendezvous.etcd_lease import LeaseKeeper
from llm_elastic.rendezvous.etcd_store import EtcdV3Store
from llm_testbed.local_etcd import LocalEtcd, free_port
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError
from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler
from trainer_support import wait_for

pytestmark = pytest.mark.trainer

PREFIX = "/test-rdzv"


@pytest.fixture
def client(etcd: LocalEtcd) -> Iterator[EtcdClient]:
    c = EtcdClient(parse_endpoints(etcd.endpoint), timeout=5)
    yield c
    c.close()


@pytest.fixture
def run_id() -> str:
    return uuid.uuid4().hex[:12]


def make_backend(
    client: EtcdClient, run_id: str, ttl: int = 30
) -> tuple[EtcdV3RendezvousBackend, LeaseKeeper]:
    lease = LeaseKeeper(client, ttl)
    return EtcdV3RendezvousBackend(client, run_id, PREFIX, lease), lease


def make_store(client: EtcdClient, run_id: str, ttl: int = 30, timeout: float = 10) -> EtcdV3Store:
    return EtcdV3Store(
        client, f"{PREFIX}/{run_id}/store/", LeaseKeeper(client, ttl), timedelta(seconds=timeout)
    )


# -- backend: compare-and-set -------------------------------------------------------------------------------


def test_state_is_absent_then_created_once(client: EtcdClient, run_id: str) -> None:
    backend, _ = make_backend(client, run_id)
    assert backend.get_state() is None
    state, token, ok = backend.set_state(b"first")  # type: ignore[misc]
    assert (state, ok) == (b"first", True)
    # Without a token a write only creates: the second creator gets the existing state back.
    assert backend.set_state(b"second") == (b"first", token, False)
    assert backend.get_state() == (b"first", token)


def test_stale_token_is_rejected(client: EtcdClient, run_id: str) -> None:
    backend, _ = make_backend(client, run_id)
    _, token1, _ = backend.set_state(b"v1")  # type: ignore[misc]
    _, token2, ok = backend.set_state(b"v2", token1)  # type: ignore[misc]
    assert ok and token2 != token1
    # A writer that still holds token1 loses and learns the current state and token.
    assert backend.set_state(b"stale", token1) == (b"v2", token2, False)
    assert backend.get_state() == (b"v2", token2)


def test_concurrent_writers_have_exactly_one_winner(client: EtcdClient, run_id: str) -> None:
    backend, _ = make_backend(client, run_id)
    _, token, _ = backend.set_state(b"base")  # type: ignore[misc]
    writers = 8
    barrier = threading.Barrier(writers)
    results: list[tuple[bytes, object, bool] | None] = [None] * writers

    def write(index: int) -> None:
        mine = make_backend(client, run_id)[0]
        barrier.wait()
        results[index] = mine.set_state(f"writer-{index}".encode(), token)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    winners = [i for i, r in enumerate(results) if r is not None and r[2]]
    assert len(winners) == 1, results
    final = backend.get_state()
    assert final is not None and final[0] == f"writer-{winners[0]}".encode()
    # Every loser was told the winner's state.
    assert all(r is not None and r[0] == final[0] for r in results)


def test_keys_expire_after_the_last_writer_is_gone(client: EtcdClient, run_id: str) -> None:
    backend, lease = make_backend(client, run_id, ttl=2)
    backend.set_state(b"state")
    store = EtcdV3Store(client, f"{PREFIX}/{run_id}/store/", lease)
    store.set("MASTER_ADDR", "node-0")
    assert len(client.keys_with_prefix(f"{PREFIX}/{run_id}/")) == 2
    lease.close()  # the agent died: nobody refreshes the lease any more
    wait_for(lambda: client.keys_with_prefix(f"{PREFIX}/{run_id}/") == [], 15, "keys of a dead job to expire")


def test_missing_etcd_fails_fast_with_a_clear_error(run_id: str) -> None:
    port = free_port()
    params = RendezvousParameters("etcd-v3", f"127.0.0.1:{port}", run_id, 1, 2, request_timeout="3")
    started = time.monotonic()
    with pytest.raises(RendezvousConnectionError, match=f"cannot reach etcd at 127.0.0.1:{port}"):
        get_rendezvous_handler(params)
    assert time.monotonic() - started < 5


def test_bad_rendezvous_config_names_the_key(etcd: LocalEtcd, run_id: str) -> None:
    params = RendezvousParameters("etcd-v3", etcd.endpoint, run_id, 1, 2, lease_ttl="soon")
    with pytest.raises(ValueError, match="lease_ttl"):
        get_rendezvous_handler(params)


# -- the handler through torch's registry (entry point) -----------------------------------------------------


def test_two_nodes_rendezvous_through_the_registered_backend(etcd: LocalEtcd, run_id: str) -> None:
    conf = {"last_call_timeout": "1", "keep_alive_interval": "1", "key_prefix": PREFIX}
    results: dict[int, tuple[int, int, str, int]] = {}
    errors: list[BaseException] = []
    both_joined = threading.Barrier(2, timeout=60)

    def node(index: int) -> None:
        try:
            params = RendezvousParameters("etcd-v3", etcd.endpoint, run_id, 2, 2, **conf)
            handler = get_rendezvous_handler(params)
            assert handler.get_backend() == "etcd-v3"
            info = handler.next_rendezvous()
            store_info = info.bootstrap_store_info
            assert store_info is not None
            results[index] = (info.rank, info.world_size, store_info.master_addr, store_info.master_port)
            both_joined.wait()  # shutdown closes the rendezvous: not before the other node is through
            handler.shutdown()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=node, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    assert sorted(r[0] for r in results.values()) == [0, 1]
    assert {r[1] for r in results.values()} == {2}
    # Rank 0 published the master address in the shared store and the other node read the same one.
    assert len({(r[2], r[3]) for r in results.values()}) == 1


# -- c10d store ---------------------------------------------------------------------------------------------


class WatchSpy(EtcdClient):
    """An etcd client that reports when a watch has been opened."""

    watching = threading.Event()

    def watch(self, key: str, start_revision: int, callback: WatchCallback) -> int:
        watch_id = super().watch(key, start_revision, callback)
        self.watching.set()
        return watch_id


def test_get_wakes_on_the_watch_not_on_polling(etcd: LocalEtcd, run_id: str) -> None:
    spy = WatchSpy(parse_endpoints(etcd.endpoint), timeout=5)
    inner = EtcdV3Store(spy, f"{PREFIX}/{run_id}/store/", LeaseKeeper(spy, 30), recheck_seconds=30)
    store = dist.PrefixStore("round.0", inner)
    got: list[tuple[bytes, float]] = []
    reader = threading.Thread(target=lambda: got.append((store.get("MASTER_ADDR"), time.monotonic())))
    reader.start()
    wait_for(spy.watching.is_set, 10, "the reader to open its watch")
    written = time.monotonic()
    store.set("MASTER_ADDR", "10.0.0.1")
    reader.join(10)
    spy.close()
    assert got and got[0][0] == b"10.0.0.1"
    # The re-check interval is 30 s: only the watch can wake the reader this fast.
    assert got[0][1] - written < 2


def test_wait_times_out_with_dist_store_error(client: EtcdClient, run_id: str) -> None:
    store = make_store(client, run_id)
    started = time.monotonic()
    with pytest.raises(dist.DistStoreError, match="missing"):
        store.wait(["missing"], timedelta(seconds=1))
    assert 0.9 < time.monotonic() - started < 4


def test_store_operations_match_hashstore(client: EtcdClient, run_id: str) -> None:
    inner = make_store(client, run_id)  # keep the Python object alive: the C++ wrapper does not
    ours = dist.PrefixStore("p", inner)
    reference = dist.PrefixStore("p", dist.HashStore())
    for store in (ours, reference):
        store.set("a", "1")
        store.multi_set(["b", "c"], ["2", "3"])
    for store in (ours, reference):
        assert store.get("a") == b"1"
        assert store.multi_get(["b", "c"]) == [b"2", b"3"]
        assert store.check(["a", "b"]) and not store.check(["a", "nope"])
    cases = [("k", "", "v1"), ("k", "v1", "v2"), ("k", "wrong", "v3"), ("absent", "x", "y")]
    assert [ours.compare_set(*c) for c in cases] == [reference.compare_set(*c) for c in cases]
    assert [ours.add("n", 5), ours.add("n", -2)] == [reference.add("n", 5), reference.add("n", -2)]
    assert ours.num_keys() == reference.num_keys() == 5
    assert ours.delete_key("a") and not ours.delete_key("a")
    assert ours.num_keys() == 4


def test_append_on_the_store_itself(client: EtcdClient, run_id: str) -> None:
    store = make_store(client, run_id)
    store.append("log", "x")
    store.append("log", b"y")
    assert store.get("log") == b"xy"


def test_concurrent_adds_are_atomic(client: EtcdClient, run_id: str) -> None:
    store = make_store(client, run_id)
    threads = [
        threading.Thread(target=lambda: [store.add("counter", 1) for _ in range(10)]) for _ in range(6)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert store.get("counter") == b"60"
