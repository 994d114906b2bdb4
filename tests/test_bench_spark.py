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
