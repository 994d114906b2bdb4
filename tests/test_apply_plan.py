"""The apply fan-out's plan (``dscar.core.apply_plan``): every committed update reaches each owner of a
partition it touched exactly once, in fewer than 2·W messages once the direct plan would cost more
than a few per worker, through a tree without cycles and no deeper than ceil(log_fanin W)."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings, strategies as st

from dscar.core.apply_plan import INLINE_BYTES, ApplyPlan, batch_fields, merge_touched, plan_apply, rides_commit, touches

TABLES = {"w": 6, "g": 3}


def _deliveries(plan: ApplyPlan, stagers: dict, owners: dict) -> dict[str, list]:
    """Simulate the plan: per owner, the keys it ends up with from elsewhere (a key twice is a bug)."""
    members = set(plan.members)
    parent: dict[str, str] = {}
    for w, role in plan.roles.items():
        if role.combine:
            for child, _ in role.combine.children:
                assert child not in parent, f"{child} has two parents"
                parent[child] = w

    def combined(w: str, seen: frozenset = frozenset()) -> list[tuple]:
        assert w not in seen, "the tree has a cycle"
        out = [(k, w) for k in plan.roles[w].combine.keys]
        for child, _ in plan.roles[w].combine.children:
            out += combined(child, seen | {w})
        return out

    got = {}
    for o in owners:
        role = plan.role(o)
        keys = [k for _, ks in role.fetch for k in ks]
        if role.root is not None:
            assert role.root in members and role.root not in parent
            from_root = [k for k, src in combined(role.root) if src != o]
            assert len(from_root) == role.expect
            keys += from_root
        got[o] = keys
    return got


workers_st = st.integers(1, 40)
#: every partition of ``TABLES``
PARTS = [(t, p) for t, k in TABLES.items() for p in range(k)]


def _workers_and_owners(draw) -> tuple[list[str], dict[str, list]]:
    """1-40 workers and each one's partitions of ``TABLES`` (each partition owned by one drawn worker)."""
    ws = [f"w{i:03d}" for i in range(draw(workers_st))]
    owner_of = {part: draw(st.sampled_from(ws)) for part in PARTS}
    return ws, {w: [p for p, o in owner_of.items() if o == w] for w in ws}


@st.composite
def passes(draw):
    ws, owners = _workers_and_owners(draw)
    stagers, touched, clock = {}, {}, 3
    shard = 0
    for w in ws:
        for _ in range(draw(st.integers(0, 3))):
            stagers.setdefault(w, []).append((clock, shard, draw(st.integers(0, 2))))
            shard += 1
        if w in stagers:
            kind = draw(st.sampled_from(["dense", "sparse", "unknown", "none"]))
            if kind == "dense":
                touched[w] = {t: None for t in TABLES}
            elif kind == "sparse":
                touched[w] = {t: sorted(draw(st.sets(st.integers(0, k - 1), min_size=1))) for t, k in TABLES.items()
                              if draw(st.booleans())}
            elif kind == "none":
                touched[w] = {}
    fanin = draw(st.integers(2, 17))
    direct = draw(st.sampled_from([0.0, 1.0, 8.0]))
    return ws, owners, stagers, touched, fanin, direct


@settings(max_examples=400, deadline=None)
@given(passes())
def test_each_committed_update_reaches_each_owner_it_touched_exactly_once(case):
    ws, owners, stagers, touched, fanin, direct = case
    plan = plan_apply(stagers, touched, owners, fanin=fanin, direct_per_worker=direct)
    got = _deliveries(plan, stagers, owners)
    for o, parts in owners.items():
        needed = {k for s, keys in stagers.items() if s != o and parts and touches(touched.get(s), parts) for k in keys}
        assert len(got[o]) == len(set(got[o])), f"{o} gets a key twice"
        assert needed <= set(got[o]), f"{o} misses {needed - set(got[o])}"
        assert not set(got[o]) & set(stagers.get(o, ())), f"{o} fetches its own updates"
        assert all(any(k in stagers[s] for s in stagers if s != o) for k in got[o])
    n = len(ws)
    assert plan.messages() <= max(2 * n - 1, direct * n)
    if plan.tree:
        assert plan.messages() <= 2 * n - 1
        assert plan.depth() <= max(math.ceil(math.log(max(len(plan.members), 1), fanin) - 1e-9), 0)
        assert plan.depth() <= max(math.ceil(math.log(n, fanin) - 1e-9), 0)
        for w, role in plan.roles.items():
            if role.combine:
                assert len(role.combine.children) <= fanin
                assert role.combine.expect == len(role.combine.keys) + sum(
                    plan.roles[c].combine.expect for c, _ in role.combine.children)


@pytest.mark.parametrize("n", [2, 5, 64, 1024, 4096])
def test_dense_passes_cost_fewer_than_two_messages_per_worker(n):
    """Every worker stages updates for every partition: direct is W·(W−1) fetches, the tree < 2·W."""
    ws = [f"w{i:05d}" for i in range(n)]
    owners = {w: [("w", i)] for i, w in enumerate(ws)}
    stagers = {w: [(1, i, 0)] for i, w in enumerate(ws)}
    plan = plan_apply(stagers, {}, owners, fanin=16)
    assert plan.tree == (n * (n - 1) > 8 * n)
    assert plan.messages() == (n * (n - 1) if not plan.tree else 2 * n - 2)
    assert plan.depth() <= math.ceil(math.log(n, 16))


