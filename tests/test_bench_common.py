"""``bench.common.other_busy``: a timing script names the processes outside its own tree that take the cores
while it measures (the same 2-worker clock read 4.66 ms and, minutes later, 3.32 ms, and nothing said why)."""
import os
import signal
import subprocess
import sys

import pytest

from bench.common import busy_note, other_busy

SPIN = "import os, sys; sys.stdout.write(str(os.getpid()) + chr(10)); sys.stdout.flush()\nwhile True: pass"


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc (Linux)")
def test_a_busy_process_outside_the_script_s_tree_is_named_and_its_own_children_are_not():
    # one spinning loop that is not ours (its parent, a shell, exits: init adopts it), one that is our child
    shell = subprocess.run(["sh", "-c", f'{sys.executable} -c "while True: pass" >/dev/null 2>&1 & echo $!'],
                           capture_output=True, text=True, timeout=60)
    stranger = int(shell.stdout.split()[0])
    child = subprocess.Popen([sys.executable, "-c", SPIN], stdout=subprocess.PIPE, text=True)
    try:
        assert int(child.stdout.readline()) == child.pid  # (spinning)
        busy = other_busy(window_s=0.5)
        pids = {b["pid"] for b in busy}
        assert stranger in pids and child.pid not in pids, busy
        mine = next(b for b in busy if b["pid"] == stranger)
        assert mine["cpu_share"] >= 0.1 and "while True" in mine["cmd"]
        assert f"pid {stranger} " in busy_note(busy)
    finally:
        os.kill(stranger, signal.SIGKILL)
        child.kill()
        child.wait()
    assert busy_note([]) == ""


def test_the_speed_probe_times_its_loop_and_every_machine_record_carries_it(monkeypatch):
    """``speed_probe``: the median of its runs' milliseconds; ``machine_info`` records it beside every figure."""
    from bench import common

    ticks = iter([0.0, 0.004, 1.0, 1.002, 2.0, 2.009])  # runs of 4, 2 and 9 ms: the median is 4
    monkeypatch.setattr(common.time, "perf_counter", lambda: next(ticks))
    assert common.speed_probe(repeats=3, n=10) == pytest.approx(4.0)
    monkeypatch.undo()
    assert common._probe_work(2048) == common._probe_work(2048) > 0  # (fixed work: the same each time)
    assert common.walk_probe(repeats=1, n=1000) > 0
    info = common.machine_info()
    assert 0 < info["speed_probe_ms"] < 1000 and 0 < info["walk_probe_ms"] < 10_000
