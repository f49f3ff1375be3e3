"""Rendezvous for torchrun on the etcd v3 API (backend + c10d store) and a standalone TCPStore server."""
