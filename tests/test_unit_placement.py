"""A fit starts with each row unit (the same rows of tables laid out alike: Lasso's ``w``, ``colsum`` and
``corr``) on one owner, on a real in-process cluster, also where the rows are not a multiple of the
partitions; the hand-off and even-out plans keep units whole from there (``tests/test_elastic.py``)."""
from __future__ import annotations

from distributed import LocalCluster

import dscar
from dscar.algorithms.datasets import make_regression
from dscar.algorithms.lasso import LassoCD
from dscar.scheduler.coordinator import PLUGIN_NAME


def test_a_fit_starts_with_each_row_range_of_tables_laid_out_alike_on_one_owner():
    X, y, _ = make_regression(600, 40, seed=2)  # 40 features on 3 workers: partitions of 14, 13 and 13 rows
    with LocalCluster(n_workers=3, threads_per_worker=1, processes=False, dashboard_address=":0") as lc:
        cl = dscar.connect(lc)  # (installs the coordinator)
        coordinator = lc.scheduler.plugins[PLUGIN_NAME]
        at_start: list[tuple[dict, dict]] = []
        begin = coordinator._begin

        async def recording(job_id: str, clock: int) -> dict:
            job = coordinator.jobs.get(job_id)
            if job is not None and clock == 1:
                at_start.append((dict(job.pmap.owners), dict(job.pmap.units)))
            return await begin(job_id, clock)

        coordinator._begin = recording
        res = dscar.fit(LassoCD(0.01), {"X": X, "y": y}, cl, n_shards=3, max_clocks=3, tol=1e-300, progress=False)
    assert res.n_clocks == 3 and at_start
    owners, units = at_start[0]
    by_unit: dict[tuple, set[str]] = {}
    for key, unit in units.items():
        by_unit.setdefault(unit, set()).add(owners[key])
    shared = {u for u in by_unit if sum(units[k] == u for k in units) >= 3}  # (w, colsum, corr: 40 rows, 3 parts)
    assert len(shared) == 3, by_unit
    assert all(len(ws) == 1 for ws in by_unit.values()), by_unit
    assert len({next(iter(by_unit[u])) for u in shared}) == 3  # one row range a worker