def test_no_fetch_from_a_worker_that_staged_nothing_for_the_owner():
    owners = {"a": [("w", 0)], "b": [("w", 1)], "c": []}
    stagers = {"a": [(1, 0, 0)], "b": [(1, 1, 0)], "c": [(1, 2, 0)]}
    touched = {"a": {"w": [0]}, "b": {"w": [0, 1]}, "c": {}}
    plan = plan_apply(stagers, touched, owners)
    assert not plan.tree
    assert plan.role("a").fetch == (("b", ((1, 1, 0),)),) and plan.role("b").fetch == ()
    assert plan.messages() == 1


def test_fanin_below_two_is_refused():
    with pytest.raises(ValueError, match="apply-fanin"):
        plan_apply({"a": [1]}, {}, {"a": [("w", 0)]}, fanin=1)


@st.composite
def passes_with_inline(draw):
    """A pass where each key's updates reach known partitions and some keys rode their commits."""
    ws, owners = _workers_and_owners(draw)
    stagers, reach, inline = {}, {}, {}
    for i, w in enumerate(ws):
        for j in range(draw(st.integers(0, 3))):
            key = (3, i * 4 + j, 0)
            stagers.setdefault(w, []).append(key)
            reach[key] = sorted(draw(st.sets(st.sampled_from(PARTS), max_size=4)))
            if draw(st.booleans()):
                inline[key] = reach[key]
    touched: dict = {}
    for w, keys in stagers.items():
        for k in keys:
            if k not in inline:
                for t, p in reach[k]:
                    merge_touched(touched.setdefault(w, {}), {t: [p]})
    return ws, owners, stagers, touched, inline, reach, draw(st.integers(2, 17)), draw(st.sampled_from([0.0, 8.0]))


@settings(max_examples=300, deadline=None)
@given(passes_with_inline())
def test_inline_updates_reach_each_owner_once_and_are_never_fetched(case):
    """Every key's update to a partition reaches that partition's owner exactly once: an inline key
    in the owner's apply message (its own stager excepted), the others fetched; an inline key is
    fetched by nobody, and the fetches cost no more than without the inline keys."""
    ws, owners, stagers, touched, inline, reach, fanin, direct = case
    plan = plan_apply(stagers, touched, owners, fanin=fanin, direct_per_worker=direct, inline=inline)
    fetched = _deliveries(plan, stagers, owners)
    stager_of = {k: w for w, keys in stagers.items() for k in keys}
    for o, parts in owners.items():
        got_inline = plan.role(o).inline
        assert len(got_inline) == len(set(got_inline)), f"{o} gets an inline update twice"
        assert set(got_inline) == {(k, p) for k, ps in inline.items() for p in ps
                                   if p in parts and stager_of[k] != o}
        assert not set(fetched[o]) & set(inline), f"{o} fetches an inline key"
        needed = {k for k, ps in reach.items() if k not in inline and stager_of[k] != o and set(ps) & set(parts)}
        assert needed <= set(fetched[o])
    without = plan_apply({w: [k for k in keys if k not in inline] for w, keys in stagers.items()}, touched, owners,
                         fanin=fanin, direct_per_worker=direct)
    assert plan.messages() == without.messages()


def test_an_owner_gets_only_inline_updates_fetches_nothing():
    """Every stager's updates rode its commit: the owner's apply carries them and it fetches nothing."""
    owners = {"a": [("w", 0)], "b": [], "c": []}
    stagers = {"b": [(1, 0, 0)], "c": [(1, 1, 0)], "a": [(1, 2, 0)]}
    inline = {(1, 0, 0): [("w", 0)], (1, 1, 0): [("w", 0)], (1, 2, 0): [("w", 0)]}
    plan = plan_apply(stagers, {}, owners, inline=inline)
    assert plan.role("a").inline == (((1, 0, 0), ("w", 0)), ((1, 1, 0), ("w", 0)))
    assert plan.messages() == 0 and plan.role("a").fetch == ()
    assert plan.role("a").to_msg() == {"inline": [[[1, 0, 0], "w", 0], [[1, 1, 0], "w", 0]]}
    mixed = plan_apply(stagers, {"c": {"w": [0]}}, owners, inline={(1, 0, 0): [("w", 0)]})
    assert mixed.role("a").fetch == (("c", ((1, 1, 0),)),) and mixed.role("a").inline == (((1, 0, 0), ("w", 0)),)


def test_small_updates_ride_the_commit():
    assert rides_commit(0) and rides_commit(INLINE_BYTES) and not rides_commit(INLINE_BYTES + 1)
    assert not rides_commit(100, limit=99) and not rides_commit(0, limit=0)  # (0: every update is fetched)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 3), st.sampled_from("abcd"), st.integers(1, 5)),
                max_size=60, unique_by=lambda c: (c[0], c[3])))
def test_an_ssp_batch_tells_each_worker_its_own_commits_and_every_worker_the_shards_by_clock(commits):
    """``batch_fields``: a worker's own commits with their clocks, in the batch's order, and the batch's
    committed shards per clock as ranges covering exactly those shards, the same for every worker."""
    committed = [[s, a, w] for s, a, w, _ in commits]
    clocks = [c for *_, c in commits]
    own, clock_shards = batch_fields(committed, clocks)
    for w in "abcd":
        mine = [(s, a, c) for s, a, ww, c in commits if ww == w]
        got = own.get(w, ([], []))
        assert [(s, a, c) for (s, a, _), c in zip(*got)] == mine and all(x[2] == w for x in got[0])
    covered = {(c, s) for c, ranges in clock_shards for lo, hi in ranges for s in range(lo, hi)}
    assert covered == {(c, s) for s, _, _, c in commits}
    assert [c for c, _ in clock_shards] == sorted({c for *_, c in commits})
