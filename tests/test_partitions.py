import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dscar.core.partitions import PartitionMap, TableLayout, data_homes, placement_plan, row_bounds


def test_row_bounds_cover_all_rows_contiguously():
    b = row_bounds(10, 3)
    assert b == [(0, 4), (4, 7), (7, 10)]
    with pytest.raises(ValueError):
        row_bounds(2, 3)


def test_layout_split_into_partition_pieces():
    t = TableLayout("w", 10, 3)
    assert t.split(3, 8) == [(0, 3, 4), (1, 4, 7), (2, 7, 8)]
    assert t.split(5, 5) == []
    with pytest.raises(IndexError):
        t.split(0, 11)


def test_assignment_gives_every_partition_one_owner_and_balances_rows():
    pm = PartitionMap([TableLayout("w", 100, 4), TableLayout("v", 10, 2)])
    pm.assign(["b", "a"])
    assert len(pm.owners) == 6
    rows = {"a": 0, "b": 0}
    for (t, p), w in pm.owners.items():
        a, b = pm.layouts[t].bounds[p]
        rows[w] += b - a
    assert abs(rows["a"] - rows["b"]) <= 10
    assert PartitionMap.owners_from_msg(pm.to_msg()) == pm.owners


def test_by_owner_groups_keys_in_the_order_given():
    from dscar.core.partitions import by_owner

    owners = {("w", 0): "a", ("w", 1): "b", ("g", 0): "a", ("g", 1): "a"}
    assert by_owner(owners, [("w", 1), ("g", 1), ("w", 0), ("g", 0)]) == {"b": [("w", 1)], "a": [("g", 1), ("w", 0), ("g", 0)]}
    assert by_owner(owners, []) == {}


def test_the_plan_puts_contiguous_blocks_of_each_phase_on_each_worker():
    assert placement_plan([4], ["a", "b"]) == [(0, "a"), (1, "a"), (2, "b"), (3, "b")]
    assert placement_plan([3, 2], ["a", "b"]) == [(0, "a"), (1, "a"), (2, "b"), (3, "a"), (4, "b")]


def test_partitions_of_the_datas_rows_start_on_the_workers_of_their_shards():
    """LDA's doc_topic: a table with the data's rows is owned where the shard of each partition's
    middle row is placed; the other tables balance around them."""
    layouts = [TableLayout("pad", 7, 1), TableLayout("doc", 100, 2), TableLayout("word", 40, 2)]
    bounds = [(0, 30), (30, 50), (50, 80), (80, 100)]
    plan = placement_plan([4], ["a", "b"])
    homes = data_homes(layouts, bounds, plan)
    assert homes == {("doc", 0): "a", ("doc", 1): "b"}  # middles 24 (shard 0 on a) and 74 (shard 2 on b)
    pm = PartitionMap(layouts)
    pm.assign(["a", "b"], homes)
    assert pm.owners[("doc", 0)] == "a" and pm.owners[("doc", 1)] == "b"
    assert pm.rows_by_worker() == {"a": 77, "b": 70}  # pad and word go where rows are fewest
    greedy = PartitionMap(layouts)
    greedy.assign(["a", "b"])
    assert greedy.owners[("doc", 0)] == "b"  # without homes: pad made a heavier, doc 0 went to b
    assert data_homes(layouts, [], plan) == {} and data_homes(layouts, bounds, []) == {}
    pm = PartitionMap(layouts)
    pm.assign(["a", "c"], homes)  # a home on a worker not given: balanced like the rest
    assert set(pm.owners.values()) <= {"a", "c"} and len(pm.owners) == 5


def _assign_by_scan(layouts, workers, homes):
    """``PartitionMap.assign`` by a scan: each row unit's partitions without a home together to the
    least-loaded worker, the units in the order of their first table."""
    load = {w: 0 for w in sorted(workers)}
    homes = {k: w for k, w in homes.items() if w in load}
    owners = {}
    for t in layouts:
        for part, (a, b) in enumerate(t.bounds):
            if (t.name, part) in homes:
                owners[(t.name, part)] = homes[(t.name, part)]
                load[homes[(t.name, part)]] += b - a
    units = {}
    for t in layouts:
        for part, (a, b) in enumerate(t.bounds):
            if (t.name, part) not in homes:
                units.setdefault((t.n_rows, t.n_parts, part), []).append(((t.name, part), b - a))
    for members in units.values():
        w = min(load, key=lambda w: (load[w], w))
        for k, rows in members:
            owners[k] = w
            load[w] += rows
    return owners


