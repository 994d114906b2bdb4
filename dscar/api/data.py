"""Training data: validation, the shard layout, and where workers get shards from.

Two sources:

* ``ArrayData``: NumPy / SciPy sparse arrays in the driver. Each shard is sent
  to one worker once; the driver keeps the arrays, so a shard whose holder is
  lost is sent again (the data is never re-sent each clock).
* ``FileData``: a directory (local path or fsspec URL) that workers read
  themselves, so the dataset never has to fit in the driver. Either one
  ``NAME.npy`` per array (C order; each shard reads its byte range), or
  pre-cut ``*.npz`` files, one shard each, every file holding every array.

``PhasedData`` groups one ``ArrayData`` per data phase of an algorithm with
multi-phase clocks (e.g. ratings grouped by user, then by item, for ALS).
"""
from __future__ import annotations

import math
import posixpath
import time
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import scipy.sparse as sp

from ..algorithm import DataMeta
from ..errors import InvalidInputError, describe
from ..core.partitions import row_bounds
from ..validation import integer


def _check_finite(name: str, a: Any, where: str = "") -> None:
    values = a.data if sp.issparse(a) else a
    if values.dtype.kind in "fc" and not np.isfinite(values).all():
        bad = int(values.size - np.count_nonzero(np.isfinite(values)))
        raise InvalidInputError(f"{name}{where} contains {bad} NaN or infinite value(s)")


def _check_array(name: str, a: Any) -> Any:
    if not (sp.issparse(a) or isinstance(a, np.ndarray)):
        try:
            a = np.asarray(a)
        except Exception as e:  # ragged lists and the like
            raise InvalidInputError(f"{name} is not an array: {e}") from None
    if a.dtype.kind not in "biuf":
        raise InvalidInputError(f"{name} has dtype {a.dtype}; dscar needs numbers")
    if a.ndim == 0 or a.shape[0] == 0:
        raise InvalidInputError(f"{name} is empty (shape {a.shape})")
    if sp.issparse(a):
        a = a.tocsr()
    _check_finite(name, a)
    return a


def check_indices(name: str, a: Any, upper: int | None = None, upper_name: str | None = None) -> np.ndarray:
    """``a`` as int64 indices (ids, class labels) in ``[0, upper)``, or ``InvalidInputError``
    naming ``name``. Integer arrays, or floats with integral values, are accepted."""
    a = np.asarray(a)
    if a.dtype.kind == "f":
        if not np.isfinite(a).all():
            raise InvalidInputError(f"{name} contain NaN or infinite values")
        if not (a == np.round(a)).all():
            raise InvalidInputError(f"{name} must be integers, got values like {a[a != np.round(a)][:3].tolist()}")
    elif a.dtype.kind not in "biu":
        raise InvalidInputError(f"{name} must be integers, got dtype {a.dtype}")
    a = a.astype(np.int64)
    if a.size and a.min() < 0:
        raise InvalidInputError(f"{name} must be >= 0, got {int(a.min())}")
    if upper is not None and a.size and a.max() >= upper:
        bound = f"{upper_name}={upper}" if upper_name else f"{upper}"
        raise InvalidInputError(f"{name} must be below {bound}, got {int(a.max())}")
    return a


def _check_bounds(n_rows: int, bounds) -> tuple[tuple[int, int], ...]:
    bounds = tuple((int(a), int(b)) for a, b in bounds)
    if not bounds:
        raise InvalidInputError("shard bounds are empty")
    ok = bounds[0][0] == 0 and bounds[-1][1] == n_rows and all(a < b for a, b in bounds)
    ok = ok and all(b == a2 for (_, b), (a2, _) in zip(bounds, bounds[1:]))
    if not ok:
        raise InvalidInputError(f"shard bounds must be non-empty contiguous row ranges covering 0..{n_rows}, "
                                f"got {list(bounds)[:6]}{'...' if len(bounds) > 6 else ''}")
    return bounds


def _check_layout(n_rows: int, n_shards: int) -> tuple[tuple[int, int], ...]:
    n_shards = integer("n_shards", n_shards, 1)
    if n_rows < n_shards:
        raise InvalidInputError(f"the data has {n_rows} rows, fewer than the {n_shards} shards asked for")
    return tuple(row_bounds(n_rows, n_shards))


