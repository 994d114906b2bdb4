"""The membership planners' benchmark runs end to end (``--quick``) and reports what it promises."""
import pytest

from bench.planners import CASES, SHARDS_PER_WORKER, TABLE_ROWS


@pytest.mark.timeout(300)
def test_quick_run_times_every_planner_and_plans_what_pays(quick_bench):
    stdout, d, png = quick_bench("planners")
    assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [r["workers"] for r in d["rows"]] == [64, 256]
    for r in d["rows"]:
        W = r["workers"]
        assert all(r[c]["ms"] > 0 for c in CASES)
        assert r["join"]["moves"] == 0  # even owners: a joiner's whole partitions lower no largest load
        assert r["doubled"]["moves"] == 3  # 10-row partitions: 80 -> 50 rows; 10,000-row ones: none pays
        # every partition and shard of the leavers goes somewhere
        assert r["retire 1"]["moves"] == len(TABLE_ROWS) + SHARDS_PER_WORKER
        assert r["retire half"]["moves"] == W // 2 * (len(TABLE_ROWS) + SHARDS_PER_WORKER)
    assert "membership planners" in stdout and "retire half" in stdout
