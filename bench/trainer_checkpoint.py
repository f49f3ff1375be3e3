"""Checkpoint cost side by side: training stall per save (sync / async / snapshot), persist throughput as a
fraction of ``dd ... conv=fsync`` on the same disk, and restore time (memory vs filesystem).

One process (world size 1), the real ``Trainer`` with its model, AdamW and data loader, driven step by step
through the runtime (``llm_elastic``: its checkpointer and snapshotter make the saves). For each mode it
trains a few steps, saves ``--rounds`` times and reports the median of:
- stall: seconds the training thread spent inside the save call (sync: the whole DCP save; async: staging
  into the reused host buffers; snapshot: the copy into /dev/shm);
- persist: seconds from the save call to the COMPLETE marker (async: in the background, while training
  steps continue), and bytes written / persist seconds as a fraction of dd's rate;
- restore: loading the newest complete checkpoint vs the in-memory snapshot into a fresh model.

CPU (what the docs show for the development box):
    python bench/trainer_checkpoint.py --model bench-55m --dir /var/tmp/ckpt-bench
One H100 (the goal: stall < 1 s for 1B, persist >= 80 % of dd; local NVMe or FSx as --dir):
    python bench/trainer_checkpoint.py --model 1b --precision bf16 --seq-len 2048 --micro-batch 4 \\
        --dir /local_nvme/ckpt-bench
Prints a Markdown table and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from llm_elastic import Elastic
from llm_elastic.checkpoint import Checkpointer, latest_checkpoint
from llm_elastic.persistence import Persistence
from llm_elastic.snapshot.manager import Snapshotter
from llm_trainer.config import MODELS, ModelConfig, TrainConfig
from llm_trainer.data.prepare import main as prepare
from llm_trainer.train import Trainer

# A CPU-sized model (about 55M parameters, 0.66 GB of fp32 weights + AdamW state).
MODELS.setdefault(
    "bench-55m",
    ModelConfig(
        dim=512, n_layers=8, n_heads=8, n_kv_heads=4, ffn_dim=1408, vocab_size=32000, max_seq_len=2048
    ),
)


def dd_rate(folder: Path, nbytes: int) -> float:
    """Bytes/s of ``dd if=/dev/zero of=folder/dd.bin bs=1M count=N conv=fsync``."""
    target = folder / "dd.bin"
    count = max(64, nbytes // (1 << 20))
    started = time.monotonic()
    subprocess.run(
        ["dd", "if=/dev/zero", f"of={target}", "bs=1M", f"count={count}", "conv=fsync"],
        check=True,
        capture_output=True,
    )
    elapsed = time.monotonic() - started
    target.unlink()
    return count * (1 << 20) / elapsed


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def make_corpus(folder: Path) -> Path:
    rng = random.Random(3)
    words = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "on", "disk"]
    (folder / "text").mkdir(parents=True)
    for index in range(4):
        (folder / "text" / f"d{index}.txt").write_text(" ".join(rng.choice(words) for _ in range(20000)))
    assert prepare([str(folder / "text"), "--output", str(folder / "shards")]) == 0
    return folder / "shards"


STANDALONE: dict[str, str] = {}
NEVER = 10**9
"""An interval that never comes: the snapshotter exists, the bench decides when it snapshots."""


def build(
    args: argparse.Namespace, corpus: Path, ckpt: Path, snapshot_dir: Path, snapshots: bool = True
) -> Trainer:
    cfg = TrainConfig(
        data=str(corpus),
        checkpoint_dir=str(ckpt),
        model=args.model,
        seq_len=args.seq_len,
        global_batch=args.micro_batch,
        micro_batch=args.micro_batch,
        steps=10_000,
        precision=args.precision,
        metrics_port=0,
        checkpoint_every=0,
        snapshot_every=NEVER if snapshots else 0,
        snapshot_dir=str(snapshot_dir),
        keep_checkpoints=2,
    ).resolved()
    return Trainer(cfg, STANDALONE)


class Driven:
    """A trainer stepped one step at a time through its runtime's loop."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self.el: Elastic = trainer.elastic
        self.steps = self.el.steps()
        self.persistence: Persistence = self.el.persistence
        """The runtime's persistence part: what this benchmark measures."""

    def step(self) -> float:
        started = time.monotonic()
        current = next(self.steps)  # the first call also forms the process group and restores
        with current:
            self.trainer.train_step(current)
        return time.monotonic() - started

    @property
    def checkpointer(self) -> Checkpointer:
        assert self.persistence.checkpointer is not None
        return self.persistence.checkpointer

    @property
    def snapshots(self) -> Snapshotter:
        assert self.persistence.snapshots is not None
        return self.persistence.snapshots

    def save(self, background: bool) -> Path:
        el, p = self.el, self.persistence
        save = self.checkpointer.save_async if background else self.checkpointer.save
        return save(el.step, el.model, self.trainer.optimizer, p.meta(), p.extras_blob())

    def close(self) -> None:
        self.steps.close()


