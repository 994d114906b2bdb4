"""A dscar page on the Dask dashboard: ``http://SCHEDULER:DASHBOARD_PORT/dscar``.

Three layers, so that the logic is tested without a cluster or a browser:

* ``Collector`` (pure): takes the coordinator's ``snapshot()`` dicts as they come and keeps what a
  page shows over time: the objective per clock, each worker's throughput samples, the events.
  ``Collector.sources()`` turns that into the columns of the page's Bokeh data sources.
* ``dscar_doc`` (Bokeh): the page: a header, the objective per clock, an event strip (losses,
  recoveries, checkpoints, stragglers), per-worker throughput over time with stragglers marked,
  shards done per worker this clock, the shard queue, checkpoints and the newest events; refreshed
  every 500 ms from the collector.
* ``DashboardPlugin`` (a SchedulerPlugin): in ``start()`` registers the page on the scheduler's HTTP
  server the way ``distributed.dashboard.scheduler.connect`` adds distributed's own pages (a
  ``BokehTornado`` application added to ``scheduler.http_application``), and runs the collector
  on the scheduler's event loop: it reads ``Coordinator.snapshot()`` after the changes the
  coordinator announces (a short poll where it announces none), at most every 0.1 s; each
  snapshot carries the newest events and clock objectives, so none is missed between two.

Bokeh is optional (the ``dashboard`` extra; distributed's own dashboard needs it too): without it
``register`` does nothing and ``page_url`` returns None.
"""
from __future__ import annotations

import asyncio
import importlib
import logging
from typing import Any

from ..api.report import event_lines, worker_names

logger = logging.getLogger("dscar.dashboard")

ROUTE = "/dscar"
PLUGIN_NAME = "dscar-dashboard"
REFRESH_MS = 500
#: the collector takes at most one snapshot this often: as often as the page looks (a snapshot costs the
#: scheduler's loop ~0.1 ms at 2 workers, ~0.6 ms at 64; the events and objectives between two are kept)
SNAPSHOT_EVERY_S = REFRESH_MS / 1000
#: event kind -> (row of the event strip, colour)
STRIP = {"worker-lost": ("loss", "#d62728"), "recovery-done": ("recovery", "#2ca02c"),
         "checkpoint-published": ("checkpoint", "#7f7f7f"), "straggler": ("straggler", "#ff7f0e"),
         "fault-kill": ("fault", "#9467bd"), "fault-hang": ("fault", "#9467bd"), "fault-slow": ("fault", "#9467bd"),
         "backup-attempt": ("backup", "#17becf")}
STRIP_ROWS = ["backup", "fault", "straggler", "checkpoint", "recovery", "loss"]
#: worker colours (no red: red marks stragglers)
PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]


