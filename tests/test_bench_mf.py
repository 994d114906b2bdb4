"""bench.mf's pairing of repeats (the solvers themselves need the bench-mf extra, not installed for tests)."""
from bench.mf import Result, merge, paired_ratios


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
