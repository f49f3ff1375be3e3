"""The hang-detection probe against real HTTP servers on 127.0.0.1: the trainer's own metrics exporter
in a child process (answering, then SIGSTOPped like a hung trainer), and a refused port."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from llm_operator.control.endpoints import Endpoints
from llm_operator.control.scrape import PROBE_TIMEOUT, probe

CHILD = """
import sys, time
from llm_elastic.metrics import Exporter
exporter = Exporter(int(sys.argv[1]), {"job": "llama", "rank": "0"})
exporter.update(step=42, last_step_timestamp_seconds=1700000000.5)
print(exporter.port, flush=True)
time.sleep(600)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def trainer_endpoint() -> Iterator[tuple[subprocess.Popen[str], str]]:
    """A child process serving the trainer's metrics (llm_elastic.metrics.Exporter)."""
    port = _free_port()
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(port)], stdout=subprocess.PIPE, text=True, env=dict(os.environ)
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == str(port), "the exporter did not bind its port"
        yield child, f"http://127.0.0.1:{port}/metrics"
    finally:
        child.send_signal(signal.SIGCONT)
        child.kill()
        child.wait(timeout=30)


def test_probe_reads_the_trainer_exporter(trainer_endpoint: tuple[subprocess.Popen[str], str]) -> None:
    _, url = trainer_endpoint
    [sample] = asyncio.run(probe([url]))
    assert (sample.step, sample.timestamp, sample.total_steps, sample.step_time_count) == (
        42,
        1700000000.5,
        0,
        0,
    )


def test_stopped_trainer_times_out_as_no_answer(trainer_endpoint: tuple[subprocess.Popen[str], str]) -> None:
    child, url = trainer_endpoint
    child.send_signal(signal.SIGSTOP)
    refused = f"http://127.0.0.1:{_free_port()}/metrics"
    started = time.monotonic()
    assert asyncio.run(probe([url, refused], timeout=1.0)) == []
    elapsed = time.monotonic() - started
    # Bounded by the 1 s timeout (aiohttp alone would wait 5 minutes); generous for a loaded machine.
    assert elapsed < 10 * PROBE_TIMEOUT, f"probes are bounded by their timeout ({elapsed:.1f}s)"
    child.send_signal(signal.SIGCONT)
    assert [s.step for s in asyncio.run(probe([url]))] == [42], "answers again once continued"


def test_rounds_share_the_operators_one_session(trainer_endpoint: tuple[subprocess.Popen[str], str]) -> None:
    _, url = trainer_endpoint

    async def rounds() -> None:
        endpoints = Endpoints()
        shared = endpoints.session()
        for _ in range(3):
            assert [s.step for s in await probe([url], endpoints=endpoints)] == [42]
        assert endpoints.session() is shared and not shared.closed
        await endpoints.close()
        assert shared.closed, "closed with the operator"
        assert endpoints.session() is not shared, "a closed session is made again on use"
        await endpoints.close()

    asyncio.run(rounds())
