import pytest

from dscar.partitions import PartitionMap, TableLayout, row_bounds


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
    from dscar.partitions import by_owner

    owners = {("w", 0): "a", ("w", 1): "b", ("g", 0): "a", ("g", 1): "a"}
    assert by_owner(owners, [("w", 1), ("g", 1), ("w", 0), ("g", 0)]) == {"b": [("w", 1)], "a": [("g", 1), ("w", 0), ("g", 0)]}
    assert by_owner(owners, []) == {}