class Collector:
    """What the page shows over time, from successive ``Coordinator.snapshot()`` dicts (pure)."""

    def __init__(self, sample_every: float = 0.25, max_samples: int = 5000):
        self.sample_every = sample_every  #: seconds between throughput samples
        self.max_samples = max_samples  #: throughput samples kept
        self.reset(None)

    def reset(self, job: str | None) -> None:
        self.job = job  #: the job shown (the newest seen)
        self.last: dict[str, Any] = {"job": None}  #: the newest snapshot of that job
        self.t0: float | None = None  #: epoch time of the job's start
        self.objective: dict[int, float] = {}  #: clock -> objective of every completed clock
        self.n_objectives = 0  #: the coordinator's objective count at the newest snapshot
        self.samples: list[tuple[float, str, float, bool]] = []  #: (t, worker, speed, straggler)
        self._last_sample = -1e300
        self.events: list[dict[str, Any]] = []  #: every event seen, in arrival order
        self.n_events = 0  #: the coordinator's event count at the newest snapshot

    def ingest(self, snap: dict[str, Any]) -> None:
        """Take one snapshot. A new job id starts afresh; a snapshot without a job keeps the last one shown."""
        job = snap.get("job")
        if job is None:
            return
        if job != self.job:
            self.reset(job)
        self.last = snap
        n, evs = int(snap.get("n_events", 0)), snap.get("events", [])
        new = evs[max(0, len(evs) - (n - self.n_events)):] if n > self.n_events else []
        self.events.extend(new)
        self.n_events = max(self.n_events, n)
        if self.t0 is None:
            starts = [e["time"] for e in self.events if e.get("kind") == "job-started"]
            self.t0 = starts[0] if starts else float(snap.get("time", 0.0))
        n, objs = int(snap.get("n_objectives", 0)), snap.get("objectives", [])
        for clock, value in (objs[max(0, len(objs) - (n - self.n_objectives)):] if n > self.n_objectives else []):
            self.objective[int(clock)] = float(value)
        self.n_objectives = max(self.n_objectives, n)
        now = float(snap.get("time", 0.0))
        if now - self._last_sample >= self.sample_every:
            self._last_sample = now
            for w, st in (snap.get("workers") or {}).items():
                if st.get("live") and st.get("speed", 0.0) > 0:
                    self.samples.append((now - self.t0, w, float(st["speed"]), bool(st.get("straggler"))))
            del self.samples[:-self.max_samples]

    def sources(self) -> dict[str, dict[str, list]]:
        """Columns of every data source of the page (see ``dscar_doc``)."""
        snap = self.last
        names = worker_names(self.events)
        for w in sorted(snap.get("workers") or {}):  # workers not in any event yet
            names.setdefault(w, f"w{len(names)}")
        colour = {w: PALETTE[int(n[1:]) % len(PALETTE)] for w, n in names.items()}
        clocks = sorted(self.objective)
        out: dict[str, dict[str, list]] = {
            "objective": {"clock": clocks, "objective": [self.objective[c] for c in clocks]},
        }
        strip = {"x": [], "row": [], "color": [], "text": []}
        for e in self.events:
            kind = e.get("kind")
            if kind in STRIP and e.get("clock") is not None:
                row, col = STRIP[kind]
                strip["x"].append(float(e["clock"]) - (0.0 if kind == "checkpoint-published" else 0.5))
                strip["row"].append(row)
                strip["color"].append(col)
                strip["text"].append(f"{kind} {names.get(e.get('worker'), e.get('worker') or '')}".strip())
        out["events"] = strip
        out["throughput"] = {
            "t": [s[0] for s in self.samples], "speed": [s[2] for s in self.samples],
            "worker": [names.get(s[1], s[1]) for s in self.samples], "color": [colour.get(s[1], "#000") for s in self.samples],
            "line": ["#d62728" if s[3] else colour.get(s[1], "#000") for s in self.samples],
            "size": [11 if s[3] else 6 for s in self.samples],
        }
        ws = dict(snap.get("workers") or {})
        for e in self.events:  # workers lost earlier in the job, which the coordinator may no longer list
            if e.get("kind") == "worker-lost" and e.get("worker") not in ws:
                ws[e["worker"]] = {"live": False, "shards_done": 0, "speed": 0.0, "straggler": None}
        order = sorted(ws, key=lambda w: int(names[w][1:]) if w in names else len(names))
        out["workers"] = {
            "worker": [names.get(w, w) for w in order],
            "shards_done": [ws[w]["shards_done"] for w in order],
            "speed": [round(ws[w]["speed"], 2) for w in order],
            "state": ["lost" if not ws[w]["live"] else (ws[w]["straggler"] or "ok") for w in order],
            "color": ["#bbbbbb" if not ws[w]["live"] else ("#d62728" if ws[w]["straggler"] else colour.get(w, "#1f77b4"))
                      for w in order],
        }
        q = snap.get("queue") or {}
        out["queue"] = {"status": ["todo", "doing", "done", "backups"],
                        "count": [int(q.get(k, 0)) for k in ("todo", "doing", "done", "backups")]}
        now = float(snap.get("time", 0.0))
        cks = snap.get("checkpoints") or []
        pub = {e.get("version"): e["time"] for e in self.events if e.get("kind") == "checkpoint-published"}
        out["checkpoints"] = {
            "version": [c["version"] for c in cks], "clock": [c["clock"] for c in cks],
            "bytes": [c["bytes"] for c in cks],
            "age_s": [round(now - pub[c["version"]], 2) if c["version"] in pub else None for c in cks],
        }
        lines = event_lines(self.events, t0=self.t0)[-40:]
        out["log"] = {"line": lines[::-1]}
        return out

    def header(self) -> str:
        """One line about the job: id, clock, stage, workers, losses and recoveries."""
        s = self.last
        if s.get("job") is None:
            return "no dscar job has run on this cluster yet"
        ws = s.get("workers") or {}
        live = sum(1 for w in ws.values() if w["live"])  # the coordinator's view of this moment
        strag = sum(1 for w in ws.values() if w["live"] and w["straggler"])
        lost = sum(1 for e in self.events if e.get("kind") == "worker-lost")
        rec = sum(1 for e in self.events if e.get("kind") == "recovery-done")
        obj = s.get("metrics", {}).get("objective")
        if obj is None and self.objective:  # between clock ends: the last completed clock's
            obj = self.objective[max(self.objective)]
        phase = f" ({s['data_phase']})" if s.get("data_phase") else ""
        return (f"job {s['job']} | clock {s['clock']} | stage {s['stage']}{phase}"
                + (" | recovering" if s.get("recovering") else "")
                + f" | workers {live} live, {strag} straggler(s), {lost} lost, {rec} recovery(ies)"
                + ("" if obj is None else f" | objective {obj:.7g}"))


