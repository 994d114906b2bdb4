"""Results that stay on the cluster: a table too large for the driver becomes a Dask array
backed by its partitions, copied into task results on the workers that own them.

The driver never holds such a table: each partition is pulled by a task pinned to its owner
(from the owner's own parameter server, through the same ``dscar_pull`` handler the driver
uses for small tables), before the job ends and frees the partitions. The Dask array lives as
long as the client that fitted it and its futures: compute slices of it, ``to_zarr`` it, or
``persist`` it.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .partitions import row_bounds
from .validation import table_bytes


def over_budget(t: Any, budget: float | None) -> bool:
    """Whether ``param`` table ``t`` (a ``TableSpec``) stays on the cluster under ``budget`` bytes."""
    return budget is not None and t.kind == "param" and table_bytes(t.n_rows, t.trailing, t.dtype) > budget


def _pull_own_partition(job_id: str, table: str, part: int, n: int) -> np.ndarray:
    """Runs as a task on the partition's owner: a copy of the partition, as a task result."""
    from distributed import get_worker
    from distributed.utils import sync

    w = get_worker()
    token = w.plugins["dscar-paramserver"].jobs[job_id].token  # (the job's: ``dscar.membership``)
    r = sync(w.loop, w.rpc(w.address).dscar_pull, job_id=job_id, table=table, part=part, lo=0, hi=n, token=token)
    return np.asarray(r["data"])


async def keep_on_cluster(client: Any, job_id: str, t: Any, owner: dict[tuple[str, int], str]) -> Any:
    """The Dask array of table ``t``, one block per partition, each computed on its owner."""
    import dask.array as da
    from distributed.client import _wait

    futures, blocks = [], []
    for p, (a, b) in enumerate(row_bounds(t.n_rows, t.n_parts)):
        f = client.submit(_pull_own_partition, job_id, t.name, p, b - a, workers=[owner[(t.name, p)]],
                          allow_other_workers=False, pure=False, key=f"dscar-result-{job_id}-{t.name}-{p}")
        futures.append(f)
        blocks.append(da.from_delayed(f, shape=(b - a, *t.trailing), dtype=np.dtype(t.dtype)))
    await _wait(futures)  # before the job ends and its partitions are freed
    bad = [f for f in futures if f.status == "error"]
    if bad:
        raise RuntimeError(f"could not keep table {t.name!r} on the cluster: {await bad[0].exception()!r}")
    return da.concatenate(blocks, axis=0)
