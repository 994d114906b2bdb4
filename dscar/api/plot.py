"""A fit as a picture: the objective per clock, seconds per clock, and what happened on the way.

``plot_fit(result)`` draws two panels sharing the clock axis: the objective at the end of every clock
(top) and each clock's wall time (bottom), with the events marked as vertical lines: worker losses,
completed recoveries, straggler flags (during the clock they were seen in, at ``clock - 0.5`` with a
small offset per kind so that a loss and its recovery stay apart) and published checkpoints (at the
clock they saved). matplotlib is optional (the ``plot`` extra): it is imported when a plot is asked for,
on the non-interactive Agg backend unless pyplot was already set up by the caller.
"""
from __future__ import annotations

from typing import Any

#: kind -> (label, colour, line style, offset from the clock's end); the ``gid`` of each line is
#: ``dscar-<key>`` so that tests and callers can find them
MARKERS: dict[str, tuple[str, str, str, float]] = {
    "straggler": ("straggler flagged", "tab:orange", ":", -0.65),
    "loss": ("worker lost", "tab:red", "-", -0.5),
    "recovery": ("recovery done", "tab:green", "--", -0.35),
    "checkpoint": ("checkpoint published", "tab:gray", (0, (1, 3)), 0.0),
}
#: event kind -> marker key
EVENT_MARKER = {"straggler": "straggler", "worker-lost": "loss", "recovery-done": "recovery",
                "checkpoint-published": "checkpoint"}


def marks(events: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Marker key -> x positions (clock units) of the events it marks, in time order (pure)."""
    out: dict[str, list[float]] = {k: [] for k in MARKERS}
    for e in sorted(events, key=lambda e: e["time"]):
        key = EVENT_MARKER.get(e["kind"])
        if key is None or e.get("clock") is None:
            continue
        out[key].append(float(e["clock"]) + MARKERS[key][3])
    return out


def _pyplot():
    try:
        import matplotlib
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("plots need matplotlib: pip install 'dscar[plot]'") from e
    import sys

    if "matplotlib.pyplot" not in sys.modules:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_fit(result: Any, ax: Any = None, title: str | None = None):
    """Draw ``result`` (a ``FitResult``); return the matplotlib figure.

    ``ax``: draw only the objective panel into this Axes (its figure is returned); otherwise a new
    figure with the objective and seconds-per-clock panels.
    """
    plt = _pyplot()
    hist = result.history
    clocks = [r.clock for r in hist]
    objective = [r.objective for r in hist]
    if ax is None:
        fig, (ax, ax_s) = plt.subplots(2, 1, sharex=True, figsize=(8, 5.5), height_ratios=(2, 1),
                                       constrained_layout=True)
    else:
        fig, ax_s = ax.figure, None
    ax.plot(clocks, objective, "o-", color="tab:blue", ms=3, lw=1.2, label="objective", gid="dscar-objective")
    pos = [v for v in objective if v > 0]
    if pos and len(pos) == len(objective) and max(pos) / min(pos) > 100:
        ax.set_yscale("log")
    ax.set_ylabel("objective")
    if ax_s is not None:
        ax_s.bar(clocks, [r.seconds for r in hist], color="tab:blue", alpha=0.6, width=0.8, gid="dscar-seconds")
        ax_s.set_ylabel("seconds per clock")
        ax_s.set_xlabel("clock")
    else:
        ax.set_xlabel("clock")
    for key, xs in marks(result.events).items():
        label, colour, style, _ = MARKERS[key]
        for i, x in enumerate(xs):
            for a in (ax, ax_s):
                if a is not None:
                    a.axvline(x, color=colour, ls=style, lw=1.2 if key != "checkpoint" else 0.8,
                              label=f"{label} ({len(xs)})" if (i == 0 and a is ax) else None, gid=f"dscar-{key}")
    ax.legend(loc="upper right", fontsize=8)
    ax.set_title(title or result.summary().split(":")[0], fontsize=9)
    return fig


def check_target(path: str) -> None:
    """Refuse, before a fit starts, a plot that could not be written: no matplotlib, no such folder,
    or a file type matplotlib does not write."""
    import os

    from ..errors import InvalidInputError

    try:
        plt = _pyplot()
    except ImportError as e:
        raise InvalidInputError(f"--plot {path!r}: {e}") from None
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise InvalidInputError(f"--plot {path!r}: no such directory {folder!r}")
    ext = os.path.splitext(path)[1].lstrip(".").lower()
    supported = plt.figure().canvas.get_supported_filetypes()
    plt.close("all")
    if ext not in supported:
        raise InvalidInputError(f"--plot {path!r}: give a file name ending in one of {', '.join(sorted(supported))}")
