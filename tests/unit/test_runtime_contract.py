"""The runtime's contract with the operator (pure: reads a mapping) and the in-pod supervisor (layer 2)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from llm_elastic.contract import IN_PROCESS, RESTART, STANDALONE, read_contract
from llm_elastic.errors import ContractError
from llm_elastic.supervise import should_restart
from support.wait import wait_for

LIVE = {
    "LLMJOB_LIVE_ETCD": "rdzv:2379",
    "LLMJOB_LIVE_PREFIX": "/llmjob/u/live/",
    "LLMJOB_POD_NAME": "job-worker-1",
}


@pytest.mark.parametrize(
    ("env", "mode"),
    [
        ({}, STANDALONE),
        ({"RANK": "0", "WORLD_SIZE": "2"}, RESTART),
        ({"LLMJOB_RECOVERY": "restart", "RANK": "1", "WORLD_SIZE": "2"}, RESTART),
        (LIVE, IN_PROCESS),
        ({"LLMJOB_RECOVERY": "inProcess", **LIVE}, IN_PROCESS),
    ],
)
def test_the_mode_follows_the_operator_or_what_is_set(env: dict[str, str], mode: str) -> None:
    assert read_contract(env).mode == mode


def test_in_process_members_are_named_after_pod_local_rank_and_pid() -> None:
    contract = read_contract(
        {**LIVE, "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "8", "LLMJOB_LIVE_MIN_MEMBERS": "4"}
    )
    host, rest = contract.member.rsplit(".", 1)
    assert host == "job-worker-1" and rest.startswith("03-") and rest.split("-")[1].isdigit()
    assert (contract.min_members, contract.local_world_size) == (4, 8)


@pytest.mark.parametrize(
    ("env", "supported", "message"),
    [
        ({"LLMJOB_RECOVERY": "inProcess"}, None, "needs $LLMJOB_LIVE_ETCD"),
        ({"LLMJOB_RECOVERY": "restart"}, None, "RANK/WORLD_SIZE are not set"),
        ({"LLMJOB_RECOVERY": "always"}, None, "must be restart or inProcess, got 'always'"),
        ({**LIVE, "LLMJOB_LIVE_PREFIX": "x"}, None, "$LLMJOB_LIVE_PREFIX must start and end with '/'"),
        ({**LIVE, "LLMJOB_LIVE_MEMBER": "a/b"}, None, "member id 'a/b'"),
        ({**LIVE, "LLMJOB_LIVE_MIN_MEMBERS": "two"}, None, "$LLMJOB_LIVE_MIN_MEMBERS must be an integer"),
        ({**LIVE, "LLMJOB_LIVE_MIN_MEMBERS": "0"}, None, "$LLMJOB_LIVE_MIN_MEMBERS must be at least 1"),
        (LIVE, ("restart",), "supports recovery restart, but runs with LLMJOB_RECOVERY=inProcess"),
    ],
)
def test_a_wrong_contract_is_one_line_naming_the_variable_and_exit_2(
    env: dict[str, str], supported: tuple[str, ...] | None, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ContractError) as raised:
        read_contract(env, supported) if supported else read_contract(env)
    assert raised.value.code == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize(
    ("code", "restart"),
    [
        (0, False),
        (2, False),
        (3, False),
        (5, False),
        (78, False),
        (79, False),
        (1, True),
        (76, True),
        (-9, True),
    ],
)
def test_the_supervisor_restarts_only_failures_of_the_program_itself(code: int, restart: bool) -> None:
    assert should_restart(code) is restart


def _supervise(tmp_path: Path, program: str, *options: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "program.py"
    script.write_text(program)
    argv = [sys.executable, "-m", "llm_elastic.supervise", *options, "--", sys.executable, str(script)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def test_the_supervisor_restarts_a_failing_program_then_hands_its_code_over(tmp_path: Path) -> None:
    program = (
        "import os, sys\nprint('run', os.environ['LLMJOB_PROCESS_RESTARTS'], flush=True)\nsys.exit(76)\n"
    )
    done = _supervise(tmp_path, program, "--max-restarts", "2")
    assert done.returncode == 76
    runs = [line for line in done.stdout.splitlines() if line.startswith("run")]
    assert runs == ["run 0", "run 1", "run 2"]
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [e["restarts"] for e in events] == [1, 2] and {e["exit_code"] for e in events} == {76}


def test_the_supervisor_passes_a_final_answer_on_without_a_restart(tmp_path: Path) -> None:
    done = _supervise(tmp_path, "import sys\nprint('run', flush=True)\nsys.exit(3)\n")
    assert done.returncode == 3 and done.stdout.count("run") == 1


def test_the_supervisor_without_a_program_is_a_usage_error() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "llm_elastic.supervise", "--"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and "no program given" in done.stderr and "Traceback" not in done.stderr


def test_the_supervisor_loads_only_what_it_needs_so_its_signal_handlers_come_first() -> None:
    """The supervisor is a pod's PID 1: a SIGTERM that comes before it handles SIGTERM is dropped, so it must
    not import the runtime (torch takes seconds) on the way to its handlers."""
    probe = "import sys, llm_elastic.supervise\nprint(' '.join(sorted(sys.modules)))"
    loaded = set(
        subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
        ).stdout.split()
    )
    ours = {name for name in loaded if name.split(".")[0] == "llm_elastic"}
    assert ours == {
        "llm_elastic",
        "llm_elastic.supervise",
        "llm_elastic.cli_errors",
        "llm_elastic.contract",
        "llm_elastic.errors",
        "llm_elastic.health",  # the termination message file and exit 78 (stdlib only)
        "llm_elastic.logrules",  # log rules (re2, a C extension)
        "llm_elastic.watched",  # the program's output read through the rules (stdlib only)
    }
    assert "torch" not in loaded and "numpy" not in loaded


def test_a_stopped_supervisor_forwards_the_signal_and_starts_nothing_more(tmp_path: Path) -> None:
    """SIGTERM to the supervisor reaches the program; the program's failing exit is then not restarted."""
    ready = tmp_path / "ready"
    script = tmp_path / "program.py"
    script.write_text(
        "import pathlib, signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: sys.exit(76))\n"
        f"pathlib.Path({str(ready)!r}).write_text('up')\n"
        "time.sleep(120)\n"
    )
    argv = [sys.executable, "-m", "llm_elastic.supervise", "--", sys.executable, str(script)]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) as supervisor:
        wait_for(lambda: ready.exists() or supervisor.poll() is not None, 60, "the program to start")
        assert ready.exists(), "the supervisor ended before its program started"
        supervisor.send_signal(signal.SIGTERM)
        out, _ = supervisor.communicate(timeout=60)
    assert supervisor.returncode == 76 and "process-restarted" not in out
