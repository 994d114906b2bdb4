"""The straggler benchmark runs end to end (``--quick``) and reports what it promises."""
import math

import pytest

SCENARIOS = ["1", "2", "4", "8", "transient"]
STRATEGIES = ["bsp", "dynamic", "dynamic+backup"]


@pytest.fixture(scope="module")
def quick_run(quick_bench):
    # the synthetic workload only: the Lasso one runs the same loop on a real model (its set-up is checked
    # below) and took half of the quick run
    return quick_bench("stragglers", "--only", "synthetic")


@pytest.mark.timeout(1600)
def test_quick_benchmark_writes_tables_json_and_plot(quick_run):
    stdout, d, png = quick_run
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    assert d["quick"] is True and d["repeats"] == 1 and d["n_workers"] == 4
    assert d["scenarios"] == SCENARIOS
    assert d["machine"]["cpu_count"] >= 1 and "distributed" in d["machine"]
    assert set(d["workloads"]) == {"synthetic-32"}
    assert len(d["runs"]) == len(SCENARIOS) * len(STRATEGIES)
    assert sum(r["failed"] for r in d["runs"]) <= 2, [r.get("error") for r in d["runs"] if r["failed"]]
    for name, a in d["workloads"].items():
        assert f"== {name}" in stdout
        assert a["S1_shard_phase_s"] > 0 and a["F1_rest_of_clock_s"] >= 0
        assert set(a["table"]) == set(SCENARIOS)
        for scen, row in a["table"].items():
            assert "n/a" in row["dynamic+adaptive"]
            for strat in STRATEGIES:
                cell = row[strat]
                if "time_per_clock_s" not in cell:  # a run the engine failed: counted, not measured
                    assert cell["failed_runs"] >= 1
                    continue
                assert cell["time_per_clock_s"] > 0 and cell["ideal_s"] > 0
                assert math.isfinite(cell["ratio_to_ideal"]) and cell["ratio_to_ideal"] > 0
                assert cell["n_clocks"] == [a["max_clocks"]]
                if "time_per_clock_s" in row["bsp"]:
                    assert cell["speedup_over_bsp"] > 0
                if strat == "bsp":
                    assert cell["backup_attempts"] == 0 and cell["shards_moved"] == 0
        assert {t["target"].split(":")[0] for t in a["targets"]} <= {"s=4", "s=8"}
        assert all(isinstance(t["met"], bool) for t in a["targets"])
    assert stdout.count("target:") == sum(len(a["targets"]) for a in d["workloads"].values())
    assert "n/a" in stdout and "minibatch" in stdout
    for r in d["runs"]:
        if not r["failed"]:
            assert len(r["clock_s"]) == len(r["shard_phase_s"]) == r["n_clocks"]


@pytest.mark.timeout(1600)
def test_quick_benchmark_shows_the_straggler_effect_on_the_sleep_workload(quick_run):
    _, d, _ = quick_run
    a = d["workloads"]["synthetic-32"]
    t = {s: {k: c.get("time_per_clock_s") for k, c in row.items()} for s, row in a["table"].items()}
    # BSP waits for the slowed worker's 8 shards; dynamic sharding moves shards off it
    assert t["8"]["bsp"] > 2.5 * t["1"]["bsp"]
    assert t["8"]["bsp"] > 2.0 * t["8"]["dynamic"]
    assert a["table"]["8"]["bsp"]["slowed_worker_shards_median"] == 8
    assert a["table"]["8"]["dynamic"]["slowed_worker_shards_median"] < 8
    assert 0 < a["per_shard_overhead_s"] < a["t0_shard_cycle_s"]


def test_lda_mlr_and_mf_run_in_full_mode_or_when_named_and_only_mlr_gets_the_adaptive_batch():
    from bench.stragglers import ADAPTIVE, ADAPTIVE_WHY, OPTIONAL_KINDS, STRATEGIES, make_workloads

    assert {w.name for w in make_workloads(True, None)} == {"synthetic-32", "lasso"}  # --quick: as before
    assert set(OPTIONAL_KINDS) == {"lda", "mlr", "mf"}  # and so in full mode
    named = {w.name: w for w in make_workloads(True, {"lda", "mlr", "mf"})}
    assert set(named) == {"lda", "mlr", "mf"}
    assert named["mlr"].strategies == [*STRATEGIES, ADAPTIVE]
    assert named["lda"].strategies == named["mf"].strategies == list(STRATEGIES)
    assert "minibatch" in ADAPTIVE_WHY["mf"]  # the reason printed in its adaptive column
    mf = named["mf"]
    assert mf.data.meta.n_shards == mf.n_shards == 2 * mf.info["n_shards_per_phase"]  # both phases' shard steps
