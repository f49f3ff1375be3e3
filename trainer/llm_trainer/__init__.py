"""Elastic LLM trainer: a Llama-style model, deterministic data order, DCP checkpoints, etcd v3 rendezvous."""

__version__ = "0.1.0"
