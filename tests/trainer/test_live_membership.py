"""Live membership on a real etcd: one winner per generation, eviction, superseding a dead generation."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

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
from llm_elastic.rendezvous.etcd_client import EtcdClient, KeyValue, WatchCallback, parse_endpoints
from llm_operator.control.live_evict import evict_pods
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
        gone = Generation(1, ("a", "b", "c"))
        wait_for(
            lambda: all(m.changed_since(gone) for m in survivors), 10, "the survivors to see the eviction"
        )
        second = form_all(survivors, 1, 3)
        assert second == [Generation(2, ("a", "c"))] * 2
        stored, _ = read_generation(client, prefix)
        assert stored == Generation(2, ("a", "c"))
        with pytest.raises(Evicted):
            members[2].next_generation(1, 1, timeout=5)  # "b" was evicted: it must leave, not rejoin
    finally:
        for member in members:
            member.leave()


SURVIVOR_ROUND_TRIPS = 4
"""etcd requests of a lone survivor from a peer's eviction to its next generation formed: the commit's read
of the job (1), the read it decides from (1), the proposal with its own arrival in one compare-and-set (1),
the read that finds every member arrived (1). docs/runtime-design.md, "etcd round trips per recovery"."""


class HandledKeys(EtcdClient):
    """An etcd client that counts the reports of each key by its watches, after the watch's own callback."""

    def __init__(self, endpoint: str) -> None:
        super().__init__(parse_endpoints(endpoint), timeout=5)
        self.handled: Counter[bytes] = Counter()

    def watch(self, key: str, start_revision: int, callback: WatchCallback) -> int:
        def then_record(keys: list[bytes] | None) -> None:
            callback(keys)
            self.handled.update(keys or [])

        return super().watch(key, start_revision, then_record)


def test_a_survivor_reforms_after_an_eviction_in_the_stated_number_of_etcd_round_trips(
    etcd: LocalEtcd, request: pytest.FixtureRequest
) -> None:
    prefix = f"/live-test/{request.node.name}/"
    clients = [HandledKeys(etcd.endpoint) for _ in range(2)]
    members = [Membership(c, prefix, name, ttl=30) for c, name in zip(clients, ("a", "b"), strict=True)]
    try:
        for member in members:
            member.register()
        first = form_all(members, 0, 2)
        assert first == [Generation(1, ("a", "b"))] * 2
        survivor = members[0]
        assert not survivor.changed_since(first[0])  # the generation's first commit reads
        assert evict(clients[1], prefix, "b")
        # The count starts once the survivor's watch handled the deletion: a deletion is a change, and a
        # change read as a broken stream would cost a re-watch (3 round trips more; CI at stop 65).
        key = layout.member_key(prefix, "b").encode()  # reported twice: its registration, its deletion
        wait_for(lambda: clients[0].handled[key] == 2, 10, "the survivor's watch to report the eviction")
        before = sum(clients[0].requests.values()) - clients[0].requests["refresh"]
        assert survivor.changed_since(first[0])
        assert survivor.next_generation(1, 1, timeout=10) == Generation(2, ("a",))
        spent = sum(clients[0].requests.values()) - clients[0].requests["refresh"] - before
        assert spent == SURVIVOR_ROUND_TRIPS, dict(clients[0].requests)
    finally:
        for member in members:
            member.leave()
        for c in clients:
            c.close()


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
    """What the operator runs when it gives up on a worker (llm_operator.control.live_evict), on a real
    etcd."""
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


class ListingHook(EtcdClient):
    """A real client whose next read of the job runs :attr:`after_listing` right after the read returned:
    what another thread of the member does between a commit's read and what the commit makes of it."""

    after_listing: Callable[[], object] | None = None

    def read_prefix(self, prefix: str) -> tuple[dict[str, KeyValue], int]:
        found = super().read_prefix(prefix)
        hook, self.after_listing = self.after_listing, None
        if hook is not None:
            hook()
        return found