def html_table(title: str, columns: dict[str, list], names: tuple[str, ...]) -> str:
    """A small HTML table of some columns of a data source (escaped)."""
    from html import escape

    head = "".join(f"<th style='text-align:left;padding:0 8px'>{escape(n)}</th>" for n in names)
    rows = "".join("<tr>" + "".join(f"<td style='padding:0 8px'>{escape('' if v is None else str(v))}</td>"
                                    for v in vals) + "</tr>" for vals in zip(*(columns[n] for n in names)))
    return (f"<b>{escape(title)}</b><table style='font-size:12px;border-collapse:collapse'>"
            f"<tr>{head}</tr>{rows}</table>")


# --------------------------------------------------------------------------- the page (Bokeh)
def dscar_doc(scheduler, extra: dict, doc) -> None:
    """The Bokeh document of the page (the signature of distributed's own page functions)."""
    from bokeh.layouts import column, row
    from bokeh.models import ColumnDataSource, Div, FactorRange
    from bokeh.plotting import figure

    plugin = scheduler.plugins.get(PLUGIN_NAME)
    collector: Collector = plugin.collector if plugin is not None else Collector()
    data = collector.sources()
    src = {k: ColumnDataSource(v, name=f"dscar-{k}") for k, v in data.items()}
    head = Div(text="", name="dscar-header", sizing_mode="stretch_width")

    obj = figure(title="objective per clock", height=260, sizing_mode="stretch_width", x_axis_label="clock",
                 tools="pan,wheel_zoom,box_zoom,reset")
    obj.line("clock", "objective", source=src["objective"], line_width=2)
    obj.scatter("clock", "objective", source=src["objective"], size=5)
    strip = figure(title="events (losses, recoveries, checkpoints, stragglers, faults, backups)", height=190,
                   sizing_mode="stretch_width", y_range=FactorRange(*STRIP_ROWS), x_range=obj.x_range,
                   tools="hover", tooltips="@text")
    strip.scatter("x", "row", color="color", source=src["events"], size=10, marker="diamond")
    tput = figure(title="shard throughput per worker (shards/s; stragglers: large, red outline)", height=260,
                  sizing_mode="stretch_width", x_axis_label="seconds since the job started",
                  tools="pan,wheel_zoom,reset,hover", tooltips="@worker: @speed")
    tput.scatter("t", "speed", source=src["throughput"], fill_color="color", line_color="line", size="size",
                 line_width=2)
    wk = figure(title="shards done this clock", height=220, width=330, y_range=FactorRange(), tools="hover",
                tooltips="@worker @state: @shards_done shards, @speed shards/s")
    wk.hbar(y="worker", right="shards_done", height=0.7, color="color", source=src["workers"])
    qu = figure(title="shard queue (active data phase)", height=220, width=330,
                y_range=FactorRange("backups", "done", "doing", "todo"), tools="")
    qu.hbar(y="status", right="count", height=0.7, source=src["queue"], color="#1f77b4")
    # tables as HTML: Bokeh's DataTable kept showing the rows it was opened with (3.9, headless
    # Chromium; a 15-line app does the same), while Divs refresh with every update
    ck = Div(text="", name="dscar-checkpoints-table", width=330)
    log = Div(text="", name="dscar-log-table", sizing_mode="stretch_width")

    def update() -> None:
        new = collector.sources()
        for k, v in new.items():
            src[k].data = v
        wk.y_range.factors = list(new["workers"]["worker"])
        head.text = f"<b>dscar</b> &nbsp; {collector.header()}"
        ck.text = html_table("checkpoints", new["checkpoints"], ("version", "clock", "bytes", "age_s"))
        log.text = html_table("events (newest first)", new["log"], ("line",))

    update()
    doc.add_periodic_callback(update, REFRESH_MS)
    doc.title = "dscar"
    doc.add_root(column(head, obj, strip, tput, row(wk, qu, ck), log, sizing_mode="stretch_width"))


