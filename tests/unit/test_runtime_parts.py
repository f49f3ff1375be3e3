"""The parts behind ``Elastic``, each alone: the commit's verdict, the one exit path, the recovery modes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from llm_elastic import IN_PROCESS, RESTART, STANDALONE, AsIs, ElasticConfig, read_records
from llm_elastic.commit import FLAGS, CommitWire, Signals
from llm_elastic.leave import Leave
from llm_elastic.modes import Restart, Standalone, make_mode
from llm_elastic.reporting import sample_fields


def _signals(stopping: bool = False, announced: bool = True) -> Signals:
    return Signals(
        changed=stopping,
        stopping=stopping,
        busy=False,
        restart_announced=announced,
        compute_seconds=0.5,
        process_restarts=2,
    )


def test_the_verdict_reads_the_value_flags_times_and_the_jobs_restarts() -> None:
    world = 3
    # value, non-finite (NaN: some member's value), changed, stopping members, busy,
    # not-yet-announced restarts, 3 compute times, 3 restart counts
    values = [6.0, 0.0, 1.0, 2.0, 0.0, 1.0, 0.5, 0.7, 0.6, 2.0, 1.0, 0.0]
    assert len(values) == 1 + FLAGS + 2 * world
    verdict = CommitWire.read(values, _signals(stopping=True), world, mean=True)
    assert verdict.value == 2.0
    assert verdict.changed and verdict.stopping == 2 and verdict.stop_announced and not verdict.busy
    assert verdict.compute_seconds == (0.5, 0.7, 0.6)
    assert verdict.process_restarts == 3  # the highest count any member knows, plus one not yet counted
    assert not verdict.nonfinite
    assert CommitWire.read(values, _signals(), world, mean=False).value == 6.0
    with pytest.raises(AttributeError):
        verdict.value = 0.0  # type: ignore[misc]  # frozen


def test_leave_carries_the_code_and_passes_any_except_exception() -> None:
    def leaving() -> Iterator[int]:
        try:
            yield 1
            raise Leave(3, ValueError("why"))
        except Exception:  # what a callback on the way out might catch: not a Leave
            pytest.fail("Leave was caught as an Exception")

    with pytest.raises(Leave) as caught:
        list(leaving())
    assert caught.value.code == 3 and isinstance(caught.value.cause, ValueError)


def test_each_mode_name_makes_its_object_and_refuses_what_it_cannot_wrap() -> None:
    config = ElasticConfig(total_steps=1)
    assert isinstance(make_mode(RESTART, config), Restart)
    assert isinstance(make_mode(STANDALONE, config), Standalone)
    live = make_mode(IN_PROCESS, config)
    assert live.name == IN_PROCESS and live.live
    with pytest.raises(SystemExit) as exited:
        live.check(AsIs())
    assert exited.value.code == 2
    make_mode(RESTART, config).check(AsIs())  # restart mode keeps the program's own wrapping


def test_the_step_log_records_a_steps_samples_in_one_place() -> None:
    from llm_elastic import ElasticSampler

    sampler = ElasticSampler(100, 4, seed=1)
    fields = sample_fields(sampler, 2)
    assert fields["sample_start"] == 8 and fields["sample_end"] == 12 and fields["samples_seen"] == 12
    assert fields["samples_crc32"] == sampler.crc32(2) and sample_fields(None, 2) == {}


def test_the_step_log_line_has_the_fields_it_always_had(tmp_path: Path) -> None:
    from llm_elastic import ElasticSampler
    from llm_elastic.commit import Verdict
    from llm_elastic.position import Progress, RestoreFacts
    from llm_elastic.reporting import Reporter
    from llm_elastic.step import Step

    config = ElasticConfig(total_steps=5, step_log=str(tmp_path / "metrics.jsonl"), log_every=0)
    sampler = ElasticSampler(100, 4)
    reporter = Reporter(config, {"rank": "0"}, 0, 0, sampler)
    reporter.open(rank=0)
    step = Step(None, 2, None, None)  # type: ignore[arg-type]  # neither the loop nor the mode is read
    step.loss, step.verdict = 1.5, Verdict(1.5, False, 0, False, False, (0.1,), 0)
    step.record(tokens=64, grad_accum=2)
    restored = RestoreFacts(resumed_from=2, source="checkpoint")
    fields = {"agent_restart": 0, "restore_seconds": 0.25, "restore_peers": 0}
    reporter.step_record(step, Progress(3, 1.5, False), 0.5, 100.0, (1, 0), 1, restored, fields)
    (line,) = read_records(tmp_path / "metrics.jsonl")
    assert set(line) == {
        "time", "step", "loss", "world_size", "step_time", "restart", "generation", "resumed_from",
        "restore_source", "process_started", "agent_restart", "restore_seconds", "restore_peers",
        "global_batch", "samples_seen", "sample_start", "sample_end", "samples_crc32", "grad_accum",
    }  # fmt: skip
    assert (line["step"], line["restart"], line["resumed_from"], line["restore_source"]) == (
        3,
        1,
        2,
        "checkpoint",
    )
    assert (line["sample_start"], line["sample_end"]) == (8, 12) and "tokens" not in line


@pytest.mark.parametrize(
    ("busy", "want"),
    [(False, [("snapshot", 4), ("save", 4), ("snapshot", 6)]), (True, [("snapshot", 4), ("save", 4)])],
)
def test_persistence_decides_itself_when_to_save(busy: bool, want: list[tuple[str, int]]) -> None:
    from llm_elastic.persistence import Persistence, SavePoint
    from llm_elastic.position import Progress

    config = ElasticConfig(total_steps=8, snapshot_every=2, checkpoint_every=4)
    at = 0
    persistence = Persistence(
        config,
        None,  # type: ignore[arg-type]  # the cadence reads no state
        lambda: SavePoint(Progress(at, 0.0, False), 1, 0),
        lambda step: None,
        live=True,
    )
    done: list[tuple[str, int]] = []
    persistence.snapshot = lambda: done.append(("snapshot", at))  # type: ignore[method-assign]
    persistence.save = lambda: done.append(("save", at))  # type: ignore[method-assign]
    for at in (3, 4, 6, 8):  # the last step is left to final_save
        persistence.at_step_end(busy=busy and at != 4)
    assert done == want  # a busy copy skips the snapshot; the checkpoint cadence does not care
