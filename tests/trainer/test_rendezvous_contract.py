"""PyTorch's own contract for rendezvous backends and c10d stores, checked on the etcd-v3 ones.

torch keeps two reusable suites: ``RendezvousBackendTestMixin`` (test/distributed/elastic/rendezvous/
rendezvous_backend_test.py), which every ``RendezvousBackend`` of torch passes, and ``StoreTestBase`` plus
the C++ trampoline check ``dist._test_python_store`` (test/distributed/test_store.py), which every c10d
store passes. The same cases, restated here, run against ``EtcdV3RendezvousBackend`` and ``EtcdV3Store``
with a real etcd, each store case both on the store itself and through ``dist.PrefixStore`` (the way
torch's rendezvous handler and process groups reach it: through the C++ trampoline).
"""

from __future__ import annotations

import base64
import pickle
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
import torch.distributed as dist
from llm_elastic.rendezvous.etcd_backend import EtcdV3RendezvousBackend
from llm_elastic.rendezvous.etcd_client import EtcdClient, parse_endpoints
from llm_elastic.rendezvous.etcd_lease import LeaseKeeper
from llm_elastic.rendezvous.etcd_store import EtcdV3Store
from llm_testbed.local_etcd import LocalEtcd
from torch.distributed.elastic.rendezvous import RendezvousStateError

pytestmark = pytest.mark.trainer

PREFIX = "/contract"
TIMEOUT_MESSAGE = "[t -i]imeout"  # the pattern torch's store suite matches a wait timeout against


@pytest.fixture
def client(etcd: LocalEtcd) -> Iterator[EtcdClient]:
    c = EtcdClient(parse_endpoints(etcd.endpoint), timeout=5)
    yield c
    c.close()


@pytest.fixture
def run_id() -> str:
    return uuid.uuid4().hex[:12]


@pytest.fixture
def lease(client: EtcdClient) -> Iterator[LeaseKeeper]:
    keeper = LeaseKeeper(client, 30)
    yield keeper
    keeper.close(revoke=True)


# -- RendezvousBackend ---------------------------------------------------------------------------------------


@pytest.fixture
def backend(client: EtcdClient, run_id: str, lease: LeaseKeeper) -> EtcdV3RendezvousBackend:
    return EtcdV3RendezvousBackend(client, run_id, PREFIX, lease)


def put(backend: EtcdV3RendezvousBackend, state: bytes, token: object = None) -> tuple[bytes, object, bool]:
    """``set_state`` that must answer (torch's suite asserts a result for every write it makes)."""
    result = backend.set_state(state, token)
    assert result is not None
    return result


def test_backend_get_returns_what_was_set_with_a_token(backend: EtcdV3RendezvousBackend) -> None:
    backend.set_state(b"x")
    result = backend.get_state()
    assert result is not None
    state, token = result
    assert state == b"x" and token is not None


def test_backend_get_without_state_is_none(backend: EtcdV3RendezvousBackend) -> None:
    assert backend.get_state() is None


@pytest.mark.parametrize("garbage", [b"non_base64", b"!!not base64 at all!!", b"abc"])
def test_backend_corrupt_state_raises_state_error(
    backend: EtcdV3RendezvousBackend, client: EtcdClient, garbage: bytes
) -> None:
    client.put(backend.key, garbage)
    with pytest.raises(RendezvousStateError, match="corrupt"):
        backend.get_state()


def test_backend_corrupt_state_is_reported_by_set_too(
    backend: EtcdV3RendezvousBackend, client: EtcdClient
) -> None:
    """A losing writer is handed the current state: a corrupt one must not pass as valid there either."""
    client.put(backend.key, b"non_base64")
    with pytest.raises(RendezvousStateError, match="corrupt"):
        backend.set_state(b"y")


def test_backend_set_creates_a_missing_state(backend: EtcdV3RendezvousBackend) -> None:
    state, token, has_set = put(backend, b"x")
    assert (state, has_set) == (b"x", True) and token is not None


