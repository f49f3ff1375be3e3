"""Tokenizers for ``prepare``: the built-in byte-level one, or a local ``tokenizer.json`` (optional import).

Nothing is downloaded: a Hugging Face tokenizer is read from a file path given on the command line.
"""

from __future__ import annotations

import hashlib
import importlib
from pathlib import Path
from typing import Any, Protocol


class Tokenizer(Protocol):
    """What ``prepare`` needs from a tokenizer."""

    name: str
    """A short description recorded in the shard metadata."""
    vocab_size: int
    """Number of ids the tokenizer can produce."""
    eos_id: int
    """Id appended after every document."""

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no special tokens added)."""
        ...


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255; 256 is BOS, 257 is EOS."""

    name = "bytes"
    vocab_size = 258
    bos_id = 256
    eos_id = 257

    def encode(self, text: str) -> list[int]:
        """The UTF-8 bytes of ``text``."""
        return list(text.encode("utf-8"))


class JsonTokenizer:
    """A ``tokenizers`` library tokenizer loaded from a local ``tokenizer.json``."""

    def __init__(self, path: Path, eos_token: str | None = None) -> None:
        try:
            library: Any = importlib.import_module("tokenizers")
        except ImportError as exc:
            raise RuntimeError(
                "a tokenizer.json needs the 'tokenizers' package: pip install tokenizers"
            ) from exc
        self._tok: Any = library.Tokenizer.from_file(str(path))
        digest = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
        self.name = f"tokenizer.json:{digest}"
        self.vocab_size = int(self._tok.get_vocab_size(with_added_tokens=True))
        self.eos_id = self._find_eos(eos_token)

    def _find_eos(self, eos_token: str | None) -> int:
        candidates = [eos_token] if eos_token else ["</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>"]
        for token in candidates:
            token_id = self._tok.token_to_id(token)
            if token_id is not None:
                return int(token_id)
        if eos_token:
            raise ValueError(f"token {eos_token!r} is not in the tokenizer's vocabulary")
        # No end-of-text token: reserve one id past the vocabulary.
        self.vocab_size += 1
        return self.vocab_size - 1

    def encode(self, text: str) -> list[int]:
        """Ids from the tokenizer, without its post-processor's special tokens."""
        return [int(i) for i in self._tok.encode(text, add_special_tokens=False).ids]


def load_tokenizer(path: str | None, eos_token: str | None = None) -> Tokenizer:
    """The byte tokenizer when ``path`` is empty, else the ``tokenizer.json`` at ``path``."""
    if not path:
        return ByteTokenizer()
    return JsonTokenizer(Path(path), eos_token)
