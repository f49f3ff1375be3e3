"""The release folder: built under ``<version>.partial`` and renamed when whole, checksums, the summary."""

from __future__ import annotations

import hashlib
import shutil
from dataclasses import dataclass
from pathlib import Path

CHECKSUMS = "SHA256SUMS"


@dataclass(frozen=True)
class ReleaseFolder:
    """``<out>/<version>/``; until every artifact is in, its contents live in ``<version>.partial``, so a
    failed run never leaves a folder that looks like a release."""

    out: Path
    version: str

    @property
    def final(self) -> Path:
        return self.out / self.version

    @property
    def work(self) -> Path:
        return self.out / f"{self.version}.partial"

    @property
    def logs(self) -> Path:
        """Logs of the steps, beside the release (never inside it)."""
        return self.out / "logs" / self.version

    def start(self) -> Path:
        shutil.rmtree(self.work, ignore_errors=True)
        self.work.mkdir(parents=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        return self.work

    def finish(self) -> Path:
        write_checksums(self.work)
        shutil.rmtree(self.final, ignore_errors=True)
        self.work.rename(self.final)
        return self.final


def files(folder: Path) -> list[Path]:
    """Every file under ``folder``, as paths relative to it, sorted."""
    return sorted(p.relative_to(folder) for p in folder.rglob("*") if p.is_file())


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_checksums(folder: Path) -> Path:
    """``SHA256SUMS`` of every other file, in ``sha256sum`` format: ``sha256sum -c SHA256SUMS`` checks it."""
    lines = [f"{sha256(folder / rel)}  {rel}\n" for rel in files(folder) if str(rel) != CHECKSUMS]
    target = folder / CHECKSUMS
    target.write_text("".join(lines))
    return target


def human(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def summary(folder: Path) -> list[str]:
    """One line per file with its size, then the total."""
    rows = [(str(rel), (folder / rel).stat().st_size) for rel in files(folder)]
    width = max((len(name) for name, _ in rows), default=0)
    lines = [f"  {name:<{width}}  {human(size):>10}" for name, size in rows]
    total = sum(size for _, size in rows)
    lines.append(f"  {'total (' + str(len(rows)) + ' files)':<{width}}  {human(total):>10}")
    return lines
