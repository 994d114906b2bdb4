"""The recovery benchmark (memory tier vs disk) runs end to end (``--quick``) and reports what it promises."""
import pytest


@pytest.mark.timeout(600)
def test_quick_run_restores_from_disk_and_from_the_buddy_and_measures_the_lost_progress(quick_bench):
    stdout, d, png = quick_bench("recovery")
    assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    disk, memory = d["results"]["disk"], d["results"]["memory"]
    assert disk["tiers"] == ["disk"] and memory["tiers"] == ["memory"]
    for s in (disk, memory):
        assert s["n"] == d["trials"] and len(s["recovery_s"]) == s["n"] and s["recovery_s_median"] > 0
        assert s["failure_free"]["clock_s"] and s["clock_s_median_ff"] > 0
    # the buddy's copy is as of the clock before the kill (or the one before, if still travelling);
    # the priority disk chain holds 10 % of the rows per clock and the bench touches 63 %: the
    # restored rows lag ~3.5 clocks (with 28 % touched they lagged ~1, and a copy still
    # travelling under load tied them)
    assert memory["lag_clocks_mean"] <= 1.0 and disk["lag_clocks_mean"] > memory["lag_clocks_mean"]
    assert "memory tier recovers" in stdout and "lost rows lag" in stdout
