"""The SSP write-back cache: a worker's pulled copy holds each of its own granted updates exactly
once, whichever owners had applied them when it fetched (no Dask here)."""
from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from dscar.algorithm import TableSpec
from dscar.worker.partition_store import PartitionStore
from dscar.core.partitions import TableLayout
from dscar.worker.pull_cache import SMALL, PullCache
from dscar.core.ssp import copy_serves

ROWS, PARTS, RUN = 12, 3, 7
SPECS = {"w": TableSpec("w", ROWS, trailing=(2,), dtype="int64", n_parts=PARTS)}
LAYOUTS = {"w": TableLayout("w", ROWS, PARTS)}
BOUNDS = {"w": LAYOUTS["w"].bounds}


def _owners() -> list[PartitionStore]:
    """Two owners, partition ``p`` on owner ``p % 2``, all zeros."""
    owners = [PartitionStore(SPECS, LAYOUTS, np) for _ in range(2)]
    for p, (a, b) in enumerate(BOUNDS["w"]):
        owners[p % 2].own("w", p, np.zeros((b - a, 2), dtype=np.int64), checkpointed=True)
    return owners


def _fetch(cache: PullCache, owners: list[PartitionStore]) -> None:
    """What ``ShardRunner.read_small_tables`` does: each partition read with the owner's answer
    to which of the cache's written-back updates it holds, then patched."""
    mine = cache.mine()
    pieces = []
    for p, (a, b) in enumerate(BOUNDS["w"]):
        owner = owners[p % 2]
        with owner.lock:
            piece = owner.rows("w", p, 0, b - a)
            held = owner.held(("w", p), *mine) if mine else []
        pieces.append(cache.patch(piece, "w", p, 0, held, np) if mine else piece)
    cache.put(SMALL, (None, {"w": np.concatenate(pieces)}))


class WriteBack(RuleBasedStateMachine):
    """One worker's own updates only: then its copy must equal the sum of every update it was
    granted, however the owners' applies, its fetches and the clocks interleave."""

    def __init__(self):
        super().__init__()
        self.owners = _owners()
        self.cache = PullCache()
        self.cache.prepare({"run": RUN, "version": 0, "shards": []})
        self.granted = np.zeros((ROWS, 2), dtype=np.int64)
        self.unapplied: list[list] = [[], []]  # per owner: (key, updates) granted, not yet applied there
        self.clock, self.floor, self.shard = 1, 0, 0

    @rule(part=st.integers(0, PARTS - 1), lo=st.integers(0, 3), n=st.integers(1, 4), by=st.integers(-3, 3),
          scatter=st.booleans())
    def grant(self, part, lo, n, by, scatter):
        self.shard += 1
        size = BOUNDS["w"][part][1] - BOUNDS["w"][part][0]
        if scatter:  # repeated rows add up
            rows = np.array([lo % size, lo % size, (lo + n) % size])
            update = ("w", part, 0, np.full((3, 2), by, dtype=np.int64), rows)
            np.add.at(self.granted, BOUNDS["w"][part][0] + rows, by)
        else:
            lo, n = lo % size, min(n, size - lo % size)
            update = ("w", part, lo, np.full((n, 2), by, dtype=np.int64), None)
            self.granted[BOUNDS["w"][part][0] + lo : BOUNDS["w"][part][0] + lo + n] += by
        key = (self.clock, self.shard, 0)
        self.cache.write_back(self.shard, self.clock, 0, [update], BOUNDS, np)
        for queue in self.unapplied:
            queue.append((key, [update]))

    @precondition(lambda self: any(self.unapplied))
    @rule(which=st.integers(0, 1))
    def owner_applies(self, which):
        which = which if self.unapplied[which] else 1 - which
        key, updates = self.unapplied[which].pop(0)
        owner = self.owners[which]
        owner.apply_pass(RUN, [key], {key: updates}, set(), owner.owned(), self.floor)

    @rule()
    def fetch(self):
        _fetch(self.cache, self.owners)

    @rule()
    def clear(self):
        self.cache.clear()

    @rule()
    def next_clock(self):
        self.clock += 1

    @precondition(lambda self: self.floor + 1 < self.clock)
    @rule()
    def clock_finishes(self):
        """The oldest open clock ends once every owner applied its updates; the next item says so."""
        if any(k[0] <= self.floor + 1 for queue in self.unapplied for k, _ in queue):
            return
        self.floor += 1
        self.cache.prepare({"run": RUN, "version": 0, "floor": self.floor, "read_floor": 0, "shards": []})

    @invariant()
    def the_copy_holds_every_granted_update_once(self):
        entry = self.cache.get(SMALL)
        if entry is not None:
            np.testing.assert_array_equal(entry[1]["w"], self.granted)


