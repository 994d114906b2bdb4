"""Checkpoint format, schedule, priority selection, publication and retention (no cluster)."""
import hashlib
import json
import os

import fsspec
import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

import dscar
from dscar import CheckpointConfig, InvalidInputError
from dscar import checkpoint as ckpt


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(fraction=0.0), r"fraction r must be in \(0, 1\]"),
        (dict(fraction=1.5), r"fraction r must be in \(0, 1\]"),
        (dict(every=0), "interval C must be an integer >= 1"),
        (dict(policy="priority", every=5, fraction=0.1), r"r\*C >= 1"),
        (dict(policy="sometimes"), "policy"),
        (dict(recovery="magic"), "recovery"),
        (dict(keep=0), "keep"),
        (dict(max_chain=1), "max_chain must be an integer >= 2"),
        (dict(interval="sometimes"), "checkpoint interval"),
        (dict(interval="auto", mtbf=0.0), "mtbf"),
        (dict(mtbf=60.0), "interval='auto'"),
    ],
)
def test_config_is_validated(kw, match):
    with pytest.raises(InvalidInputError, match=match):
        CheckpointConfig("x", **kw).validate()


def test_schedule_has_the_same_budget_for_full_and_priority():
    full = CheckpointConfig("x", policy="full", every=10)
    prio = CheckpointConfig("x", policy="priority", every=10, fraction=0.2)
    assert [c for c in range(1, 31) if full.due(c)] == [10, 20, 30]
    assert [c for c in range(1, 31) if prio.due(c)] == [2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30]
    # rows saved per clock are equal: 1.0 / 10 == 0.2 / 2
    assert full.save_fraction / full.period == pytest.approx(prio.save_fraction / prio.period)
    odd = CheckpointConfig("x", policy="priority", every=10, fraction=0.25)  # every 2.5 clocks
    assert [c for c in range(1, 11) if odd.due(c)] == [3, 5, 8, 10]  # the first clock end past each multiple


def test_priority_rows_are_the_ones_that_moved_most():
    saved = np.zeros((6, 2))
    current = saved.copy()
    current[4] = [3, 0]
    current[1] = [0, 2]
    current[5] = [0.1, 0]
    assert list(ckpt.priority_rows(ckpt.moved(current, saved), 2)) == [1, 4]
    assert list(ckpt.priority_rows(ckpt.moved(current, saved), 6)) == list(range(6))


@given(st.integers(1, 500), st.sampled_from([0.05, 0.1, 0.25, 0.5]), st.integers(1, 40))
@hsettings(max_examples=200, deadline=None)
def test_priority_saves_take_the_fraction_of_rows_exactly_on_average(n, r, saves):
    credit, total = 0.0, 0
    for _ in range(saves):
        k, credit = ckpt.priority_count(n, r, credit)
        assert 0 <= k <= n and 0 <= credit < 1
        total += k
    assert abs(total - r * n * saves) < 1  # never more than a row ahead or behind the budget


def write(fs, path, parts, states=None):
    """One writer's file with ``parts`` (``(table, part, rows, values, n_rows)``); its manifest entries."""
    data, entries = ckpt.encode_file(parts, states or {})
    w = ckpt.write_file(fs, os.path.dirname(str(path)), str(path), data)
    assert w["bytes"] == len(data) == sum(e["bytes"] for e in entries)  # the entries' ranges add up to the file
    return [{**e, "path": w["path"]} for e in entries]


def test_files_round_trip_and_chains_layer_partial_saves(tmp_path):
    fs = fsspec.filesystem("file")
    base = np.zeros((5, 2))
    full, other = write(fs, tmp_path / "a.bin", [("w", 0, None, np.ones((5, 2)), 5), ("v", 1, None, np.arange(3), 3)])
    (part,) = write(fs, tmp_path / "b.bin", [("w", 0, np.array([1, 3]), np.full((2, 2), 7.0), 5)])
    got = ckpt.apply_chain(fs, str(tmp_path), base, [full, part])
    np.testing.assert_array_equal(got[:, 0], [1, 7, 1, 7, 1])
    np.testing.assert_array_equal(ckpt.apply_chain(fs, str(tmp_path), base, [part])[:, 0], [0, 7, 0, 7, 0])
    np.testing.assert_array_equal(ckpt.apply_chain(fs, str(tmp_path), np.zeros(3, np.int64), [other]), np.arange(3))
    # raw arrays, no container: a partial save is its values and a compact index (5 rows: a 1-byte
    # bitmap, padded to 8 bytes like every array)
    assert (tmp_path / "b.bin").stat().st_size == 2 * 2 * 8 + 8 and part["index"][0] == "bitmap"


