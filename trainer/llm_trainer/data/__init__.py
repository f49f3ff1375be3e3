"""Token shards on shared storage, the deterministic global sample order and the per-rank batches."""
