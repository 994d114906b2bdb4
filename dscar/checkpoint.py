"""Checkpoints: configuration, schedule, row priority, and the file format (no Dask here).

Store layout under ``url`` (a local directory or any fsspec URL)::

    manifest-00000007.json            one per published version (written atomically)
    v00000007/3f2a9c01d4e8.bin        one file per writer (a worker) per version: the rows
                                      of its partitions and the shard states it saved,
                                      raw arrays one after another (``encode_file``)

A writer's file has no header: each manifest entry is a byte range of it
(``offset``, ``bytes``, the range's own ``sha256``) and says where its arrays
are in that range (``wire.layout``: ``[offset, bytes, dtype, shape]``), so a
priority checkpoint of tiny tables writes the rows it saves and their index,
not a container's headers per partition, and a restore reads and verifies only
its entries. A partition's entry names its ``values`` and, for a partial save,
its ``index`` of saved rows: ``["varint", ...]`` (the gaps between sorted rows,
LEB128) or ``["bitmap", ...]`` (one bit per row), whichever is shorter. A
shard's state entry names its arrays (``arrays``). Manifests carry
``"format": FORMAT``; one of another format (an older dscar's ``.npz`` files)
is skipped, not misread.

The store follows no link and touches nothing outside its own real path
(``in_store``): on a local filesystem every path it reads, writes or deletes
must resolve (``os.path.realpath``) to itself under the store's real path, so
a symbolic link below the store (a version folder, a file, a manifest) is
refused, never followed, and reported like a corrupt checkpoint (an older
version is used); a file is opened with ``O_NOFOLLOW``. Object stores
(``memory://``, ``s3://``) have no links: there a path is confined by name
(``validation.confined``). Retention deletes only regular files of the store.
Before use, every entry's arrays are checked against what the model declared:
a partition's dtype and shape against its table's, a shard state's names,
dtypes and shapes against ``Algorithm.shard_state`` (when the model declares it).

A version is *published* only when its manifest exists; the manifest is
written (temp name, then rename) after every file it names is written,
flushed and its SHA-256 recorded. A partition's value at a version is its
*chain*: the initial values (checkpoint 0, deterministic from the seed), then
each listed entry in order: a full save replaces every row, a priority save
(``index`` + ``values``) replaces those rows. ``full`` checkpoints give chains
of one entry; ``priority`` checkpoints add one entry per version, up to
``max_chain`` entries: then the partition's next save writes it whole, which
starts its chain anew (older entries, and files no kept manifest names, go).
A shard's
saved state is whole: the manifest's ``states`` names, per shard, the newest
entry that holds it.

A manifest's ``clock`` is the clock whose end it was taken at. Under SSP the
tables may then hold later clocks' updates of shards that ran ahead: its
``cut`` (``{"shard": clock}``, every shard, present only when some shard is past
``clock``) is, per shard, the newest clock whose update the saved tables and that
shard's saved state hold. A resume starts each shard at the clock after its cut
(``ClockWindow.resume_from``); without ``cut`` every shard starts at ``clock + 1``.

Priority (SCAR): with fraction ``r`` every ``r * C`` clocks, each partition
saves the ``r * rows`` rows (on average over saves: ``priority_count``) whose
value moved most (L2 norm of current - last saved): the same rows, and with
this format nearly the same bytes, as a full save every ``C`` clocks. A whole
save in a priority chain is paid for from the rows the partition's next saves
would write, spread over the saves until its next whole one (``whole_count``),
so the bytes stay those of full checkpoints.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import posixpath
import re
import stat
import uuid
from dataclasses import asdict, dataclass
from typing import Any, Mapping

import numpy as np

from . import wire
from .errors import DscarError, InvalidInputError

MANIFEST_RE = re.compile(r"manifest-(\d{8})\.json$")
DATA_DIR_RE = re.compile(r"^v(\d{8})$")  #: a version's data folder (``data_dir``)
MAX_CHAIN = 50  #: the default ``CheckpointConfig.max_chain``
#: the key ``find_resume`` adds to the manifests it returns (never written to a store): the newest
#: version number the store showed, so the resumed fit's ledger numbers its versions past it
NEWEST_TAKEN = "newest_taken"
#: the store layout manifests describe (2: one raw file per writer and version, ranges per entry)
FORMAT = 2


class CorruptCheckpointError(DscarError):
    """A checkpoint file is missing, unreadable or does not match its checksum."""


@dataclass(frozen=True)
class CheckpointConfig:
    """Where and how to checkpoint, and how to recover from a lost worker.

    ``policy``: ``"full"`` (every table every ``every`` clocks) or ``"priority"``
    (fraction ``fraction`` of the rows that moved most, every ``fraction * every``
    clocks). ``recovery``: ``"partial"`` (restore only what the lost worker held:
    its partitions and its shards' states) or ``"full"`` (roll every param table,
    and the state of every shard the newest manifest saved, back to the newest
    manifest; clocks keep their numbers: the clock counter is not rolled back,
    and rolled-back clocks count as rework). ``keep``: how many
    published versions to keep. ``memory``: a memory tier under the disk tier:
    after every clock each owner copies its param partitions, and each holder its
    shards' states, into the memory of a buddy worker (the next live worker in
    address order), and partial recovery restores a lost partition or shard state
    from its buddy when the buddy is alive (from disk otherwise, e.g. when owner
    and buddy are lost together). ``interval``: ``"fixed"`` (a checkpoint every
    ``period`` clocks) or ``"auto"``: every Young/Daly period ``sqrt(2 cost MTBF)``,
    from the checkpoints' measured cost and ``mtbf`` (seconds; None: observed from
    the job's own losses, and ``period`` until one happens); see ``dscar.core.intervals``.
    ``max_chain``: the most entries a partition's priority chain holds before its
    next save writes it whole; bounds the manifests, the files kept and what a
    restore reads, however long the fit runs.
    """

    url: str
    policy: str = "priority"
    every: int = 10
    fraction: float = 0.1
    keep: int = 3
    recovery: str = "partial"
    storage_options: dict | None = None
    memory: bool = False
    interval: str = "fixed"
    mtbf: float | None = None
    max_chain: int = MAX_CHAIN

    def validate(self) -> "CheckpointConfig":
        from . import validation as v

        v.instance("checkpoint url", self.url, str, "a directory path or an fsspec URL string")
        if not self.url:
            raise InvalidInputError("checkpoint url is empty")
        v.choice("checkpoint policy", self.policy, ("full", "priority"))
        v.choice("recovery", self.recovery, ("partial", "full"))
        v.integer("checkpoint interval C", self.every, 1)
        if not 0 < v.number("checkpoint fraction r", self.fraction) <= 1:
            raise InvalidInputError(f"checkpoint fraction r must be in (0, 1], got {self.fraction!r}")
        if self.policy == "priority" and self.fraction * self.every < 1 - 1e-9:
            raise InvalidInputError(
                f"priority checkpoints every r*C = {self.fraction * self.every:g} clocks: need r*C >= 1"
            )
        v.integer("keep", self.keep, 1)
        v.integer("max_chain", self.max_chain, 2)
        if not isinstance(self.memory, bool):
            raise InvalidInputError(f"checkpoint memory must be True or False, got {self.memory!r}")
        v.choice("checkpoint interval", self.interval, ("fixed", "auto"))
        v.number("mtbf", self.mtbf, 0.0, strict_min=True, optional=True)
        if self.mtbf is not None and self.interval != "auto":
            raise InvalidInputError("mtbf sets the automatic checkpoint interval: give interval='auto' with it")
        if self.storage_options is not None:
            v.instance("storage_options", self.storage_options, dict, "a dict of fsspec options or None")
        return self

    @property
    def period(self) -> float:
        """Clocks between two checkpoints."""
        return self.every * (self.fraction if self.policy == "priority" else 1.0)

    @property
    def save_fraction(self) -> float:
        return self.fraction if self.policy == "priority" else 1.0

    def due(self, clock: int) -> bool:
        """Checkpoint after ``clock``? (every ``period`` clocks, counted from 0)."""
        p = self.period
        return math.floor(clock / p + 1e-9) > math.floor((clock - 1) / p + 1e-9)

    def to_msg(self) -> dict:
        return asdict(self)


def fs_and_root(url: str, storage_options: dict | None = None):
    import fsspec

    return fsspec.core.url_to_fs(url, **(storage_options or {}))


def is_local(fs) -> bool:
    """Whether ``fs`` is the local filesystem: the one kind of store whose paths can be symbolic links."""
    protocol = getattr(fs, "protocol", ())
    return bool({"file", "local"} & set([protocol] if isinstance(protocol, str) else protocol))


def in_store(fs, root: str, path: str) -> str:
    """``path`` if it lies inside the store ``root``, else ``CorruptCheckpointError`` naming it.

    By name on every filesystem (``validation.confined``: manifests are plain JSON anyone can
    edit); on a local one by its real path too: it must resolve to itself under the store's real
    path, so no component below the store is a symbolic link (the store's own path may pass
    through one: a store in a linked directory). A path not there yet (a file about to be
    written) is resolved as far as it exists."""
    from .validation import confined

    if posixpath.normpath(path) != posixpath.normpath(root) and not confined(path, root):
        raise CorruptCheckpointError(f"{path!r} lies outside the checkpoint store {root!r}")
    if is_local(fs):
        real = os.path.realpath(path)
        inside = os.path.relpath(os.path.abspath(path), os.path.abspath(root))
        if real != os.path.normpath(os.path.join(os.path.realpath(root), inside)):
            raise CorruptCheckpointError(f"{path}: a symbolic link, or under one, to {real!r}: the checkpoint "
                                         f"store {root!r} follows no link")
    return path


def _open_regular(path: str, flags: int) -> int:
    """A descriptor of the regular file ``path``, its last component not followed if a link
    (``O_NOFOLLOW``: a link swapped in after ``in_store`` looked fails here); to write, also with
    no other name (through a hard link a write would change a file outside the store; a read of
    one reads bytes the store holds, as a hard-linked copy of a store does)."""
    fd = os.open(path, flags | getattr(os, "O_NOFOLLOW", 0), 0o666)
    st = os.fstat(fd)
    writes = flags & (os.O_WRONLY | os.O_RDWR)
    if not stat.S_ISREG(st.st_mode) or (writes and st.st_nlink > 1):
        os.close(fd)
        raise CorruptCheckpointError(f"{path}: not a regular file of the checkpoint store "
                                     f"({'hard-linked' if stat.S_ISREG(st.st_mode) else 'not a file'})")
    return fd


def check_writable(cfg: CheckpointConfig) -> None:
    """Create the store and write, read back and delete a probe file; ``InvalidInputError`` if not possible."""
    try:
        fs, root = fs_and_root(cfg.url, cfg.storage_options)
        fs.makedirs(root, exist_ok=True)
        probe = posixpath.join(root, f".probe-{uuid.uuid4().hex}")
        with fs.open(probe, "wb") as f:
            f.write(b"dscar")
        with fs.open(probe, "rb") as f:
            ok = f.read() == b"dscar"
        fs.rm(probe)
        if not ok:
            raise OSError("read back different bytes")
    except InvalidInputError:
        raise
    except Exception as e:
        raise InvalidInputError(f"checkpoint location {cfg.url!r} is not writable: {e}") from None


TEMPORARY_PREFIX = "dscar-checkpoints-"


def temporary_store() -> str:
    """A new local directory for the checkpoints of a run that injects worker losses but names no
    store (the API and the CLI alike); the caller removes it with ``remove_temporary``."""
    import tempfile

    return tempfile.mkdtemp(prefix=TEMPORARY_PREFIX)


def remove_temporary(path: str | None) -> None:
    import os
    import shutil

    if path and os.path.basename(path.rstrip("/")).startswith(TEMPORARY_PREFIX):
        shutil.rmtree(path, ignore_errors=True)


def needs_store(faults) -> bool:
    """Whether injected faults lose workers (kill / hang): recovery then needs checkpoints."""
    return any(getattr(f, "kind", None) in ("kill", "hang") for f in faults)


def priority_count(n: int, fraction: float, credit: float, repay: float = 0.0) -> tuple[int, float]:
    """How many rows a priority save takes from a partition of ``n`` rows, and the credit carried
    to its next save: ``fraction * n`` rows per save on average, exactly (at r = 0.1 a partition of
    125 rows saves 12 and 13 rows in turn, not 13 every time; one of 2 rows saves a row every
    fifth time), so priority checkpoints write the rows a full one would, no more; less by
    ``repay`` rows while the partition pays for a whole save (``whole_count``)."""
    credit += fraction * n - repay
    k = max(0, min(n, int(math.floor(credit + 1e-9))))  # 1e-9: 0.1 * 10 rows is a whole row, not 0.99...
    rest = credit - k  # negative while a repayment exceeds the share: carried, not forgiven
    return k, 0.0 if -1e-6 < rest < 0 else rest


def whole_count(n: int, fraction: float, credit: float) -> tuple[int, float]:
    """A whole save of a partition in a priority chain (``max_chain``): all ``n`` rows now, and the
    debt beyond this save's share and the credit it had, which its next saves repay (``repay``
    of ``priority_count``), so the bytes over time stay ``fraction * n`` rows a save."""
    return n, n - fraction * n - credit  # negative (a credit left) only for a partition of a row or two


def moved(current: np.ndarray, saved: np.ndarray) -> np.ndarray:
    """Each row's squared L2 change since it was saved (float64)."""
    n = current.shape[0]
    diff = (current - saved).reshape(n, -1).astype(np.float64, copy=False)
    return np.einsum("ij,ij->i", diff, diff)


