"""Readers of real data sets in their standard formats, from local paths or fsspec URLs.

* ``movielens(path)``: explicit ratings of MovieLens — ``u.data`` of ml-100k (tab separated,
  no header), ``ratings.csv`` of ml-latest / ml-latest-small / ml-20m / ml-25m (header
  ``userId,movieId,rating,timestamp``) and ``ratings.dat`` of ml-1m / ml-10m (``::``);
  for ``dscar.algorithms.mf.MF``.
* ``uci_bag_of_words(docword, vocab)``: the UCI "Bag of Words" corpora (``docword.kos.txt``,
  ``docword.nytimes.txt.gz``, ... with ``vocab.*.txt``); for ``dscar.algorithms.lda.LDA``.
* ``svmlight(path)``: LIBSVM / svmlight files (scikit-learn's reader); for ``Lasso`` and ``MLR``.

The data sets are not downloaded here: point the loaders at the files (``s3://`` and
``gcs://`` work through fsspec with ``pip install 'dscar[s3]'`` / ``'dscar[gcs]'``; ``.gz``,
``.bz2`` and ``.xz`` files are decompressed by their extension). A file that is not in the format
raises ``dscar.InvalidInputError`` naming the file and the line.
"""
from __future__ import annotations

import io
import posixpath
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import scipy.sparse as sp

from dscar import InvalidInputError
from dscar.errors import describe

from .corpora import Corpus


def _open(path: str, storage_options: dict | None, mode: str = "rb"):
    import fsspec

    try:
        return fsspec.open(str(path), mode, compression="infer", **(storage_options or {})).open()
    except (OSError, ValueError, ImportError) as e:  # not there, unreachable, or no fsspec backend for it
        raise InvalidInputError(f"cannot open {path!r}: {describe(e)}") from None


@dataclass
class Ratings:
    """Explicit ratings with ids re-numbered ``0..n-1`` (``users``, ``items``, ``ratings``; the
    original ids in ``user_ids`` / ``item_ids``). Unpacks as ``users, items, ratings``, so
    ``MF().fit(movielens(path))`` works."""

    users: np.ndarray  #: int64, 0..n_users-1
    items: np.ndarray  #: int64, 0..n_items-1
    ratings: np.ndarray  #: float64
    user_ids: np.ndarray  #: the file's id of user u is user_ids[u]
    item_ids: np.ndarray  #: the file's id of item i is item_ids[i]
    timestamps: np.ndarray | None = None  #: int64 seconds, when the file has them

    def __iter__(self) -> Iterator[np.ndarray]:
        return iter((self.users, self.items, self.ratings))

    def __len__(self) -> int:
        return 3

    @property
    def n_users(self) -> int:
        return len(self.user_ids)

    @property
    def n_items(self) -> int:
        return len(self.item_ids)


def _table(path: str, text: str, sep: str, header: bool) -> np.ndarray:
    """The numeric columns of a delimited text file (pandas when installed: ml-25m has 25 M lines)."""
    try:
        import pandas as pd
    except ImportError:
        pd = None
    try:
        if pd is not None:
            df = pd.read_csv(io.StringIO(text), sep=sep, header=0 if header else None, engine="c" if len(sep) == 1 else "python")
            return df.to_numpy(dtype=np.float64)
        lines = text.splitlines()[1 if header else 0:]
        rows = [ln.split(sep) if sep != r"\s+" else ln.split() for ln in lines if ln.strip()]
        return np.array(rows, dtype=np.float64)
    except (ValueError, TypeError) as e:
        raise InvalidInputError(f"{path}: not a table of numbers ({e})") from None


