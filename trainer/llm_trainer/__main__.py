"""``python -m llm_trainer``: train (the default, under torchrun) or ``prepare`` token shards."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence


def _setup_logging() -> None:
    # In process every member logs (ranks change per generation); under torchrun rank 0 logs INFO.
    rank = os.environ.get("RANK", "0")
    live = bool(os.environ.get("LLMJOB_LIVE_ETCD"))
    who = os.environ.get("LLMJOB_POD_NAME", "") if live else f"r{rank}"
    from llm_elastic import configure_logging  # LLMJOB_LOG_FORMAT=json: one JSON object per line

    configure_logging(
        os.environ.get("LOGLEVEL", "INFO").upper() if live else ("INFO" if rank == "0" else "WARNING"),
        text_format=f"[trainer {who}] %(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def train_main(argv: Sequence[str]) -> int:
    """Parse, build, train, close."""
    from llm_trainer.cli import parse_train_args

    cfg = parse_train_args(argv)  # exits 2 on bad input, before torch is imported
    _setup_logging()
    from llm_elastic import StateLost

    from llm_trainer.train import Trainer

    try:
        trainer = Trainer(cfg)
    except ValueError as exc:  # settings that only the data can reveal
        logging.getLogger("llm_trainer").error("%s", exc)
        return 1
    try:
        return trainer.train()
    except StateLost as exc:  # a checkpoint of other data or settings
        logging.getLogger("llm_trainer").error("%s", exc)
        return 1


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch ``prepare`` or training."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "prepare":
        from llm_trainer.data.prepare import main as prepare_main

        return prepare_main(args[1:])
    if args and args[0] == "train":
        args = args[1:]
    return train_main(args)


if __name__ == "__main__":
    sys.exit(main())