class ArrayData:
    """Row-aligned arrays held by the driver, cut into ``n_shards`` row ranges.

    ``bounds``: explicit ``(start, stop)`` row ranges instead of equal cuts (when
    a shard must hold whole groups of rows, e.g. all ratings of a user).
    """

    reloadable = False

    def __init__(self, arrays: Mapping[str, Any], n_shards: int | None = None,
                 bounds: "list[tuple[int, int]] | None" = None):
        if not arrays:
            raise InvalidInputError("no data arrays given")
        self.arrays = {k: _check_array(k, v) for k, v in arrays.items()}
        rows = {k: v.shape[0] for k, v in self.arrays.items()}
        if len(set(rows.values())) != 1:
            raise InvalidInputError(f"arrays have different numbers of rows: {rows}")
        n_rows = next(iter(rows.values()))
        if bounds is None and n_shards is None:
            raise InvalidInputError("give n_shards or shard bounds")
        layout = _check_layout(n_rows, n_shards) if bounds is None else _check_bounds(n_rows, bounds)
        self.meta = DataMeta(
            n_rows=n_rows,
            n_shards=len(layout),
            shapes={k: tuple(v.shape[1:]) for k, v in self.arrays.items()},
            dtypes={k: str(v.dtype) for k, v in self.arrays.items()},
            sparse={k: sp.issparse(v) for k, v in self.arrays.items()},
            shard_bounds=layout,
        )

    def shard(self, i: int) -> dict[str, Any]:
        a, b = self.meta.shard_bounds[i]
        return {k: v[a:b] for k, v in self.arrays.items()}

    def loader(self) -> None:
        return None  # workers cannot read driver memory: shards are placed


class PhasedData:
    """The data of an algorithm with multi-phase clocks: one ``ArrayData`` per phase.

    ``phases`` maps each phase name (in clock order) to an ``ArrayData`` or a dict
    of arrays (cut into ``n_shards`` equal shards). Shard ids are global: phase
    ``i``'s shards follow those of the phases before it, and so do its rows in
    ``meta.shard_bounds``. An array name present in several phases must have the
    same trailing shape in each.
    """

    reloadable = False

    def __init__(self, phases: Mapping[str, Any], n_shards: int | None = None):
        if not phases:
            raise InvalidInputError("PhasedData needs at least one phase")
        self.parts: dict[str, ArrayData] = {}
        for name, d in phases.items():
            if not isinstance(name, str) or not name:
                raise InvalidInputError(f"phase names must be non-empty strings, got {name!r}")
            if isinstance(d, ArrayData):
                self.parts[name] = d
            elif isinstance(d, Mapping):
                self.parts[name] = ArrayData(d, n_shards)
            else:
                raise InvalidInputError(f"phase {name!r}: data must be an ArrayData or a dict of arrays, "
                                        f"not {type(d).__name__}")
        shapes: dict[str, tuple] = {}
        dtypes: dict[str, str] = {}
        sparse: dict[str, bool] = {}
        bounds: list[tuple[int, int]] = []
        self._where: list[tuple[ArrayData, int]] = []  # global shard id -> (phase data, local id)
        offset = 0
        for name, d in self.parts.items():
            for k, shape in d.meta.shapes.items():
                if shapes.setdefault(k, shape) != shape:
                    raise InvalidInputError(f"array {k!r} has rows of shape {shape} in phase {name!r} "
                                            f"but {shapes[k]} in another phase")
            dtypes.update(d.meta.dtypes)
            sparse.update(d.meta.sparse)
            bounds += [(a + offset, b + offset) for a, b in d.meta.shard_bounds]
            self._where += [(d, i) for i in range(d.meta.n_shards)]
            offset += d.meta.n_rows
        self.meta = DataMeta(
            n_rows=offset, n_shards=len(bounds), shapes=shapes, dtypes=dtypes, sparse=sparse,
            shard_bounds=tuple(bounds), phases=tuple((n, d.meta.n_shards) for n, d in self.parts.items()),
        )

    def shard(self, i: int) -> dict[str, Any]:
        d, local = self._where[i]
        return d.shard(local)

    def loader(self) -> None:
        return None


@dataclass(frozen=True)
class _NpyArray:
    path: str
    shape: tuple[int, ...]
    dtype: str
    offset: int  # byte offset of the first row


