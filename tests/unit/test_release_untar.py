"""Unpacking our own archives on a Python without extraction filters (Debian 12's 3.11.2)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest
from llm_testbed.release import untar
from llm_testbed.release.errors import ReleaseError


def _archive(*members: tarfile.TarInfo) -> tarfile.TarFile:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for member in members:
            tar.addfile(member, io.BytesIO(b"x" * member.size) if member.isfile() else None)
    buffer.seek(0)
    return tarfile.open(fileobj=buffer)


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.size = kind, link, 1 if kind == tarfile.REGTYPE else 0
    return info


@pytest.mark.parametrize(
    ("member", "why"),
    [
        (_member("a/b.txt"), None),
        (_member("a", tarfile.DIRTYPE), None),
        (_member("a/l", tarfile.SYMTYPE, "b.txt"), None),
        (_member("/etc/passwd"), "/etc/passwd: a path outside the destination"),
        (_member("a/../../x"), "a/../../x: a path outside the destination"),
        (_member("a/l", tarfile.SYMTYPE, "/etc"), "a/l: a link to /etc, outside the destination"),
        (_member("a/l", tarfile.SYMTYPE, "../../etc"), "a/l: a link to ../../etc, outside the destination"),
        (_member("dev", tarfile.CHRTYPE), "dev: not a file, folder or link"),
    ],
)
def test_members_that_could_escape_are_named(member: tarfile.TarInfo, why: str | None) -> None:
    assert untar.unsafe_member(member) == why


def test_without_filters_a_bad_member_stops_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delattr(tarfile, "data_filter", raising=False)
    with (
        _archive(_member("ok.txt"), _member("../escape.txt")) as tar,
        pytest.raises(ReleaseError, match="escape"),
    ):
        untar.extract_all(tar, tmp_path / "out")
    assert not (tmp_path / "out" / "ok.txt").exists() and not (tmp_path / "escape.txt").exists()
    with _archive(_member("ok.txt")) as tar:
        untar.extract_all(tar, tmp_path / "out")
    assert (tmp_path / "out" / "ok.txt").read_bytes() == b"x"
