"""Test helper (run under torchrun or alone): load a checkpoint at this world size, write the full params.

``python dump_params.py CHECKPOINT_STEP_DIR MODEL PARALLEL OUT`` builds the model exactly like the trainer
(DDP or FSDP2 at the current world size), loads the checkpoint through ``Checkpointer.load`` (DCP
resharding), gathers every parameter in full and rank 0 writes them with ``torch.save``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from llm_elastic.checkpoint import Checkpointer, CheckpointInfo, read_marker
from llm_trainer.config import model_config
from llm_trainer.distributed import build_model, init_distributed
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict


def main(step_path: str, model_name: str, parallel: str, out: str) -> int:
    env = init_distributed(120)
    path = Path(step_path)
    meta = read_marker(path)
    assert meta is not None, f"{path} is not a complete checkpoint"
    model = build_model(model_config(model_name), env, parallel, bf16=False, seed=999, compile_model=False)
    Checkpointer(path.parent, keep=1, rank=env.rank).load(
        CheckpointInfo(int(meta["step"]), path, meta), model, None
    )
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if env.rank == 0:
        torch.save({k: v.clone() for k, v in full.items()}, out)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