class FileData:
    """A directory of ``.npy`` arrays or ``.npz`` shards, read by the workers."""

    reloadable = True

    def __init__(self, url: str, n_shards: int | None = None, storage_options: dict | None = None):
        import fsspec

        self.url = str(url)
        self.storage_options = dict(storage_options or {})
        try:
            fs, root = fsspec.core.url_to_fs(self.url, **self.storage_options)
            if fs.isfile(root):
                raise InvalidInputError(
                    f"{self.url!r} is a file; FileData reads a directory of NAME.npy arrays (X.npy, y.npy, ...) "
                    "or of .npz shards: give the directory that holds it")
            names = sorted(fs.ls(root, detail=False))
        except (OSError, ImportError, ValueError) as e:  # not there, unreachable, or no fsspec backend for it
            raise InvalidInputError(f"cannot list data directory {self.url!r}: {describe(e)}") from None
        npy = [n for n in names if n.endswith(".npy")]
        npz = [n for n in names if n.endswith(".npz")]
        if npy and npz:
            raise InvalidInputError(f"{self.url!r} mixes .npy and .npz files; use one kind")
        if npy:
            self._init_npy(fs, npy, n_shards)
        elif npz:
            self._init_npz(fs, npz, n_shards)
        else:
            raise InvalidInputError(f"{self.url!r} holds no .npy or .npz files")

    def _init_npy(self, fs, paths: list[str], n_shards: int | None) -> None:
        self.kind = "npy"
        self.files: dict[str, _NpyArray] = {}
        for p in paths:
            name = posixpath.basename(p)[: -len(".npy")]
            with fs.open(p, "rb") as f:
                try:
                    version = np.lib.format.read_magic(f)
                    read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                                   else np.lib.format.read_array_header_2_0)
                    shape, fortran, dtype = read_header(f)
                except Exception as e:  # NumPy raises ValueError, SyntaxError, tokenize errors...
                    raise InvalidInputError(f"{p}: malformed .npy header ({type(e).__name__}: {e})") from None
                if fortran and len(shape) > 1:
                    raise InvalidInputError(f"{p} is in Fortran order; save it in C order to shard by rows")
                if dtype.hasobject:
                    raise InvalidInputError(f"{p} holds Python objects; dscar reads numbers only")
                if dtype.kind not in "biuf":
                    raise InvalidInputError(f"{p} has dtype {dtype}; dscar needs numbers")
                offset = f.tell()
            need = offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            size = fs.size(p)
            if size is not None and size < need:
                raise InvalidInputError(f"{p} is truncated: its header says {tuple(shape)} {dtype} ({need} bytes "
                                        f"with the header) but the file has {size} bytes")
            self.files[name] = _NpyArray(p, tuple(shape), dtype.str, offset)
        rows = {k: v.shape[0] if v.shape else 0 for k, v in self.files.items()}
        if len(set(rows.values())) != 1:
            raise InvalidInputError(f"arrays in {self.url!r} have different numbers of rows: {rows}")
        n_rows = next(iter(rows.values()))
        if n_rows == 0:
            raise InvalidInputError(f"arrays in {self.url!r} are empty")
        if n_shards is None:
            raise InvalidInputError("n_shards is required for a directory of .npy arrays")
        self.meta = DataMeta(
            n_rows=n_rows,
            n_shards=n_shards,
            shapes={k: v.shape[1:] for k, v in self.files.items()},
            dtypes={k: np.dtype(v.dtype).name for k, v in self.files.items()},
            sparse={k: False for k in self.files},
            shard_bounds=_check_layout(n_rows, n_shards),
        )

    def _init_npz(self, fs, paths: list[str], n_shards: int | None) -> None:
        self.kind = "npz"
        self.paths = paths
        if n_shards not in (None, len(paths)):
            raise InvalidInputError(f"{self.url!r} holds {len(paths)} .npz shards, not {n_shards}")
        bounds, start, shapes, dtypes = [], 0, None, None
        for p in paths:
            try:
                with fs.open(p, "rb") as f, np.load(f, allow_pickle=False) as z:
                    arrs = {k: z[k] for k in z.files}
            except InvalidInputError:
                raise
            except Exception as e:  # a bad zip, a truncated member, a pickled object array
                raise InvalidInputError(f"{p}: not a readable .npz file of arrays ({type(e).__name__}: {e})") from None
            if not arrs:
                raise InvalidInputError(f"{p} holds no arrays")
            s = {k: v.shape[1:] for k, v in arrs.items()}
            d = {k: v.dtype.name for k, v in arrs.items()}
            if shapes is not None and (s != shapes or d != dtypes):
                raise InvalidInputError(f"{p} has arrays {s} {d}, unlike the first shard's {shapes} {dtypes}")
            shapes, dtypes = s, d
            n = {v.shape[0] for v in arrs.values()}
            if len(n) != 1 or 0 in n:
                raise InvalidInputError(f"{p}: arrays are empty or have different numbers of rows")
            bounds.append((start, start + n.pop()))
            start = bounds[-1][1]
        self.meta = DataMeta(
            n_rows=start,
            n_shards=len(paths),
            shapes=shapes,
            dtypes=dtypes,
            sparse={k: False for k in shapes},
            shard_bounds=tuple(bounds),
        )

    def loader(self) -> "FileData":
        return self

    def load_shard(self, i: int) -> dict[str, np.ndarray]:
        """Read shard ``i`` (runs on a worker); checks values like ``ArrayData`` does."""
        import fsspec

        fs, _ = fsspec.core.url_to_fs(self.url, **self.storage_options)
        if self.kind == "npz":
            with fs.open(self.paths[i], "rb") as f, np.load(f, allow_pickle=False) as z:
                out = {k: z[k] for k in z.files}
            where = f" in {self.paths[i]}"
        else:
            a, b = self.meta.shard_bounds[i]
            out = {}
            for name, info in self.files.items():
                dt = np.dtype(info.dtype)
                row_bytes = dt.itemsize * int(np.prod(info.shape[1:], dtype=np.int64))
                with fs.open(info.path, "rb") as f:
                    f.seek(info.offset + a * row_bytes)
                    buf = f.read((b - a) * row_bytes)
                if len(buf) != (b - a) * row_bytes:
                    raise InvalidInputError(f"{info.path} is truncated: rows {a}:{b} need {(b - a) * row_bytes} "
                                            f"bytes at offset {info.offset + a * row_bytes}, got {len(buf)}")
                out[name] = np.frombuffer(buf, dtype=dt).reshape((b - a, *info.shape[1:]))
            where = f" (rows {a}:{b} of {self.url})"
        for k, v in out.items():
            _check_finite(k, v, where)
        return out