@given(st.integers(1, 3000).flatmap(lambda n: st.tuples(st.just(n), st.sets(st.integers(0, n - 1), min_size=1))))
@hsettings(max_examples=300, deadline=None)
def test_row_indices_round_trip_in_the_shorter_encoding(case):
    n, rows = case
    rows = np.array(sorted(rows), dtype=np.int64)
    kind, data = ckpt.encode_index(rows, n)
    assert len(data) <= (n + 7) // 8  # never longer than one bit per row
    np.testing.assert_array_equal(ckpt.decode_index(kind, data, rows.size if kind == "varint" else n), rows)


def test_a_priority_save_of_a_tenth_of_the_rows_costs_little_more_than_their_values():
    rng = np.random.default_rng(0)
    n = 125
    rows = np.sort(rng.choice(n, 13, replace=False))
    data, (e,) = ckpt.encode_file([("w", 0, rows, rng.standard_normal(13), n)], {})
    assert len(data) <= 13 * 8 + 16  # the values, then an index of one byte per row, padded to 8


def test_a_corrupt_or_missing_file_is_detected(tmp_path):
    fs = fsspec.filesystem("file")
    (entry,) = write(fs, tmp_path / "a.bin", [("w", 0, None, np.ones(4), 4)])
    data = bytearray((tmp_path / "a.bin").read_bytes())
    data[-5] ^= 0xFF
    (tmp_path / "a.bin").write_bytes(bytes(data))
    with pytest.raises(ckpt.CorruptCheckpointError, match="checksum"):
        ckpt.read_entry(fs, str(tmp_path), entry)
    os.remove(tmp_path / "a.bin")
    with pytest.raises(ckpt.CorruptCheckpointError, match="cannot read"):
        ckpt.read_entry(fs, str(tmp_path), entry)
    (wrong_shape,) = write(fs, tmp_path / "c.bin", [("w", 0, None, np.ones(3), 3)])
    with pytest.raises(ckpt.CorruptCheckpointError, match="shape"):
        ckpt.apply_chain(fs, str(tmp_path), np.zeros(4), [wrong_shape])
    outside = {**wrong_shape, "values": [16, 24, "<f8", [3]]}  # an array past the entry's range
    with pytest.raises(ckpt.CorruptCheckpointError, match="does not fit"):
        ckpt.read_entry(fs, str(tmp_path), outside)
    for broken in ({k: v for k, v in wrong_shape.items() if k != "offset"}, {**wrong_shape, "values": "x"}):
        with pytest.raises(ckpt.CorruptCheckpointError):  # a malformed entry is a clear error, not a KeyError
            ckpt.read_entry(fs, str(tmp_path), broken)


def test_each_entry_is_read_and_verified_alone(tmp_path):
    """A restore reads its entries' ranges only: damage to another partition's range of the same
    writer's file does not stop it."""
    fs = fsspec.filesystem("file")
    first, second = write(fs, tmp_path / "a.bin", [("w", 0, None, np.ones(4), 4), ("w", 1, None, np.full(4, 2.0), 4)])
    raw = bytearray((tmp_path / "a.bin").read_bytes())
    raw[second["offset"]] ^= 0xFF
    (tmp_path / "a.bin").write_bytes(bytes(raw))
    np.testing.assert_array_equal(ckpt.read_entry(fs, str(tmp_path), first)[1], np.ones(4))
    with pytest.raises(ckpt.CorruptCheckpointError, match="checksum"):
        ckpt.read_entry(fs, str(tmp_path), second)


def test_manifests_are_published_atomically_and_retention_keeps_referenced_files(tmp_path):
    fs = fsspec.filesystem("file")
    root = str(tmp_path)
    entries = []
    for v in range(1, 5):
        (e,) = write(fs, f"{ckpt.data_dir(root, v)}/a.bin", [("w", 0, np.array([0]), np.full(1, v), 3)])
        entries.append(e)
        # a priority chain: every version names all files so far
        ckpt.publish(fs, root, {"format": ckpt.FORMAT, "version": v, "clock": v, "chains": {"w/0": list(entries)}})
    assert ckpt.list_versions(fs, root) == [1, 2, 3, 4]
    assert not [p for p in os.listdir(root) if p.startswith(".tmp")]  # no temporary file left
    ckpt.retain(fs, root, keep=2)
    assert ckpt.list_versions(fs, root) == [3, 4]
    for e in entries:  # still named by manifest 4's chain
        assert os.path.exists(e["path"])
    m = ckpt.load_manifest(fs, root, 4)
    assert json.loads(json.dumps(m)) == m


def test_a_manifest_of_another_format_is_refused_not_misread(tmp_path):
    fs = fsspec.filesystem("file")
    ckpt.publish(fs, str(tmp_path), {"version": 1, "clock": 1, "chains": {"w/0": [{"path": f"{tmp_path}/v1/w.p0.npz"}]}})
    with pytest.raises(ckpt.CorruptCheckpointError, match="format 1"):
        ckpt.load_manifest(fs, str(tmp_path), 1)


