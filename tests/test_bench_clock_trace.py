"""bench.clock_trace: the timeline's arithmetic, and a quick trace of both clock-end paths."""
import json
import subprocess
import sys
from pathlib import Path

from bench import clock_trace


def test_the_timeline_is_each_handlers_median_offset_from_its_clocks_begin():
    stamps = []
    for c in range(8):  # clocks 10 ms apart; W0's apply 3 ms (+c/10) after each begin, a second call 1 ms later
        t0 = 100.0 + c * 0.010
        stamps += [("S", "begin_clock", t0, t0 + 0.008), ("W0", "apply", t0 + 0.003 + c * 1e-4, t0 + 0.005),
                   ("W0", "apply", t0 + 0.004 + c * 1e-4, t0 + 0.006)]
    stamps.append(("S", "clock_done", 100.0 + 5 * 0.010 + 0.007, 100.0 + 5 * 0.010 + 0.0075))  # in one clock only
    rows, n = clock_trace.timeline(stamps, warmup=2)
    assert n == 5  # clocks 2..6 (the last begin has no next one)
    got = {(r["server"], r["handler"], r["n"]): r for r in rows}
    assert set(got) == {("S", "begin_clock", 0), ("W0", "apply", 0), ("W0", "apply", 1), ("driver", "clock", 0)}
    assert abs(got[("W0", "apply", 0)]["entry_ms"] - 3.4) < 1e-6  # the median of 3.2 .. 3.6
    assert abs(got[("W0", "apply", 1)]["exit_ms"] - 6.0) < 1e-6
    assert abs(got[("driver", "clock", 0)]["exit_ms"] - 10.0) < 1e-6
    assert [r["handler"] for r in rows][:2] == ["begin_clock", "clock"]


def test_a_quick_trace_shows_the_clock_end_folded_into_an_apply_and_not_when_off(tmp_path):
    root = Path(__file__).resolve().parents[1]
    handlers = {}
    for fold in ("on", "off"):
        out = tmp_path / f"{fold}.json"
        r = subprocess.run([sys.executable, "-m", "bench.clock_trace", "--quick", "--shards", "4", "--fold", fold,
                            "--json", str(out)], cwd=root, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        assert "median ms from the clock's begin entry" in r.stdout
        rows = json.loads(out.read_text())["rows"]
        handlers[fold] = {(row["server"], row["handler"]) for row in rows}
    for fold in ("on", "off"):
        assert {("W0", "apply"), ("W1", "apply"), ("S", "commit"), ("S", "begin")} <= handlers[fold]
    assert ("S", "clock_done") not in handlers["on"] and ("S", "clock_done") in handlers["off"]
    # folded, the trivial model's clock end (it only reads) runs ahead of the next clock: its outcome is asked apart
    assert {h for s, h in handlers["on"] if s != "S"} >= {"clock_end_outcome"}
    assert "clock_end_outcome" not in {h for _, h in handlers["off"]}
    # folded, the coordinator begins the clocks after the first (``dscar.auto-begin``); else the driver does
    assert ("S", "begin_clock") not in handlers["on"] and ("S", "begin_clock") in handlers["off"]