def test_backend_set_with_the_current_token_replaces_it(backend: EtcdV3RendezvousBackend) -> None:
    _, token1, has_set1 = put(backend, b"x")
    state2, token2, has_set2 = put(backend, b"y", token1)
    assert state2 == b"y" and token1 != token2 and has_set1 and has_set2


def test_backend_set_with_an_old_token_returns_the_current_state(backend: EtcdV3RendezvousBackend) -> None:
    _, token1, _ = put(backend, b"x")
    state2, token2, _ = put(backend, b"y", token1)
    state3, token3, has_set = put(backend, b"z", token1)
    assert (state3, token3, has_set) == (state2, token2, False)


def test_backend_set_without_token_returns_the_existing_state(backend: EtcdV3RendezvousBackend) -> None:
    state1, token1, _ = put(backend, b"x")
    assert put(backend, b"y") == (state1, token1, False)


def test_backend_set_with_a_foreign_token_returns_the_existing_state(
    backend: EtcdV3RendezvousBackend,
) -> None:
    state1, token1, _ = put(backend, b"x")
    assert put(backend, b"y", token="invalid") == (state1, token1, False)


# Beyond torch's suite: the stored format.


def test_backend_stores_base64_like_torchs_own_backends(
    backend: EtcdV3RendezvousBackend, client: EtcdClient
) -> None:
    state = pickle.dumps({"round": 3, "participants": ["node-0"]})
    put(backend, state)
    raw = client.get(backend.key)
    assert raw is not None and raw.value == base64.b64encode(state)
    assert backend.get_state() == (state, raw.mod_revision)


def test_backend_reads_a_raw_pickle_written_by_earlier_versions(
    backend: EtcdV3RendezvousBackend, client: EtcdClient
) -> None:
    """State written before the base64 format (a bare pickle) is still read, and replaced on next write."""
    legacy = pickle.dumps({"round": 1})
    client.put(backend.key, legacy)
    result = backend.get_state()
    assert result is not None and result[0] == legacy
    state, _, has_set = put(backend, pickle.dumps({"round": 2}), result[1])
    assert has_set and pickle.loads(state) == {"round": 2}
    stored = client.get(backend.key)
    assert stored is not None and stored.value == base64.b64encode(state)


# -- c10d Store ----------------------------------------------------------------------------------------------

StoreFactory = Callable[[], dist.Store]


@pytest.fixture(params=["direct", "prefixed"])
def make_store(
    request: pytest.FixtureRequest, client: EtcdClient, run_id: str, lease: LeaseKeeper
) -> Iterator[StoreFactory]:
    """New stores on one fresh etcd prefix; "prefixed" wraps each in ``dist.PrefixStore`` (C++ side)."""
    keep: list[EtcdV3Store] = []  # the C++ wrapper does not keep a Python store alive

    def create() -> dist.Store:
        inner = EtcdV3Store(client, f"{PREFIX}/{run_id}/store/", lease, timedelta(seconds=300))
        keep.append(inner)
        return dist.PrefixStore("p", inner) if request.param == "prefixed" else inner

    yield create
    keep.clear()


def test_store_set_get_add_check_delete(make_store: StoreFactory) -> None:
    store = make_store()
    for amount in (1, 2, 3):
        store.add("key", amount)
    store.set("key0", "value0")
    store.add("key3", 1)
    store.set("key1", "value1")
    store.add("key3", 2)
    store.set("key2", "value2")
    for amount in (3, 4, 5, 6):
        store.add("key3", amount)
    assert store.num_keys() == 5
    assert [store.get(k) for k in ("key", "key0", "key1", "key2", "key3")] == [
        b"6",
        b"value0",
        b"value1",
        b"value2",
        b"21",
    ]
    assert store.check(["key3"]) and not store.check(["Randomkey3"])
    store.set("-key3", "7")
    assert store.get("-key3") == b"7"
    store.delete_key("-key3")
    assert store.num_keys() == 5