def movielens(path: str, storage_options: dict | None = None) -> Ratings:
    """MovieLens ratings from ``u.data`` (ml-100k), ``ratings.csv`` (ml-latest, ml-25m, ...) or
    ``ratings.dat`` (ml-1m, ml-10m); the format follows the file name."""
    name = posixpath.basename(str(path)).lower()
    for ext in (".gz", ".bz2", ".xz"):
        name = name.removesuffix(ext)
    with _open(path, storage_options, "rt") as f:
        text = f.read()
    if name.endswith(".csv"):
        first = text.split("\n", 1)[0].lower()
        if "userid" not in first.replace("_", "") or "rating" not in first:
            raise InvalidInputError(f"{path}: expected the header userId,movieId,rating,timestamp, got {first[:80]!r}")
        a = _table(path, text, ",", True)
    elif name.endswith(".dat"):
        a = _table(path, text, "::", False)
    else:
        a = _table(path, text, r"\s+", False)  # u.data: user item rating timestamp, tab separated
    if a.ndim != 2 or a.shape[1] < 3 or a.shape[0] == 0:
        raise InvalidInputError(f"{path}: expected rows of user, item, rating[, timestamp]; got shape {a.shape}")
    if not np.isfinite(a[:, :3]).all() or (a[:, :2] != np.round(a[:, :2])).any():
        raise InvalidInputError(f"{path}: user and item ids must be integers and ratings numbers")
    user_ids, users = np.unique(a[:, 0].astype(np.int64), return_inverse=True)
    item_ids, items = np.unique(a[:, 1].astype(np.int64), return_inverse=True)
    ts = a[:, 3].astype(np.int64) if a.shape[1] > 3 else None
    return Ratings(users.astype(np.int64), items.astype(np.int64), a[:, 2].copy(), user_ids, item_ids, ts)


def uci_bag_of_words(docword: str, vocab: str | None = None, storage_options: dict | None = None) -> Corpus:
    """A UCI bag-of-words corpus: ``docword.NAME.txt[.gz]`` (three header lines D, W, NNZ, then
    ``docID wordID count`` triples, 1-based) and optionally ``vocab.NAME.txt`` (one word a line).
    Returns a ``Corpus`` (``X``: documents x words int64 counts in CSR; ``vocab``)."""
    with _open(docword, storage_options, "rt") as f:
        head = [f.readline() for _ in range(3)]
        try:
            D, W, nnz = (int(h) for h in head)
        except ValueError:
            raise InvalidInputError(f"{docword}: expected three header lines D, W, NNZ, got {[h.strip() for h in head]}") from None
        body = f.read()
    try:
        t = np.array(body.split(), dtype=np.int64)
    except ValueError as e:
        raise InvalidInputError(f"{docword}: the triples after the header must be integers ({e})") from None
    if t.size != 3 * nnz:
        raise InvalidInputError(f"{docword}: the header says {nnz} (doc, word, count) triples, the file has "
                                f"{t.size / 3:g} (truncated or not a docword file)")
    t = t.reshape(nnz, 3)
    d, w, c = t[:, 0] - 1, t[:, 1] - 1, t[:, 2]
    if nnz and (d.min() < 0 or d.max() >= D or w.min() < 0 or w.max() >= W or c.min() < 0):
        raise InvalidInputError(f"{docword}: ids outside 1..{D} (documents) / 1..{W} (words) or negative counts")
    X = sp.csr_matrix((c, (d, w)), shape=(D, W), dtype=np.int64)
    words: tuple[str, ...] = tuple(str(j) for j in range(W))
    if vocab is not None:
        with _open(vocab, storage_options, "rt") as f:
            words = tuple(line.rstrip("\n") for line in f if line.strip())
        if len(words) != W:
            raise InvalidInputError(f"{vocab} has {len(words)} words, but {docword} says W = {W}")
    return Corpus(X, words)


def svmlight(path: str, n_features: int | None = None, *, zero_based: Any = "auto",
             storage_options: dict | None = None) -> tuple[sp.csr_matrix, np.ndarray]:
    """``X`` (CSR float64) and ``y`` of a LIBSVM / svmlight file (scikit-learn's reader)."""
    try:
        from sklearn.datasets import load_svmlight_file
    except ImportError:
        raise InvalidInputError("reading svmlight files needs scikit-learn (pip install scikit-learn)") from None
    with _open(path, storage_options) as f:
        try:
            X, y = load_svmlight_file(f, n_features=n_features, zero_based=zero_based)
        except (ValueError, TypeError) as e:
            raise InvalidInputError(f"{path}: not a svmlight / LIBSVM file ({e})") from None
    if X.shape[0] == 0:
        raise InvalidInputError(f"{path} holds no rows")
    return X.tocsr(), y
