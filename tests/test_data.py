"""Data validation and the file source (local directory and fsspec memory://)."""
import fsspec
import numpy as np
import pytest
import scipy.sparse as sp

from dscar import ArrayData, FileData, InvalidInputError


def test_array_data_layout():
    X, y = np.ones((10, 3)), np.zeros(10)
    d = ArrayData({"X": X, "y": y}, 3)
    assert d.meta.n_rows == 10 and d.meta.shapes == {"X": (3,), "y": ()}
    assert [b - a for a, b in d.meta.shard_bounds] == [4, 3, 3]
    assert d.shard(1)["X"].shape == (3, 3)


@pytest.mark.parametrize(
    "arrays, match",
    [
        ({"X": np.array([[np.nan, 1.0]]), "y": np.ones(1)}, "NaN or infinite"),
        ({"X": np.array([[np.inf, 1.0]]), "y": np.ones(1)}, "NaN or infinite"),
        ({"X": np.ones((3, 2)), "y": np.ones(4)}, "different numbers of rows"),
        ({"X": np.ones((0, 2)), "y": np.ones(0)}, "empty"),
        ({"X": np.array([["a"]]), "y": np.ones(1)}, "dtype"),
        ({}, "no data"),
    ],
)
def test_bad_arrays_are_refused(arrays, match):
    with pytest.raises(InvalidInputError, match=match):
        ArrayData(arrays, 1)


def test_sparse_nan_is_refused_and_fewer_rows_than_shards():
    X = sp.random(5, 3, density=0.5, format="csr", random_state=0)
    X.data[0] = np.nan
    with pytest.raises(InvalidInputError, match="NaN"):
        ArrayData({"X": X, "y": np.ones(5)}, 1)
    with pytest.raises(InvalidInputError, match="fewer than the 6 shards"):
        ArrayData({"X": np.ones((5, 2)), "y": np.ones(5)}, 6)


def test_npy_directory_reads_each_shard_by_byte_range(tmp_path):
    X = np.arange(60, dtype=np.float64).reshape(20, 3)
    y = np.arange(20, dtype=np.float32)
    np.save(tmp_path / "X.npy", X)
    np.save(tmp_path / "y.npy", y)
    d = FileData(str(tmp_path), n_shards=3)
    assert d.meta.n_rows == 20 and d.meta.dtypes == {"X": "float64", "y": "float32"}
    got = [d.load_shard(i) for i in range(3)]
    np.testing.assert_array_equal(np.concatenate([g["X"] for g in got]), X)
    np.testing.assert_array_equal(np.concatenate([g["y"] for g in got]), y)


def test_npz_shards_on_an_fsspec_url():
    fs = fsspec.filesystem("memory")
    rng = np.random.default_rng(0)
    parts = [rng.standard_normal((n, 2)) for n in (3, 5)]
    for i, p in enumerate(parts):
        with fs.open(f"/npzdata/shard-{i}.npz", "wb") as f:
            np.savez(f, X=p, y=p[:, 0])
    d = FileData("memory://npzdata")
    assert d.meta.n_shards == 2 and d.meta.shard_bounds == ((0, 3), (3, 8))
    np.testing.assert_array_equal(d.load_shard(1)["X"], parts[1])


def test_bad_directories(tmp_path):
    with pytest.raises(InvalidInputError, match="cannot list"):
        FileData(str(tmp_path / "missing"), 2)
    with pytest.raises(InvalidInputError, match="no .npy or .npz"):
        FileData(str(tmp_path), 2)
    np.save(tmp_path / "X.npy", np.ones((4, 2)))
    np.save(tmp_path / "y.npy", np.ones(5))
    with pytest.raises(InvalidInputError, match="different numbers of rows"):
        FileData(str(tmp_path), 2)


def test_nan_in_a_file_is_named_when_its_shard_is_read(tmp_path):
    X = np.ones((6, 2))
    X[4, 1] = np.nan
    np.save(tmp_path / "X.npy", X)
    np.save(tmp_path / "y.npy", np.ones(6))
    d = FileData(str(tmp_path), n_shards=2)
    d.load_shard(0)
    with pytest.raises(InvalidInputError, match=r"rows 3:6"):
        d.load_shard(1)