def test_a_read_that_missed_the_members_own_re_registration_is_not_an_eviction(
    etcd: LocalEtcd, request: pytest.FixtureRequest
) -> None:
    """The CI failure of the store-outage test: a fresh etcd lost every key; a commit read the members
    (itself missing), the lease keeper's thread then granted a new lease and registered the member again,
    and the commit's renewal found that new lease alive and took the member for evicted (exit 3). A member
    is evicted only when its key is still gone; a real eviction still ends it."""
    client = ListingHook(parse_endpoints(etcd.endpoint), timeout=5)
    prefix = f"/live-test/{request.node.name}/"
    member = Membership(client, prefix, "a", ttl=30)  # the keeper's own renewal waits 10 s: not in the way
    gen = Generation(1, ("a",))
    try:
        member.register()
        client.revoke_lease(member.lease.lease_id)  # the store lost the lease and the key with it
        client.after_listing = member.lease.renew  # the keeper registers again right after the read
        assert not member.differs(gen)
        assert client.after_listing is None, "the read ran before the re-registration"
        assert live_members(client, prefix) == ["a"]

        assert evict(client, prefix, "a")
        with pytest.raises(Evicted):
            member.differs(gen)
    finally:
        member.leave()
        client.close()


def test_a_member_that_registers_while_a_generation_forms_is_taken_in_at_the_first_commit(
    client: EtcdClient, request: pytest.FixtureRequest
) -> None:
    """Issue 38: "c" registers exactly while "a" waits in its arrival for "b" (the seam pauses "a" there).
    The generation forms as (a, b) without "c"; both members must see at their first commit that the
    membership differs, and again after a quiet commit if "c" comes later (a wake-up is never lost)."""
    prefix = f"/live-test/{request.node.name}/"
    a, b, c = (Membership(client, prefix, name, ttl=5) for name in ("a", "b", "c"))
    registered = threading.Event()

    def c_registers(generation: Generation) -> None:
        if generation.number == 1 and not registered.is_set():
            c.register()  # the watch of every member fires now, while "a" is arriving
            registered.set()

    a.arriving = c_registers
    try:
        a.register()
        b.register()
        formed = form_all([a, b], 0, 2)
        assert registered.is_set()
        assert formed == [Generation(1, ("a", "b"))] * 2
        assert live_members(client, prefix) == ["a", "b", "c"]
        gen = Generation(1, ("a", "b"))
        assert a.changed_since(gen) and b.changed_since(gen), "the joiner was swallowed by a wait"
    finally:
        for member in (a, b, c):
            member.leave()


def test_a_commit_that_found_nothing_still_sees_the_next_registration(
    client: EtcdClient, request: pytest.FixtureRequest
) -> None:
    """After a commit that read the members and found the generation right, a registration that comes
    later is seen at the next commit, also when another reader (the watchdog, the judge) waited meanwhile."""
    prefix = f"/live-test/{request.node.name}/"
    a, b, c = (Membership(client, prefix, name, ttl=5) for name in ("a", "b", "c"))
    try:
        a.register()
        b.register()
        assert form_all([a, b], 0, 2) == [Generation(1, ("a", "b"))] * 2
        gen = Generation(1, ("a", "b"))
        assert not a.changed_since(gen)  # the first commit reads: nothing to change
        assert not a.changed_since(gen)  # no event since: no read
        other_reader = a.changes.mark()
        c.register()
        assert a.changes.wait(other_reader, 10)  # another reader waits on the same events, consuming nothing
        wait_for(lambda: a.changed_since(gen), 10, "the registration to reach the commit check")
    finally:
        for member in (a, b, c):
            member.leave()


STEP_SECONDS = 0.02
"""A simulated member's step: how often it reaches a commit (where it checks the membership)."""


