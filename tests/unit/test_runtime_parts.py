"""The parts behind ``Elastic``, each alone: the commit's verdict, the one exit path, the recovery modes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from llm_elastic import IN_PROCESS, RESTART, STANDALONE, AsIs, ElasticConfig
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
    # value, changed, stopping members, busy, not-yet-announced restarts, 3 compute times, 3 restart counts
    values = [6.0, 1.0, 2.0, 0.0, 1.0, 0.5, 0.7, 0.6, 2.0, 1.0, 0.0]
    assert len(values) == 1 + FLAGS + 2 * world
    verdict = CommitWire.read(values, _signals(stopping=True), world, mean=True)
    assert verdict.value == 2.0
    assert verdict.changed and verdict.stopping == 2 and verdict.stop_announced and not verdict.busy
    assert verdict.compute_seconds == (0.5, 0.7, 0.6)
    assert verdict.process_restarts == 3  # the highest count any member knows, plus one not yet counted
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
