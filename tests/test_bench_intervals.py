"""The checkpoint-interval benchmark runs end to end (``--quick``) and reports what it promises."""
import math

import pytest


@pytest.mark.timeout(600)
def test_quick_run_compares_the_automatic_interval_with_fixed_ones(quick_bench):
    stdout, d, png = quick_bench("intervals", "--mb", "2")  # a 2 MB table: the same schedule, less to write
    assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    s = d["summary"]
    assert set(s) == {"C=1", "C=2", "C=5", "C=10", "C=20", "C=40", "auto"}
    for v in s.values():
        assert v["clock_ms"] > 0 and math.isfinite(v["waste"]) and v["rework_clocks"] >= 0
    # fixed C checkpoints every C clocks; the automatic one measured a cost and chose a period by it
    assert s["C=1"]["checkpoints"] == d["clocks"] and s["C=5"]["checkpoints"] == d["clocks"] // 5
    assert s["auto"]["period"] >= 1 and s["auto"]["cost_s"] > 0
    assert s["C=1"]["rework_clocks"] <= s["C=10"]["rework_clocks"] <= s["C=40"]["rework_clocks"]
    assert "Young/Daly sqrt(2 c M)" in stdout and "lowest measured waste" in stdout
