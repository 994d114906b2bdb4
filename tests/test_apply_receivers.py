"""A BSP pass's apply goes only to the workers with something to apply (``apply_plan.apply_receivers``):
owners, workers with a role in the fetch plan, the folded clock end's worker; every worker when a commit
of the pass moved a shard's data or state. At W workers and one partition, one apply a pass instead of W
(bench.hollow), and every shard's update is still applied once."""
import functools

import numpy as np
import pytest

import dscar
from bench.overhead import install_counters, read_counters
from conftest import RowCounter, assert_exactly_once, row_data
from dscar.core.apply_plan import apply_receivers, plan_apply
from dscar.core.protocol import Finished

WORKERS = ["a", "b", "c", "d", "e"]


# ------------------------------------------------------------------------------ pure
def test_only_owners_plan_roles_and_kept_workers_get_a_pass_that_moved_no_shard():
    plan = plan_apply({"b": [(1, 0, 0)], "c": [(1, 1, 0)], "d": [(1, 2, 0)]}, {}, {"a": [("w", 0)]})
    assert not plan.tree and [w for w in WORKERS if plan.role(w).to_msg()] == ["a"]  # the owner fetches
    assert apply_receivers(WORKERS, ["a"], plan, shards_moved=False) == ["a"]
    assert apply_receivers(WORKERS, ["a", "a"], plan, keep={"e", None}, shards_moved=False) == ["a", "e"]
    assert apply_receivers(WORKERS, ["a"], plan, shards_moved=True) == WORKERS  # a shard's store changes
    assert apply_receivers(["e", "a"], ["a"], plan, keep={"e"}, shards_moved=False) == ["e", "a"]  # (order kept)


def test_a_pass_that_moved_a_shard_goes_to_the_workers_the_move_involved_too():
    plan = plan_apply({"b": [(1, 0, 0)], "c": [(1, 1, 0)], "d": [(1, 2, 0)]}, {}, {"a": [("w", 0)]})
    assert apply_receivers(WORKERS, ["a"], plan, shards_moved=True, involved={"c", "d"}) == ["a", "c", "d"]
    assert apply_receivers(WORKERS, ["a"], plan, shards_moved=True, involved=None) == WORKERS  # (not known)
    assert apply_receivers(WORKERS, ["a"], plan, shards_moved=False, involved={"c"}) == ["a"]  # (no move)


def test_every_stager_of_an_apply_tree_gets_its_combine_step():
    stagers = {w: [(1, i, 0)] for i, w in enumerate(WORKERS[1:])}
    plan = plan_apply(stagers, {}, {"a": [("w", 0)]}, fanin=2, direct_per_worker=0)
    assert plan.tree
    assert apply_receivers(WORKERS, ["a"], plan, shards_moved=False) == WORKERS


def test_a_finished_attempt_says_it_moved_its_shard_only_when_it_did():
    assert "moved" not in Finished(1, 0, 3).to_msg()  # (the common case costs no byte)
    assert Finished.from_msg(Finished(1, 0, 3, moved=True).to_msg(), 3).moved is True
    assert Finished.from_msg({"shard": 1, "attempt": 0}, 3).moved is False


# --------------------------------------------------------------------------- cluster
@pytest.fixture(scope="module")
def four():
    """Four in-process workers."""
    with dscar.Cluster(n_workers=4, processes=False) as cl:
        cl.wait_for_workers(4)
        yield cl


def _applies(cl, fit) -> tuple[dscar.FitResult, int]:
    """``fit()``'s result and the ``dscar_apply`` calls the workers answered during it."""
    cl.client.run(install_counters)
    before = sum(c.get("dscar_apply", 0) for c in cl.client.run(read_counters).values())
    res = fit()
    return res, sum(c.get("dscar_apply", 0) for c in cl.client.run(read_counters).values()) - before


