"""Results that stay on the cluster: a table over the driver budget comes back as a Dask array
backed by the partitions on their owners, never gathered by the driver."""
import numpy as np
import pytest

import dscar
from dscar.algorithms.datasets import make_regression
from dscar.algorithms.lasso import LassoCD

from conftest import RowCounter, assert_exactly_once, row_data

da = pytest.importorskip("dask.array")


@pytest.mark.timeout(120)
def test_a_table_over_the_budget_stays_on_the_cluster(procs, monkeypatch):
    n = 5000  # 'count': 40 kB, over a 10 kB budget; the driver must not pull it
    from dscar.api import driver

    pulled = []
    real = driver._Run._gather

    async def spy(self):
        out = await real(self)
        pulled.extend(k for k, v in out.items() if isinstance(v, np.ndarray))
        return out

    monkeypatch.setattr(driver._Run, "_gather", spy)
    res = dscar.fit(RowCounter(n_parts=3), row_data(n), procs, n_shards=4, max_clocks=3, result_budget=10_000)
    count = res.params["count"]
    assert isinstance(count, da.Array) and count.shape == (n,) and count.numblocks == (3,)
    assert "count" not in pulled
    # its blocks are task results on the workers that owned the partitions
    keys = [k for k in procs.client.who_has(count) if "dscar-result" in str(k)]
    assert len(keys) == 3 and all(procs.client.who_has(count)[k] for k in keys)
    res.params["count"] = procs.client.compute(count).result()
    assert_exactly_once(res, n)
    np.testing.assert_array_equal(procs.client.compute(count[10:20]).result(), np.full(10, 3.0))


def test_small_tables_are_gathered_and_an_embedded_cluster_refuses_the_budget(procs):
    X, y, _ = make_regression(1000, 10, 3, seed=0)
    res = dscar.fit(LassoCD(0.01), {"X": X, "y": y}, procs, result_budget=10**9)
    assert all(isinstance(v, np.ndarray) for v in res.params.values())
    with pytest.raises(dscar.InvalidInputError, match="must outlive the fit"):
        dscar.fit(LassoCD(0.01), {"X": X, "y": y}, result_budget=16)
