"""Snapshot shards in host shared memory: one payload file and one header file per shard and slot.

A shard is the local part of every tensor of one rank's training state, packed into one byte payload
(64-byte aligned entries). ``<kind>-r<rank>.s<slot>.bin`` holds the payload, ``...json`` the header (step,
where each tensor lies in the payload, data position, world size, layout). ``kind`` is ``local`` (this
rank's own state) or ``buddy`` (a copy of another node's rank). Each kind has two slots written in turn,
so the previous complete snapshot survives while the next one is written or copied. The header is removed
before the payload is overwritten and written atomically (temp file + rename) after it is complete, so a
header on disk always describes a complete payload: a process killed mid-write leaves no header, never a
torn snapshot. Files in ``/dev/shm`` (tmpfs) outlive the process, so a restarted worker on the same node
finds them; a lost node loses them, which is what the buddy copy is for.
"""

from __future__ import annotations

import contextlib
import json
import logging
import mmap
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

ALIGN = 64
FILE = re.compile(r"^(local|buddy)-r(\d+)\.s([01])\.json$")
SLOTS = (0, 1)

DTYPES: dict[str, torch.dtype] = {
    str(dtype).removeprefix("torch."): dtype
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int32)
}
DTYPES["uint8"] = torch.uint8


def dtype_name(dtype: torch.dtype) -> str:
    """``float32`` for ``torch.float32``."""
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise ValueError(f"snapshot: unsupported dtype {name}")
    return name


@dataclass(frozen=True)
class Entry:
    """Where one tensor lies in a payload."""

    path: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


def layout(tensors: list[tuple[str, torch.Tensor]]) -> tuple[list[Entry], int]:
    """Pack ``(path, tensor)`` pairs into aligned entries; returns the entries and the payload size."""
    entries = []
    offset = 0
    for path, tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        entries.append(Entry(path, dtype_name(tensor.dtype), tuple(tensor.shape), offset, nbytes))
        offset += (nbytes + ALIGN - 1) // ALIGN * ALIGN
    return entries, offset


def entry_view(payload: torch.Tensor, entry: Entry) -> torch.Tensor:
    """The tensor ``entry`` describes, as a view into ``payload`` (a uint8 tensor)."""
    raw = payload[entry.offset : entry.offset + entry.nbytes]
    return raw.view(DTYPES[entry.dtype]).view(entry.shape)


def encode_header(header: dict[str, Any]) -> bytes:
    """JSON bytes of a header."""
    return json.dumps(header, sort_keys=True).encode()


def entries_of(header: dict[str, Any]) -> list[Entry]:
    """The entries listed in a header."""
    return [Entry(e[0], e[1], tuple(e[2]), int(e[3]), int(e[4])) for e in header["entries"]]


def entries_json(entries: list[Entry]) -> list[list[Any]]:
    """Entries as JSON-able lists."""
    return [[e.path, e.dtype, list(e.shape), e.offset, e.nbytes] for e in entries]


class ShardFile:
    """One memory-mapped payload file plus its header, in ``folder``."""

    def __init__(self, folder: Path, kind: str, rank: int, slot: int = 0, pin: bool = False) -> None:
        self.folder = folder
        self.kind = kind
        self.rank = rank
        self.slot = slot
        self.pin = pin
        """Page-lock the mapping for CUDA (device-to-host copies at full speed); best effort."""
        self.pinned = False
        self.payload_path = folder / f"{kind}-r{rank}.s{slot}.bin"
        self.header_path = folder / f"{kind}-r{rank}.s{slot}.json"
        self._map: mmap.mmap | None = None
        self._payload: torch.Tensor | None = None

    def read_header(self) -> dict[str, Any] | None:
        """The header, or None when there is no complete shard."""
        try:
            header = json.loads(self.header_path.read_text())
        except (OSError, ValueError):
            return None
        return header if isinstance(header, dict) else None

    def invalidate(self) -> None:
        """Remove the header (before the payload is overwritten)."""
        with contextlib.suppress(FileNotFoundError):
            self.header_path.unlink()

    def payload(self, size: int) -> torch.Tensor:
        """The payload as a writable uint8 tensor of ``size`` bytes (mapped once; remapped on resize)."""
        if self._payload is not None and self._payload.numel() == size:
            return self._payload
        self.close()
        self.folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.payload_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_size != size:
                os.ftruncate(fd, size)
            self._map = mmap.mmap(fd, max(size, 1))
        finally:
            os.close(fd)
        self._payload = torch.frombuffer(self._map, dtype=torch.uint8, count=size) if size else torch.empty(0)
        if self.pin and size and torch.cuda.is_available():
            cudart = torch.cuda.cudart()  # type: ignore[no-untyped-call]
            code = cudart.cudaHostRegister(self._payload.data_ptr(), size, 0)
            self.pinned = int(code) == 0
            if not self.pinned:
                log.warning(
                    "could not page-lock %s (cudaHostRegister: %s); copies will be slower",
                    self.payload_path,
                    code,
                )
        return self._payload

    def commit(self, header: dict[str, Any]) -> None:
        """Publish the header of the payload just written."""
        tmp = self.header_path.with_suffix(".tmp")
        tmp.write_bytes(encode_header(header))
        tmp.replace(self.header_path)

    def close(self) -> None:
        """Unmap the payload (the files stay)."""
        if self.pinned and self._payload is not None:
            torch.cuda.cudart().cudaHostUnregister(self._payload.data_ptr())  # type: ignore[no-untyped-call]
            self.pinned = False
        self._payload = None
        if self._map is not None:
            with contextlib.suppress(BufferError):
                self._map.close()
            self._map = None


def inventory(folder: Path) -> list[dict[str, Any]]:
    """Headers of every complete shard in ``folder`` (each with ``kind`` and ``slot`` added)."""
    if not folder.is_dir():
        return []
    found = []
    for entry in sorted(folder.iterdir()):
        match = FILE.match(entry.name)
        if not match:
            continue
        kind, rank, slot = match.group(1), int(match.group(2)), int(match.group(3))
        header = ShardFile(folder, kind, rank, slot).read_header()
        if header is not None:
            found.append({**header, "kind": kind, "slot": slot})
    return found


def older_slot(slots: list[ShardFile]) -> ShardFile:
    """The slot to write next: one without a complete shard, else the one with the older step."""

    def age(shard: ShardFile) -> int:
        header = shard.read_header()
        return -1 if header is None else int(header.get("step", -1))

    return min(slots, key=age)
