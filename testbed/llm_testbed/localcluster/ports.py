"""Ports for a new cluster's components, chosen so that clusters started side by side never collide.

kwokctl on its own counts down from 32767 in every process, so two clusters created at the same moment
(parallel test sessions on one machine) pick the same ports. We pick random free ports below the
kernel's ephemeral range instead, skip every port another cluster's config already claims (even when
it is stopped), and start clusters one at a time under a lock (see :mod:`cluster`).
"""

from __future__ import annotations

import random
import socket
from collections.abc import Iterable
from pathlib import Path

import yaml

# kwokctl option -> component: every port a binary-runtime cluster listens on.
PORT_OPTIONS = (
    "kubeApiserverPort",
    "etcdPort",
    "etcdPeerPort",
    "kwokControllerPort",
    "kubeControllerManagerPort",
    "kubeSchedulerPort",
)
LOW, HIGH = 20000, 32000  # below Linux's default ephemeral range (32768-60999)


def is_free(port: int) -> bool:
    """Nothing listens on ``port`` on loopback or on all interfaces."""
    for host in ("127.0.0.1", ""):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host, port))
            except OSError:
                return False
    return True


def claimed_ports(cluster_dirs: Iterable[Path]) -> set[int]:
    """Ports written in the saved kwokctl config (``kwok.yaml``) of existing clusters."""
    claimed: set[int] = set()
    for folder in cluster_dirs:
        try:
            docs = list(yaml.safe_load_all((folder / "kwok.yaml").read_text()))
        except (OSError, yaml.YAMLError):
            continue
        for doc in docs:
            if isinstance(doc, dict) and doc.get("kind") == "KwokctlConfiguration":
                options = doc.get("options") or {}
                claimed.update(int(options[k]) for k in PORT_OPTIONS if options.get(k))
    return claimed


def pick(options: Iterable[str], *, taken: set[int], fixed: dict[str, int] | None = None) -> dict[str, int]:
    """A free, unclaimed port for each kwokctl port option (``fixed`` ones are kept as given)."""
    chosen = dict(fixed or {})
    avoid = set(taken) | set(chosen.values())
    candidates = [p for p in range(LOW, HIGH) if p not in avoid]
    random.SystemRandom().shuffle(candidates)
    free = (p for p in candidates if is_free(p))
    for option in options:
        if option in chosen:
            continue
        port = next(free, None)
        if port is None:
            raise OSError(f"no free port left in {LOW}-{HIGH} for {option}")
        chosen[option] = port
    return chosen
