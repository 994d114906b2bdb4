"""The staleness measurement (``bench.staleness``): its model of SSP reads, and its outputs."""
import json

import numpy as np
import pytest

import dscar
from dscar import TableSpec
from bench.staleness import LaggingRun, StaleRun, main


class WhatDidISee(dscar.Algorithm):
    """Each shard adds 1 to its own row of ``count`` every clock and records the whole table it read."""

    name = "seen"
    data_names = ("row",)

    def tables(self, meta):
        return [TableSpec("count", meta.n_shards), TableSpec("total", 1, kind="reduction")]

    def shard_step(self, ctx, data):
        ctx.set_state("read", np.array(ctx.pull("count")))
        ctx.add("count", np.ones(1), start=ctx.shard)
        ctx.add("total", np.ones(1))

    def clock_end(self, ctx):
        return {"objective": float(ctx.pull("count").sum()), "total": float(ctx.pull("total")[0])}

    def converged(self, history, tol):
        return False


@pytest.mark.parametrize("staleness", [0, 1, 2, 4])
def test_a_read_in_clock_t_sees_the_end_of_clock_t_minus_1_minus_s_and_its_own_updates(staleness):
    n = 4
    run = StaleRun(WhatDidISee(), {"row": np.arange(n)}, n, staleness)
    for t in range(1, 10):
        m = run.clock(t)
        assert m["objective"] == n * t and m["total"] == n  # updates land on the current tables, exactly once
        others = max(0, t - 1 - staleness)
        for shard, state in enumerate(run.states):
            want = np.full(n, float(others))
            want[shard] = t - 1  # its own updates: all of them (read-my-writes)
            np.testing.assert_array_equal(state["read"], want, err_msg=f"clock {t}, shard {shard}")
    assert len(run.ends) <= staleness + 1  # only the ends a later read may need are kept


@pytest.mark.parametrize("staleness", [1, 2, 4])
def test_a_lagging_worker_s_clocks_behind_is_missing_from_on_time_reads_for_s_clocks_only(staleness):
    """One of 4 workers (shards 0 and 4 of 8: every 4th) runs ``s`` clocks behind. On-time shards of a
    round read the tables as of its start; the lagging worker's steps read them as they are."""
    reads = []

    class Logged(WhatDidISee):
        def shard_step(self, ctx, data):
            reads.append((ctx.shard, ctx.clock, np.array(ctx.pull("count"))))
            super().shard_step(ctx, data)

    n, clocks = 8, 7
    run = LaggingRun(Logged(), {"row": np.arange(n)}, n, staleness, workers=4)
    reached, objective = run.run(clocks)
    assert reached is None and len(objective) == clocks  # never converges: every clock ends once
    assert [h["total"] for h in run.history] == [n] * clocks  # each clock's reductions are its own, exactly once
    lagging = {0, 4}
    for shard, clock, read in reads:
        if shard in lagging:  # round clock + s: on-time shards have done clock + s, lagging ones in order
            want = [clock + staleness if j not in lagging else clock - 1 + (j < shard) for j in range(n)]
        else:  # round clock: on-time shards have done clock - 1, lagging ones clock - 1 - s
            want = [clock - 1 if j not in lagging else max(0, clock - 1 - staleness) for j in range(n)]
        want = [min(w, clocks) for w in want]  # the last rounds run lagging shards only
        np.testing.assert_array_equal(read, want, err_msg=f"shard {shard} clock {clock}")
    assert sorted((s, c) for s, c, _ in reads) == [(s, c) for s in range(n) for c in range(1, clocks + 1)]


class TwoPhases(dscar.Algorithm):
    """Phase "a" then "b": each shard records what it read of both tables and adds 1 to its own row of
    its phase's table; ``seen`` (a reduction) counts the clock's steps over both phases."""

    name = "two-phases"
    data_names = ("row",)
    phases = ("a", "b")

    def tables(self, meta):
        return [TableSpec("a", meta.n_shards), TableSpec("b", meta.n_shards), TableSpec("seen", 1, kind="reduction")]

    def shard_step(self, ctx, data):
        ctx.set_state("read", (np.array(ctx.pull("a")), np.array(ctx.pull("b"))))
        ctx.add(ctx.phase, np.ones(1), start=ctx.shard)
        ctx.add("seen", np.ones(1))

    def clock_end(self, ctx):
        return {"objective": float(ctx.pull("a").sum() + ctx.pull("b").sum()), "seen": float(ctx.pull("seen")[0])}

    def converged(self, history, tol):
        return False


@pytest.mark.parametrize("staleness", [0, 2])
def test_phases_under_staleness_read_the_end_of_clock_t_minus_1_minus_s_in_every_phase(staleness):
    """Under BSP phase b sees phase a's updates of the same clock; stale, both phases read the end of clock
    t-1-s (plus their own shard's rows); a reduction sums both phases of one clock."""
    data = dscar.PhasedData({"a": {"row": np.arange(2)}, "b": {"row": np.arange(2)}}, n_shards=2)
    run = StaleRun(TwoPhases(), data, 4, staleness)
    for t in range(1, 7):
        m = run.clock(t)
        assert m["seen"] == 4 and m["objective"] == 4 * t
        old = max(0, t - 1 - staleness)
        for shard in (0, 1):  # phase a: shards 0, 1 write rows 0, 1 of table a
            a, b = run.states[shard]["read"]
            assert list(a) == [t - 1 if r == shard else old for r in (0, 1)] + [0, 0]
            assert list(b) == [0, 0, old, old]
        for shard in (2, 3):  # phase b: shards 2, 3 write rows 2, 3 of table b, after phase a is applied
            a, b = run.states[shard]["read"]
            fresh_a = t if staleness == 0 else old
            assert list(a) == [fresh_a, fresh_a, 0, 0]
            assert list(b) == [0, 0] + [t - 1 if r == shard else old for r in (2, 3)]


def test_lagging_skips_models_with_phases_and_says_so(capsys):
    assert main(["--quick", "--models", "mf", "--lagging", "4"]) == 2
    assert "mf: skipped (--lagging models one data phase per clock)" in capsys.readouterr().out


def test_the_benchmark_prints_a_table_and_writes_json_and_a_plot(tmp_path, capsys):
    out, png = tmp_path / "st.json", tmp_path / "st.png"
    assert main(["--quick", "--models", "lasso", "--staleness", "0,1", "--json", str(out), "--plot", str(png)]) == 0
    text = capsys.readouterr().out
    assert "clocks of work to target" in text and "lasso" in text
    d = json.loads(out.read_text())
    (s0, s1) = d["summary"]
    assert (s0["staleness"], s1["staleness"]) == (0, 1) and s0["reached"] == 1 and s0["vs_bsp"] == 1.0
    assert s1["median_clocks"] > s0["median_clocks"]  # stale gradients cost coordinate descent clocks
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("model", ["lda", "mlr-m0"])
def test_each_model_reaches_its_target_at_the_staleness_it_declares(model):
    """``max_staleness`` is a measured claim: at that staleness (every read that stale) the quick problem
    still reaches its target. (Lasso, ALS and MLR with momentum declare 0: BSP.)"""
    from bench.staleness import problems

    (p,) = problems(True, [model])
    algo = p.make_algo(0)
    assert algo.max_staleness > 0
    reached, objective = StaleRun(algo, p.data, p.n_shards, algo.max_staleness, tol=algo.tol).run(p.max_clocks)
    assert reached is not None, objective[-5:]
