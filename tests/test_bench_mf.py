"""bench.mf's pairing of repeats (the solvers themselves need the bench-mf extra, not installed for tests)."""
import statistics

from bench.mf import Result, merge, paired_ratios, rmse_differences


def test_repeats_merge_to_medians_and_pair_by_repeat_at_equal_cores():
    runs = [Result("dscar-2w-32", 2, 0.1, s, repeat=k) for k, s in enumerate([0.30, 0.40, 0.20])]
    runs += [Result("lenskit-2t", 2, 0.1, s, repeat=k) for k, s in enumerate([0.25, 0.50, 0.20])]
    runs += [Result("lenskit-1t", 1, 0.1, 9.0, repeat=0), Result("dscar-2w-32", 2, 3.0, 1.0, repeat=0)]
    merged = {(r.solver, r.reg): r for r in merge(runs)}
    assert merged[("dscar-2w-32", 0.1)].per_iter_s == 0.30 and merged[("dscar-2w-32", 0.1)].repeats_s == [0.30, 0.40, 0.20]
    assert merged[("lenskit-2t", 0.1)].per_iter_s == 0.25
    # each repeat against the same repeat and cores (not the 1-thread run, not another reg)
    assert paired_ratios(runs, 0.1) == {"dscar-2w-32": [0.30 / 0.25, 0.40 / 0.50, 0.20 / 0.20]}
    assert paired_ratios(runs, 3.0) == {}  # no lenskit run at that reg


def test_rmse_differences_summarise_each_reg_over_the_data_seeds():
    rows = [{"seed": k, "reg": 3.0, "dscar": 1.0 + d, "lenskit": 1.0} for k, d in enumerate([2e-4, -5e-4, 4e-4, -3e-4])]
    rows.append({"seed": 0, "reg": 0.1, "dscar": 1.1, "lenskit": 1.2})
    s = rmse_differences(rows)
    assert set(s) == {"3.0", "0.1"}
    assert s["3.0"]["n"] == 4 and s["3.0"]["no_worse"] == 2
    assert abs(s["3.0"]["mean"] - (-0.5e-4)) < 1e-12 and abs(s["3.0"]["median"] - (-0.5e-4)) < 1e-12
    assert abs(s["3.0"]["se"] - statistics.stdev([2e-4, -5e-4, 4e-4, -3e-4]) / 2) < 1e-12
    assert s["0.1"]["n"] == 1 and s["0.1"]["se"] is None and s["0.1"]["no_worse"] == 1
