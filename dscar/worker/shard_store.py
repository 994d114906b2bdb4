"""The shards one worker holds for one job, and the new states its attempts staged.

Pure (no Dask). A shard's state is its state as of the last applied pass: an
attempt's new state waits in ``pending`` and is installed only when the pass is
applied and the coordinator names that attempt as the shard's committed one
(``install``: the winner's worker installs it, every other copy of the shard is
stale and dropped). An attempt on another worker than the holder runs from a
copy (asked by the peer), and the holder keeps its own until then. So until
the pass is applied every attempt (a backup, a steal, a pass run again after a
loss) starts from the state as of the pass's start, and no attempt, however
late, can leave the holder without the shard.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

from ..xp import is_array, to_host

@dataclass
class ShardEntry:
    """A shard's data and its state as of its last applied commit (e.g. topic assignments)."""

    #: the prepared arrays (and whatever a step keeps with them, e.g. a cache)
    data: dict[str, Any]
    #: name -> array, replaced only when a pass is applied
    state: dict[str, Any] = field(default_factory=dict)

    def movable(self) -> tuple[dict, dict]:
        """Host copies of what travels when the shard moves: its arrays (a cache a step keeps with
        its data, such as Lasso's Gram of the columns seen, stays behind and is rebuilt) and state."""
        return {k: to_host(v) for k, v in self.data.items() if is_array(v)}, self.host_state()

    def host_state(self) -> dict:
        """The state on the host (no copy where it is there already: a state is replaced, never written into)."""
        return {k: to_host(v) for k, v in self.state.items()}


class ShardStore:
    """Shards held here (``shards``) and the pending new states of attempts run here."""

    def __init__(self, lock: threading.RLock | None = None):
        #: guards every field; shared with the job's partition store, so a pass applies atomically
        self.lock = lock if lock is not None else threading.RLock()
        #: shard -> its data and state, held here
        self.shards: dict[int, ShardEntry] = {}
        #: (clock, shard, attempt) -> (entry, new state) of attempts run here, installed if they commit
        self.pending: dict[tuple[int, int, int], tuple[ShardEntry, dict]] = {}
        #: shard -> (run, clock) of the newest commit of it applied here (its state installed, or the
        #: copy here dropped for the winner's): attempts of that pass or clock, or older, lost
        self.settled: dict[int, tuple[int, int]] = {}

    def put(self, shard: int, entry: ShardEntry) -> None:
        with self.lock:
            self.shards[int(shard)] = entry

    def drop(self, shard: int) -> ShardEntry | None:
        """Forget the shard held here (its holder is another worker now); what was held (None: nothing)."""
        with self.lock:
            return self.shards.pop(int(shard), None)

    def get(self, shard: int) -> ShardEntry | None:
        """The shard held here (None: not held), e.g. for a peer to copy; it stays held."""
        with self.lock:
            return self.shards.get(int(shard))

    def claim(self, shard: int, fetch_from: str | None, backup: bool) -> ShardEntry | None:
        """The entry an attempt runs from without fetching, or None: copy it from ``fetch_from``
        (the holder) or read it from the source.

        Told to fetch elsewhere, a copy held here is stale (an attempt of ours lost the commit,
        or arrived late): it is dropped. A backup on the holder runs from a copy of the entry
        (fresh state dict), the primary from the entry itself."""
        with self.lock:
            if fetch_from:
                self.shards.pop(shard, None)
                return None
            entry = self.shards.get(shard)
        if entry is None or not backup:
            return entry
        return ShardEntry(entry.data, dict(entry.state))

    def stage_state(self, key: tuple[int, int, int], entry: ShardEntry, new_state: dict) -> None:
        """Keep an attempt's new state until its pass is applied."""
        with self.lock:
            self.pending[tuple(key)] = (entry, dict(new_state))

    def lost(self, shard: int, run: int, clock: int) -> bool:
        """Whether an attempt of ``shard`` in ``clock`` under ``run`` can no longer commit: a commit
        of the shard of that run and clock or a newer one was applied here (``install``). A copy
        of the shard taken now would not be the state that attempt must start from."""
        with self.lock:
            return self.settled.get(int(shard), (-1, -1)) >= (int(run), int(clock))

    def install(self, committed: Iterable, me: str, drop_through: int, run: int = -1) -> None:
        """Apply a pass's (or an SSP batch's) shard side: for each committed ``(shard, attempt,
        worker, clock)`` the winner (``worker == me``) installs its attempt's state, any other copy
        held here is dropped; then every pending state of those shards up to their clock, and
        every pending state of a clock up to ``drop_through``, is dropped (no attempt of them
        can commit any more). ``run``: the pass's (or batch's) run id, kept per shard (``lost``)."""
        with self.lock:
            done: dict[int, int] = {}
            for shard, attempt, worker, clock in committed:
                key = (int(clock), int(shard), int(attempt))
                done[int(shard)] = int(clock)
                self.settled[int(shard)] = max(self.settled.get(int(shard), (-1, -1)), (int(run), int(clock)))
                if worker == me:
                    if key in self.pending:  # (not after this worker forgot the job: a simulated loss)
                        entry, new_state = self.pending[key]
                        entry.state = {**entry.state, **new_state}
                        self.shards[int(shard)] = entry
                else:
                    self.shards.pop(int(shard), None)
            for key in [k for k in self.pending if k[0] <= drop_through or k[0] <= done.get(k[1], -1)]:
                del self.pending[key]

    def states(self, shards: Iterable[int]) -> dict[int, dict[str, np.ndarray]]:
        """Host copies of the (non-empty) states of ``shards`` held here: a checkpoint's share."""
        with self.lock:
            return {s: {k: to_host(v).copy() for k, v in self.shards[s].state.items()}
                    for s in sorted(map(int, shards)) if s in self.shards and self.shards[s].state}

    def clear(self) -> None:
        """Drop everything, as a crash would (a simulated loss)."""
        with self.lock:
            self.shards.clear()
            self.pending.clear()
            self.settled.clear()
