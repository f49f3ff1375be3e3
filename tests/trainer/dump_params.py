"""Test helper (run under torchrun or alone): load a checkpoint at this world size, write the full params.

``python dump_params.py CHECKPOINT_STEP_DIR MODEL PARALLEL OUT`` builds the model exactly like the trainer
(``llm_trainer.train.build`` and its wrap policy: DDP, or FSDP2 over every rank at the current world size),
loads the checkpoint through ``Checkpointer.load`` (DCP resharding), gathers every parameter in full and
rank 0 writes them with ``torch.save``.
"""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from llm_elastic import read_contract
from llm_elastic.checkpoint import Checkpointer, CheckpointInfo, read_marker
from llm_elastic.wrap import WrapContext
from llm_trainer.config import TrainConfig, model_config
from llm_trainer.train import build
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict


def main(step_path: str, model_name: str, parallel: str, out: str) -> int:
    contract = read_contract()
    if contract.mode == "standalone":
        from torch._C._distributed_c10d import HashStore

        dist.init_process_group("gloo", store=HashStore(), rank=0, world_size=1)
    else:
        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    path = Path(step_path)
    meta = read_marker(path)
    assert meta is not None, f"{path} is not a complete checkpoint"
    cfg = TrainConfig(model=model_name, parallel=parallel, seed=999)
    model, optimizer, policy = build(cfg, model_config(model_name), contract, cuda=False, bf16=False)
    gen = WrapContext(world, rank, torch.device("cpu"), "gloo", timedelta(seconds=120))
    wrapped = policy.wrap(model, [optimizer], gen)
    Checkpointer(path.parent, keep=1, rank=rank).load(
        CheckpointInfo(int(meta["step"]), path, meta), wrapped.base, None
    )
    full = get_model_state_dict(
        wrapped.base, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    if rank == 0:
        torch.save({k: v.clone() for k, v in full.items()}, out)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
