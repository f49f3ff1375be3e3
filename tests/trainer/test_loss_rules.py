"""The loss rule (``loss: nonFinite``) with real processes on a real etcd, two members in process, the rules
in ``$LLMJOB_LOSS_RULES`` as the operator sets them.

* The reference trainer: a NaN loss injected on ONE member at step 3 is dropped by every member in that
  step (``skipStep``); the same processes train on, every later loss finite, the step log exact (step 3's
  samples move on, counted as skipped), and both members end with equal, finite parameters.
* The reference trainer alone (standalone, in this process): ``event`` applies the step, a higher ``after``
  escalates to ``skipStep`` and then ``restartJob``, which ends the program with exit code 79 and the
  operator's termination message; the metrics endpoint counts every firing by rule and action, and the
  skipped steps.
* A plain script (public API only): a dropped step changes no parameter on either member; two breaks in a
  row escalate from ``skipStep`` to ``rollback``: both members load the newest snapshot (the parameters the
  snapshotted step started from), and the replayed steps train exactly as the first time.
* The same escalation in a fixed process group (standalone, as in restart mode): the steps replayed after
  the rollback give exactly the losses of a run without the NaNs.
"""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import torch
from live_support import check_exact_sequence, member_argv, records, start_member
from llm_elastic import audit
from llm_elastic.snapshot.store import entries_of, entry_view, inventory
from llm_operator.control.scrape import parse_sample
from llm_testbed.local_etcd import LocalEtcd, free_port
from llm_trainer.config import TrainConfig
from llm_trainer.train import NAN_AT_STEPS_ENV, Trainer
from support.live_events import events
from trainer_support import Processes, trainer_env

pytestmark = pytest.mark.trainer

SCRIPT = Path(__file__).resolve().parent / "loss_rule_script.py"
RUN = 180.0
"""Seconds for two members to start (torch imports on a shared 2-core machine) and finish a short run."""
SKIP = [{"name": "nan", "action": "skipStep"}]


def _finish(procs: Processes, members: list[Any]) -> None:
    for proc in members:
        code = proc.wait(RUN)
        assert code == 0, procs.dump()


def _fired(log: str) -> list[tuple[str, str, int]]:
    return [(e["rule"], e["action"], e["step"]) for e in events(log) if e.get("event") == "rule-fired"]


def _final_model(folder: Path) -> dict[str, torch.Tensor]:
    """The model tensors of this member's newest local snapshot shard (its full replica under DDP)."""
    header = max((h for h in inventory(folder) if h["kind"] == "local"), key=lambda h: h["step"])
    raw = (folder / f"local-r{header['rank']}.s{header['slot']}.bin").read_bytes()
    payload = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    return {e.path: entry_view(payload, e).clone() for e in entries_of(header) if e.path.startswith("model")}


def test_the_trainer_drops_a_nan_of_one_member_on_every_member_and_trains_on(
    etcd: LocalEtcd, corpus: Path, tmp_path: Path, procs: Processes
) -> None:
    metrics = tmp_path / "metrics.jsonl"
    members = []
    for name in ("a", "b"):
        argv, env = member_argv(
            corpus, metrics, etcd.endpoint, "/loss-trainer/", name,
            "--min-members", "2", "--steps", "6", "--snapshot-every", "1",
        )  # fmt: skip
        env = {
            **env,
            "LLMJOB_LOSS_RULES": json.dumps(SKIP),
            "LLMJOB_SNAPSHOT_DIR": str(tmp_path / f"shm-{name}"),
        }
        if name == "b":
            env["LLM_TRAINER_FAULT_NAN_AT_STEPS"] = "3"
        members.append(start_member(procs, (argv, env), name))
    _finish(procs, members)

    log = records(metrics)
    check_exact_sequence(log, corpus)  # step 3's samples moved on with it: nothing lost or repeated
    assert [r["step"] for r in log if r.get("skipped")] == [3] and log[2]["loss"] is None
    assert all(r["loss"] is not None for r in log if r["step"] != 3), log  # every later loss is finite
    pids = {p.pid for p in members}
    assert all(set(r["pids"]) == pids for r in log), "the same two processes trained every step"
    assert audit(log).skipped == [3]
    for proc in members:  # every member learnt of b's NaN in the same step
        assert _fired(procs.log_of(proc)) == [("nan", "skipStep", 3)], procs.log_of(proc)
    a, b = (_final_model(tmp_path / f"shm-{n}") for n in ("a", "b"))
    assert a.keys() == b.keys() and a
    for path, tensor in a.items():
        assert torch.isfinite(tensor.float()).all() and torch.equal(tensor, b[path]), path


def _params(log: str) -> list[tuple[int, str]]:
    return [(e["index"], e["digest"]) for e in events(log) if e.get("event") == "params"]


