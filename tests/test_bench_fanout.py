"""The fan-out benchmark: messages a clock per worker, at two W on hollow workers, for a model that pulls,
stages and checks; its flatness rule, and its quick run on the real protocol."""
import pytest

from bench import fanout


def _row(w: int, variant: str, per: dict[str, float]) -> dict:
    return {"workers": w, "variant": variant, "per_clock_per_worker": per}


def test_a_kind_that_grows_with_w_is_flagged_and_one_bounded_per_worker_is_not():
    rows = [_row(12, "no checkpoint", {"worker:dscar_pull_many": 11.0, "scheduler:dscar_commit": 1.0,
                                       "worker:dscar_pull": 2.0, "worker:dscar_release": 0.3}),
            _row(24, "no checkpoint", {"worker:dscar_pull_many": 23.0, "scheduler:dscar_commit": 1.1,
                                       "worker:dscar_copy_shard": 0.8, "worker:dscar_release": 1.6})]
    g = {r["kind"]: r for r in fanout.growth(rows)}
    assert not g["worker:dscar_pull_many"]["flat"]  # W - 1 a worker a clock: O(W^2) a clock
    assert g["worker:dscar_pull_many"]["per_worker_added"] == 1.0
    assert g["scheduler:dscar_commit"]["flat"] and g["worker:dscar_pull"]["flat"]  # the same, or fewer
    assert g["worker:dscar_copy_shard"]["flat"]  # new at the larger W, bounded per worker
    assert not g["worker:dscar_release"]["flat"]  # +1.3 over 12 workers added: more than 0.1 a worker
    assert (g["worker:dscar_pull_many"]["at_lo"], g["worker:dscar_pull_many"]["at_hi"]) == (11.0, 23.0)


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
        (w, v) for w in (12, 24) for v in sorted(fanout.VARIANTS)]
    for r in d["rows"]:
        per = r["per_clock_per_worker"]
        # every worker commits its shards and the owners are applied to: the counts are of a real run
        assert per["scheduler:dscar_commit"] >= 1 and per["worker:dscar_apply"] >= 1, per
        assert r["violations"] == 0 and r["lost"] == 0, r
        assert per.get("worker:dscar_pull_many", 0) < 2, per  # a step reads rows, not every owner's tables
    assert d["flat"] is True and d["violations"] == 0
    assert "flat in W" in stdout and "GROWS" not in stdout
