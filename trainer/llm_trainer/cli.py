"""Command line of the trainer, generated from ``TrainConfig`` (field docstrings become the help text).

``python -m llm_trainer [train] [--option value ...]`` trains; ``python -m llm_trainer prepare ...`` makes
token shards (``llm_trainer.data.prepare``). Bad input prints one line naming the option and exits 2.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import itertools
import textwrap
from collections.abc import Sequence
from typing import Any

from llm_elastic import ExitOnErrorParser, usage_error

from llm_trainer.config import TrainConfig

PROG = "python -m llm_trainer"


def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of a dataclass, read from its source (empty if unavailable)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError):
        return {}
    docs: dict[str, str] = {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    for node, following in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            docs[node.target.id] = " ".join(following.value.value.split())
    return docs


def _option(name: str) -> str:
    return "--" + name.replace("_", "-")


def _bool(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, not {text!r}")


def build_parser() -> argparse.ArgumentParser:
    """One option per ``TrainConfig`` field, typed from the field's default."""
    parser = ExitOnErrorParser(prog=PROG, description="Train a Llama-style model (run under torchrun).")
    docs = field_docs(TrainConfig)
    defaults = TrainConfig()
    for field in dataclasses.fields(TrainConfig):
        default = getattr(defaults, field.name)
        kind: Any = type(default)
        help_text = docs.get(field.name, "")
        if kind is bool:
            parser.add_argument(
                _option(field.name),
                type=_bool,
                nargs="?",
                const=True,
                default=default,
                metavar="BOOL",
                help=f"{help_text} (default: {default})",
            )
        else:
            parser.add_argument(
                _option(field.name),
                type=kind,
                default=default,
                metavar=field.name.upper(),
                help=f"{help_text} (default: {default!r})" if default != "" else help_text,
            )
    return parser


def parse_train_args(argv: Sequence[str]) -> TrainConfig:
    """Parse and validate; on bad input print one line naming the option and exit 2."""
    namespace = build_parser().parse_args(list(argv))
    config = TrainConfig(**vars(namespace)).resolved()
    problems = config.problems()
    if problems:
        name, message = problems[0]
        usage_error(PROG, f"argument {_option(name)}: {message}")
    return config
