"""Pre-tokenized token shards: flat binary files of token ids plus a ``meta.json`` written last.

A sample is ``seq_len + 1`` consecutive tokens of one shard (inputs and next-token targets); shard ``k``
holds ``(tokens_k - 1) // seq_len`` samples and sample ids number them across shards in order. Shards are
memory-mapped, so every rank reads only the samples it trains on.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

META_FILE = "meta.json"
FORMAT = "llm-trainer-shards"
VERSION = 1


@dataclass(frozen=True)
class ShardMeta:
    """The contents of ``meta.json``."""

    dtype: str
    """numpy dtype of the token ids: uint16 or uint32."""
    vocab_size: int
    """Number of ids the tokenizer can produce."""
    eos_id: int
    """Id placed after every document."""
    tokenizer: str
    """Which tokenizer made the shards."""
    files: tuple[str, ...]
    """Shard file names, in order."""
    tokens: tuple[int, ...]
    """Token count of each shard."""


def dtype_for(vocab_size: int) -> str:
    """The smallest unsigned dtype that holds every id."""
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


class ShardWriter:
    """Append token ids; cut a new shard file every ``shard_tokens``; :meth:`close` writes ``meta.json``."""

    def __init__(self, folder: Path, vocab_size: int, eos_id: int, tokenizer: str, shard_tokens: int) -> None:
        if shard_tokens < 2:
            raise ValueError("shard_tokens must be at least 2")
        self.folder = folder
        self.vocab_size = vocab_size
        self.eos_id = eos_id
        self.tokenizer = tokenizer
        self.shard_tokens = shard_tokens
        self.dtype = np.dtype(dtype_for(vocab_size))
        self._buffer: list[int] = []
        self._files: list[str] = []
        self._counts: list[int] = []
        folder.mkdir(parents=True, exist_ok=True)
        (folder / META_FILE).unlink(missing_ok=True)

    def add(self, ids: Iterable[int]) -> None:
        """Append ids (one document, already followed by EOS)."""
        self._buffer.extend(ids)
        while len(self._buffer) >= self.shard_tokens:
            self._flush(self._buffer[: self.shard_tokens])
            del self._buffer[: self.shard_tokens]

    def _flush(self, ids: list[int]) -> None:
        name = f"shard-{len(self._files):05d}.bin"
        array = np.asarray(ids, dtype=np.int64)
        if array.size and (array.min() < 0 or array.max() >= self.vocab_size):
            raise ValueError(f"token id out of range 0..{self.vocab_size - 1}")
        path = self.folder / name
        with path.open("wb") as handle:
            handle.write(array.astype(self.dtype).tobytes())
            handle.flush()
            os.fsync(handle.fileno())
        self._files.append(name)
        self._counts.append(len(ids))

    def close(self) -> ShardMeta:
        """Write the last shard and ``meta.json`` (atomically, last)."""
        if self._buffer:
            self._flush(self._buffer)
            self._buffer = []
        meta = ShardMeta(
            self.dtype.name,
            self.vocab_size,
            self.eos_id,
            self.tokenizer,
            tuple(self._files),
            tuple(self._counts),
        )
        body = {
            "format": FORMAT,
            "version": VERSION,
            "dtype": meta.dtype,
            "vocab_size": meta.vocab_size,
            "eos_id": meta.eos_id,
            "tokenizer": meta.tokenizer,
            "shards": [{"file": f, "tokens": n} for f, n in zip(meta.files, meta.tokens, strict=True)],
        }
        tmp = self.folder / (META_FILE + ".tmp")
        tmp.write_text(json.dumps(body, indent=1) + "\n")
        tmp.replace(self.folder / META_FILE)
        return meta


def read_meta(folder: Path) -> ShardMeta:
    """Parse ``meta.json``; raises ``ValueError`` with the folder name when it is missing or malformed."""
    path = folder / META_FILE
    try:
        body = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(
            f"{folder} has no {META_FILE}: make it with `python -m llm_trainer prepare`"
        ) from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from None
    if body.get("format") != FORMAT or body.get("version") != VERSION:
        raise ValueError(f"{path} is not a {FORMAT} v{VERSION} file")
    shards = body["shards"]
    return ShardMeta(
        str(body["dtype"]),
        int(body["vocab_size"]),
        int(body["eos_id"]),
        str(body["tokenizer"]),
        tuple(str(s["file"]) for s in shards),
        tuple(int(s["tokens"]) for s in shards),
    )


class TokenShards:
    """Samples of ``seq_len + 1`` tokens from memory-mapped shards."""

    def __init__(self, folder: Path, seq_len: int) -> None:
        if seq_len < 1:
            raise ValueError("seq_len must be at least 1")
        self.folder = folder
        self.seq_len = seq_len
        self.meta = read_meta(folder)
        self._maps = [
            np.memmap(folder / name, dtype=self.meta.dtype, mode="r", shape=(count,))
            for name, count in zip(self.meta.files, self.meta.tokens, strict=True)
        ]
        per_shard = [max(0, (count - 1) // seq_len) for count in self.meta.tokens]
        self._starts = np.cumsum([0, *per_shard])
        self.num_samples = int(self._starts[-1])
        if self.num_samples == 0:
            raise ValueError(f"{folder} holds fewer than {seq_len + 1} tokens per shard: no sample fits")

    @property
    def fingerprint(self) -> str:
        """Identifies the data and sample length (stored with the data position in checkpoints)."""
        text = json.dumps([self.meta.files, self.meta.tokens, self.meta.tokenizer, self.seq_len])
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def sample(self, sample_id: int) -> npt.NDArray[np.int64]:
        """Tokens of one sample (``seq_len + 1`` ids)."""
        if not 0 <= sample_id < self.num_samples:
            raise IndexError(f"sample {sample_id} out of range 0..{self.num_samples - 1}")
        shard = int(np.searchsorted(self._starts, sample_id, side="right")) - 1
        offset = (sample_id - int(self._starts[shard])) * self.seq_len
        return np.asarray(self._maps[shard][offset : offset + self.seq_len + 1], dtype=np.int64)
