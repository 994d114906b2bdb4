"""bench.spark's tables and picture from given figures (Spark itself never runs in the tests)."""
import pytest

from bench.spark import Row, format_tables, write_png


def rows():
    return [
        Row("als", "dscar", 10.0, 0.5, 0.93, "test RMSE", {"data": "als data", "iters": 10}),
        Row("als", "spark", 40.0, 2.0, 0.94, "test RMSE", {"data": "als data", "iters": 10}),
        Row("lda", "dscar-gibbs", 2.0, 0.04, -7.5, "loglik/token", {"data": "lda data", "tokens_per_s": 2e6}),
        Row("lda", "spark-em", 20.0, 0.4, -7.6, "loglik/token", {"data": "lda data", "tokens_per_s": 2e5}),
        Row("lasso", "dscar", 3.0, None, 0.5, "objective", {"data": "lasso data", "iters": 8, "nnz": 80,
                                                           "rel_gap_to_best": 0.0}),
        Row("lasso", "spark", 45.0, None, 0.5000001, "objective", {"data": "lasso data", "iters": 50, "nnz": 81,
                                                                  "rel_gap_to_best": 2e-7}),
        Row("failure", "dscar", 3.3, None, 0.94, "test RMSE", {"data": "fail data", "baseline_s": 3.0,
                                                             "baseline_rmse": 0.94, "workers_lost": 1}),
        Row("failure", "spark", 23.0, None, 0.95, "test RMSE", {"data": "fail data", "baseline_s": 15.0,
                                                              "baseline_rmse": 0.95, "workers_lost": 1}),
    ]


def test_tables_have_the_ratios():
    text = format_tables(rows())
    lines = text.splitlines()
    als = next(line for line in lines if line.startswith("spark/dscar") and "4.00" in line)
    assert als.split()[1:] == ["4.00", "4.00"]
    lda = next(line for line in lines if line.startswith("spark-em"))
    assert lda.split()[3] == "10.00"  # dscar's tokens/s over Spark EM's
    assert any(line.startswith("spark/dscar") and "15.00" in line for line in lines)  # lasso total
    fail = {line.split()[0]: line.split() for line in lines if line.startswith(("dscar ", "spark "))}
    assert fail["dscar"][3:5] == ["+0.30", "+10"] and fail["spark"][3:5] == ["+8.00", "+53"]
    assert "spark/dscar extra seconds: 26.7" in text and "Not like-for-like:" in text


def test_png(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "spark.png"
    write_png(str(path), rows())
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_a_failure_cost_within_the_noise_is_said_so():
    r = rows()
    r[-2].total_s = 2.9
    r[-2].extra.update(baseline_all_s=[3.0, 3.1], killed_all_s=[2.9, 3.0])
    text = format_tables(r)
    assert "dscar runs (s): no kill 3.00 3.10; killed 2.90 3.00" in text
    assert "dscar's extra is within its run-to-run spread (-0.10 s); Spark's +8.00 s" in text


# ------------------------------------------------- Spark's time per iteration (issue 43, item 4)
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from bench.spark import per_iter_points, per_iteration  # noqa: E402


def test_quicks_noisy_fits_give_a_labelled_bound_not_a_negative_time():
    # the shape of --quick's ALS (3 iterations, 20k ratings): the 1-iteration fit was the slowest, so
    # the old (T(3) - T(1)) / 2 was negative
    iters, secs = [1, 2, 3, 1, 2, 3], [5.1, 4.2, 3.7, 4.1, 4.6, 4.4]
    est = per_iteration(iters, secs)
    assert (est.seconds, est.method) == (pytest.approx((3.7 + 4.4) / 2 / 3), "upper bound")
    assert est.slope_s < 0  # what the old figure would have reported, kept for the record


def test_a_clear_marginal_cost_is_the_slope():
    iters = [1, 5, 10, 1, 5, 10]
    secs = [3.0 + 0.8 * n + e for n, e in zip(iters, [0.05, -0.04, 0.03, -0.05, 0.04, -0.02])]
    est = per_iteration(iters, secs)
    assert est.method == "slope"
    assert est.seconds == pytest.approx(0.8, abs=0.02) and est.intercept_s == pytest.approx(3.0, abs=0.1)
    assert 0 < est.slope_se_s < 0.02


def test_per_iter_points_and_bad_input():
    assert per_iter_points(10) == [1, 5, 10] and per_iter_points(3) == [1, 3] and per_iter_points(1) == [1]
    with pytest.raises(ValueError):
        per_iteration([1, 2], [1.0])
    assert per_iteration([4], [2.0]).seconds == 0.5  # one fit: time / iterations


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 50), st.floats(0, 1e3)), min_size=1, max_size=12))
def test_the_figure_is_never_negative(fits):
    iters, secs = map(list, zip(*fits))
    est = per_iteration(iters, secs)
    assert est.seconds >= 0
    assert est.method == "slope" or est.seconds <= max(secs) / max(iters) + 1e-12


def test_the_table_marks_a_bound():
    r = rows()
    r[1].extra.update(per_iter={"seconds": 2.0, "method": "upper bound", "slope_s": -0.3, "slope_se_s": 0.4,
                                "intercept_s": 5.0}, fits={"iters": [1, 3], "seconds": [5.1, 6.0]})
    text = format_tables(r)
    assert next(line for line in text.splitlines() if line.startswith("spark/dscar")).split()[1:] == ["<=4.00", "4.00"]
    assert next(line for line in text.splitlines() if line.startswith("spark ")).split()[1] == "<=2.000"
    assert "an upper bound: the slope is not resolved (slope -0.300 ± 0.400 s over fits of 1 it 5.10 s, 3 it 6.00 s)" in text