TestWriteBack = WriteBack.TestCase
TestWriteBack.settings = settings(max_examples=150, stateful_step_count=40, deadline=None,
                                  suppress_health_check=[HealthCheck.too_slow])


def test_a_copy_serves_an_item_when_it_holds_the_floor_and_each_shards_own_update():
    # (shard, clock, seen, mine): the shard's update of clock - 1 is in tables of version ``seen``
    assert copy_serves(5, set(), 5, [(0, 3, 5, False)])
    assert not copy_serves(4, set(), 5, [(0, 3, 2, True)])  # older than every update of clocks <= t - s - 1
    assert not copy_serves(5, set(), 0, [(0, 3, 6, True)])  # its own update came later, not written back
    assert copy_serves(5, {(0, 2)}, 0, [(0, 3, 6, True)])  # ... written back
    assert not copy_serves(5, {(0, 2)}, 0, [(0, 3, 6, False)])  # ... but another worker's attempt was applied


def test_an_item_whose_previous_update_was_not_this_workers_drops_the_copy():
    cache = PullCache()
    cache.prepare({"run": 1, "version": 3, "shards": []})
    cache.put(SMALL, (None, {"w": np.zeros((ROWS, 2), dtype=np.int64)}))
    cache.write_back(4, 2, 0, [("w", 0, 0, np.ones((1, 2), dtype=np.int64), None)], BOUNDS, np)
    item = {"run": 1, "version": 9, "floor": 0, "read_floor": 0}
    cache.prepare({**item, "shards": [{"shard": 4, "clock": 3, "seen": 8, "mine": True}]})
    assert cache.get(SMALL) is not None  # its own write is in the copy
    cache.prepare({**item, "shards": [{"shard": 4, "clock": 3, "seen": 8, "mine": False}]})
    assert cache.get(SMALL) is None and cache.version == 9 and not cache.written_back  # written off: not ours


def test_a_finished_clocks_writes_stay_known_to_the_copy_and_leave_the_questions():
    cache = PullCache()
    cache.prepare({"run": 1, "version": 3, "shards": []})
    cache.put(SMALL, (None, {"w": np.zeros((ROWS, 2), dtype=np.int64)}))
    cache.write_back(4, 2, 0, [("w", 0, 0, np.ones((1, 2), dtype=np.int64), None)], BOUNDS, np)
    cache.prepare({"run": 1, "version": 9, "floor": 2, "read_floor": 0,
                   "shards": [{"shard": 4, "clock": 3, "seen": 8, "mine": True}]})
    assert cache.get(SMALL) is not None and cache.mine() is None  # settled: every owner holds it
    cache.prepare({"run": 2, "version": 9, "shards": []})
    assert cache.get(SMALL) is None and not cache.settled  # a new run id: nothing is kept


def test_whole_partitions_for_a_message_are_copies():
    """A message is serialised after the store's lock is let go: an apply meanwhile must not
    change what was read (a pull's answer about which updates the rows hold would be wrong)."""
    owner = _owners()[0]
    [out] = owner.host_parts([("w", 0)])
    owner.apply_pass(RUN, [(1, 0, 0)], {(1, 0, 0): [("w", 0, 0, np.ones((4, 2), dtype=np.int64), None)]}, set(),
                     owner.owned(), 0)
    assert not out.any() and owner.held(("w", 0), RUN, [[1, 0, 0]]) == [(1, 0, 0)]