def test_a_plain_script_skips_then_rolls_back_to_the_snapshot(
    etcd: LocalEtcd, tmp_path: Path, procs: Processes
) -> None:
    rules = [*SKIP, {"name": "nan-again", "action": "rollback", "after": 2}]
    members = []
    for name in ("a", "b"):
        env = {
            "LLMJOB_RECOVERY": "inProcess",
            "LLMJOB_LIVE_ETCD": etcd.endpoint,
            "LLMJOB_LIVE_PREFIX": "/loss-plain/",
            "LLMJOB_LIVE_MEMBER": name,
            "LLMJOB_LIVE_MIN_MEMBERS": "2",
            "LLMJOB_CHECKPOINT_DIR": str(tmp_path / "ckpt"),
            "LLMJOB_SNAPSHOT_DIR": str(tmp_path / f"shm-{name}"),
            "LLMJOB_LOSS_RULES": json.dumps(rules),
        }
        argv = [sys.executable, str(SCRIPT), "--steps", "9", "--snapshot-every", "4"]
        if name == "b":  # step 3 breaks alone (skip); 6 and 7 in a row: skip, then roll back to step 4
            argv += ["--nan-at-steps", "3,6,7"]
        members.append(procs.start(argv, name, env=trainer_env(env)))
    _finish(procs, members)

    seen = [_params(procs.log_of(p)) for p in members]
    assert seen[0] == seen[1], "both members started every step from the same parameters"
    params = seen[0]
    indices = [i for i, _ in params]
    assert indices == [0, 1, 2, 3, 4, 5, 6, 4, 5, 6, 7, 8], indices  # after step 7: back to the start of 5
    digest = dict(params[:7])
    assert digest[3] == digest[2], "the dropped step 3 changed no parameter"
    assert params[7][1] == digest[4], "the rollback loaded the parameters of the snapshot at step 4"
    assert params[7][1] != digest[6]
    assert params[8][1] == digest[5], "the replayed step 5 trained exactly as the first time"
    for proc in members:
        fired = _fired(procs.log_of(proc))
        assert fired == [("nan", "skipStep", 3), ("nan", "skipStep", 6), ("nan-again", "rollback", 7)]
        rolled = [e for e in events(procs.log_of(proc)) if e.get("event") == "rolled-back"]
        assert [(e["step"], e["to"]) for e in rolled] == [(7, 4)]

    log = records(tmp_path / "ckpt" / "metrics.jsonl")
    found = audit(log)
    assert found.ok, found.problems
    assert found.skipped == [3, 6, 7] and found.replayed == 3 and found.steps == 9
    assert all(r["loss"] is not None for r in log if not r.get("skipped"))


def test_event_applies_the_step_and_the_escalation_ends_in_restart_job_counted_by_rule(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    rules = [
        {"name": "log", "action": "event"},
        {"name": "drop", "action": "skipStep", "after": 2},
        {"name": "give-up", "action": "restartJob", "after": 3},
    ]
    monkeypatch.setenv(NAN_AT_STEPS_ENV, "2,3,4")
    port = free_port()
    cfg = TrainConfig(
        data=str(corpus), checkpoint_dir=str(tmp_path), model="tiny", seq_len=32, global_batch=4,
        micro_batch=4, steps=6, checkpoint_every=0, async_checkpoint=False, metrics_port=port,
    )  # fmt: skip
    message = tmp_path / "termination-log"
    trainer = Trainer(cfg, {"LLMJOB_LOSS_RULES": json.dumps(rules), "LLMJOB_TERMINATION_LOG": str(message)})
    with pytest.raises(SystemExit) as exited:
        trainer.train()
    assert exited.value.code == 79  # a rule ended the worker: the operator restarts every worker
    assert message.read_text() == "rule-fired: give-up restartJob: non-finite loss at step 4 (3 in a row)\n"
    out = capsys.readouterr().out
    assert _fired(out) == [("log", "event", 2), ("drop", "skipStep", 3), ("give-up", "restartJob", 4)]
    log = records(tmp_path / "metrics.jsonl")
    assert [(r["step"], r["loss"] is None, bool(r.get("skipped"))) for r in log] == [
        (1, False, False),
        (2, True, False),  # event: recorded only, the step was applied
        (3, True, True),
        (4, True, True),  # dropped, then the program ended
    ]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    for rule, action in (("log", "event"), ("drop", "skipStep"), ("give-up", "restartJob")):
        assert f'llm_trainer_rule_fired_total{{action="{action}",rank="0",rule="{rule}"}} 1.0' in text, text
    assert 'llm_trainer_skipped_steps_total{rank="0"} 2.0' in text
    sample = parse_sample(text)  # what the operator's progress probe reads of it
    assert sample is not None
    assert sample.rules_fired == (("drop", "skipStep", 1), ("give-up", "restartJob", 1), ("log", "event", 1))


def test_rollback_in_a_fixed_group_replays_from_the_snapshot_like_a_clean_run(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same escalation in the fixed process group of restart mode and standalone (here standalone): the
    steps replayed after the rollback lose exactly what a run without the NaNs loses."""
    rules = [*SKIP, {"name": "nan-again", "action": "rollback", "after": 2}]

    def run(folder: Path, nan_steps: str) -> list[dict[str, Any]]:
        monkeypatch.setenv(NAN_AT_STEPS_ENV, nan_steps)
        cfg = TrainConfig(
            data=str(corpus), checkpoint_dir=str(folder), model="tiny", seq_len=32, global_batch=4,
            micro_batch=4, steps=6, checkpoint_every=0, async_checkpoint=False, metrics_port=0,
            snapshot_every=2, snapshot_dir=str(folder / "shm"),
        )  # fmt: skip
        assert Trainer(cfg, {"LLMJOB_LOSS_RULES": json.dumps(rules)}).train() == 0
        return records(folder / "metrics.jsonl")

    clean = run(tmp_path / "clean", "")
    broken = run(tmp_path / "broken", "3,4")  # skip 3, then roll back at 4 to the snapshot of step 2
    assert [(r["step"], bool(r.get("skipped"))) for r in broken] == [
        (1, False), (2, False), (3, True), (4, True), (3, False), (4, False), (5, False), (6, False),
    ]  # fmt: skip
    assert broken[4]["resumed_from"] == 2 and broken[4]["restore_source"] == "memory"
    found = audit(broken)
    assert found.ok and found.skipped == [3, 4] and found.replayed == 2, found.problems
    replayed = [r["loss"] for r in broken[4:]]
    assert replayed == [r["loss"] for r in clean[2:]]  # model, optimizer and data as if nothing happened
