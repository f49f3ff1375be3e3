"""Compare etcd v3 client libraries on what the rendezvous needs: import cost, put/get/CAS latency, how fast
a watch sees a put, and how fast a call fails when nothing listens. Clients that are not installed are
skipped: ``pip install python3-etcd3 etcd3gw aetcd`` in a scratch venv to compare all three.

    python bench/trainer_etcd_clients.py --rounds 100
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from llm_testbed.local_etcd import LocalEtcd, etcd_binary, free_port


def ms(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1000, 2)


def timed(fn: Callable[[], Any], rounds: int) -> list[float]:
    out = []
    for _ in range(rounds):
        started = time.perf_counter()
        fn()
        out.append(time.perf_counter() - started)
    return out


def import_seconds(module: str) -> float:
    code = f"import time; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return round(float(result.stdout), 3)


def bench_python3_etcd3(host: str, port: int, rounds: int) -> dict[str, Any]:
    etcd3: Any = importlib.import_module("etcd3")
    c = etcd3.client(host, port, timeout=5)
    c.put("/b/k", "0")
    put = timed(lambda: c.put("/b/k", "x"), rounds)
    get = timed(lambda: c.get("/b/k"), rounds)

    def cas() -> None:
        _, meta = c.get("/b/k")
        t = c.transactions
        ok, _ = c.transaction(
            compare=[t.mod("/b/k") == meta.mod_revision],
            success=[t.put("/b/k", "y")],
            failure=[t.get("/b/k")],
        )
        assert ok

    txn = timed(cas, rounds)
    seen = threading.Event()
    watch_id = c.add_watch_callback("/b/w", lambda _r: seen.set())
    watch = []
    for i in range(min(rounds, 30)):
        seen.clear()
        started = time.perf_counter()
        c.put("/b/w", str(i))
        seen.wait(5)
        watch.append(time.perf_counter() - started)
    c.cancel_watch(watch_id)
    started = time.perf_counter()
    try:
        etcd3.client(host, free_port(), timeout=3).get("/x")
    except Exception as exc:
        failure = (type(exc).__name__, round(time.perf_counter() - started, 3))
    return {
        "put_ms": ms(put),
        "get_ms": ms(get),
        "cas_get+txn_ms": ms(txn),
        "watch_ms": ms(watch),
        "fail": failure,
    }


def bench_etcd3gw(host: str, port: int, rounds: int) -> dict[str, Any]:
    client_mod: Any = importlib.import_module("etcd3gw.client")
    c = client_mod.Etcd3Client(host=host, port=port, timeout=5)
    c.put("/b/k", "0")
    put = timed(lambda: c.put("/b/k", "x"), rounds)
    get = timed(lambda: c.get("/b/k", metadata=True), rounds)
    watch = []
    for i in range(min(rounds, 30)):
        events, cancel = c.watch("/b/w")
        seen = threading.Event()
        reader = threading.Thread(target=lambda ev=events, s=seen: (next(iter(ev)), s.set()))
        reader.start()
        time.sleep(0.05)  # the HTTP watch has no "created" acknowledgement to wait on
        started = time.perf_counter()
        c.put("/b/w", str(i))
        seen.wait(5)
        watch.append(time.perf_counter() - started)
        cancel()
        reader.join(5)
    started = time.perf_counter()
    try:
        client_mod.Etcd3Client(host=host, port=free_port(), timeout=3).get("/x")
    except Exception as exc:
        failure = (type(exc).__name__, round(time.perf_counter() - started, 3))
    return {"put_ms": ms(put), "get_ms": ms(get), "watch_ms": ms(watch), "fail": failure}


def bench_aetcd(host: str, port: int, rounds: int) -> dict[str, Any]:
    aetcd: Any = importlib.import_module("aetcd")

    async def run() -> dict[str, Any]:
        async with aetcd.Client(host=host, port=port) as c:
            await c.put(b"/b/k", b"0")
            put, get = [], []
            for _ in range(rounds):
                started = time.perf_counter()
                await c.put(b"/b/k", b"x")
                put.append(time.perf_counter() - started)
            for _ in range(rounds):
                started = time.perf_counter()
                await c.get(b"/b/k")
                get.append(time.perf_counter() - started)
            return {
                "put_ms": ms(put),
                "get_ms": ms(get),
                "note": "asyncio only: sync callers need a loop thread",
            }

    return asyncio.run(run())


BENCHES = {"etcd3": bench_python3_etcd3, "etcd3gw": bench_etcd3gw, "aetcd": bench_aetcd}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--client", choices=list(BENCHES), help="(internal) measure one client")
    parser.add_argument("--endpoint", help="(internal) host:port of the etcd to use")
    args = parser.parse_args()
    if args.client:  # one client per process: aetcd and python3-etcd3 register the same .proto files
        host, port = args.endpoint.rsplit(":", 1)
        found = {
            "import_s": import_seconds(args.client),
            **BENCHES[args.client](host, int(port), args.rounds),
        }
        print(json.dumps(found))
        return 0
    results: dict[str, Any] = {}
    with LocalEtcd(etcd_binary(), Path(tempfile.mkdtemp(prefix="etcd-clients-"))) as etcd:
        for module in BENCHES:
            argv = [sys.executable, __file__, "--client", module, "--endpoint", etcd.endpoint]
            argv += ["--rounds", str(args.rounds)]
            if importlib.util.find_spec(module) is None:
                results[module] = "not installed"
                continue
            run = subprocess.run(argv, capture_output=True, text=True, timeout=300)
            lines = run.stdout.strip().splitlines()
            results[module] = json.loads(lines[-1]) if run.returncode == 0 and lines else run.stderr[-500:]
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