class SimulatedMember(threading.Thread):
    """One member's loop as the runtime runs it, without torch: register, form, check the membership at
    every commit, re-form when it changed. Records the world size of every generation it formed."""

    def __init__(self, membership: Membership, min_members: int, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.membership = membership
        self.min_members = min_members
        self.stop = stop
        self.generation: Generation | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.membership.register()
            left = 0
            while not self.stop.is_set():
                gen = self.membership.next_generation(left, self.min_members, timeout=30)
                self.generation = gen
                while not self.stop.wait(STEP_SECONDS):  # one "step", then the commit's check
                    if self.membership.changed_since(gen):
                        break
                left = gen.number
        except BaseException as exc:  # reported by the test
            self.error = exc


def run_staggered_round(
    client: EtcdClient, prefix: str, delay: float, members: int, target: int, bound: float
) -> list[SimulatedMember]:
    """Start ``members`` members spread evenly over ``delay`` seconds; return once every member trains in or
    stands by beside a generation of ``min(members, target or members)`` (fails after ``bound``)."""
    stop = threading.Event()
    names = [f"w{i}" for i in range(members)]
    sims = [
        SimulatedMember(Membership(client, prefix, name, ttl=5, target=target), 2, stop) for name in names
    ]
    timers = [threading.Timer(delay * i / max(1, members - 1), sim.start) for i, sim in enumerate(sims)]
    size = min(members, target) if target else members
    try:
        for timer in timers:
            timer.start()

        def settled() -> bool:
            errors = [sim.error for sim in sims if sim.error is not None]
            assert not errors, errors
            trained = [sim.generation for sim in sims if sim.generation is not None]
            newest = max((g.number for g in trained), default=0)
            current = [g for g in trained if g.number == newest]
            return bool(current) and current[0].world_size == size and len(current) == size

        wait_for(settled, delay + bound, f"a generation of {size} (delay {delay * 1000:.0f} ms)")
    finally:
        for timer in timers:
            timer.cancel()
        stop.set()
        for sim in sims:
            if sim.is_alive():
                sim.join(10)
            sim.membership.leave()
    return sims


ROUNDS_AT_ONCE = 5
"""Staggered rounds that run side by side (each on its own prefix): their start-up delays are sleeps, so the
sweep takes about a fifth of their sum; the other rounds' members add load and jitter to each one."""


def run_staggered_rounds(
    client: EtcdClient, prefix: str, delays: list[float], members: int, target: int
) -> list[list[SimulatedMember]]:
    """:func:`run_staggered_round` for every delay, :data:`ROUNDS_AT_ONCE` at a time; the first failure
    is raised."""
    with ThreadPoolExecutor(ROUNDS_AT_ONCE, thread_name_prefix="round") as pool:
        futures = [
            pool.submit(run_staggered_round, client, f"{prefix}{i}/", delay, members, target, 10)
            for i, delay in enumerate(delays)
        ]
        return [future.result() for future in futures]


def test_three_members_started_with_staggered_delays_always_form_a_generation_of_three(
    client: EtcdClient, request: pytest.FixtureRequest
) -> None:
    """Issue 38: in a loop of start-up delays (0, 50, ... 2000 ms between the first and the last member),
    the generation always reaches world size 3, however the registrations fall into the forming."""
    delays = [step * 0.05 for step in range(41)]
    run_staggered_rounds(client, f"/live-test/{request.node.name}/", delays, 3, 0)  # each round asserts


def test_staggered_members_with_a_spare_train_at_the_target_size(
    client: EtcdClient, request: pytest.FixtureRequest
) -> None:
    """The same with a spare (target 3, four members): three train, whatever the order of arrival."""
    delays = [step * 0.1 for step in range(21)]
    for sims in run_staggered_rounds(client, f"/live-test/{request.node.name}/", delays, 4, 3):
        assert sum(1 for sim in sims if sim.membership.standby) <= 1


def test_a_member_left_outside_a_generation_that_is_not_full_knows_since_when(
    client: EtcdClient, request: pytest.FixtureRequest
) -> None:
    """The guard: a generation that never reaches a step boundary keeps a joiner out; the joiner records
    since when it waits (the runtime logs it past ``outside_warn_seconds`` and serves it as a gauge)."""
    prefix = f"/live-test/{request.node.name}/"
    a, b, c = (Membership(client, prefix, name, ttl=5) for name in ("a", "b", "c"))
    try:
        a.register()
        b.register()
        assert form_all([a, b], 0, 2) == [Generation(1, ("a", "b"))] * 2
        c.register()
        before = time.monotonic()
        with pytest.raises(TimeoutError):
            c.next_generation(0, 2, timeout=1)
        assert c.outside_since is not None and before <= c.outside_since < before + 1
        assert not c.standby
    finally:
        for member in (a, b, c):
            member.leave()
