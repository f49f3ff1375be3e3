"""Unpack a tar archive that we made ourselves (``git archive``, an sdist) without trusting its paths.

Python 3.11.4 added extraction filters (``filter="data"``); Debian 12's Python is 3.11.2, where
``extractall`` takes no ``filter`` (a fresh-clone run with it failed the release, upgrade and skew tests).
Where the filter exists it is used; elsewhere the same rule is checked here first: regular files, folders
and links that stay inside ``dest``, nothing absolute, no ``..``, no device or fifo.
"""

from __future__ import annotations

import tarfile
from pathlib import Path, PurePosixPath

from llm_testbed.release.errors import ReleaseError


def unsafe_member(member: tarfile.TarInfo) -> str | None:
    """Why ``member`` may not be unpacked, or None (pure)."""
    path = PurePosixPath(member.name)
    if path.is_absolute() or ".." in path.parts:
        return f"{member.name}: a path outside the destination"
    if not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
        return f"{member.name}: not a file, folder or link"
    if member.issym() or member.islnk():
        target = PurePosixPath(member.linkname)
        inside = target if member.islnk() else path.parent / target
        if target.is_absolute() or ".." in PurePosixPath(*inside.parts).parts:
            return f"{member.name}: a link to {member.linkname}, outside the destination"
    return None


def extract_all(archive: tarfile.TarFile, dest: Path) -> None:
    """Unpack ``archive`` into ``dest``; :class:`ReleaseError` naming the first member that would escape."""
    if hasattr(tarfile, "data_filter"):
        archive.extractall(dest, filter="data")
        return
    members = archive.getmembers()
    for member in members:
        why = unsafe_member(member)
        if why is not None:
            raise ReleaseError(f"refusing to unpack {why}")
    archive.extractall(dest, members=members)  # noqa: S202 - every member was checked above
