"""A process's long-lived heap kept out of the cyclic garbage collector's passes while jobs run.

A Dask scheduler or worker process holds about 10^5 long-lived objects (the cluster's state, the
imported modules), and CPython's full (generation 2) collection walks every one of them. With hollow
workers at W = 64 (``bench.hollow``) one came about every 60 clocks in each process and took 85-210 ms
on the scheduler and 40-210 ms in a worker process: a clock two to three times its length, and on the
scheduler a stall after which every running shard looks late to the backup policy. ``gc.freeze`` moves
every object tracked at that moment to the permanent generation, which no collection walks; what a
job allocates afterwards is collected as before. When the last job of the process ends, ``gc.unfreeze``
puts the frozen objects back, so cycles among them that became garbage meanwhile are collected then:
nothing is kept for good. (A process that froze objects itself has them unfrozen then too.)
"""
from __future__ import annotations

import gc
import threading
from typing import Hashable

_lock = threading.Lock()
#: what holds the heap frozen now (a job on the scheduler, a job on one worker of the process)
_holders: set[Hashable] = set()


def hold(key: Hashable) -> None:
    """``key`` (a running job) holds the heap frozen; the first holder freezes it (idempotent per key)."""
    with _lock:
        if key in _holders:
            return
        if not _holders:
            gc.freeze()
        _holders.add(key)


def release(key: Hashable) -> None:
    """``key`` no longer holds the heap frozen; after the last holder it is unfrozen (a key that holds
    nothing is ignored)."""
    with _lock:
        if key not in _holders:
            return
        _holders.discard(key)
        if not _holders:
            gc.unfreeze()


def holders() -> int:
    """How many keys hold the heap frozen now."""
    with _lock:
        return len(_holders)
