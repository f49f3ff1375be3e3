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
