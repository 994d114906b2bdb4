"""One test per class of bad input (not per case): each ends in a clear dscar error naming the
problem, before any cluster starts where the information is available."""
import json
import time

import numpy as np
import pytest

import dscar
from dscar import CheckpointConfig, ClusterError, InvalidInputError, faults, validation
from dscar import checkpoint as ckpt
from dscar.algorithms.lasso import Lasso, LassoCD
from dscar.algorithms.lda import LDA, LDAGibbs
from dscar.algorithms.mf import MF
from dscar.algorithms.mlr import MLR, MLRSGD

X = np.random.default_rng(0).standard_normal((40, 3))
Y = X[:, 0].copy()


@pytest.fixture
def no_cluster(monkeypatch):
    """Fails the test if dscar.fit gets as far as starting or connecting to a cluster."""
    def refuse(*a, **kw):
        raise AssertionError("a cluster was started before the bad input was refused")

    monkeypatch.setattr(dscar.api.driver, "Cluster", refuse)


# 1. integer options given as floats, strings or bools
@pytest.mark.parametrize("call, match", [
    (lambda: dscar.fit(LassoCD(0.1), {"X": X, "y": Y}, n_shards=2.5), r"n_shards must be an integer.*2\.5"),
    (lambda: dscar.fit(LassoCD(0.1), {"X": X, "y": Y}, n_workers=1.5), r"n_workers must be an integer.*1\.5"),
    (lambda: dscar.fit(LassoCD(0.1), {"X": X, "y": Y}, n_shards="4"), r"n_shards must be an integer.*'4'"),
    (lambda: dscar.fit(LassoCD(0.1), {"X": X, "y": Y}, max_clocks=2.5), r"max_clocks must be an integer"),
    (lambda: dscar.fit(LassoCD(0.1), {"X": X, "y": Y}, max_failures=True), r"max_failures must be an integer"),
    (lambda: Lasso(max_iter=2.5).fit(X, Y), r"max_iter must be an integer"),
    (lambda: LDA(n_iter=1.5).fit(np.ones((4, 3), dtype=np.int64)), r"n_iter must be an integer"),
    (lambda: MLR(n_workers=1.5).fit(X, (Y > 0).astype(int)), r"n_workers must be an integer"),
    (lambda: MF(n_shards="8").fit((np.arange(4), np.arange(4), np.ones(4))), r"n_shards must be an integer"),
    (lambda: LDAGibbs(n_topics=4.0), r"n_topics"),
    (lambda: CheckpointConfig("x", every=2.5).validate(), r"interval C must be an integer"),
    (lambda: CheckpointConfig("x", keep="3").validate(), r"keep must be an integer"),
])
def test_integer_options_refuse_floats_strings_and_bools(no_cluster, call, match):
    with pytest.raises(InvalidInputError, match=match):
        call()


# 2. numbers, flags and choices of the wrong type or out of range
@pytest.mark.parametrize("call, match", [
    (lambda: LassoCD("big"), r"alpha must be a finite number >= 0, got 'big'"),
    (lambda: LassoCD(0.1, tol=0), r"tol must be a finite number > 0"),
    (lambda: MLRSGD(3, lr="0.5"), r"lr must be a finite number > 0, got '0.5'"),
    (lambda: dscar.fit(LassoCD(0.1), {"X": X, "y": Y}, tol=float("nan")), r"tol must be a finite number"),
    (lambda: dscar.fit(LassoCD(0.1), {"X": X, "y": Y}, sharding="fast"), r"sharding must be one of"),
    (lambda: dscar.fit(LassoCD(0.1), {"X": X, "y": Y}, progress="yes"), r"progress must be True or False"),
    (lambda: Lasso(progress=1).fit(X, Y), r"progress must be True or False"),
    (lambda: CheckpointConfig(3).validate(), r"checkpoint url must be"),
    (lambda: CheckpointConfig("x", fraction="0.5").validate(), r"fraction r must be a finite number"),
])
def test_numbers_flags_and_choices_are_checked(no_cluster, call, match):
    with pytest.raises(InvalidInputError, match=match):
        call()


# 3. schedulers that cannot be reached: a prompt ClusterError naming the address and the cause
@pytest.mark.parametrize("address, match", [
    ("not-an-address:::", "is not a scheduler address"),
    ("nonsense", "is not a scheduler address"),
    ("tcp://127.0.0.1", "is not a scheduler address"),
    ("tls://127.0.0.1:1", "TLS address but no TLS settings"),
    ("tcp://127.0.0.1:1", r"cannot reach the Dask scheduler at 'tcp://127.0.0.1:1': OSError"),
])
def test_unreachable_schedulers_are_prompt_cluster_errors(address, match):
    t0 = time.monotonic()
    with pytest.raises(ClusterError, match=match) as e:
        dscar.connect(address, timeout=1.0)
    assert address in str(e.value)
    assert time.monotonic() - t0 < 5  # not Dask's 30 s connect timeout, nor a 60 s close
    if not address.startswith("tcp://127.0.0.1:1"):  # dscar.fit reports the same (its timeout is 10 s)
        with pytest.raises(ClusterError, match=match):
            dscar.fit(LassoCD(0.1), {"X": X, "y": Y}, address)