def as_data(data: Any, n_shards: int | None, client: Any = None) -> "ArrayData | FileData | PhasedData | DaskData":
    """Accept a mapping of arrays (NumPy, SciPy or Dask), an ``ArrayData`` / ``FileData`` /
    ``PhasedData`` / ``DaskData``, or a path / URL string. Dask collections need the ``client``
    of the cluster they are computed on."""
    if isinstance(data, (ArrayData, FileData, PhasedData, DaskData)):
        return data
    if is_dask(data):
        if client is None:
            raise InvalidInputError("Dask collections train on the cluster they live on: pass cluster= "
                                    "(a distributed.Client, its address or a dscar.Cluster)")
        if not isinstance(data, Mapping):
            raise InvalidInputError("give Dask collections as a dict of name -> array / DataFrame / Series, "
                                    "e.g. {'X': X, 'y': y}")
        return DaskData(data, n_shards, client=client)
    if isinstance(data, str) or hasattr(data, "__fspath__"):
        return FileData(str(data), n_shards)
    if isinstance(data, Mapping) and data and all(isinstance(v, (Mapping, ArrayData)) for v in data.values()):
        return PhasedData(data, n_shards)  # phase name -> arrays of that phase
    if isinstance(data, Mapping):
        return ArrayData(data, n_shards)
    raise InvalidInputError(
        f"data must be a dict of arrays, a FileData or a path/URL, not {type(data).__name__}"
    )


# ------------------------------------------------------------------ Dask collections
def is_dask(data: Any) -> bool:
    """Whether ``data`` is a Dask collection or a mapping holding one (no Dask import needed)."""
    def one(v: Any) -> bool:
        return hasattr(v, "__dask_graph__") and callable(getattr(v, "__dask_keys__", None))

    if isinstance(data, Mapping):
        return any(one(v) for v in data.values())
    return one(data)


