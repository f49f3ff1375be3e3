"""Checkpoints: saved on SIGTERM, robust to a kill during a save, and resharded across world sizes."""

from __future__ import annotations

import signal
import sys
import urllib.request
from pathlib import Path

import pytest
import torch
from llm_elastic.checkpoint import MARKER, SAVE_STALL_ENV, latest_checkpoint, step_dir
from llm_elastic.metrics import read_records
from llm_testbed.local_etcd import free_port
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from trainer_support import Processes, launch_world, train_argv, trainer_env, wait_for

pytestmark = pytest.mark.trainer

HERE = Path(__file__).parent


def records(ckpt: Path) -> list[dict[str, object]]:
    path = ckpt / "metrics.jsonl"
    return read_records(path) if path.exists() else []


def test_sigterm_finishes_the_step_saves_and_exits_zero(
    corpus: Path, tmp_path: Path, procs: Processes
) -> None:
    ckpt = tmp_path / "ckpt"
    argv = train_argv(
        corpus, ckpt, "--steps", "10000", "--checkpoint-every", "0", "--min-step-seconds", "0.1"
    )
    port = free_port()
    proc = procs.start([*argv, "--metrics-port", str(port)], "trainer")
    wait_for(lambda: len(records(ckpt)) >= 3 or proc.poll() is not None, 120, "three training steps")
    assert proc.poll() is None, procs.log_of(proc)
    # The worker's Prometheus endpoint (port base + LOCAL_RANK 0) reports the training progress.
    scraped = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    gauges = {
        line.split("{")[0]: float(line.rsplit(" ", 1)[1])
        for line in scraped.splitlines()
        if line.startswith("llm_trainer_")
    }
    assert gauges["llm_trainer_step"] >= 3 and gauges["llm_trainer_loss"] > 0
    assert gauges["llm_trainer_tokens_per_second"] > 0
    assert gauges["llm_trainer_last_step_timestamp_seconds"] > 1e9
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, procs.log_of(proc)
    last = records(ckpt)[-1]
    info = latest_checkpoint(ckpt)
    assert info is not None and info.step == last["step"]
    assert info.meta["data"]["position"] == last["samples_seen"] == info.step * 12
    assert "stopped by SIGTERM" in procs.log_of(proc)


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_kill_during_a_save_keeps_the_previous_checkpoint(
    corpus: Path, tmp_path: Path, procs: Processes, mode: str
) -> None:
    ckpt = tmp_path / "ckpt"
    argv = train_argv(corpus, ckpt, "--steps", "100", "--checkpoint-every", "3")
    argv += ["--async-checkpoint", str(mode == "async")]
    # Every save from step 6 on stalls between the shards and the marker: kill the process right there.
    proc = procs.start(argv, "first", env=trainer_env({SAVE_STALL_ENV: "6:600"}))
    wait_for(
        lambda: (step_dir(ckpt, 6) / ".metadata").exists() or proc.poll() is not None, 120, "step-6 shards"
    )
    if mode == "async":  # training goes on while step 6 persists in the background (until step 9's save)
        wait_for(lambda: max(r["step"] for r in records(ckpt)) >= 8 or proc.poll() is not None, 120, "step 8")
        assert max(r["step"] for r in records(ckpt)) <= 9
    assert proc.poll() is None, procs.log_of(proc)
    procs.kill_group(proc)
    proc.wait(timeout=30)
    assert not (step_dir(ckpt, 6) / MARKER).exists()
    info = latest_checkpoint(ckpt)
    assert info is not None and info.step == 3
    first_run = {r["step"]: r for r in records(ckpt)}

    rerun = procs.start(train_argv(corpus, ckpt, "--steps", "7", "--checkpoint-every", "3"), "second")
    assert rerun.wait(timeout=120) == 0, procs.log_of(rerun)
    resumed = [r for r in records(ckpt) if r["restart"] == 1]
    assert [r["step"] for r in resumed] == [4, 5, 6, 7]
    assert all(r["resumed_from"] == 3 for r in resumed)
    for record in resumed:
        if record["step"] in first_run:  # a replayed step trains on exactly the same samples
            assert record["samples_crc32"] == first_run[record["step"]]["samples_crc32"]
    assert (step_dir(ckpt, 6) / MARKER).exists() and latest_checkpoint(ckpt).step == 7  # type: ignore[union-attr]


def test_checkpoint_from_three_ranks_loads_on_two_and_one(
    corpus: Path, tmp_path: Path, procs: Processes
) -> None:
    ckpt = tmp_path / "ckpt"
    ranks = launch_world(procs, [*train_argv(corpus, ckpt, "--steps", "2"), "--parallel", "fsdp"], 3, "train")
    for proc in ranks:
        assert proc.wait(timeout=240) == 0, procs.dump()
    info = latest_checkpoint(ckpt)
    assert info is not None and info.step == 2 and info.meta["world_size"] == 3

    # Ground truth: the checkpoint's own tensors, read without any process group.
    dcp_to_torch_save(info.path, tmp_path / "truth.pt")
    truth = torch.load(tmp_path / "truth.pt", weights_only=True)["model"]
    assert truth and all(isinstance(v, torch.Tensor) for v in truth.values())

    helper = [sys.executable, str(HERE / "dump_params.py"), str(info.path), "tiny", "fsdp"]
    loaders = launch_world(procs, [*helper, str(tmp_path / "w2.pt")], 2, "load-w2")
    loaders += launch_world(procs, [*helper, str(tmp_path / "w1.pt")], 1, "load-w1")
    for proc in loaders:
        assert proc.wait(timeout=240) == 0, procs.dump()

    for world in ("w2", "w1"):
        params = torch.load(tmp_path / f"{world}.pt", weights_only=True)
        assert params.keys() == truth.keys(), world
        for name, tensor in truth.items():
            assert torch.equal(params[name], tensor), f"{name} differs at {world}"
