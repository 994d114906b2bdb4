"""The shards one worker holds for one job, and the new states its attempts staged.

Pure (no Dask). A shard's state is its state as of the last applied pass: an
attempt's new state waits in ``pending`` and is installed only when the pass is
applied and the coordinator names that attempt as the shard's committed one
(``install``: the winner's worker installs it, every other copy of the shard is
stale and dropped). So until the pass is applied a backup copies the state as of
the pass's start, and a pass run again after a loss starts from it.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

from .xp import to_host

#: how long a backup waits for the new holder of its shard to receive the data
BACKUP_FETCH_WAIT_S = 5.0
#: the same, when the primary's source can be asked next
BACKUP_ALT_WAIT_S = 0.5


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
        return ({k: to_host(v) for k, v in self.data.items() if _is_array(v)},
                {k: to_host(v) for k, v in self.state.items()})


class ShardStore:
    """Shards held here (``shards``) and the pending new states of attempts run here."""

    def __init__(self, lock: threading.RLock | None = None):
        #: guards every field; shared with the job's partition store, so a pass applies atomically
        self.lock = lock if lock is not None else threading.RLock()
        #: shard -> its data and state, held here
        self.shards: dict[int, ShardEntry] = {}
        #: (clock, shard, attempt) -> (entry, new state) of attempts run here, installed if they commit
        self.pending: dict[tuple[int, int, int], tuple[ShardEntry, dict]] = {}

    def put(self, shard: int, entry: ShardEntry) -> None:
        with self.lock:
            self.shards[int(shard)] = entry

    def take(self, shard: int, keep: bool = False) -> ShardEntry | None:
        """Give the shard away (``keep``: lend it, for a backup's copy); None when not held here."""
        with self.lock:
            return self.shards.get(int(shard)) if keep else self.shards.pop(int(shard), None)

    def claim(self, shard: int, fetch_from: str | None, backup: bool, fetch_alt: str | None,
              me: str) -> ShardEntry | None:
        """The entry an attempt runs from without fetching, or None: fetch it (``fetch_sources``).

        A primary attempt told to fetch the shard elsewhere drops a copy held here: it is stale
        (an attempt of ours lost the commit to a backup). A backup copies, never takes: our own
        copy serves when nobody else holds a newer one (no ``fetch_from``), or while its holder
        is still receiving the shard from here (``fetch_alt`` is us)."""
        with self.lock:
            entry = self.shards.get(shard)
            if entry is not None and fetch_from and not backup:
                del self.shards[shard]
                return None
        if entry is None or not backup:
            return entry
        if not fetch_from or fetch_alt == me:
            return ShardEntry(entry.data, dict(entry.state))
        return None

    def stage_state(self, key: tuple[int, int, int], entry: ShardEntry, new_state: dict) -> None:
        """Keep an attempt's new state until its pass is applied."""
        with self.lock:
            self.pending[tuple(key)] = (entry, dict(new_state))

    def install(self, clock: int, committed: Iterable, me: str) -> None:
        """Apply the pass's shard side: for each committed ``(shard, attempt, worker)`` the winner
        (``worker == me``) installs its attempt's state, any other copy held here is dropped; then
        every pending state of this clock or an older one is dropped."""
        with self.lock:
            for shard, attempt, worker in committed:
                key = (clock, int(shard), int(attempt))
                if worker == me:
                    if key in self.pending:  # (not after this worker forgot the job: a simulated loss)
                        entry, new_state = self.pending[key]
                        entry.state = {**entry.state, **new_state}
                        self.shards[int(shard)] = entry
                else:
                    self.shards.pop(int(shard), None)
            for key in [k for k in self.pending if k[0] <= clock]:
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


def fetch_sources(fetch_from: str | None, fetch_alt: str | None, backup: bool,
                  me: str) -> list[tuple[str, float]]:
    """``(worker, wait)`` to ask for a shard, in order: its holder; for a backup, which copies,
    waiting up to ``wait`` for the holder to receive it, then the primary's own source."""
    sources = [(fetch_from, 0.0)] if not backup else [
        (fetch_from, BACKUP_ALT_WAIT_S if fetch_alt else BACKUP_FETCH_WAIT_S), (fetch_alt, 0.0)]
    return [(s, w) for s, w in sources if s and s != me]


def _is_array(v) -> bool:
    """A NumPy / CuPy / SciPy-sparse array (not a tuple or dict of them)."""
    import scipy.sparse as sp

    return isinstance(v, np.ndarray) or sp.issparse(v) or hasattr(v, "__cuda_array_interface__")