def _clean_fit_applies(cl, algo, clocks: int) -> int:
    """The ``dscar_apply`` calls of a fit of ``algo`` on 40 rows in 8 shards, which must run with no
    loss and no failed shard, and apply every update once. Static sharding: no shard moves, however
    the load delays a worker (a steal would send the apply to the workers it involved too)."""
    res, applies = _applies(cl, lambda: dscar.fit(algo, row_data(40), cl, n_shards=8, max_clocks=clocks,
                                                   progress=False, policies=[], sharding="static"))
    assert_exactly_once(res, 40)
    assert not [e for e in res.events if e["kind"] in ("shard-failed", "worker-lost")]
    return applies


def test_a_pass_with_one_owner_is_sent_to_the_owner_and_the_clock_end_s_worker_only(four):
    clocks = 4
    applies = _clean_fit_applies(four, RowCounter(n_parts=1), clocks)
    assert clocks <= applies <= 2 * clocks  # before: 4 workers x 4 clocks = 16


class _StateCounter(RowCounter):
    """``RowCounter`` whose shards count their steps in their state, checked against the clock."""

    def shard_step(self, ctx, data):
        n = int(np.asarray(ctx.state["n"])[0]) if "n" in ctx.state else 0
        if n != ctx.clock - 1:
            raise AssertionError(f"shard {ctx.shard}: state n={n} in clock {ctx.clock}")
        ctx.set_state("n", np.array([n + 1]))
        super().shard_step(ctx, data)


def test_a_pass_that_moved_shard_state_is_sent_to_every_worker_and_each_state_is_installed(four):
    clocks = 3
    assert _clean_fit_applies(four, _StateCounter(n_parts=1), clocks) == 4 * clocks


def _note_applies(dask_worker) -> list[int]:
    """The clocks of the ``dscar_apply`` messages this worker got (recorded from the first call on)."""
    h = dask_worker.handlers["dscar_apply"]
    if not getattr(h, "_clocks_noted", False):
        @functools.wraps(h)  # keeps the signature: distributed passes ``comm`` as the original wants it
        def noted(*a, **k):
            dask_worker._apply_clocks.append(int(k["clock"]))
            return h(*a, **k)
        noted._clocks_noted = True
        dask_worker._apply_clocks = []
        dask_worker.handlers["dscar_apply"] = noted
    return list(dask_worker._apply_clocks)


def test_a_stolen_shard_s_pass_goes_to_its_old_and_new_holder_not_to_every_worker():
    """Six workers, two shards each; the first worker's two are slow, so an idle worker steals one (a
    copy of its data). That pass's apply reaches the owner, the clock end's worker, the stolen
    shard's old and new holders, and no one else; every row still counts each clock once."""
    with dscar.Cluster(n_workers=6, processes=False) as cl:
        cl.wait_for_workers(6)
        before = cl.client.run(_note_applies)
        res = dscar.fit(RowCounter(n_parts=1, sleep=0.3, slow_shards=(0, 1)), row_data(60), cl, n_shards=12,
                        max_clocks=3, progress=False, policies=[])
        got = {w: c[len(before[w]):] for w, c in cl.client.run(_note_applies).items()}
    assert_exactly_once(res, 60)
    assert not [e for e in res.events if e["kind"] in ("shard-failed", "worker-lost")]
    moved_clocks = {e["clock"] for e in res.events if e["kind"] == "shard-moved"}
    assert moved_clocks, "no shard was stolen"
    for clock in moved_clocks:
        receivers = {w for w, cs in got.items() if clock in cs}
        movers = {w for e in res.events if e["kind"] == "shard-moved" and e["clock"] == clock
                  for w in (e["source"], e["target"])}
        assert movers <= receivers
        # beyond the movers, the owner and the clock end's worker only (not 'fewer than all 6': under load
        # clock 1 can move shards of 4 or 5 workers, and then every worker is rightly a receiver)
        assert len(receivers - movers) <= 2, (clock, receivers, movers)
