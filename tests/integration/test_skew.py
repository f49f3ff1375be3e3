"""Version skew (issue 56, docs/operations.md "Version skew"): a training image built with the previous
release's runtime keeps working under today's operator.

The previous release is the one CHANGELOG.md names; its ``runtime`` and ``trainer`` come out of git history
(``git archive`` of that commit, as tests/integration/test_release_upgrade.py does for the old operator) and
go first on the workers' ``PYTHONPATH``: the workers run the 0.1.0 ``llm_elastic`` and ``llm_trainer``, as an
image a team built months ago does. Proof that they do: their metrics serve no contract gauge (0.1.0 had
none; today's runtime serves ``llm_trainer_contract_version``), and the operator, which reads that as
contract 1, serves the job (no ``RuntimeUnsupported``).

Then the in-process story of tests/integration/test_e2e_live.py: a node is lost, the survivor keeps its pod
and its process, the replacement joins, and the audit finds no step replayed. A runtime outside the
operator's range is refused by the pass's pure step (tests/unit/test_contract_skew.py): no cluster needed.
"""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest
from llm_elastic import contract
from llm_operator.policy.skew import CONDITION
from llm_testbed import training
from llm_testbed.release.previous import export_tree, previous_release
from support.wait import wait_for

from .e2e_support import JOB, STEP_TIMEOUT, Training

pytestmark = [pytest.mark.cluster, pytest.mark.trainer, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]


def _old_runtime(tmp_path: Path) -> tuple[str, Path]:
    old = previous_release((ROOT / "CHANGELOG.md").read_text())
    tree = export_tree(ROOT, old.commit, ["runtime", "trainer"], tmp_path / f"release-{old.version}")
    return old.version, tree


def _metrics(pod: dict[str, object]) -> str:
    ip = pod["status"]["podIP"]  # type: ignore[index]
    with urllib.request.urlopen(f"http://{ip}:{contract.METRICS_PORT}/metrics", timeout=5) as answer:
        return str(answer.read().decode())


def test_skew_previous_release_runtime_trains_in_process_through_a_node_loss(
    train: Training, tmp_path: Path
) -> None:
    version, tree = _old_runtime(tmp_path)
    job = training.training_job(JOB, train.ns, minimum=1, maximum=2, steps=100000, recovery="inProcess")
    old_path = f"{tree / 'runtime'}:{tree / 'trainer'}:$(PYTHONPATH)"  # the pod runner expands it
    job["spec"]["env"] = [*job["spec"].get("env", []), {"name": "PYTHONPATH", "value": old_path}]
    train.apply(job)
    first = train.wait_steps(f"5 steps at world size 2 on the {version} runtime", world=2, count=5)
    pids_before = set(first[-1]["pids"])
    assert len(pids_before) == 2, first[-1]

    # The workers speak the previous release's contract, and the operator serves it.
    served = _metrics(train.worker_on(0))
    assert f"{contract.METRIC_PREFIX}step" in served, served[:2000]
    assert contract.CONTRACT_METRIC not in served, f"not the {version} runtime:\n{served[:2000]}"
    wait_for(
        lambda: (train.status().get("progress") or {}).get("step"), STEP_TIMEOUT, "a probe of the workers"
    )
    status = train.status()
    assert status.get("phase") == "Running", status
    assert CONDITION not in {c["type"] for c in status.get("conditions") or []}, status

    loss = train.lose_node_in_process(pids_before)
    alone, lost_at = loss.alone, loss.lost_at
    assert contract.CONTRACT_METRIC not in _metrics(loss.replacement), (
        "the replacement runs the old runtime too"
    )

    result = train.audit()
    sizes = [(i.world_before, i.world_after) for i in result.interruptions]
    assert (2, 1) in sizes and (1, 2) in sizes, sizes
    assert all(i.replayed == 0 for i in result.interruptions), result.interruptions
    assert {r.get("restart") for r in train.records()} == {0}, "no fallback to a checkpoint"
    assert CONDITION not in {c["type"] for c in train.status().get("conditions") or []}
    print(f"skew: {version} runtime under today's operator, lost node -> survivor's step "
          f"{alone[0]['time'] - lost_at:.2f} s; {result.summary()}")  # fmt: skip