def evict(folder: Path) -> None:
    """Drop ``folder``'s files from the page cache (so a read comes from the disk)."""
    for path in folder.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def timed_restore(args: argparse.Namespace, corpus: Path, ckpt: Path, snap: Path, source: str) -> float:
    """Seconds the runtime took to restore a fresh trainer (its own ``restored.seconds``): from the newest
    snapshot (``memory``) or the newest checkpoint (page cache warm, or evicted first: ``cold``)."""
    info = latest_checkpoint(ckpt)
    assert info is not None
    if source == "cold":
        evict(info.path)
    fresh = Driven(build(args, corpus, ckpt, snap, snapshots=source == "memory"))
    fresh.step()
    want = "memory" if source == "memory" else "checkpoint"
    assert fresh.el.restored.source == want, (fresh.el.restored.source, want)
    seconds = fresh.el.restored.seconds
    fresh.close()
    return seconds


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="bench-55m")
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--micro-batch", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--dir", default="", help="checkpoint folder on the disk to measure (default: a temp dir)"
    )
    parser.add_argument("--snapshot-dir", default="/dev/shm/llm-trainer-bench")
    args = parser.parse_args()

    work = Path(args.dir or tempfile.mkdtemp(prefix="ckpt-bench-"))
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    snap = Path(args.snapshot_dir)
    shutil.rmtree(snap, ignore_errors=True)
    corpus = make_corpus(work / "corpus")
    ckpt = work / "ckpt"
    run = Driven(build(args, corpus, ckpt, snap))
    for _ in range(2):
        run.step()  # AdamW state exists from here on
    plain = [run.step() for _ in range(3)]
    # First use allocates the staging buffers and both snapshot slots: not what a steady-state save costs.
    run.save(background=True)
    run.checkpointer.wait()
    for _ in range(2):
        run.step()
        run.persistence.snapshot()
    optimizer = run.trainer.optimizer
    state_bytes = sum(
        t.numel() * t.element_size()
        for t in [
            *run.el.model.parameters(),
            *(v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)),
        ]
    )
    dd = dd_rate(work, state_bytes)

    rows: dict[str, dict[str, list[float]]] = {
        m: {"stall": [], "persist": [], "rate": []} for m in MODELS_ORDER
    }
    during: list[float] = []
    for _ in range(args.rounds):
        run.step()
        path = run.save(background=False)
        rows["sync"]["stall"].append(run.checkpointer.last_stall)
        rows["sync"]["persist"].append(run.checkpointer.last_persist)
        rows["sync"]["rate"].append(dir_bytes(path) / run.checkpointer.last_persist)

        run.step()
        path = run.save(background=True)
        while run.checkpointer.in_flight:
            during.append(run.step())
        run.checkpointer.wait()
        rows["async"]["stall"].append(run.checkpointer.last_stall)
        rows["async"]["persist"].append(run.checkpointer.last_persist)
        rows["async"]["rate"].append(dir_bytes(path) / run.checkpointer.last_persist)

        run.step()  # the same background persist with the training thread idle (the persist path alone)
        path = run.save(background=True)
        run.checkpointer.wait()
        rows["async, training idle"]["stall"].append(run.checkpointer.last_stall)
        rows["async, training idle"]["persist"].append(run.checkpointer.last_persist)
        rows["async, training idle"]["rate"].append(dir_bytes(path) / run.checkpointer.last_persist)

        run.step()
        run.persistence.snapshot()
        rows["snapshot"]["stall"].append(run.snapshots.last_stall)
        rows["snapshot"]["persist"].append(run.snapshots.last_stall)
        rows["snapshot"]["rate"].append(
            run.snapshots.local.payload_path.stat().st_size / run.snapshots.last_stall
        )

    # Restore into a fresh trainer: memory first (newest snapshot), then the newest checkpoint from disk.
    run.save(background=False)
    run.persistence.snapshot()
    run.snapshots.wait()
    run.close()
    restore: dict[str, float] = {}
    restore["memory"] = timed_restore(args, corpus, ckpt, snap, "memory")
    restore["filesystem (page cache)"] = timed_restore(args, corpus, ckpt, snap, "warm")
    restore["filesystem (cold)"] = timed_restore(args, corpus, ckpt, snap, "cold")

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else (platform.processor() or "cpu")
    print(
        f"\nmodel {args.model}: {state_bytes / 1e9:.2f} GB of state on {device}; "
        f"dd conv=fsync {dd / 1e9:.2f} GB/s"
    )
    print(
        f"training step {median(plain):.2f} s without a save, "
        f"{median(during):.2f} s while an async persist runs\n"
    )
    print("| mode | training stall per save (s) | persist (s) | persist GB/s | % of dd |")
    print("|---|---|---|---|---|")
    for mode in MODELS_ORDER:
        r = rows[mode]
        rate = median(r["rate"])
        print(
            f"| {mode} | {median(r['stall']):.3f} | {median(r['persist']):.2f} | {rate / 1e9:.2f} | "
            f"{'-' if mode == 'snapshot' else f'{100 * rate / dd:.0f} %'} |"
        )
    print("\nrestore: " + ", ".join(f"{k} {v:.2f} s" for k, v in restore.items()) + "\n")
    result: dict[str, Any] = {
        "model": args.model,
        "device": device,
        "state_bytes": state_bytes,
        "dd_bytes_per_s": dd,
        "step_s": median(plain),
        "step_during_persist_s": median(during),
        "modes": {m: {k: median(v) for k, v in rows[m].items()} for m in MODELS_ORDER},
        "restore_s": restore,
        "torch": torch.__version__,
    }
    print(json.dumps(result))
    shutil.rmtree(snap, ignore_errors=True)
    if not args.dir:
        shutil.rmtree(work, ignore_errors=True)
    return 0


MODELS_ORDER = ("sync", "async", "async, training idle", "snapshot")

if __name__ == "__main__":
    raise SystemExit(main())
