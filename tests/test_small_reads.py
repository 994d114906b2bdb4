"""A shard step's pull of a small table (``runner.SMALL_TABLE_BYTES``): every small table read whole, one
message per owner, while they have few owners (``runner.WHOLE_READ_OWNERS``); past that only the rows asked
for, from their owners, so W workers do not each ask all W owners every clock (W^2 messages a clock). On a
real in-process cluster, both ways read the same values."""
from __future__ import annotations

import numpy as np
import pytest

import dscar
from dscar import Algorithm, TableSpec
from dscar.worker import runner
from bench.overhead import install_counters, read_counters
from conftest import row_data


class NextRowReader(Algorithm):
    """Each step reads the ``count`` of the row after its shard's last (another owner's, at a partition's
    end) and marks ``bad`` where it is not the clock before; ``count`` +1 a row a clock, ``seen`` 1."""

    name = "next-row-reader"
    data_names = ("row",)

    def __init__(self, n_parts: int):
        self.n_parts = n_parts

    def tables(self, meta):
        n = meta.n_rows
        return [TableSpec("count", n, n_parts=self.n_parts), TableSpec("bad", n, n_parts=self.n_parts),
                TableSpec("seen", n, kind="reduction", n_parts=self.n_parts)]

    def shard_step(self, ctx, data):
        rows = data["row"]
        nxt = (int(rows[-1]) + 1) % ctx.meta.n_rows
        got = float(dscar.to_host(ctx.pull("count", nxt, nxt + 1))[0])
        ones = ctx.xp.ones(rows.shape[0])
        ctx.add("count", ones, start=int(rows[0]))
        ctx.add("seen", ones, start=int(rows[0]))
        if got != ctx.clock - 1:
            ctx.add("bad", ctx.xp.ones(1), start=nxt)

    def clock_end(self, ctx):
        count, seen, bad = (dscar.to_host(ctx.pull(t)) for t in ("count", "seen", "bad"))
        return {"objective": float(count.sum()), "count_ok": float(np.all(count == ctx.clock)),
                "seen_ok": float(np.all(seen == 1)), "bad": float(bad.sum())}

    def converged(self, history, tol):
        return False


@pytest.fixture(scope="module")
def four():
    with dscar.Cluster(n_workers=4, processes=False) as cl:
        cl.wait_for_workers(4)
        yield cl


def _fit(cl) -> tuple[dscar.FitResult, dict[str, int]]:
    """A fit of ``NextRowReader`` (4 partitions: each worker owns one) and the pulls its workers answered."""
    cl.client.run(install_counters)

    def served() -> dict[str, int]:
        out: dict[str, int] = {}
        for c in cl.client.run(read_counters).values():
            for k in ("dscar_pull", "dscar_pull_many"):
                out[k] = out.get(k, 0) + c.get(k, 0)
        return out

    before = served()
    res = dscar.fit(NextRowReader(4), row_data(32), cl, n_shards=8, max_clocks=4, progress=False, policies=[],
                    sharding="static")
    after = served()
    return res, {k: after[k] - before[k] for k in after}


def _assert_right(res: dscar.FitResult) -> None:
    assert res.n_clocks == 4
    for rec in res.history:
        assert rec.metrics["count_ok"] == rec.metrics["seen_ok"] == 1.0 and rec.metrics["bad"] == 0, rec.metrics
    np.testing.assert_array_equal(res.params["count"], np.full(32, 4.0))


def test_with_few_owners_a_step_reads_every_small_table_whole_in_one_message_per_owner(four):
    res, pulls = _fit(four)
    _assert_right(res)
    # each worker asks each of the 3 other owners once a clock, beside the clock end's one read a clock
    assert pulls["dscar_pull_many"] > res.n_clocks * 3 and pulls["dscar_pull"] == 0, pulls


def test_past_the_owner_limit_a_step_asks_only_the_owner_of_the_rows_it_reads(four, monkeypatch):
    monkeypatch.setattr(runner, "WHOLE_READ_OWNERS", 2)  # (3 other owners here)
    res, pulls = _fit(four)
    _assert_right(res)
    # a step on a partition's last shard asks the next partition's owner; the clock end still reads whole
    assert pulls["dscar_pull_many"] <= res.n_clocks and 0 < pulls["dscar_pull"] <= 8 * res.n_clocks, pulls
