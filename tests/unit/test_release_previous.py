"""The previous release as CHANGELOG.md names it (llm_testbed.release.previous)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from llm_testbed.release.errors import ReleaseError
from llm_testbed.release.previous import export_tree, previous_release

ROOT = Path(__file__).resolve().parents[2]
LOG = (
    "# Changelog\n\n## [Unreleased]\n\n- x\n\n## [0.2.0] - 2027-01-01\n\nCommit `abc1234` (main).\n\n"
    "## [0.1.0]\n\nCommit `b333866`.\n"
)


def test_the_newest_released_section_and_its_commit() -> None:
    release = previous_release(LOG)
    assert (release.version, release.commit) == ("0.2.0", "abc1234")


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("# Changelog\n\n## [Unreleased]\n", "no released section"),
        ("## [0.3.0] - d\n\nno hash\n## [0.2.0]\nCommit `abc1234`", "[0.3.0] names no commit"),
    ],
)
def test_a_changelog_without_an_upgrade_path_says_why(text: str, says: str) -> None:
    with pytest.raises(ReleaseError, match=re.escape(says)):
        previous_release(text)


def test_a_missing_commit_names_the_reason(tmp_path: Path) -> None:
    with pytest.raises(ReleaseError, match=r"is missing: .*fetch the full history"):
        export_tree(ROOT, "0" * 40, ["crds"], tmp_path)
