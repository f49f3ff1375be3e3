"""``python -m llm_trainer prepare``: turn text files into token shards (no downloads).

Each input file is one document; documents are tokenized, followed by the end-of-text id and packed into
shards of ``--shard-tokens`` ids. ``meta.json`` is written last, so an interrupted run leaves no usable
(half) dataset behind.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from llm_elastic import ExitOnErrorParser, usage_error

from llm_trainer.data.shards import ShardWriter
from llm_trainer.data.tokenizer import load_tokenizer

PROG = "python -m llm_trainer prepare"


def build_parser() -> ExitOnErrorParser:
    """The command line of ``prepare``."""
    parser = ExitOnErrorParser(prog=PROG, description="Tokenize text files into memory-mapped token shards.")
    parser.add_argument("inputs", nargs="+", type=Path, help="text files (UTF-8) or folders of *.txt files")
    parser.add_argument("--output", "-o", type=Path, required=True, help="folder to write the shards into")
    parser.add_argument("--tokenizer", default="", help="local tokenizer.json (default: built-in bytes)")
    parser.add_argument("--eos-token", default=None, help="end-of-text token of the tokenizer.json")
    parser.add_argument("--shard-tokens", type=int, default=1 << 24, help="tokens per shard (default: 2^24)")
    return parser


def _expand(inputs: Sequence[Path]) -> list[Path]:
    files: list[Path] = []
    for item in inputs:
        if item.is_dir():
            files.extend(sorted(p for p in item.rglob("*.txt") if p.is_file()))
        elif item.is_file():
            files.append(item)
        else:
            usage_error(PROG, f"argument inputs: {item} does not exist")
    if not files:
        usage_error(PROG, "argument inputs: no text files found")
    return files


def main(argv: Sequence[str]) -> int:
    """Tokenize and write; prints a summary line."""
    args = build_parser().parse_args(list(argv))
    if args.shard_tokens < 2:
        usage_error(PROG, "argument --shard-tokens: must be at least 2")
    if args.tokenizer and not Path(args.tokenizer).is_file():
        usage_error(PROG, f"argument --tokenizer: {args.tokenizer} is not a file")
    files = _expand(args.inputs)
    try:
        tokenizer = load_tokenizer(args.tokenizer or None, args.eos_token)
    except (RuntimeError, ValueError, OSError) as exc:
        usage_error(PROG, f"argument --tokenizer: {exc}")
    writer = ShardWriter(
        args.output, tokenizer.vocab_size, tokenizer.eos_id, tokenizer.name, args.shard_tokens
    )
    total = 0
    for path in files:
        ids = tokenizer.encode(path.read_text(encoding="utf-8", errors="replace"))
        ids.append(tokenizer.eos_id)
        writer.add(ids)
        total += len(ids)
    meta = writer.close()
    print(
        f"prepare: {len(files)} documents, {total} tokens, {len(meta.files)} shards "
        f"({meta.dtype}, vocab {meta.vocab_size}, {meta.tokenizer}) -> {args.output}",
        file=sys.stderr,
    )
    return 0
