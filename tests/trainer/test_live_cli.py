"""Bad options of the live driver: one line naming the option, exit code 2, no traceback."""

from __future__ import annotations

import pytest
from llm_trainer.live.driver import parse_args

BASE = ["--data", "d", "--metrics", "m.jsonl", "--etcd", "127.0.0.1:2379", "--prefix", "/job/"]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (["--etcd", ""], "--etcd is required"),
        (["--etcd", "host:99999"], "--etcd: etcd endpoint 'host:99999' has an invalid port"),
        (["--prefix", "job"], "--prefix must start and end with '/'"),
        (["--member", "a/b"], "--member 'a/b' must be printable ASCII"),
        (["--min-members", "0"], "--min-members must be at least 1"),
        (["--lease-ttl", "1"], "--lease-ttl must be at least 2 seconds"),
        (["--global-batch", "0"], "--global-batch must be at least 1"),
        (["--steps", "x"], "argument --steps: invalid int value"),
        (["--checkpoint-every", "5"], "--checkpoint-every needs --checkpoint-dir"),
        (["--checkpoint-every", "-1", "--checkpoint-dir", "c"], "--checkpoint-every must be 0 (off) or more"),
        (["--keep-checkpoints", "0"], "--keep-checkpoints must be at least 1"),
    ],
)
def test_bad_option(changes: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_args(BASE + changes)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_defaults_name_the_member_after_host_and_pid() -> None:
    cfg, opts = parse_args(BASE)
    assert opts.member.rsplit(".", 1)[1].isdigit()
    assert cfg.global_batch == 12 and opts.start_when is None


def test_without_metrics_or_checkpoint_dir_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [a for a in BASE if a not in ("--metrics", "m.jsonl")]
    with pytest.raises(SystemExit) as exit_info:
        parse_args(argv)
    assert exit_info.value.code == 2
    assert "--metrics is required without --checkpoint-dir" in capsys.readouterr().err


def test_the_operator_env_sets_member_min_members_and_checkpoint_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    """In an operator-made pod: member ``<pod>.<pid>`` (what the operator evicts by pod), the job's minimum,
    checkpoints and metrics in the job's checkpointDir."""
    monkeypatch.setenv("LLMJOB_POD_NAME", "train-worker-1")
    monkeypatch.setenv("LLMJOB_LIVE_MIN_MEMBERS", "2")
    monkeypatch.setenv("LLMJOB_CHECKPOINT_DIR", "/shared/ckpt")
    argv = [a for a in BASE if a not in ("--metrics", "m.jsonl")]
    _, opts = parse_args(argv)
    host, pid = opts.member.rsplit(".", 1)
    assert host == "train-worker-1" and pid.isdigit()
    assert opts.min_members == 2
    assert str(opts.checkpoint_dir) == "/shared/ckpt" and str(opts.metrics) == "/shared/ckpt/metrics.jsonl"


def test_a_bad_min_members_env_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LLMJOB_LIVE_MIN_MEMBERS", "two")
    with pytest.raises(SystemExit) as exit_info:
        parse_args(BASE)
    assert exit_info.value.code == 2
    assert "$LLMJOB_LIVE_MIN_MEMBERS must be an integer, got 'two'" in capsys.readouterr().err
