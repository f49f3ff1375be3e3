"""Live membership on a real etcd: one winner per generation, eviction, superseding a dead generation."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
from llm_elastic.live import layout
from llm_elastic.live.layout import Generation
from llm_elastic.live.membership import (
    Evicted,
    Membership,
    evict,
    evict_host,
    live_members,
    read_generation,
)
from llm_elastic.rendezvous.etcd_client import EtcdClient, parse_endpoints
from llm_operator.live_evict import evict_pods
from llm_testbed.local_etcd import LocalEtcd
from trainer_support import wait_for


@pytest.fixture
def client(etcd: LocalEtcd) -> Iterator[EtcdClient]:
    c = EtcdClient(parse_endpoints(etcd.endpoint), timeout=5)
    try:
        yield c
    finally:
        c.close()


def form_all(members: list[Membership], left: int, min_members: int) -> list[Generation | BaseException]:
    """Run next_generation on every member at once (threads), as separate processes would."""
    results: list[Generation | BaseException] = [RuntimeError("not run")] * len(members)

    def one(index: int) -> None:
        try:
            results[index] = members[index].next_generation(left, min_members, timeout=20)
        except BaseException as exc:  # reported by the assertion below
            results[index] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(members))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return results


def test_members_agree_then_survivors_agree_after_an_eviction(
    client: EtcdClient, request: pytest.FixtureRequest
) -> None:
    prefix = f"/live-test/{request.node.name}/"
    members = [Membership(client, prefix, name, ttl=5) for name in ("c", "a", "b")]
    try:
        for member in members:
            member.register()
        first = form_all(members, 0, 3)
        assert first == [Generation(1, ("a", "b", "c"))] * 3
        assert live_members(client, prefix) == ["a", "b", "c"]

        assert evict(client, prefix, "b") is True
        assert evict(client, prefix, "b") is False
        survivors = [m for m in members if m.member != "b"]
        wait_for(lambda: all(m.changed.is_set() for m in survivors), 10, "the watch to report the eviction")
        assert all(m.differs(Generation(1, ("a", "b", "c"))) for m in survivors)
        second = form_all(survivors, 1, 3)
        assert second == [Generation(2, ("a", "c"))] * 2
        stored, _ = read_generation(client, prefix)
        assert stored == Generation(2, ("a", "c"))
        with pytest.raises(Evicted):
            members[2].next_generation(1, 1, timeout=5)  # "b" was evicted: it must leave, not rejoin
    finally:
        for member in members:
            member.leave()


def test_a_generation_whose_member_never_arrives_is_superseded(
    client: EtcdClient, request: pytest.FixtureRequest
) -> None:
    prefix = f"/live-test/{request.node.name}/"
    a, b = Membership(client, prefix, "a", ttl=5), Membership(client, prefix, "b", ttl=5)
    try:
        a.register()
        b.register()
        # Generation 1 names a member "ghost" that is registered but never arrives, then is evicted.
        client.put(layout.member_key(prefix, "ghost"), b"{}")
        client.put(layout.generation_key(prefix), Generation(1, ("a", "b", "ghost")).encode())
        timer = threading.Timer(0.5, lambda: evict(client, prefix, "ghost"))
        timer.start()
        results = form_all([a, b], 0, 1)
        timer.join()
        assert results == [Generation(2, ("a", "b"))] * 2
    finally:
        a.leave()
        b.leave()


def test_evicting_a_host_removes_all_its_members_and_no_other(
    client: EtcdClient, request: pytest.FixtureRequest
) -> None:
    prefix = f"/live-test/{request.node.name}/"
    names = ["pod-1.0", "pod-1.1", "pod-10.0", "pod-2.0"]
    members = [Membership(client, prefix, name, ttl=5) for name in names]
    try:
        for member in members:
            member.register()
        assert evict_host(client, prefix, "pod-1") == 2
        assert live_members(client, prefix) == ["pod-10.0", "pod-2.0"]
        with pytest.raises(ValueError, match="host"):
            evict_host(client, prefix, "a/b")
    finally:
        for member in members:
            member.leave()


def test_the_operators_eviction_removes_one_pods_members_through_the_json_gateway(
    etcd: LocalEtcd, client: EtcdClient
) -> None:
    """What the operator runs when it gives up on a worker (llm_operator.live_evict), on a real etcd."""
    prefix = "/op-evict/"
    members = [Membership(client, prefix, m, ttl=30) for m in ("w-1.100", "w-1.101", "w-10.100", "w-2.100")]
    for member in members:
        member.register()
    try:
        deleted = asyncio.run(evict_pods(etcd.endpoint, prefix, ["w-1"]))
        assert deleted == 2
        assert live_members(client, prefix) == ["w-10.100", "w-2.100"]
        assert asyncio.run(evict_pods(etcd.endpoint, prefix, ["w-1"])) == 0, "evicting again is a no-op"
    finally:
        for member in members:
            member.leave()
    with pytest.raises(RuntimeError, match=r"etcd at 127\.0\.0\.1:1: "):
        asyncio.run(evict_pods("127.0.0.1:1", prefix, ["w-2"], timeout=2))
