"""bench.time_to_target: the medians, the ideal, the acceptance rows (pure), and the entry point."""
from __future__ import annotations

import pytest

from bench import stragglers
from bench import time_to_target as ttt


class _Model:
    name = "m"
    tol = 0.01


def _run(strategy, s, seconds, objective=1.0, reached=True, cpu_s=1.0):
    return {"model": "m", "strategy": strategy, "slowdown": s, "seconds": seconds, "clocks": 8, "objective": objective,
            "failed": False, "reached": reached, "compute_s": 2.0, "compute_cpu_s": cpu_s}


def test_time_to_target_is_judged_against_the_capacity_ideal_and_the_backup_strategy():
    names = ["bsp", "dynamic+backup", "ssp-1"]
    runs = []
    for s in ttt.SLOWDOWNS:
        runs += [_run("bsp", s, 1.0 * s), _run("dynamic+backup", s, 1.2),
                 _run("ssp-1", s, 1.1, objective=1.005, cpu_s=1.2)]
    runs.append(_run("ssp-1", 4, 99.0, reached=False))  # not reached: left out of the median, counted
    a = ttt.analyse(runs, _Model(), names)
    assert a["t1"] == 1.0  # the fastest strategy at s = 1
    row = next(r for r in a["rows"] if r["strategy"] == "ssp-1" and r["slowdown"] == 4)
    assert row["ideal"] == 4 / (3 + 1 / 4) and row["seconds"] == 1.1 and row["not_reached"] == 1
    assert abs(row["objective_vs_bsp"] - 0.005) < 1e-12
    assert row["cpu_share"] == 0.6  # its steps' CPU over their wall time: short of cores 40 % of the time
    t = {(x["strategy"], x["slowdown"]): x for x in ttt.targets(a)}
    assert set(t) == {("ssp-1", 4), ("ssp-1", 8)}
    assert t[("ssp-1", 4)]["within_1_10"] and t[("ssp-1", 4)]["faster_than_backup"] and t[("ssp-1", 4)]["objective_ok"]
    assert "ssp-1" in ttt.format_table(a, 1.0)


def test_the_ideal_counts_the_capacity_of_every_worker():
    runs = [_run("dynamic", s, 1.0) for s in ttt.SLOWDOWNS]
    row = next(r for r in ttt.analyse(runs, _Model(), ["dynamic"], n_workers=2)["rows"] if r["slowdown"] == 8)
    assert row["ideal"] == ttt.ideal(1.0, 8, 2) == 2 / (1 + 1 / 8)


def test_a_worse_final_model_or_a_slower_run_fails_its_row():
    runs = [_run("bsp", s, 1.0) for s in ttt.SLOWDOWNS] + [_run("dynamic+backup", s, 1.0) for s in ttt.SLOWDOWNS]
    runs += [_run("ssp-1", s, 2.0, objective=1.02) for s in ttt.SLOWDOWNS]
    [four, eight] = ttt.targets(ttt.analyse(runs, _Model(), ["bsp", "dynamic+backup", "ssp-1"]))
    assert not four["within_1_10"] and not four["faster_than_backup"] and not four["objective_ok"]


def test_ssp_rows_stop_at_the_models_max_staleness():
    assert list(ttt.strategies(2)) == ["bsp", "dynamic", "dynamic+backup", "ssp-1", "ssp-2"]
    assert list(ttt.strategies(0)) == ["bsp", "dynamic", "dynamic+backup"]


def test_stragglers_to_target_hands_over_and_an_unknown_model_exits_2(capsys):
    assert stragglers.main(["--to-target", "--models", "nope"]) == 2
    assert "unknown model" in capsys.readouterr().err


@pytest.mark.timeout(600)
def test_quick_run_on_the_sleep_model_reaches_the_target_with_every_strategy(quick_bench):
    """End to end on worker processes: every strategy, SSP included, applies the target's row updates
    (a counter: exact), and the steps' CPU share is near 0 because they sleep (``compute_cpu_s``)."""
    stdout, d, png = quick_bench("time_to_target", "--models", "sleep")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "cpu/wall" in stdout
    [a] = d["analyses"]
    assert a["model"] == "sleep" and a["target"] == -3200 * a["ref_clocks"]
    assert {(r["strategy"], r["slowdown"]) for r in a["rows"]} == {
        (st, s) for st in ("bsp", "dynamic", "dynamic+backup", "ssp-1", "ssp-2", "ssp-4") for s in (1, 4)}
    for r in a["rows"]:
        assert r["runs"] == 1 and not r["failed"] and not r["not_reached"], r
        assert r["objective"] <= a["target"] and r["cpu_share"] < 0.5, r
    assert {(t["strategy"], t["slowdown"]) for t in d["targets"]} == {("ssp-1", 4), ("ssp-2", 4), ("ssp-4", 4)}
