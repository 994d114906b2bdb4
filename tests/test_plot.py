"""FitResult.plot(): the objective per clock with the run's events marked; ``dscar run --plot``."""
import subprocess
import sys

import pytest

from dscar.api import plot
from dscar.api.driver import ClockRecord, FitResult

mpl = pytest.importorskip("matplotlib")
T = 1_700_000_000.0
A, B, C = (f"tcp://127.0.0.1:{p}" for p in (1001, 1002, 1003))


def _result() -> FitResult:
    hist = [ClockRecord(c, 0.1 * c, {"objective": 10.0 / c}, {}, {}, {}) for c in range(1, 8)]
    events = [
        {"time": T, "clock": 0, "kind": "job-started", "workers": (A, B, C)},
        {"time": T + 0.1, "clock": 1, "kind": "checkpoint-published", "version": 1, "bytes": 10},
        {"time": T + 0.2, "clock": 2, "kind": "checkpoint-published", "version": 2, "bytes": 10},
        {"time": T + 0.3, "clock": 3, "kind": "straggler", "worker": A, "straggler": "transient"},
        {"time": T + 0.4, "clock": 5, "kind": "worker-lost", "worker": B},
        {"time": T + 0.45, "clock": 5, "kind": "shard-moved", "shard": 1, "source": B, "target": C},
        {"time": T + 0.5, "clock": 5, "kind": "recovery-done", "worker": B, "seconds": 0.02},
    ]
    return FitResult({}, hist, events, True, 1.0, 0.1, [A, B, C])


def test_marks_place_events_on_the_clock_axis():
    m = plot.marks(_result().events)
    assert m == {"straggler": [2.35], "loss": [4.5], "recovery": [4.65], "checkpoint": [1.0, 2.0]}


def _lines(ax, key):
    return [ln for ln in ax.get_lines() if ln.get_gid() == f"dscar-{key}"]


def test_the_figure_has_the_objective_and_the_event_markers():
    res = _result()
    fig = res.plot()
    try:
        top, bottom = fig.axes
        (obj,) = _lines(top, "objective")
        assert list(obj.get_xdata()) == list(range(1, 8)) and list(obj.get_ydata()) == [10.0 / c for c in range(1, 8)]
        for ax in (top, bottom):
            assert [ln.get_xdata()[0] for ln in _lines(ax, "loss")] == [4.5]
            assert [ln.get_xdata()[0] for ln in _lines(ax, "recovery")] == [4.65]
            assert [ln.get_xdata()[0] for ln in _lines(ax, "straggler")] == [2.35]
            assert len(_lines(ax, "checkpoint")) == 2
        labels = [t.get_text() for t in top.get_legend().get_texts()]
        assert "worker lost (1)" in labels and "checkpoint published (2)" in labels
        assert [p.get_height() for p in bottom.patches] == pytest.approx([0.1 * c for c in range(1, 8)])
        assert "2 of 3 worker(s) live" in top.get_title()
    finally:
        mpl.pyplot.close(fig)


def test_plot_into_a_given_axes():
    plt = mpl.pyplot
    fig, ax = plt.subplots()
    try:
        assert _result().plot(ax=ax) is fig and len(fig.axes) == 1 and len(_lines(ax, "loss")) == 1
    finally:
        plt.close(fig)


def test_check_target_refuses_before_the_fit(tmp_path):
    from dscar import InvalidInputError

    plot.check_target(str(tmp_path / "fit.png"))
    with pytest.raises(InvalidInputError, match="no such directory"):
        plot.check_target(str(tmp_path / "missing" / "fit.png"))
    with pytest.raises(InvalidInputError, match="ending in one of"):
        plot.check_target(str(tmp_path / "fit.xyz"))


@pytest.mark.timeout(120)
def test_dscar_run_writes_the_plot(tmp_path):
    out = tmp_path / "fit.png"
    r = subprocess.run([sys.executable, "-m", "dscar", "run", "lasso", "--workers", "2", "--rows", "3000",
                        "--features", "60", "--no-progress", "--plot", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"plot: {out}" in r.stdout and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from dscar.scheduler.dashboard import available

    if available():  # the dashboard page's address is printed when the job starts
        assert "dscar: dashboard page of job lasso-" in r.stdout and "/dscar\n" in r.stdout
    r = subprocess.run([sys.executable, "-m", "dscar", "run", "lasso", "--no-progress", "--plot",
                        str(tmp_path / "nope" / "fit.png")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "dscar: error: --plot" in r.stderr