def _dask_columns(name: str, v: Any, client: Any):
    """A Dask array of ``v`` (an array, a DataFrame or Series, or a NumPy array) with known row chunks."""
    import dask.array as da

    if isinstance(v, da.Array):
        a = v
    elif hasattr(v, "to_dask_array"):  # dask.dataframe: its row counts, computed on the workers
        a = _known_rows(v.to_dask_array(), client)
    elif isinstance(v, np.ndarray) or sp.issparse(v):
        if sp.issparse(v):
            raise InvalidInputError(f"{name}: mix SciPy sparse arrays with Dask collections through a dense "
                                    "dask.array, or give every array as NumPy / SciPy")
        a = da.from_array(v, chunks=(max(1, v.shape[0]),) + v.shape[1:]) if v.ndim else None
    else:
        raise InvalidInputError(f"{name}: a Dask array, DataFrame or Series (or a NumPy array) expected, "
                                f"not {type(v).__name__}")
    if a is None or a.ndim == 0 or a.shape[0] == 0:
        raise InvalidInputError(f"{name} is empty or 0-d")
    if any(math.isnan(c) for c in a.chunks[0]) or math.isnan(a.shape[0]):
        raise InvalidInputError(f"{name}: unknown chunk sizes; call .compute_chunk_sizes() first")
    if np.dtype(a.dtype).kind not in "biuf":
        raise InvalidInputError(f"{name} has dtype {a.dtype}; dscar needs numbers")
    return a


def _known_rows(a: Any, client: Any) -> Any:
    """Dask array ``a`` (from a DataFrame: row chunks unknown) with its row chunks counted on the
    workers, from the blocks of this very graph.

    Counting rows on the DataFrame instead (``map_partitions(len)``) optimizes a different
    expression: Dask fuses the partitions of a narrow Parquet projection, so the counts of one
    column of a 4-file dataset came as 2 lengths for 4 partitions."""
    import dask.array as da

    if not any(math.isnan(c) for c in a.chunks[0]):
        return a
    a = client.persist(a)  # computed once: the counts below and the training read the same chunks
    counts = a.map_blocks(lambda b: np.array([b.shape[0]]), dtype=np.int64, chunks=((1,) * a.numblocks[0],),
                          drop_axis=list(range(1, a.ndim)))
    rows = tuple(int(n) for n in client.compute(counts).result())
    return da.Array(a.dask, a.name, (rows,) + a.chunks[1:], meta=a._meta)


class DaskData:
    """Dask collections (arrays, DataFrames, Series; from Zarr, Parquet, generated...) as training
    data, sharded where their chunks live.

    The collections are persisted on the cluster (computed by the workers; nothing passes
    through the driver), their row chunks become the shards (``n_shards`` re-cuts the rows
    into equal shards, on the workers; with fewer chunks than workers and no ``n_shards``, as
    many equal shards as ``fit`` cuts in-memory data of that size into), and each worker reads a shard from the persisted chunk
    itself: from its own memory when the chunk is there, else from the worker that holds it.
    The driver keeps the persisted collections (so the chunks stay) and their metadata only.
    """

    reloadable = True

    def __init__(self, arrays: Mapping[str, Any], n_shards: int | None = None, *, client: Any):
        if not arrays:
            raise InvalidInputError("no data arrays given")
        cols = {k: _dask_columns(k, v, client) for k, v in arrays.items()}
        rows = {k: a.shape[0] for k, a in cols.items()}
        if len(set(rows.values())) != 1:
            raise InvalidInputError(f"arrays have different numbers of rows: {rows}")
        n_rows = next(iter(rows.values()))
        first = next(iter(cols.values()))
        if n_shards is None and first.numblocks[0] < (n_workers := _worker_count(client)):
            # fewer chunks than workers (a one-file Parquet, a single-chunk array): equal shards, as
            # many as fit() gives in-memory data of this size
            from .driver import default_n_shards

            n_bytes = sum(int(a.nbytes) for a in cols.values())
            n_shards = min(n_rows, default_n_shards(n_workers, int(n_rows), n_bytes))
        if n_shards is not None:
            layout = _check_layout(n_rows, n_shards)
            chunks = tuple(b - a for a, b in layout)
        else:
            chunks = first.chunks[0]  # the first array's row chunks are the shards
        cols = {k: a.rechunk({0: chunks, **{i: -1 for i in range(1, a.ndim)}}) for k, a in cols.items()}
        names = list(cols)
        persisted = client.persist([cols[k] for k in names])
        _wait_computed(client, persisted)
        self._arrays = dict(zip(names, persisted))  # holds the chunks on the workers while this lives
        bounds = tuple(zip(np.cumsum((0,) + chunks[:-1]).tolist(), np.cumsum(chunks).tolist()))
        self.meta = DataMeta(
            n_rows=int(n_rows),
            n_shards=len(chunks),
            shapes={k: tuple(int(s) for s in a.shape[1:]) for k, a in self._arrays.items()},
            dtypes={k: np.dtype(a.dtype).name for k, a in self._arrays.items()},
            sparse={k: False for k in self._arrays},
            shard_bounds=_check_bounds(n_rows, bounds),
        )
        keys = {}
        for k, a in self._arrays.items():  # one block per row chunk (the other axes are whole): its key
            keys[k] = [_flat_key(row) for row in a.__dask_keys__()]
        self._loader = DaskChunks(keys, self.meta.shard_bounds)

    def loader(self) -> "DaskChunks":
        return self._loader