# 4. data files: malformed, truncated, a file where a directory goes, a broken .npz
def test_bad_data_files_are_named_up_front(tmp_path):
    good = tmp_path / "good"
    good.mkdir()
    np.save(good / "X.npy", np.ones((8, 3)))
    np.save(good / "y.npy", np.ones(8))
    with pytest.raises(InvalidInputError, match=r"X.npy' is a file; FileData reads a directory"):
        dscar.FileData(str(good / "X.npy"), 2)

    bad = tmp_path / "header"
    bad.mkdir()
    (bad / "X.npy").write_bytes(b"\x93NUMPY\x01\x00\x10\x00{'descr': garbage}\n")
    with pytest.raises(InvalidInputError, match=r"X.npy: malformed .npy header"):
        dscar.FileData(str(bad), 2)

    cut = tmp_path / "truncated"
    cut.mkdir()
    np.save(cut / "y.npy", np.ones(8))
    raw = (good / "X.npy").read_bytes()
    (cut / "X.npy").write_bytes(raw[: len(raw) - 20])
    with pytest.raises(InvalidInputError, match=r"X.npy is truncated: its header says \(8, 3\) float64"):
        dscar.FileData(str(cut), 2)

    npz = tmp_path / "npz"
    npz.mkdir()
    (npz / "shard-0.npz").write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(InvalidInputError, match=r"shard-0.npz: not a readable .npz"):
        dscar.FileData(str(npz))


# 5. faults that could never fire, or are not faults
@pytest.mark.parametrize("fs, match", [
    ([faults.kill(0, 50)], r"kill fault aimed at clock 50, but the run stops at max_clocks=3"),
    ([faults.slow(0, 2.0, clock=4)], r"slow fault aimed at clock 4"),
    ([faults.hang(0, 2.5)], r"hang fault clock must be an integer"),
    (["kill 0"], r"faults must be dscar.faults.Fault objects"),
])
def test_faults_that_cannot_fire_are_refused(no_cluster, fs, match):
    with pytest.raises(InvalidInputError, match=match):
        dscar.fit(LassoCD(0.1), {"X": X, "y": Y}, faults=fs, max_clocks=3)


# 6. tables that cannot fit in the workers' memory, refused before allocation
def test_tables_larger_than_worker_memory_are_refused(no_cluster):
    T = dscar.TableSpec
    validation.check_table_memory([T("w", 1000, (10,))], 2, 1e6)  # 80 kB of 1 MB: fine
    validation.check_table_memory([T("w", 10**9, (10**3,))], 2, None)  # no known limit: nothing to check
    with pytest.raises(InvalidInputError, match=r"table 'w' .* needs 7.45 GiB"):
        validation.check_table_memory([T("w", 10**6, (10**3,))], 2, 2**30)
    # each table fits, but a worker's share of all of them does not
    many = [T(f"t{i}", 10**5, (100,), n_parts=2) for i in range(30)]
    with pytest.raises(InvalidInputError, match=r"tables need .* per worker on 2 worker"):
        validation.check_table_memory(many, 2, 2**30)
    with pytest.raises(InvalidInputError, match=r"table 'word_topic' .* needs .*GiB.*fewer topics"):
        LDA(n_topics=10**9).fit(np.ones((20, 30), dtype=np.int64))


# 7. checkpoint stores: unreadable manifests, paths outside the store, other hyperparameters
def _store(tmp_path, manifests):
    root = tmp_path / "store"
    root.mkdir()
    for v, m in manifests.items():
        text = m if isinstance(m, str) else json.dumps(m)
        (root / f"manifest-{v:08d}.json").write_text(text)
    return CheckpointConfig(str(root)), str(root)


def _manifest(root, v, params, path=None):
    entry = {"path": path or f"{root}/v{v:08d}/w.p0.npz", "sha256": "0", "bytes": 1}
    return {"format": ckpt.FORMAT, "version": v, "clock": v, "tables": [["w", 4, 1, "param"]], "chains": {"w/0": [entry]},
            "model": {"name": "lda", "class": "m.LDAGibbs", "params": params, "n_rows": 10, "shapes": {"X": [4]}}}


def test_checkpoint_stores_are_checked_on_resume(tmp_path):
    want = {"name": "lda", "class": "m.LDAGibbs", "params": {"n_topics": 5, "early_stop": False, "tol": 1e-4},
            "n_rows": 10, "shapes": {"X": [4]}}
    tables = [dscar.TableSpec("w", 4)]
    root = str(tmp_path / "store")
    cfg, root = _store(tmp_path, {
        1: _manifest(root, 1, {"n_topics": 5, "early_stop": True, "tol": 1e-3}),  # only the stopping rule differs
        2: _manifest(root, 2, want["params"], path="/etc/passwd"),  # outside the store
        3: _manifest(root, 3, want["params"], path=f"{root}/../elsewhere/w.npz"),
        4: "{not json",
    })
    skipped = []
    found = ckpt.find_resume(cfg, want, tables, skipped)
    assert [m["version"] for m in found] == [1]
    assert [e["version"] for e in skipped] == [4, 3, 2] and all(e["kind"] == "checkpoint-skipped" for e in skipped)
    assert "not a readable JSON manifest" in skipped[0]["error"] and "outside the checkpoint store" in skipped[1]["error"]

    other = dict(want, params={"n_topics": 7, "early_stop": False, "tol": 1e-4})
    with pytest.raises(InvalidInputError, match=r"differing: n_topics: checkpoint 5, this fit 7$"):
        ckpt.find_resume(cfg, other, tables, [])
    (tmp_path / "b").mkdir()
    cfg2, _ = _store(tmp_path / "b", {1: "{"})
    with pytest.raises(InvalidInputError, match=r"holds no published checkpoint \(1 unreadable manifest"):
        ckpt.find_resume(cfg2, want, tables, [])


def test_confined_paths():
    assert validation.confined("/s/store/v00000001/w.npz", "/s/store")
    assert validation.confined("bucket/run/v1/w.npz", "bucket/run")
    for p in ("/s/store/../x.npz", "/s/storex/a.npz", "/etc/passwd", "", None, "/s/store"):
        assert not validation.confined(p, "/s/store"), p
