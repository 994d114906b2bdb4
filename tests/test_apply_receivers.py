"""A BSP pass's apply goes only to the workers with something to apply (``apply_plan.apply_receivers``):
owners, workers with a role in the fetch plan, the folded clock end's worker; every worker when a commit
of the pass moved a shard's data or state. At W workers and one partition, one apply a pass instead of W
(bench.hollow), and every shard's update is still applied once."""
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
    loss and no failed shard, and apply every update once."""
    res, applies = _applies(cl, lambda: dscar.fit(algo, row_data(40), cl, n_shards=8, max_clocks=clocks,
                                                   progress=False, policies=[]))
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