def _worker_count(client: Any) -> int:
    from .cluster import worker_info

    return len(worker_info(client))


def _wait_computed(client: Any, collections: list) -> None:
    """Wait until the workers hold every chunk; a chunk that failed (a missing file, a bad
    graph) is an ``InvalidInputError`` before the job starts."""
    from distributed import futures_of
    from distributed.client import _wait

    futures = futures_of(collections)
    client.sync(_wait, futures)
    bad = [f for f in futures if f.status == "error"]
    if bad:
        e = bad[0].exception()
        raise InvalidInputError(f"computing the Dask data failed in {len(bad)} chunk(s), first {bad[0].key!r}: "
                                f"{type(e).__name__}: {e}")


def _flat_key(k: Any) -> Any:
    while isinstance(k, list):  # the nested key lists of a block grid that is one block wide
        (k,) = k
    return k


@dataclass(frozen=True)
class DaskChunks:
    """What a worker needs to read a shard of ``DaskData``: the persisted chunks' keys (picklable,
    small: the job spec carries it to every worker)."""

    keys: dict[str, list]
    bounds: tuple[tuple[int, int], ...]

    def load_shard(self, i: int) -> dict[str, np.ndarray]:
        """Shard ``i``'s chunks (runs on a worker): from this worker's memory, else from their holder."""
        worker = _this_worker()
        out = {}
        for name, keys in self.keys.items():
            out[name] = np.asarray(_chunk(worker, keys[i]))
        a, b = self.bounds[i]
        for k, v in out.items():
            if v.shape[0] != b - a:
                raise InvalidInputError(f"chunk {self.keys[k][i]!r} of {k} has {v.shape[0]} rows, expected {b - a}")
            _check_finite(k, v, f" (rows {a}:{b})")
        return out


def _this_worker():
    """The Dask worker whose dscar thread runs this call (a process may hold several workers)."""
    import threading

    from distributed import Worker

    workers = list(Worker._instances)
    me = threading.current_thread()
    for w in workers:
        for p in getattr(w, "plugins", {}).values():
            if getattr(p, "_thread", None) is me:
                return w
    try:
        from distributed import get_worker

        return get_worker()
    except ValueError:
        pass
    if len(workers) == 1:
        return workers[0]
    raise RuntimeError("cannot tell which Dask worker runs this shard")


#: how long a worker waits for a persisted chunk whose holder was lost to be recomputed
CHUNK_WAIT_S = 60.0


def _chunk(worker, key) -> Any:
    """A persisted chunk: in this worker's memory, or fetched from a worker that holds it."""
    from distributed.utils import sync
    from distributed.worker import get_data_from_worker

    try:
        return worker.data[key]
    except KeyError:
        pass
    deadline = time.monotonic() + CHUNK_WAIT_S
    while True:
        who = [a for holders in sync(worker.loop, worker.scheduler.who_has, keys=[key]).values() for a in holders]
        for addr in who:
            try:
                r = sync(worker.loop, get_data_from_worker, rpc=worker.rpc, keys=[key], worker=addr, who=worker.address)
            except OSError:  # that holder just left
                continue
            if r.get("status") == "OK" and key in r["data"]:
                return r["data"][key]
        # no holder: a lost worker held it and the scheduler recomputes it (the driver's
        # persisted collection still wants it), or it was released
        if time.monotonic() > deadline:
            raise LookupError(f"chunk {key!r} is held by no live worker after {CHUNK_WAIT_S:.0f}s")
        time.sleep(0.2)
