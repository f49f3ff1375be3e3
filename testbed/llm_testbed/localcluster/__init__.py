"""The local control plane: pinned upstream binaries, a kwok cluster, failure injection."""