def priority_rows(moved_sq: np.ndarray, k: int) -> np.ndarray:
    """Indices (sorted) of the ``k`` rows that moved most (``moved_sq``: ``moved``'s per-row change)."""
    n = moved_sq.shape[0]
    if k >= n:
        return np.arange(n)
    if k <= 0:
        return np.zeros(0, dtype=np.int64)
    return np.sort(np.argpartition(-moved_sq, k - 1)[:k])


def encode_index(rows: np.ndarray, n: int) -> tuple[str, bytes]:
    """The sorted row indices of a partial save among ``n`` rows, as the shorter of a LEB128
    varint of the gaps between them (``"varint"``) and one bit per row (``"bitmap"``)."""
    rows = np.asarray(rows, dtype=np.int64)
    gaps = np.diff(rows, prepend=-1) - 1  # >= 0: rows are sorted and distinct
    v = gaps.astype(np.uint64)
    width = np.ones(v.size, dtype=np.int64)
    rest = v >> np.uint64(7)
    while rest.any():
        width += rest > 0
        rest >>= np.uint64(7)
    j = np.arange(int(width.max()) if v.size else 1, dtype=np.uint64)
    digits = ((v[:, None] >> (np.uint64(7) * j)) & np.uint64(0x7F)).astype(np.uint8)
    digits |= np.where(j[None, :] < (width[:, None] - 1).astype(np.uint64), 0x80, 0).astype(np.uint8)
    varint = digits[j[None, :] < width[:, None].astype(np.uint64)].tobytes()
    mask = np.zeros(n, dtype=bool)
    mask[rows] = True
    bitmap = np.packbits(mask).tobytes()
    return ("varint", varint) if len(varint) <= len(bitmap) else ("bitmap", bitmap)


