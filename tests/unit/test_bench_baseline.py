"""The side-by-side guard of the recovery bench (``--baseline REF``): its parsing and its verdict."""

from __future__ import annotations

from llm_testbed.benchcmp import Row, compare, parse_rows

OUTPUT = """
backend etcd-v3, 6 losses per mode, 2 CPUs, one run
| event | n | p50 | p99 (max) |
|---|---|---|---|
| inProcess: node lost -> first step after resume | 6 | 1.5 s | 1.6 s |
| inProcess: joining pod created -> first step at full size | 0 | - | - |
| spare: node lost -> first step at full size again | 6 | 1.6 s | 1.7 s |
"""


def test_rows_are_parsed_by_label_and_rows_without_figures_left_out() -> None:
    rows = parse_rows(OUTPUT)
    assert rows == {
        "inProcess: node lost -> first step after resume": Row(
            "inProcess: node lost -> first step after resume", 6, 1.5, 1.6
        ),
        "spare: node lost -> first step at full size again": Row(
            "spare: node lost -> first step at full size again", 6, 1.6, 1.7
        ),
    }


def test_a_p99_more_than_a_fifth_above_the_baseline_is_worse() -> None:
    old = {"a": Row("a", 6, 1.0, 1.0), "b": Row("b", 6, 1.0, 1.0), "c": Row("c", 6, 1.0, 1.0)}
    new = {"a": Row("a", 6, 1.1, 1.2), "b": Row("b", 6, 1.3, 1.21), "d": Row("d", 6, 1.0, 1.0)}
    lines = compare(old, new)
    assert lines == [
        "a: baseline 1.0 / 1.0 s, working tree 1.1 / 1.2 s (p50 / p99): no worse",
        "b: baseline 1.0 / 1.0 s, working tree 1.3 / 1.2 s (p50 / p99): WORSE",
        "c: only in the baseline",
        "d: only in the working tree",
    ]
