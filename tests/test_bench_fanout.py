"""The fan-out benchmark: messages a clock per worker, at two W on hollow workers, for a model that pulls,
stages and checks; its flatness rule, and its quick run on the real protocol."""
import pytest

from bench import fanout


def _row(w: int, variant: str, per: dict[str, float]) -> dict:
    return {"workers": w, "variant": variant, "per_clock_per_worker": per}


def test_a_kind_that_follows_w_is_flagged_and_one_bounded_per_worker_is_not():
    ws = (16, 32, 64, 128)
    per = {"worker:dscar_pull_many": [w - 1.0 for w in ws],  # every other owner: O(W^2) a clock
           "worker:dscar_pull": [w / 16 for w in ws],  # W / 16 of them
           "scheduler:dscar_commit": [1.0, 1.0, 1.02, 1.7],  # backups on a loaded machine
           "worker:dscar_copy_shard": [0.0, 0.0, 0.0, 0.68],  # shards moved off slow workers, from nothing
           "worker:dscar_release": [0.8, 0.6, 0.7, 0.5]}
    rows = [_row(w, "no checkpoint", {k: v[i] for k, v in per.items() if v[i]}) for i, w in enumerate(ws)]
    g = {r["kind"]: r for r in fanout.growth(rows)}
    assert g["worker:dscar_pull_many"]["exponent"] == pytest.approx(1.0)
    assert not g["worker:dscar_pull_many"]["flat"] and not g["worker:dscar_pull"]["flat"]
    assert g["scheduler:dscar_commit"]["flat"] and g["worker:dscar_copy_shard"]["flat"] and g["worker:dscar_release"]["flat"]
    assert (g["worker:dscar_pull_many"]["at_lo"], g["worker:dscar_pull_many"]["at_hi"]) == (15.0, 127.0)
    # W a factor 4 apart (the quick run's ends): a bounded kind the load raises to near 1 a clock reads flat,
    # all-to-all does not
    two = fanout.growth([_row(12, "no checkpoint", {"a": 11.0, "b": 0.2}), _row(48, "no checkpoint", {"a": 47.0, "b": 0.9})])
    assert [r["flat"] for r in two] == [False, True]


@pytest.fixture(scope="module")
def quick_run(quick_bench):
    return quick_bench("fanout")


@pytest.mark.timeout(900)
def test_quick_run_counts_every_kind_at_both_w_and_finds_none_growing(quick_run):
    """Past ``WHOLE_READ_OWNERS`` a step reads its rows from their owners: nothing a worker sends a clock
    grows with W (before 1ca9fc3, ``worker:pull_many`` was W - 1 a worker a clock). Every clock exactly once."""
    stdout, d, png = quick_run
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted({(r["workers"], r["variant"]) for r in d["rows"]}) == [
        (w, v) for w in (12, 24, 48) for v in sorted(fanout.VARIANTS)]
    for r in d["rows"]:
        per = r["per_clock_per_worker"]
        # every worker commits its shards (a commit message may carry several of a batch's attempts: fewer
        # messages than shards on a loaded machine) and the owners are applied to: the counts are of a real run
        assert 0 < per["scheduler:dscar_commit"] <= fanout.SHARDS_PER_WORKER and per["worker:dscar_apply"] >= 1, per
        assert r["violations"] == 0 and r["lost"] == 0, r
        assert per.get("worker:dscar_pull_many", 0) < 2, per  # a step reads rows, not every owner's tables
    assert d["flat"] is True and d["violations"] == 0
    assert "flat in W" in stdout and "GROWS" not in stdout
