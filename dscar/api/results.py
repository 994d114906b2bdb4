"""Results outside a fit: tables that stay on the cluster, and results saved as arrays and JSON.

Results that stay on the cluster: a table too large for the driver becomes a Dask array
backed by its partitions, copied into task results on the workers that own them.

The driver never holds such a table: each partition is pulled by a task pinned to its owner
(from the owner's own parameter server, through the same ``dscar_pull`` handler the driver
uses for small tables), before the job ends and frees the partitions. The Dask array lives as
long as the client that fitted it and its futures: compute slices of it, ``to_zarr`` it, or
``persist`` it.
"""
from __future__ import annotations

import io
import json
from typing import Any

import numpy as np

from ..errors import InvalidInputError
from ..core.partitions import row_bounds
from ..validation import table_bytes

#: the saved form's file names: the arrays (``np.savez``, read with ``allow_pickle=False``) and the
#: JSON document, written last so a reader never sees half of a saved result
ARRAYS_FILE, DOC_FILE = "arrays.npz", "model.json"


def over_budget(t: Any, budget: float | None) -> bool:
    """Whether ``param`` table ``t`` (a ``TableSpec``) stays on the cluster under ``budget`` bytes."""
    return budget is not None and t.kind == "param" and table_bytes(t.n_rows, t.trailing, t.dtype) > budget


def _pull_own_partition(job_id: str, table: str, part: int, n: int) -> np.ndarray:
    """Runs as a task on the partition's owner: a copy of the partition, as a task result."""
    from distributed import get_worker
    from distributed.utils import sync

    w = get_worker()
    token = w.plugins["dscar-paramserver"].jobs[job_id].token  # (the job's: ``dscar.core.membership``)
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


def json_value(name: str, v: Any) -> Any:
    """``v`` as JSON (NumPy scalars and arrays as Python numbers and lists, tuples as lists), or
    ``InvalidInputError`` naming ``name``."""
    def plain(x: Any) -> Any:
        if isinstance(x, np.generic):
            return x.item()
        if isinstance(x, np.ndarray):
            return x.tolist()
        raise TypeError(f"{type(x).__name__} is not JSON")

    try:
        return json.loads(json.dumps(v, default=plain))
    except (TypeError, ValueError) as e:
        raise InvalidInputError(f"{name} cannot be saved as JSON: {e}") from None


def write_saved(path: str, doc: dict[str, Any], arrays: dict[str, np.ndarray],
                storage_options: dict | None = None) -> None:
    """``arrays`` and the JSON ``doc`` under ``path`` (a directory: local or an fsspec URL)."""
    from ..checkpoint import fs_and_root

    for k, a in arrays.items():
        if a.dtype == object:
            raise InvalidInputError(f"{k} holds Python objects; only numeric and string arrays are saved")
    fs, root = fs_and_root(path, storage_options)
    fs.makedirs(root, exist_ok=True)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    with fs.open(f"{root}/{ARRAYS_FILE}", "wb") as f:
        f.write(buf.getvalue())
    with fs.open(f"{root}/{DOC_FILE}", "w") as f:
        json.dump(doc, f, indent=1)


def read_saved(path: str, fmt: str, version: int,
               storage_options: dict | None = None) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """``(doc, arrays)`` that ``write_saved`` wrote under ``path``; ``InvalidInputError`` when
    nothing of format ``fmt`` and ``version`` is there."""
    from ..checkpoint import fs_and_root

    fs, root = fs_and_root(path, storage_options)
    try:
        with fs.open(f"{root}/{DOC_FILE}", "r") as f:
            doc = json.load(f)
        with fs.open(f"{root}/{ARRAYS_FILE}", "rb") as f:
            data = io.BytesIO(f.read())
    except FileNotFoundError:
        raise InvalidInputError(f"nothing saved at {path!r} ({DOC_FILE} and {ARRAYS_FILE} expected)") from None
    except ValueError as e:
        raise InvalidInputError(f"{path!r} holds nothing dscar saved: {e}") from None
    if not isinstance(doc, dict) or doc.get("format") != fmt:
        raise InvalidInputError(f"{path!r} holds no saved {fmt}" + (
            f" (it holds a {doc['format']})" if isinstance(doc, dict) and "format" in doc else ""))
    if doc.get("version") != version:
        raise InvalidInputError(f"{path!r} is a {fmt} of format version {doc.get('version')}; "
                                f"this dscar reads version {version}")
    with np.load(data, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    return doc, arrays


#: what ``FitResult.save`` writes, and its version
RESULT_FORMAT, RESULT_VERSION = "dscar-fit-result", 1


def save_result(res: Any, path: str, storage_options: dict | None = None) -> None:
    """``FitResult`` ``res`` under ``path``: its tables in ``arrays.npz``, its history, events and
    totals in ``model.json``. Tables kept on the cluster are not pulled here: compute or
    ``to_zarr`` them first."""
    import dataclasses

    arrays = {}
    for k, v in res.params.items():
        if not isinstance(v, np.ndarray):
            raise InvalidInputError(f"table {k!r} is kept on the cluster ({type(v).__name__}); save it with "
                                    f".to_zarr(...), or give res.params[{k!r}] = res.params[{k!r}].compute() first")
        arrays[k] = v
    doc = {"format": RESULT_FORMAT, "version": RESULT_VERSION, "tables": sorted(arrays),
           "history": [json_value(f"clock {r.clock}", dataclasses.asdict(r)) for r in res.history],
           "events": [json.loads(json.dumps(e, default=_event_value)) for e in res.events],
           **{k: json_value(k, getattr(res, k)) for k in ("converged", "seconds", "setup_seconds", "workers",
                                                          "checkpoints")}}
    write_saved(path, doc, arrays, storage_options)


def _event_value(x: Any) -> Any:
    """An event's value as JSON: NumPy as Python numbers, anything else as its text."""
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    return str(x)


def load_result(path: str, storage_options: dict | None = None) -> Any:
    """The ``FitResult`` ``save_result`` wrote under ``path``."""
    from .driver import ClockRecord, FitResult

    doc, arrays = read_saved(path, RESULT_FORMAT, RESULT_VERSION, storage_options)
    return FitResult(params={k: arrays[k] for k in doc["tables"]},
                     history=[ClockRecord(**r) for r in doc["history"]], events=doc["events"],
                     **{k: doc[k] for k in ("converged", "seconds", "setup_seconds", "workers", "checkpoints")})