def test_full_chains_let_retention_delete_old_files(tmp_path):
    fs = fsspec.filesystem("file")
    root = str(tmp_path)
    for v in range(1, 4):
        (e,) = write(fs, f"{ckpt.data_dir(root, v)}/a.bin", [("w", 0, None, np.full(3, v), 3)])
        ckpt.publish(fs, root, {"format": ckpt.FORMAT, "version": v, "clock": v, "chains": {"w/0": [e]}})
    ckpt.retain(fs, root, keep=1)
    assert ckpt.list_versions(fs, root) == [3]
    assert not os.path.exists(ckpt.data_dir(root, 1)) and os.path.exists(ckpt.data_dir(root, 3))


def test_unwritable_location_is_refused(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(InvalidInputError, match="not writable"):
        ckpt.check_writable(CheckpointConfig(str(blocker / "sub")))
    ckpt.check_writable(CheckpointConfig(str(tmp_path / "new" / "dir")))  # created


def test_memory_url_store(tmp_path):
    cfg = CheckpointConfig("memory://dscar-test-store")
    ckpt.check_writable(cfg)
    fs, root = ckpt.fs_and_root(cfg.url)
    (e,) = write(fs, f"{root}/v00000001/a.bin", [("w", 0, None, np.arange(3.0), 3)])
    np.testing.assert_array_equal(ckpt.read_entry(fs, root, e)[1], np.arange(3.0))


# ------------------------------------------------ a store that follows no link

DISTINCT = np.array([4.25, -1.5, 1e300])  #: bytes no checkpoint of these tests holds
MODEL = {"name": "m", "class": "c", "params": {}, "n_rows": 3, "shapes": {}}  #: the model record of their manifests


def outside_dir(tmp_path):
    """A folder beside the store with three files of distinctive bytes; their contents, to check later."""
    out = tmp_path / "outside"
    out.mkdir()
    for name in ("a.bin", "b.txt", "manifest-00000000.json"):
        (out / name).write_bytes(DISTINCT.tobytes() + name.encode())
    return out, {p.name: p.read_bytes() for p in out.iterdir()}


def full_store(tmp_path, versions=3):
    """A store of ``versions`` full checkpoints of ``w/0`` (values ``v``): its root and each version's entry."""
    root = tmp_path / "store"
    fs = fsspec.filesystem("file")
    entries = {}
    for v in range(1, versions + 1):
        (entries[v],) = write(fs, f"{ckpt.data_dir(str(root), v)}/a.bin", [("w", 0, None, np.full(3, float(v)), 3)])
        ckpt.publish(fs, str(root), {"format": ckpt.FORMAT, "version": v, "clock": v, "chains": {"w/0": [entries[v]]},
                                     "model": MODEL})
    return fs, str(root), entries


@pytest.fixture
def opened(monkeypatch):
    """Every path opened (``os.open``, ``open``) while the test runs."""
    import builtins

    seen, os_open, builtin_open = [], os.open, builtins.open

    def spy_os(path, *a, **kw):
        seen.append(os.fspath(path))
        return os_open(path, *a, **kw)

    def spy_builtin(path, *a, **kw):
        if isinstance(path, (str, os.PathLike)):
            seen.append(os.fspath(path))
        return builtin_open(path, *a, **kw)

    monkeypatch.setattr(os, "open", spy_os)
    monkeypatch.setattr(builtins, "open", spy_builtin)
    return seen


def test_retention_deletes_nothing_through_a_planted_link(tmp_path):
    """A ``v00000000`` link to an outside folder (retention deleted its files), a link among an old
    version's files and a manifest name linked outside: all left alone and reported."""
    out, before = outside_dir(tmp_path)
    fs, root, _ = full_store(tmp_path)
    os.symlink(out, ckpt.data_dir(root, 0))
    os.symlink(out / "a.bin", f"{ckpt.data_dir(root, 1)}/z.bin")
    os.symlink(out / "manifest-00000000.json", ckpt.manifest_path(root, 0))
    refused: list[str] = []
    removed = ckpt.retain(fs, root, keep=1, refused=refused)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # every outside file still there, unchanged
    assert ckpt.list_versions(fs, root) == [3]
    assert removed == [f"{ckpt.data_dir(root, v)}/a.bin" for v in (1, 2)]  # the store's own old files do go
    links = [ckpt.data_dir(root, 0), ckpt.manifest_path(root, 0), f"{ckpt.data_dir(root, 1)}/z.bin"]
    assert sorted(r.split(":")[0] for r in refused) == sorted(links) and all("left alone" in r for r in refused)
    assert os.path.islink(ckpt.data_dir(root, 0)) and os.path.islink(f"{ckpt.data_dir(root, 1)}/z.bin")


def test_a_linked_checkpoint_file_or_version_folder_is_refused_unread(tmp_path, opened):
    """An entry whose file is a link, or under a linked version folder, to outside bytes whose
    SHA-256 the entry holds (read, they would verify): refused before anything outside is opened."""
    out, before = outside_dir(tmp_path)
    fs, root, entries = full_store(tmp_path, versions=1)
    outside_bytes = (out / "a.bin").read_bytes()
    forged = {**entries[1], "offset": 0, "bytes": len(outside_bytes), "values": [0, 24, "<f8", [3]],
              "sha256": hashlib.sha256(outside_bytes).hexdigest()}
    os.symlink(out / "a.bin", f"{ckpt.data_dir(root, 1)}/linked.bin")
    os.symlink(out, ckpt.data_dir(root, 2))
    base = np.zeros(3)
    for path in (f"{ckpt.data_dir(root, 1)}/linked.bin", f"{ckpt.data_dir(root, 2)}/a.bin"):
        entry = {**forged, "path": path}
        opened.clear()
        with pytest.raises(ckpt.CorruptCheckpointError, match="symbolic link"):
            ckpt.apply_chain(fs, root, base, [entry])
        assert not any(str(out) in p or p == path for p in opened), opened
        # and the same entry, copied into the store as a regular file, verifies: the refusal is the link's
    np.testing.assert_array_equal(ckpt.apply_chain(fs, root, base, [entries[1]]), np.ones(3))
    (tmp_path / "store" / "v00000003").mkdir()
    (tmp_path / "store" / "v00000003" / "copy.bin").write_bytes(outside_bytes)
    np.testing.assert_array_equal(ckpt.apply_chain(fs, root, base, [{**forged, "path": f"{ckpt.data_dir(root, 3)}/copy.bin"}]),
                                  DISTINCT)
    # a manifest naming a linked file is refused whole: a resume passes over it
    ckpt.publish(fs, root, {"format": ckpt.FORMAT, "version": 2, "clock": 2,
                            "chains": {"w/0": [{**forged, "path": f"{ckpt.data_dir(root, 2)}/a.bin"}]}})
    with pytest.raises(ckpt.CorruptCheckpointError, match="outside the checkpoint store.*symbolic link"):
        ckpt.load_manifest(fs, root, 2)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_a_linked_manifest_is_no_version_and_a_resume_reports_it(tmp_path, opened):
    out, before = outside_dir(tmp_path)
    fs, root, entries = full_store(tmp_path, versions=1)
    (out / "manifest-00000000.json").write_text(json.dumps(  # a well-formed manifest of a newer version
        {"format": ckpt.FORMAT, "version": 9, "clock": 9, "chains": {"w/0": [entries[1]]}}))
    before["manifest-00000000.json"] = (out / "manifest-00000000.json").read_bytes()
    os.symlink(out / "manifest-00000000.json", ckpt.manifest_path(root, 9))
    refused: list[str] = []
    assert ckpt.list_versions(fs, root, refused) == [1] and refused == [ckpt.manifest_path(root, 9)]
    opened.clear()
    with pytest.raises(ckpt.CorruptCheckpointError, match="symbolic link"):
        ckpt.load_manifest(fs, root, 9)
    assert not any(str(out) in p or p == ckpt.manifest_path(root, 9) for p in opened), opened
    skipped: list[dict] = []
    found = ckpt.find_resume(CheckpointConfig(root), MODEL, [], skipped)
    assert [m["version"] for m in found] == [1]
    assert [(e["kind"], e["version"]) for e in skipped] == [("checkpoint-skipped", 9)]
    assert "symbolic link" in skipped[0]["error"]
    # publishing a version whose manifest name is a link to a folder would move it into that folder
    os.symlink(out, ckpt.manifest_path(root, 10))
    with pytest.raises(ckpt.CorruptCheckpointError, match="symbolic link"):
        ckpt.publish(fs, root, {"format": ckpt.FORMAT, "version": 10, "clock": 10, "chains": {}})
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_writing_refuses_a_linked_version_folder_or_file(tmp_path):
    out, before = outside_dir(tmp_path)
    fs, root, _ = full_store(tmp_path, versions=1)
    os.symlink(out, ckpt.data_dir(root, 2))
    os.makedirs(ckpt.data_dir(root, 3))
    os.symlink(out / "a.bin", f"{ckpt.data_dir(root, 3)}/w.bin")
    for path in (f"{ckpt.data_dir(root, 2)}/w.bin", f"{ckpt.data_dir(root, 3)}/w.bin"):
        with pytest.raises(ckpt.CorruptCheckpointError, match="symbolic link"):
            ckpt.write_file(fs, root, path, b"overwritten")
    with pytest.raises(ckpt.CorruptCheckpointError, match="outside the checkpoint store"):
        ckpt.write_file(fs, root, str(out / "c.bin"), b"overwritten")
    os.link(out / "b.txt", f"{ckpt.data_dir(root, 3)}/h.bin")  # a hard link: the same file under two names
    with pytest.raises(ckpt.CorruptCheckpointError, match="hard-linked"):
        ckpt.write_file(fs, root, f"{ckpt.data_dir(root, 3)}/h.bin", b"overwritten")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_an_object_store_confines_paths_by_name():
    fs, root = ckpt.fs_and_root("memory://dscar-confined-store")
    (e,) = write(fs, f"{root}/v00000001/a.bin", [("w", 0, None, np.arange(3.0), 3)])
    (other,) = write(fs, "/dscar-elsewhere/v00000001/a.bin", [("w", 0, None, np.arange(3.0), 3)])
    np.testing.assert_array_equal(ckpt.read_entry(fs, root, e)[1], np.arange(3.0))
    with pytest.raises(ckpt.CorruptCheckpointError, match="outside the checkpoint store"):
        ckpt.read_entry(fs, root, other)
    with pytest.raises(ckpt.CorruptCheckpointError, match="outside the checkpoint store"):
        ckpt.write_file(fs, root, "/dscar-elsewhere/v00000002/a.bin", b"x")


def test_entries_of_another_dtype_or_shape_than_declared_are_refused(tmp_path):
    """An entry swapped together with a matching SHA-256 is not read as raw bytes of the model's dtype."""
    fs = fsspec.filesystem("file")
    root = str(tmp_path)
    (as_float32,) = write(fs, tmp_path / "a.bin", [("w", 0, None, np.ones(4, np.float32), 4)])
    with pytest.raises(ckpt.CorruptCheckpointError, match="dtype float32, the table's is float64"):
        ckpt.apply_chain(fs, root, np.zeros(4), [as_float32])
    declared = {"z": dscar.StateSpec("int32", (5,))}
    good, wide, short, extra = write(fs, tmp_path / "s.bin", [], {
        1: {"z": np.arange(5, dtype=np.int32)},
        2: {"z": np.arange(5, dtype=np.float64)},  # what an attacker's swap looked like: shard_seen = 848626818.0
        3: {"z": np.arange(4, dtype=np.int32)},
        4: {"z": np.arange(5, dtype=np.int32), "n": np.ones(1)},
    })
    np.testing.assert_array_equal(ckpt.read_state(fs, root, good, 1, declared)["z"], np.arange(5))
    for entry, shard, match in ((wide, 2, r"'z' is float64 \(5,\), the model declares int32 \(5,\)"),
                                (short, 3, r"'z' is int32 \(4,\)"), (extra, 4, r"holds \['n', 'z'\]")):
        with pytest.raises(ckpt.CorruptCheckpointError, match=match):
            ckpt.read_state(fs, root, entry, shard, declared)
        ckpt.read_state(fs, root, entry, shard)  # undeclared: used as saved, checksum verified


def test_lda_declares_its_topic_assignments():
    from dscar.algorithms.lda import LDAGibbs

    w = np.arange(7)
    assert LDAGibbs(n_topics=3).shard_state({"w": w}) == {"z": dscar.StateSpec("int32", (7,))}


# ------------------------------------------------ the checkpoint ledger (dscar.core.ledger, pure)


def coordinator_job(policy="priority"):
    """A job with table ``w`` (param, partitions on a and b) and ``g`` (reduction, on a)."""
    from dscar.core.job import JobConfig, JobState
    from dscar.core.partitions import PartitionMap, TableLayout
    from dscar.core.shards import ShardQueue

    pm = PartitionMap([TableLayout("w", 10, 2), TableLayout("g", 4, 1)])
    pm.owners = {("w", 0): "a", ("w", 1): "b", ("g", 0): "a"}
    cfg = JobConfig("j", 2, {"w": "param", "g": "reduction"}, [], [""],
                    CheckpointConfig("x", policy=policy, every=2, fraction=0.5))
    return JobState(cfg, ShardQueue(2, reloadable=True), pm)


def entry(part, v):
    return {"table": "w", "part": part, "path": f"v{v}/w.p{part}", "sha256": "0", "bytes": 10, "rows": 3, "partial": True}


def test_a_version_becomes_a_manifest_only_when_every_owner_has_written():
    job = coordinator_job()
    v = job.ledger.start(2, {"a", "b"})
    job.checkpoint_written(v, "a", [entry(0, 1)], None, 0.0)
    assert job.ledger.to_publish == []  # b has not finished writing: nothing visible
    job.checkpoint_written(v, "b", [entry(1, 1)], None, 0.0)
    (m,) = job.ledger.to_publish
    assert m["version"] == 1 and m["clock"] == 2 and set(m["chains"]) == {"w/0", "w/1"}  # reductions are not saved
    assert m["tables"] == [["w", 10, 2, "param"], ["g", 4, 1, "reduction"]]


def test_versions_complete_in_order_and_priority_chains_extend():
    job = coordinator_job("priority")
    v1, v2 = job.ledger.start(2, {"a", "b"}), job.ledger.start(4, {"a", "b"})
    job.checkpoint_written(v2, "a", [entry(0, 2)], None, 0.0)
    job.checkpoint_written(v2, "b", [entry(1, 2)], None, 0.0)
    assert job.ledger.to_publish == []  # version 1 is not complete yet
    job.checkpoint_written(v1, "a", [entry(0, 1)], None, 0.0)
    job.checkpoint_written(v1, "b", [entry(1, 1)], None, 0.0)
    assert [m["version"] for m in job.ledger.to_publish] == [1, 2]
    assert [e["path"] for e in job.ledger.to_publish[1]["chains"]["w/0"]] == ["v1/w.p0", "v2/w.p0"]
    assert job.published(1, 0.0) is None and [m["version"] for m in job.ledger.published] == [1]
    assert [m["version"] for m in job.ledger.newest_first()] == [2, 1]


def test_a_writer_lost_mid_checkpoint_abandons_that_version_only():
    job = coordinator_job("full")
    v1, v2 = job.ledger.start(2, {"a", "b"}), job.ledger.start(4, {"a"})
    job.checkpoint_written(v1, "a", [entry(0, 1)], None, 0.0)
    job.pmap.owners = {("w", 0): "a", ("w", 1): "a", ("g", 0): "a"}  # b's partitions moved before it died
    job.lose("b", 0.0)
    job.checkpoint_written(v2, "a", [entry(0, 2), entry(1, 2)], None, 0.0)
    assert [m["version"] for m in job.ledger.to_publish] == [2]
    assert any(e["kind"] == "checkpoint-abandoned" and e["version"] == 1 for e in job.events)


def test_recovery_plans_restore_only_lost_partitions_onto_the_least_loaded_and_full_rolls_back_all():
    from dscar.core.ledger import plan_recovery, restore_candidates

    owners = {("w", 0): "a", ("w", 1): "b", ("w", 2): "c", ("g", 0): "b"}
    kinds = {"w": "param", "g": "reduction"}
    rows = {("w", 0): 4, ("w", 1): 4, ("w", 2): 4, ("g", 0): 2}
    m = {"version": 3, "chains": {"w/1": [{"path": "v3/w.p1"}]}, "states": {"5": {"path": "s"}}}
    p = plan_recovery(owners=owners, kinds=kinds, rows=rows, lost={"b"}, live=["a", "c"], full=False,
                      manifests=[m], lost_shards=[5, 6], n_shards=8)
    assert p.restores == {("g", 0): "a", ("w", 1): "c"} and p.states == {5: {"path": "s"}} and p.version == 3
    f = plan_recovery(owners=owners, kinds=kinds, rows=rows, lost={"b"}, live=["a", "c"], full=True,
                      manifests=[m], lost_shards=[], n_shards=8)
    assert f.restores[("w", 0)] == "a" and f.restores[("w", 2)] == "c" and set(f.restores) == set(owners)
    assert restore_candidates([m], "w", 1) == [(3, [{"path": "v3/w.p1"}]), (0, [])]
    assert restore_candidates([m], "w", 0) == [(3, []), (0, [])]


def test_recovery_takes_a_lost_partition_from_its_live_buddy_s_memory_and_else_from_disk():
    from dscar.core.ledger import INITIAL_STATE, describe, plan_recovery

    owners = {("w", 0): "a", ("w", 1): "b", ("w", 2): "c", ("g", 0): "b"}
    kinds = {"w": "param", "g": "reduction"}
    rows = {k: 4 for k in owners}
    m = {"version": 3, "clock": 6, "chains": {}, "states": {}}
    mirrors = {("w", 0): ("b", 7), ("w", 1): ("c", 7), ("w", 2): ("a", 7), ("g", 0): ("c", 7)}
    kw = dict(owners=owners, kinds=kinds, rows=rows, manifests=[m], lost_shards=[], n_shards=4, mirrors=mirrors)
    p = plan_recovery(lost={"b"}, live=["a", "c"], full=False, **kw)
    assert p.from_memory == {("w", 1): ("c", 7)}  # a param partition whose buddy lives; reductions are recomputed
    assert describe(p)["from_memory"] == [["w", 1, "c", 7]]
    both = plan_recovery(lost={"b", "c"}, live=["a"], full=False, **kw)
    assert ("w", 1) in both.restores and both.from_memory == {("w", 2): ("a", 7)}  # w/1: owner and buddy lost
    assert plan_recovery(lost={"b"}, live=["a", "c"], full=True, **kw).from_memory == {}  # a rollback: disk
    stale = plan_recovery(lost={"b"}, live=["a", "c"], full=False, **{**kw, "mirrors": {("w", 1): ("c", 5)}})
    assert stale.from_memory == {}  # the disk's full version (clock 6) is newer
    prio = {**kw, "mirrors": {("w", 1): ("c", 5)}, "manifests": [{**m, "policy": "priority"}]}
    assert plan_recovery(lost={"b"}, live=["a", "c"], full=False, **prio).from_memory == {("w", 1): ("c", 5)}
    older = {**prio, "mirrors": {("w", 1): ("c", 4)}}  # two clocks behind a priority version: disk
    assert plan_recovery(lost={"b"}, live=["a", "c"], full=False, **older).from_memory == {}
    # lost shard states: from the live buddy's memory, the saved file (if any) as the fallback
    sk = {**kw, "lost_shards": [1, 2, 3], "manifests": [{**m, "states": {"2": {"path": "s2"}}}],
          "state_mirrors": {1: ("c", 7), 2: ("a", 7), 3: ("b", 7)}}
    p = plan_recovery(lost={"b"}, live=["a", "c"], full=False, **sk)
    assert p.states == {1: {"memory": "c", "clock": 7, "file": None}, 2: {"memory": "a", "clock": 7,
                        "file": {"path": "s2"}}}  # shard 3's copy went with b, and no file saved it
    assert describe(p)["states_from_memory"] == [[1, "c", 7], [2, "a", 7]]
    # full recovery rolls every shard back: to its saved state, or to none where the version saved none
    assert plan_recovery(lost={"b"}, live=["a", "c"], full=True, **sk).states == {
        0: INITIAL_STATE, 1: INITIAL_STATE, 2: {"path": "s2"}, 3: INITIAL_STATE}


def test_a_memory_copy_whose_holder_died_is_no_source_and_the_disk_then_checkpoint_0_serve():
    """Owner and buddy lost together: the buddy's copy is skipped (or, once tried, left out), the disk's
    chains come next, newest first, then the initial values; no source names a dead worker."""
    from dscar.core.ledger import restore_sources

    m5 = {"version": 5, "chains": {"w/1": [{"path": "v5"}]}}
    m3 = {"version": 3, "chains": {"w/1": [{"path": "v3"}]}}
    disk = [(5, [{"path": "v5"}], None), (3, [{"path": "v3"}], None), (0, [], None)]
    assert restore_sources([m5, m3], "w", 1, ("c", 7), live=["a", "c"]) == [(0, [], "c")] + disk
    assert restore_sources([m5, m3], "w", 1, ("c", 7), live=["a"]) == disk  # the buddy died before the restore
    assert restore_sources([m5, m3], "w", 1, ("c", 7), live=["a", "c"], tried=[(0, "c")]) == disk  # ... or during it
    assert restore_sources([m5, m3], "w", 1, None, live=["a"], tried=[(0, None), (5, None)]) == disk[1:2]
    assert restore_sources([], "w", 1, ("c", 7), live=["a"]) == [(0, [], None)]  # no version: checkpoint 0


@given(st.sets(st.sampled_from("abcd")), st.sampled_from("abcd"), st.integers(0, 3))
def test_restore_sources_never_name_a_dead_holder_and_always_end_with_checkpoint_0(live, holder, n_versions):
    from dscar.core.ledger import restore_sources

    manifests = [{"version": v, "chains": {"w/0": [{"path": f"v{v}"}]}} for v in range(n_versions, 0, -1)]
    sources = restore_sources(manifests, "w", 0, (holder, 4), live)
    assert all(h is None or h in live for _, _, h in sources)
    assert sources[-1] == (0, [], None) and [v for v, _, h in sources if h is None] == list(range(n_versions, -1, -1))
    assert (sources[0][2] == holder) == (holder in live)


def test_shard_states_rotate_oldest_first_at_the_priority_budget():
    assert ckpt.state_shards(5, 1.0, {0: 3}) == ([0, 1, 2, 3, 4], 0.0)
    saved: dict[int, int] = {}
    seen, credit = [], 0.0
    for clock in range(1, 6):  # r = 0.2 of 10 shards: 2 per checkpoint, every shard once in 5
        pick, credit = ckpt.state_shards(10, 0.2, saved, credit)
        assert len(pick) == 2
        seen += pick
        saved.update({s: clock for s in pick})
    assert sorted(seen) == list(range(10))


@given(n=st.integers(1, 40), fraction=st.sampled_from([0.05, 0.1, 0.25, 0.3, 0.5]), saves=st.integers(1, 60))
def test_shard_state_saves_write_the_budget_exactly_and_each_shard_in_turn(n, fraction, saves):
    """``fraction * n`` shards a save on average, never one more than the saves so far allow (rounded up,
    1 shard a save at r = 0.1 of 8 shards wrote 1.25x a full checkpoint's state bytes), oldest first."""
    saved: dict[int, int] = {}
    credit, total = 0.0, 0
    for clock in range(1, saves + 1):
        pick, credit = ckpt.state_shards(n, fraction, saved, credit)
        assert pick == sorted(sorted(range(n), key=lambda s: (saved.get(s, -1), s))[:len(pick)])
        total += len(pick)
        saved.update({s: clock for s in pick})
        assert total <= fraction * n * clock + 1e-6 and total > fraction * n * clock - 1


def test_shard_states_share_the_writer_s_file_and_round_trip_and_detect_corruption(tmp_path):
    fs = fsspec.filesystem("file")
    states = {3: {"z": np.arange(5, dtype=np.int32)}, 7: {"z": np.zeros(2, np.int32), "n": np.ones(1)}}
    part, s3, s7 = write(fs, tmp_path / "a.bin", [("w", 0, None, np.ones(2), 2)], states)
    assert s3["shards"] == [3] and s7["shards"] == [7] and s3["path"] == s7["path"] == part["path"]
    got = ckpt.read_state(fs, str(tmp_path), s7, 7)
    assert set(got) == {"z", "n"} and got["z"].dtype == np.int32
    np.testing.assert_array_equal(ckpt.read_state(fs, str(tmp_path), s3, 3)["z"], np.arange(5))
    raw = bytearray((tmp_path / "a.bin").read_bytes())
    raw[s3["offset"] + 1] ^= 0xFF
    (tmp_path / "a.bin").write_bytes(bytes(raw))
    with pytest.raises(ckpt.CorruptCheckpointError, match="checksum"):
        ckpt.read_state(fs, str(tmp_path), s3, 3)
    assert set(ckpt.read_state(fs, str(tmp_path), s7, 7)) == {"z", "n"}  # another shard's range still verifies
    with pytest.raises(ckpt.CorruptCheckpointError, match="not a state entry"):
        ckpt.read_state(fs, str(tmp_path), s7, 3)


@given(st.integers(1, 500), st.sampled_from([0.05, 0.1, 0.25]), st.sampled_from([2, 10, 50]),
       st.lists(st.booleans(), min_size=1, max_size=120))
@hsettings(max_examples=300, deadline=None)
def test_whole_saves_in_a_priority_chain_are_paid_for_by_the_next_saves(n, r, max_chain, whole):
    """``max_chain``'s whole saves keep the bytes of full checkpoints: the rows written, plus the
    credit, minus the debt, are the budget, and the saves that repay it still write rows when
    their share exceeds the repayment."""
    credit, debt, rate, total = 0.0, 0.0, 0.0, 0
    for i, w in enumerate(whole):
        # a chain is asked for a whole save only when it holds max_chain entries: its partition
        # made max_chain - 1 saves since the last one, and they repaid it
        if w and debt == 0:
            k, debt = ckpt.whole_count(n, r, credit)
            credit, debt = max(-debt, 0.0), max(debt, 0.0)
            rate = debt / (max_chain - 1)
            assert k == n
        else:
            repay = min(debt, rate)
            debt = debt - repay if debt - repay > 1e-9 else 0.0
            k, credit = ckpt.priority_count(n, r, credit, repay)
            assert 0 <= k <= n and credit < 1 and (credit >= 0 or k == 0)
            if repay and r * n - rate >= 1:
                assert k >= 1  # repaying a debt slows the saves down, it does not stop them
        total += k
        budget = r * n * (i + 1)
        assert abs(total + credit - debt - budget) < 1e-6 * (i + 1)


def test_a_chain_at_max_chain_is_saved_whole_next_and_starts_anew():
    from dscar.core.ledger import CheckpointLedger

    led = CheckpointLedger("priority", keep=3, max_chain=3)
    parts = {"w": 4}

    def version(whole, complete=True):
        v = led.start(v_clock[0], {"a"}, whole)
        v_clock[0] += 1
        if complete:
            led.written(v, "a", [{"table": "w", "part": p, "path": f"v{v}", "sha256": "0", "bytes": 1,
                                  "partial": ("w", p) not in set(whole)} for p in range(4)])
        else:
            led.written(v, "a", [], "disk full")
        led.build(parts, 0.0)
        return v

    v_clock = [1]
    lengths = []
    for _ in range(12):
        due = led.whole_due(parts)
        if len(lengths) == 3:  # the first time chains reach 3: half the partitions (one in max_chain
            assert due == [("w", 0), ("w", 1)]  # of the 4, rounded up) are saved whole this version
        version(due)
        lengths.append([len(led.built["chains"][f"w/{p}"]) for p in range(4)])
    assert max(max(x) for x in lengths) <= 4  # max_chain, plus one version's wait for its turn
    assert lengths[3] == [1, 1, 4, 4] and lengths[4] == [2, 2, 1, 1]
    # a pending version that saves a partition whole is not asked again; an abandoned one is
    led2 = CheckpointLedger("priority", keep=3, max_chain=2)
    led, v_clock = led2, [1]
    version([]), version([])
    due = led.whole_due(parts)
    assert due == [("w", 0), ("w", 1)]
    v = led.start(5, {"a"}, due)
    assert led.whole_due(parts) == [("w", 2), ("w", 3)]
    led.written(v, "a", [], "disk full")
    led.build(parts, 0.0)  # abandoned: the chains stay long and are asked for again
    assert led.whole_due(parts) == [("w", 0), ("w", 1)]
    assert CheckpointLedger("full", keep=3, max_chain=2).whole_due(parts) == []