def test_store_compare_set(make_store: StoreFactory) -> None:
    store = make_store()
    # A missing key with a non-empty expectation is left alone; the expectation comes back.
    assert store.compare_set("cs_key0", "wrong_old_value", "new_value0") == b"wrong_old_value"
    assert not store.check(["cs_key0"])
    store.set("cs_key0", "value0")
    assert store.compare_set("cs_key0", "wrong_old_value", "new_value0") == b"value0"
    assert store.get("cs_key0") == b"value0"
    assert store.compare_set("cs_key0", "value0", "new_value0") == b"new_value0"
    assert store.get("cs_key0") == b"new_value0"
    assert store.compare_set("cs_key1", "", "new_value1") == b"new_value1"
    assert store.get("cs_key1") == b"new_value1"


def test_store_wait_times_out_with_torchs_wording(make_store: StoreFactory) -> None:
    store = make_store()
    with pytest.raises(RuntimeError, match=TIMEOUT_MESSAGE):
        store.wait(["bad_key"], timedelta(seconds=0.25))
    store.add("good_key", 1)
    store.wait(["good_key"])


def test_store_get_times_out_with_torchs_wording(make_store: StoreFactory) -> None:
    store = make_store()
    store.set_timeout(timedelta(seconds=0.25))
    with pytest.raises(dist.DistStoreError, match=TIMEOUT_MESSAGE):
        store.get("never_set")


def test_store_append(make_store: StoreFactory) -> None:
    store = make_store()
    store.set("foo", "po")
    store.append("foo", "tato")
    store.append("bar", "po")
    store.append("bar", "tato")
    assert (store.get("foo"), store.get("bar")) == (b"potato", b"potato")


def test_store_multi_set(make_store: StoreFactory) -> None:
    store = make_store()
    store.multi_set(["foo", "bar"], ["po", "tato"])
    assert (store.get("foo"), store.get("bar")) == (b"po", b"tato")


def test_store_multi_get(make_store: StoreFactory) -> None:
    store = make_store()
    store.set("foo", "po")
    store.set("bar", "tato")
    assert store.multi_get(["foo", "bar"]) == [b"po", b"tato"]


def test_store_claims_the_extended_api(make_store: StoreFactory) -> None:
    """append/multi_get/multi_set are native (atomic), and PrefixStore forwards them to them."""
    assert make_store().has_extended_api()


def test_store_has_no_queues_and_says_so(make_store: StoreFactory) -> None:
    """torch's queue cases skip a store whose queue_push raises NotImplementedError; that is this one."""
    with pytest.raises(NotImplementedError):
        make_store().queue_push("test_queue_support", "1")


def test_store_clone_sees_the_same_keys(make_store: StoreFactory) -> None:
    original = make_store()
    copy = original.clone()
    assert isinstance(copy, dist.Store)
    original.set("foo", "bar")
    assert copy.get("foo") == b"bar"
    copy.set("back", "x")
    assert original.get("back") == b"x"


def test_store_clone_is_independent(make_store: StoreFactory) -> None:
    """A clone is used from another thread with its own settings: its timeout is its own."""
    original = make_store()
    copy = original.clone()
    copy.set_timeout(timedelta(seconds=0.25))
    with pytest.raises(dist.DistStoreError, match=TIMEOUT_MESSAGE):
        copy.get("absent")
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(original.get("late")))
    reader.start()  # the original still waits with its 300 s default
    copy.set("late", "here")
    reader.join(30)
    assert got == [b"here"]


def test_store_clones_talk_both_ways_from_threads(make_store: StoreFactory) -> None:
    store = make_store()

    def side_a() -> bytes:
        mine = store.clone()
        mine.set("a", "a1")
        return bytes(mine.get("b"))

    def side_b() -> bytes:
        mine = store.clone()
        value = bytes(mine.get("a"))
        mine.set("b", "b1")
        return value

    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = [pool.submit(side_a), pool.submit(side_b)]
        assert [f.result(timeout=30) for f in futures] == [b"b1", b"a1"]


def test_store_passes_torchs_cpp_trampoline_check(
    client: EtcdClient, run_id: str, lease: LeaseKeeper
) -> None:
    """``dist._test_python_store`` drives the store from C++ (set/get/add/compare_set/clone ...)."""
    store = EtcdV3Store(client, f"{PREFIX}/{run_id}/store/", lease, timedelta(seconds=30))
    dist._test_python_store(store)
