"""Helpers for the trainer's tests and benchmarks (a local etcd, free ports); not used in training."""