@settings(max_examples=200, deadline=None)
@given(tables=st.lists(st.tuples(st.integers(1, 60), st.integers(1, 8)), min_size=1, max_size=4),
       workers=st.lists(st.sampled_from(["a", "b", "c", "w10", "w9", "tcp://x:1"]), min_size=1, unique=True),
       home_seed=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 7), st.sampled_from(["a", "b", "z"])),
                          max_size=6))
def test_assign_gives_each_partition_to_the_worker_a_scan_would(tables, workers, home_seed):
    """The least-loaded worker comes from a heap (O(P log W), not O(P W)): the same owners as the scan."""
    layouts = [TableLayout(f"t{i}", max(rows, parts), parts) for i, (rows, parts) in enumerate(tables)]
    homes = {(f"t{i}", p): w for i, p, w in home_seed if i < len(layouts) and p < layouts[i].n_parts}
    pm = PartitionMap(layouts)
    pm.assign(workers, homes)
    assert dict(pm.owners) == _assign_by_scan(layouts, workers, homes)


@settings(max_examples=200, deadline=None)
@given(tables=st.lists(st.tuples(st.integers(1, 60), st.integers(1, 8)), min_size=1, max_size=5),
       workers=st.lists(st.sampled_from(["a", "b", "c", "d"]), min_size=1, unique=True))
def test_a_fit_starts_with_each_row_unit_on_one_owner_and_the_rows_balanced_within_a_unit(tables, workers):
    """Tables laid out alike (as many rows and partitions) share their row ranges' owners, whatever the cut
    (rows not a multiple of the partitions included), and no worker owns more than the least loaded one plus
    the largest unit's rows."""
    layouts = [TableLayout(f"t{i}", max(rows, parts), parts) for i, (rows, parts) in enumerate(tables)]
    pm = PartitionMap(layouts)
    pm.assign(workers)
    by_unit = {}
    for k, u in pm.units.items():
        by_unit.setdefault(u, set()).add(pm.owners[k])
    assert all(len(owners) == 1 for owners in by_unit.values())
    unit_rows = {}
    for k, u in pm.units.items():
        unit_rows[u] = unit_rows.get(u, 0) + pm.rows[k]
    load = {w: 0 for w in workers} | pm.rows_by_worker()
    assert max(load.values()) - min(load.values()) <= max(unit_rows.values())


def test_an_item_carries_the_owners_map_only_where_its_worker_holds_another():
    """``PartitionMap.for_item``: the whole map with its token for a worker that names none or another
    (one that never had it, one whose map changed since), the token alone for one that holds it; a
    change of an owner, and another map of the same owners, name a new token."""
    pmap = PartitionMap([TableLayout("w", 8, 2)])
    pmap.assign(["a", "b"])
    token = pmap.token()
    first = pmap.for_item({"op": "shard", "owners": pmap.to_msg()}, None)
    assert first["owners"] == pmap.to_msg() and first["owners_token"] == token
    again = pmap.for_item({"op": "shard", "owners": pmap.to_msg()}, token)
    assert "owners" not in again and again["owners_token"] == token
    pmap.owners[("w", 0)] = "b"
    assert pmap.token() != token
    moved = pmap.for_item({"op": "shard", "owners": pmap.to_msg()}, token)
    assert moved["owners"] == [["w", 0, "b"], ["w", 1, "b"]] and moved["owners_token"] == pmap.token()
    other = PartitionMap([TableLayout("w", 8, 2)])
    other.assign(["a", "b"])
    other.owners[("w", 0)] = "b"
    assert other.owners == pmap.owners and other.owners.version == pmap.owners.version
    assert other.token() != pmap.token()  # (a job set up again: a worker's old token never names it)
    pmap.owners = dict(pmap.owners)  # (a plain dict counts no changes: every item carries the map)
    assert pmap.token() is None and "owners" in pmap.for_item({"owners": pmap.to_msg()}, token)
