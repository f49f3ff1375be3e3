"""The pre-flight checkpoint-write probe on a folder every worker checks at once (a shared file system)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from llm_elastic.health import check_checkpoint_dir


def test_workers_probing_one_shared_folder_at_once_do_not_collide(tmp_path: Path) -> None:
    """Threads of one process share a PID, as the trainers of two pods often do (a PID namespace each):
    a probe file named after the PID made one worker delete the other's and fail its pre-flight."""
    folder = tmp_path / "checkpoints" / "job"
    with ThreadPoolExecutor(max_workers=8) as pool:
        findings = list(pool.map(lambda _: check_checkpoint_dir(folder, max_seconds=60.0), range(8)))
    assert findings == [None] * 8
    assert list(folder.iterdir()) == [], "every probe file is removed"


def test_a_folder_that_cannot_be_written_is_a_finding(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    finding = check_checkpoint_dir(blocker / "checkpoints", max_seconds=60.0)
    assert finding is not None and finding.check == "checkpoint-write"
    assert str(blocker / "checkpoints") in finding.reason
