"""ports.py: clusters started side by side get distinct, free, unclaimed ports."""

from __future__ import annotations

import socket
from pathlib import Path

import yaml
from llm_testbed.localcluster import ports


def test_pick_gives_distinct_free_ports_and_keeps_fixed_ones() -> None:
    chosen = ports.pick(ports.PORT_OPTIONS, taken=set(), fixed={"kubeApiserverPort": 6443})
    assert set(chosen) == set(ports.PORT_OPTIONS)
    assert chosen["kubeApiserverPort"] == 6443
    others = [p for k, p in chosen.items() if k != "kubeApiserverPort"]
    assert len(set(others)) == len(others)
    assert all(ports.LOW <= p < ports.HIGH and ports.is_free(p) for p in others)


def test_pick_avoids_claimed_ports() -> None:
    taken = set(range(ports.LOW, ports.HIGH - 10))
    chosen = ports.pick(["etcdPort", "etcdPeerPort"], taken=taken)
    assert all(p >= ports.HIGH - 10 for p in chosen.values())


def test_a_listening_port_is_not_free() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        assert not ports.is_free(held.getsockname()[1])


def test_claimed_ports_read_saved_cluster_configs(tmp_path: Path) -> None:
    config = {"kind": "KwokctlConfiguration", "options": {"etcdPort": 21001, "kubeApiserverPort": 21002}}
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "kwok.yaml").write_text(yaml.safe_dump_all([config, {"kind": "Stage"}]))
    (tmp_path / "b").mkdir()  # a folder without config is ignored
    assert ports.claimed_ports([tmp_path / "a", tmp_path / "b"]) == {21001, 21002}
