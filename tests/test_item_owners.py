"""A work item carries the partitions' owners map only where its worker does not hold it already
(``PartitionMap.for_item``): each request names the map the worker holds, and the coordinator leaves
it out of the answer's item while it is the same. On a real in-process cluster: a fit's items carry
the map once per worker (and again after a change of the owners), and every row is counted once."""
from __future__ import annotations

import dscar
from dscar.worker.runner import ShardRunner
from conftest import RowCounter, assert_exactly_once, row_data


def _record_items(monkeypatch) -> list[tuple[str, str, bool]]:
    """``(worker, op, carried the map)`` of every item a runner takes up."""
    seen: list[tuple[str, str, bool]] = []
    prepare = ShardRunner._prepare

    def recorded(self, job, item):
        seen.append((self.host.address, item["op"], "owners" in item))
        return prepare(self, job, item)

    monkeypatch.setattr(ShardRunner, "_prepare", recorded)
    return seen


def test_items_carry_the_owners_map_once_per_worker(inproc, monkeypatch):
    seen = _record_items(monkeypatch)
    res = dscar.fit(RowCounter(), row_data(40), inproc, progress=False, n_shards=8, max_clocks=10, policies=[])
    assert_exactly_once(res, 40)
    shard_items = [s for s in seen if s[1] == "shard"]
    with_map = [s for s in shard_items if s[2]]
    assert len(shard_items) >= 20
    assert len(with_map) <= len({w for w, _, _ in seen}), with_map  # (every item carried it before)
