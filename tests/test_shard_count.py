"""The default shard count (``dscar.core.shard_count``): one per worker unless the step work makes more worth their cost."""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dscar.core.shard_count import (MAX_PER_WORKER, MIB, SHARD_COST_S, SHARD_COST_SHARE, STEP_S_PER_MIB,
                               default_n_shards, shards_per_worker)

pytestmark = pytest.mark.pure

sizes = st.one_of(st.none(), st.floats(0, 1e13, allow_nan=False))


def test_one_shard_per_worker_until_extra_ones_cost_a_small_share_of_the_steps():
    # the first extra shard is worth it once SHARD_COST_SHARE of the steps pays for it
    threshold = SHARD_COST_S / SHARD_COST_SHARE / STEP_S_PER_MIB * MIB
    assert shards_per_worker(0.99 * threshold, balancing=True, shards_cost_quality=False) == 1
    assert shards_per_worker(1.01 * threshold, balancing=True, shards_cost_quality=False) == 2
    assert shards_per_worker(3.01 * threshold, balancing=True, shards_cost_quality=False) == 4
    assert shards_per_worker(1e6 * threshold, balancing=True, shards_cost_quality=False) == MAX_PER_WORKER
    # measured costs passed in: a step 10x dearer per byte affords shards 10x sooner
    assert shards_per_worker(0.11 * threshold, balancing=True, shards_cost_quality=False,
                             step_s_per_mib=10 * STEP_S_PER_MIB) == 2


def test_shards_that_cost_quality_or_cannot_be_balanced_stay_one_per_worker():
    big = 1e12
    assert shards_per_worker(big, balancing=True, shards_cost_quality=True) == 1
    assert shards_per_worker(big, balancing=False, shards_cost_quality=False) == 1
    assert shards_per_worker(None, balancing=True, shards_cost_quality=False) == MAX_PER_WORKER  # size unknown


@given(sizes, sizes, st.booleans(), st.booleans())
def test_more_data_never_means_fewer_shards_and_the_count_is_bounded(a, b, balancing, quality):
    lo, hi = (a, b) if a is None or b is None or a <= b else (b, a)
    k_lo = shards_per_worker(lo, balancing=balancing, shards_cost_quality=quality)
    k_hi = shards_per_worker(hi, balancing=balancing, shards_cost_quality=quality)
    assert 1 <= k_lo <= MAX_PER_WORKER and 1 <= k_hi <= MAX_PER_WORKER
    if lo is not None and hi is not None:
        assert k_lo <= k_hi


@given(st.integers(1, 1000), st.one_of(st.none(), st.integers(1, 10**9)), st.one_of(st.none(), st.integers(0, 10**13)),
       st.booleans(), st.booleans())
def test_the_count_is_whole_shards_per_worker_within_the_rows_and_one_per_worker_at_least(w, rows, n_bytes, bal, q):
    n = default_n_shards(w, rows, n_bytes, balancing=bal, shards_cost_quality=q)
    per = shards_per_worker(None if n_bytes is None else n_bytes / w, balancing=bal, shards_cost_quality=q)
    assert n >= w
    assert n == max(w, per * w if rows is None else min(per * w, rows))