def decode_index(kind: str, data: bytes, count: int) -> np.ndarray:
    """The row indices ``encode_index`` wrote (``count``: rows, or the partition's rows for a bitmap)."""
    b = np.frombuffer(data, dtype=np.uint8)
    if kind == "bitmap":
        return np.flatnonzero(np.unpackbits(b, count=count)).astype(np.int64)
    if kind != "varint":
        raise ValueError(f"unknown row index encoding {kind!r}")
    if not b.size:
        return np.zeros(0, dtype=np.int64)
    ends = np.flatnonzero(b < 0x80)
    if ends.size != count or not ends.size or ends[-1] != b.size - 1:
        raise ValueError("row index length does not match")
    starts = np.r_[0, ends[:-1] + 1]
    pos = np.arange(b.size) - np.repeat(starts, ends - starts + 1)
    gaps = np.add.reduceat((b & 0x7F).astype(np.uint64) << (np.uint64(7) * pos.astype(np.uint64)), starts)
    return np.cumsum(gaps.astype(np.int64) + 1) - 1


def encode_file(parts: list[tuple[str, int, np.ndarray | None, np.ndarray, int]],
                states: dict[int, dict[str, np.ndarray]]) -> tuple[bytes, list[dict]]:
    """One writer's checkpoint file and its manifest entries (without the file's ``path``).

    ``parts``: ``(table, part, rows, values, n_rows)`` per saved partition (``rows`` None: all
    ``n_rows`` rows); ``states``: shard -> its state arrays. Each entry is a byte range of the
    file (``offset``, ``bytes``, its own ``sha256``) laid out by ``wire.layout``, so a restore
    reads and verifies its entries only, not the whole file; the ranges add up to the file."""
    chunks, entries, size = [], [], 0

    def add(entry: dict, arrays: list) -> list:
        nonlocal size
        data, where = wire.layout(arrays)
        entry.update(offset=size, bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
        chunks.append(data)
        size += len(data)
        entries.append(entry)
        return where

    for table, part, rows, values, n_rows in parts:
        entry = {"table": table, "part": int(part), "rows": int(values.shape[0]), "partial": rows is not None}
        if rows is None:
            (entry["values"],) = add(entry, [values])
        else:
            kind, index = encode_index(rows, n_rows)
            entry["values"], where = add(entry, [values, np.frombuffer(index, dtype=np.uint8)])
            entry["index"] = [kind, where, int(len(rows)) if kind == "varint" else int(n_rows)]
    for shard, st in sorted(states.items()):
        entry = {"kind": "state", "shards": [int(shard)]}
        names = list(st)
        entry["arrays"] = dict(zip(names, add(entry, [st[k] for k in names])))
    return b"".join(chunks), entries


def _array(data: bytes, where: list, path: str) -> np.ndarray:
    """One array of a verified entry (a writable copy); ``CorruptCheckpointError`` if it does not fit."""
    try:
        return wire.read_array(data, where).copy()
    except ValueError as e:
        raise CorruptCheckpointError(f"{path}: {e}") from None


def state_shards(n_shards: int, fraction: float, last_saved: dict[int, int],
                 credit: float = 0.0) -> tuple[list[int], float]:
    """The shards whose state a checkpoint saves, and the credit carried to the next one: all
    (``fraction == 1``), or ``fraction * n_shards`` on average, exactly (``priority_count``'s
    rule: at r = 0.1 of 8 shards, 4 saves of 1 shard in every 5), those saved longest ago (never
    saved first, ties by id).

    Shard state (e.g. topic assignments) is saved whole per shard; rotating by age at that
    count keeps a priority checkpoint's state bytes at a full one's budget. (Rounded up, 1 shard
    a save at r = 0.1 of 8, it wrote 1.25x the budget: LDA's priority checkpoints were 1.21x full's.)
    """
    if fraction >= 1:
        return list(range(n_shards)), 0.0
    k, credit = priority_count(n_shards, fraction, credit)
    return sorted(sorted(range(n_shards), key=lambda s: (last_saved.get(s, -1), s))[:k]), credit


def read_state(fs, root: str, entry: dict, shard: int,
               declared: Mapping[str, Any] | None = None) -> dict[str, np.ndarray]:
    """Shard ``shard``'s state from its manifest entry in the store ``root``; ``CorruptCheckpointError``
    if it does not verify or, when the model declares its state (``declared``: name ->
    ``StateSpec``, from ``Algorithm.shard_state``), its arrays are not those names, dtypes and shapes."""
    arrays = entry.get("arrays")
    if not isinstance(arrays, dict) or shard not in entry.get("shards", ()):
        raise CorruptCheckpointError(f"{entry.get('path')}: not a state entry of shard {shard}")
    data = _read_verified(fs, root, entry)
    state = {name: _array(data, where, entry["path"]) for name, where in arrays.items()}
    check_state(state, declared, shard, entry["path"])
    return state


def check_state(state: Mapping[str, np.ndarray], declared: Mapping[str, Any] | None, shard: int, where: str) -> None:
    """``CorruptCheckpointError`` (naming ``where`` the copy came from) unless shard ``shard``'s
    ``state`` holds exactly the arrays the model declares (``Algorithm.shard_state``: name ->
    ``StateSpec``), of those dtypes and shapes; nothing to check where the model declares none.
    Every copy of a state is checked, the memory tier's as the disk's: a wrong one is never used."""
    if declared is None:
        return
    if set(state) != set(declared):
        raise CorruptCheckpointError(f"{where}: shard {shard}'s state holds {sorted(state)}, "
                                     f"the model declares {sorted(declared)}")
    for name, a in state.items():
        want = declared[name]
        if a.dtype != np.dtype(want.dtype) or a.shape != tuple(want.shape):
            raise CorruptCheckpointError(
                f"{where}: shard {shard}'s state {name!r} is {a.dtype} {a.shape}, the model "
                f"declares {np.dtype(want.dtype)} {tuple(want.shape)}")


def _read_range(fs, root: str, path: str, start: int, end: int) -> bytes:
    """Bytes ``[start, end)`` of the store's file ``path`` (``in_store``; never through a link)."""
    in_store(fs, root, path)
    if not is_local(fs):
        return fs.cat_file(path, start=start, end=end)
    fd = _open_regular(path, os.O_RDONLY)
    try:
        chunks, at = [], start
        while at < end:  # one pread returns at most ~2 GiB
            chunk = os.pread(fd, min(end - at, 1 << 30), at)
            if not chunk:
                break
            chunks.append(chunk)
            at += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _read_verified(fs, root: str, entry: dict) -> bytes:
    """The bytes of a manifest entry's range of its file in the store ``root``, checked against the
    entry's SHA-256."""
    try:
        start = int(entry["offset"])
        end = start + int(entry["bytes"])
        path, sha = entry["path"], entry["sha256"]
    except (KeyError, TypeError, ValueError) as e:
        raise CorruptCheckpointError(f"{entry.get('path') if isinstance(entry, dict) else entry!r}: "
                                     f"malformed file entry ({e!r})") from None
    try:
        data = _read_range(fs, root, path, start, end)
    except (FileNotFoundError, OSError) as e:
        raise CorruptCheckpointError(f"{path}: cannot read ({e})") from None
    if len(data) != end - start or hashlib.sha256(data).hexdigest() != sha:
        raise CorruptCheckpointError(f"{path}: checksum mismatch")
    return data


def write_file(fs, root: str, path: str, data: bytes) -> dict:
    """Write, flush and fsync ``data`` at ``path`` in the store ``root``; return its manifest entry
    (path, sha256, bytes). ``CorruptCheckpointError`` where the path leaves the store (``in_store``)."""
    folder = in_store(fs, root, posixpath.dirname(path))
    fs.makedirs(folder, exist_ok=True)
    in_store(fs, root, path)
    if is_local(fs):
        fd = _open_regular(path, os.O_WRONLY | os.O_CREAT)
        try:
            os.ftruncate(fd, 0)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
    else:
        with fs.open(path, "wb") as f:  # object stores have no fsync: a completed put is durable
            f.write(data)
    return {"path": path, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


def read_entry(fs, root: str, entry: dict) -> tuple[np.ndarray | None, np.ndarray]:
    """``(rows or None, values)`` of a partition's manifest entry in the store ``root``;
    ``CorruptCheckpointError`` if its range of the file does not verify or does not hold what
    the entry says."""
    data = _read_verified(fs, root, entry)
    values = _array(data, entry.get("values"), entry["path"])
    if "index" not in entry:
        return None, values
    try:
        kind, where, count = entry["index"]
        rows = decode_index(kind, wire.read_array(data, where).tobytes(), int(count))
    except (TypeError, ValueError, IndexError) as e:
        raise CorruptCheckpointError(f"{entry['path']}: bad row index ({e})") from None
    if rows.size != values.shape[0]:
        raise CorruptCheckpointError(f"{entry['path']}: {rows.size} row indices for {values.shape[0]} rows")
    return rows, values


def apply_chain(fs, root: str, base: np.ndarray, chain: list[dict]) -> np.ndarray:
    """The partition's value: ``base`` (its initial values, of the table's declared dtype) with
    every entry of ``chain`` (in the store ``root``) applied in order; an entry of another dtype or
    shape is corrupt, not cast."""
    out = np.array(base, copy=True)
    for entry in chain:
        rows, values = read_entry(fs, root, entry)
        if values.dtype != out.dtype:
            raise CorruptCheckpointError(f"{entry['path']}: dtype {values.dtype}, the table's is {out.dtype}")
        if rows is None:
            if values.shape != out.shape:
                raise CorruptCheckpointError(f"{entry['path']}: shape {values.shape}, expected {out.shape}")
            out[...] = values
        else:
            if rows.size and (rows.min() < 0 or rows.max() >= out.shape[0]) or values.shape[1:] != out.shape[1:]:
                raise CorruptCheckpointError(f"{entry['path']}: rows or shape do not fit the partition")
            out[rows] = values
    return out


def manifest_path(root: str, version: int) -> str:
    return posixpath.join(root, f"manifest-{version:08d}.json")


def data_dir(root: str, version: int) -> str:
    return posixpath.join(root, f"v{version:08d}")


def publish(fs, root: str, manifest: dict) -> str:
    """Write the manifest atomically: a temporary name, then a rename. ``CorruptCheckpointError``
    where its name is taken by a link (``in_store``): a rename onto a link to a folder would
    move the manifest into that folder, wherever it is."""
    path = in_store(fs, root, manifest_path(root, manifest["version"]))
    tmp = posixpath.join(root, f".tmp-{uuid.uuid4().hex}.json")
    text = json.dumps(manifest, sort_keys=True, separators=(",", ":"))  # the C encoder, one write
    with fs.open(tmp, "w") as f:
        f.write(text)
    if is_local(fs):
        os.replace(tmp, path)  # replaces a file, never follows a link (shutil.move follows one to a folder)
    else:
        fs.mv(tmp, path)
    return path


def list_versions(fs, root: str, refused: list[str] | None = None) -> list[int]:
    """The published versions in the store, oldest first; a manifest name that is a link is no
    version of the store: it is left alone and appended to ``refused``."""
    return _versions(_ls(fs, root, refused), MANIFEST_RE)


def _ls(fs, root: str, refused: list[str] | None = None) -> list[str]:
    """The paths of the store's top level, less the symbolic links among them (appended to
    ``refused``): nothing the store lists is followed out of it."""
    try:
        names = fs.ls(root, detail=False)
    except FileNotFoundError:
        return []
    if not is_local(fs):
        return names
    links = [n for n in names if os.path.islink(n)]
    if refused is not None:
        refused.extend(links)
    return [n for n in names if n not in links]


def _versions(names: list[str], pattern: re.Pattern) -> list[int]:
    """The version numbers of the ``names`` (paths) that match ``pattern`` (manifests or data folders)."""
    return sorted(int(m.group(1)) for n in names if (m := pattern.search(posixpath.basename(n.rstrip("/")))))


def load_manifest(fs, root: str, version: int) -> dict:
    """The manifest of ``version``; ``CorruptCheckpointError`` if it is a link, is not valid JSON of
    the expected form or names a file outside the store or through a link (``in_store``: workers
    must never read elsewhere)."""
    path = in_store(fs, root, manifest_path(root, version))
    try:
        if is_local(fs):
            fd = _open_regular(path, os.O_RDONLY)
            with os.fdopen(fd, "r") as f:
                m = json.load(f)
        else:
            with fs.open(path, "r") as f:
                m = json.load(f)
    except (OSError, ValueError) as e:
        raise CorruptCheckpointError(f"{path}: not a readable JSON manifest ({e})") from None
    if not isinstance(m, dict) or not all(k in m for k in ("version", "clock", "chains")):
        raise CorruptCheckpointError(f"{path}: not a dscar manifest (needs version, clock, chains)")
    if m.get("format") != FORMAT:
        raise CorruptCheckpointError(f"{path}: checkpoint format {m.get('format', 1)!r}, this dscar reads {FORMAT} "
                                     "(written by another version)")
    cut = m.get("cut", {})
    if not isinstance(cut, dict) or not all(isinstance(c, int) and isinstance(m["clock"], int) and c >= m["clock"]
                                            for c in cut.values()):
        raise CorruptCheckpointError(f"{path}: malformed cut {cut!r} (shard -> a clock from the manifest's on)")
    try:
        entries = [e for chain in m["chains"].values() for e in chain] + list(m.get("states", {}).values())
        paths = [e["path"] for e in entries]
    except (AttributeError, KeyError, TypeError) as e:
        raise CorruptCheckpointError(f"{path}: malformed file entries ({e!r})") from None
    outside = []
    for p in sorted(set(map(str, paths))):  # one writer's file holds many entries: each path once
        try:
            in_store(fs, root, p)
        except CorruptCheckpointError as e:
            outside.append(str(e))
    if outside:
        raise CorruptCheckpointError(f"{path}: names file(s) outside the checkpoint store {root!r}: {outside[:3]}")
    return m


#: options of the stopping rule and of execution, not of the model: a run may resume with other values
RESUME_IGNORES = ("tol", "early_stop", "window", "patience", "backend", "min_chunks", "max_chunk_elems")


def row_order(algorithm, meta) -> dict[str, str]:
    """``{table: digest}`` of the tables ``algorithm`` stores in another row order than its result's
    (``Algorithm.result_rows``), as a model record holds it: a checkpoint holds stored rows, so a fit
    that would store them in another order (LDA's partitioned schedule over another shard count)
    must not resume from it. Tables in result order are left out (an older record has none)."""
    out = {}
    for spec in algorithm.tables(meta):
        rows = algorithm.result_rows(spec.name, meta)
        if rows is not None:
            out[spec.name] = hashlib.sha256(np.ascontiguousarray(rows, dtype=np.int64).tobytes()).hexdigest()[:16]
    return out


def find_resume(cfg: CheckpointConfig, want: dict, tables: list, skipped: list[dict]) -> list[dict]:
    """This model's published manifests in ``cfg``'s store, newest first, or ``InvalidInputError``.

    ``want``: the fit's model record (name, class, params, n_rows, shapes). Only the model's
    hyperparameters and the data are compared (not ``RESUME_IGNORES``), and a refusal names
    the keys that differ. Every manifest passed over (unreadable, malformed, a link, naming a
    file outside the store or through a link) is appended to ``skipped`` as an event.
    """
    import time

    from .validation import param_differences

    fs, root = fs_and_root(cfg.url, cfg.storage_options)
    names = {t.name: t.n_rows for t in tables}
    found, links = [], []
    listed = _ls(fs, root, links)
    versions = _versions(listed, MANIFEST_RE)
    # every version number the store shows (a manifest, readable or not; a data folder, published
    # or abandoned; a link): a resumed fit numbers its versions past all of them, so none of its
    # writes lands in a folder or on a manifest name an older run left behind
    taken = versions + _versions(listed, DATA_DIR_RE) + _versions(links, MANIFEST_RE) + _versions(links, DATA_DIR_RE)
    for link in links:
        if (m := MANIFEST_RE.search(posixpath.basename(link))) is not None:
            skipped.append({"time": time.time(), "kind": "checkpoint-skipped", "version": int(m.group(1)),
                            "error": f"{link}: a symbolic link: the checkpoint store follows no link"})
    for v in reversed(versions):
        try:
            m = load_manifest(fs, root, v)
        except CorruptCheckpointError as e:
            skipped.append({"time": time.time(), "kind": "checkpoint-skipped", "version": v, "error": str(e)})
            continue  # try an older one
        got = m.get("model", {})
        if got.get("name") != want["name"] or got.get("class") != want["class"]:
            raise InvalidInputError(
                f"{cfg.url!r} holds checkpoints of model {got.get('name')!r} ({got.get('class')}), "
                f"not of {want['name']!r} ({want['class']})"
            )
        diff = param_differences(got.get("params", {}), want["params"], RESUME_IGNORES)
        diff += param_differences({k: got.get(k) for k in ("n_rows", "shapes")},
                                  {k: want[k] for k in ("n_rows", "shapes")})
        if diff:
            raise InvalidInputError(f"{cfg.url!r} holds a {want['name']} checkpoint of other hyperparameters "
                                    f"or data; differing: {'; '.join(diff)}")
        got_order, want_order = got.get("row_order", {}), want.get("row_order", {})
        if differ := sorted(t for t in {*got_order, *want_order} if got_order.get(t) != want_order.get(t)):
            raise InvalidInputError(
                f"{cfg.url!r} holds a {want['name']} checkpoint whose tables {differ} store their rows in another "
                f"order than this fit's (the model's layout follows settings such as the shard count): resume it "
                f"with the settings it was written with")
        if {t: int(n) for t, n, _, _ in m.get("tables", [])} != names:
            raise InvalidInputError(f"{cfg.url!r}: the checkpoint's tables {m.get('tables')} do not match {names}")
        found.append(m)
    if not found:
        more = f" ({len(skipped)} unreadable manifest(s) skipped)" if skipped else ""
        raise InvalidInputError(f"nothing to resume: {cfg.url!r} holds no published checkpoint{more}")
    for m in found:
        m[NEWEST_TAKEN] = max(taken)
    return found


def retain(fs, root: str, keep: int, refused: list[str] | None = None) -> list[str]:
    """Delete manifests older than the ``keep`` newest and, in the data folders of every version
    older than the newest kept one, the files no kept manifest names; return the paths deleted.

    Every such folder is looked at again at each call until its last file goes: a priority chain
    names a version's file for up to ``max_chain`` versions, an abandoned version's files are
    named by none. Newer folders belong to versions still being written.

    Nothing outside the store is deleted: a manifest, folder or file that is a symbolic link (or
    anything but a regular file in a data folder) is left alone, neither followed nor removed;
    while a kept manifest cannot be read, no data file goes (what it names is unknown). Each is
    appended to ``refused``, a sentence naming the path."""
    refused = [] if refused is None else refused
    links: list[str] = []
    names = _ls(fs, root, links)
    refused.extend(f"{p}: a symbolic link, left alone: the checkpoint store follows no link" for p in links)
    versions = _versions(names, MANIFEST_RE)
    kept, dropped = versions[-keep:], versions[:-keep]
    for v in dropped:
        fs.rm(manifest_path(root, v))
    if not kept:
        return []
    referenced = set()
    for v in kept:
        try:
            m = load_manifest(fs, root, v)
        except CorruptCheckpointError as e:
            refused.append(str(e))
            return []
        referenced.update(e["path"] for chain in m["chains"].values() for e in chain)
        referenced.update(e["path"] for e in m.get("states", {}).values())
    removed = []
    for v in _versions(names, DATA_DIR_RE):
        if v >= kept[-1]:
            continue
        d = data_dir(root, v)
        for p in fs.ls(d, detail=False):
            if p in referenced or posixpath.join("/", p) in referenced:
                continue
            if is_local(fs) and not stat.S_ISREG(os.lstat(p).st_mode):
                refused.append(f"{p}: not a regular file (a symbolic link?), left alone: the checkpoint store "
                               "follows no link")
                continue
            fs.rm(p)
            removed.append(p)
        if not fs.ls(d, detail=False):
            try:
                fs.rmdir(d)
            except OSError:  # a late writer of an abandoned version put a file there meanwhile
                pass
    return removed


def chain_key(table: str, part: int) -> str:
    return f"{table}/{part}"
