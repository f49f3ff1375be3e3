"""``python -m llm_trainer``: train (the default, under torchrun) or ``prepare`` token shards."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence


def _setup_logging() -> None:
    rank = os.environ.get("RANK", "0")
    logging.basicConfig(
        level=logging.INFO if rank == "0" else logging.WARNING,
        format=f"[trainer r{rank}] %(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def train_main(argv: Sequence[str]) -> int:
    """Parse, build, train, close."""
    from llm_trainer.cli import parse_train_args

    cfg = parse_train_args(argv)  # exits 2 on bad input, before torch is imported
    _setup_logging()
    import torch.distributed as dist

    from llm_trainer.distributed import init_distributed
    from llm_trainer.signals import StopRequest
    from llm_trainer.train import Trainer

    stop = StopRequest().install()
    env = init_distributed(cfg.dist_timeout)
    try:
        try:
            trainer = Trainer(cfg, env, stop)
            trainer.restore()
        except ValueError as exc:  # settings that only the data or the checkpoint can reveal
            logging.getLogger("llm_trainer").error("%s", exc)
            return 1
        return trainer.train()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


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
