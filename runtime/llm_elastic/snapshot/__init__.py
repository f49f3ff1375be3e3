"""In-memory snapshots in host shared memory, replicated to a buddy node (see ``manager``)."""