# --------------------------------------------------------------------------- the plugin
try:
    from distributed import SchedulerPlugin
except ImportError:  # pragma: no cover - distributed is a dependency
    SchedulerPlugin = object  # type: ignore[misc,assignment]


class DashboardPlugin(SchedulerPlugin):
    """Adds the page to the scheduler's HTTP server and feeds its collector from the coordinator."""

    name = PLUGIN_NAME
    idempotent = True

    async def start(self, scheduler) -> None:
        self.scheduler = scheduler
        self.collector = Collector()
        self._closing = False
        try:
            # importing Bokeh takes ~0.5 s of CPU: in a thread, so the scheduler's loop keeps answering meanwhile
            await asyncio.to_thread(importlib.import_module, "distributed.dashboard.core")
            from tornado.ioloop import IOLoop

            from distributed.dashboard.core import BokehApplication

            prefix = getattr(scheduler, "http_prefix", None) or ""
            app = BokehApplication({ROUTE: dscar_doc}, scheduler, prefix=prefix)
            scheduler.http_application.add_application(app)
            app.initialize(IOLoop.current())
        except Exception as e:  # bokeh missing or too old, no HTTP server: the job runs without the page
            logger.warning("dscar dashboard page not available: %s", e)
        self._task = asyncio.ensure_future(self._collect())

    async def close(self) -> None:
        self._closing = True
        self._task.cancel()

    def _coordinator(self):
        from .coordinator import PLUGIN_NAME as COORD

        return self.scheduler.plugins.get(COORD)

    async def _collect(self) -> None:
        """Snapshot after changes, at most every ``SNAPSHOT_EVERY_S``: wait on the coordinator's change
        event only when nothing changed since the last snapshot (its ``_changed`` is replaced at every
        change). The snapshot carries the newest events and objectives, so none is missed between two."""
        seen = None  # the change event current when the last snapshot was taken
        while not self._closing:
            try:
                await asyncio.sleep(SNAPSHOT_EVERY_S)  # a clock may take 2 ms: the page needs no more than this
            except asyncio.CancelledError:
                return
            coord = self._coordinator()
            changed = getattr(coord, "_changed", None)
            try:
                if not isinstance(changed, asyncio.Event):
                    await asyncio.sleep(0.05)  # a coordinator that announces no changes: poll
                elif changed is seen:
                    await asyncio.wait_for(changed.wait(), 0.25)
            except asyncio.TimeoutError:
                pass
            except asyncio.CancelledError:
                return
            if coord is not None and hasattr(coord, "snapshot"):
                seen = getattr(coord, "_changed", None)
                try:
                    self.collector.ingest(coord.snapshot())
                except Exception:  # never take the scheduler down for a picture
                    logger.exception("dscar dashboard: snapshot failed")
                    await asyncio.sleep(1.0)
            else:
                await asyncio.sleep(0.05)


def available() -> bool:
    """Bokeh importable at a version distributed's dashboard accepts."""
    try:
        import distributed.dashboard.core  # noqa: F401
    except Exception:
        return False
    return True


def register(client) -> bool:
    """Register ``DashboardPlugin`` on the client's scheduler (idempotent); False without Bokeh here."""
    if not available():
        return False
    client.register_plugin(DashboardPlugin())
    return True


def page_url(client) -> str | None:
    """The page's address from the client's dashboard link, or None when the scheduler has no dashboard."""
    link = getattr(client, "dashboard_link", None)
    if not link or not available():
        return None
    base = link.rsplit("/", 1)[0] if link.rstrip("/").endswith("status") else link.rstrip("/")
    return base + ROUTE
