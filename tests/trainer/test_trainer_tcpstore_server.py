"""The standalone TCPStore server of the c10d rendezvous pod."""

from __future__ import annotations

import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist
from llm_testbed.local_etcd import free_port
from trainer_support import Processes, wait_for

pytestmark = pytest.mark.trainer

ARGV = [sys.executable, "-m", "llm_elastic.rendezvous.tcpstore_server"]


def test_serves_clients_and_exits_cleanly_on_sigterm(tmp_path: Path, procs: Processes) -> None:
    port = free_port()
    server = procs.start([*ARGV, "--host", "127.0.0.1", "--port", str(port)], "tcpstore")
    wait_for(lambda: "listening" in procs.log_of(server) or server.poll() is not None, 60, "the ready line")
    assert server.poll() is None, procs.log_of(server)
    client = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10))
    client.set("MASTER_ADDR", "node-3")
    other = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10))
    assert other.get("MASTER_ADDR") == b"node-3"
    assert other.add("joined", 2) == 2
    server.send_signal(signal.SIGTERM)
    assert server.wait(timeout=30) == 0
    assert "stopping" in procs.log_of(server)


def test_bad_port_is_one_line_exit_2() -> None:
    result = subprocess.run([*ARGV, "--port", "70000"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--port" in lines[0]
