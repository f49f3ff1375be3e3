"""The collection that frees a closed generation, kept cheap: the heap is frozen at each generation boundary.

A generation's process groups can stay referenced from reference cycles (the failed step's frames, the
wrapped module's hooks, the autograd graph), so their connections, which a peer may still be blocked on, close
only when a collection runs (``docs/decisions.md``, "live recovery: HSDP"). A full collection of a process
that imported torch scans every object it ever made: 160-300 ms on a 2-core VM, on the path from a lost peer
to the next step. :func:`settle` collects, then moves what survives to the interpreter's permanent
generation (:func:`gc.freeze`), so each later collection scans only what was made since: the closed
generation's module, groups and frames (decision LM2). Frozen objects are still freed by reference counting;
only garbage cycles among them wait until :func:`gc.unfreeze`, which runs at exit so the interpreter's last
collection sees everything.
"""

from __future__ import annotations

import atexit
import gc

_thaw_at_exit = False


def freeze() -> None:
    """Leave what exists now out of every later collection (first call: thaw again at exit)."""
    global _thaw_at_exit
    if not _thaw_at_exit:
        atexit.register(gc.unfreeze)
        _thaw_at_exit = True
    gc.freeze()


def settle() -> int:
    """Collect the garbage cycles made since the last freeze, then freeze the survivors; returns how many
    unreachable objects the collection found."""
    found = gc.collect()
    freeze()
    return found
