"""The dscar page on the Dask dashboard: the collector (pure), the Bokeh document, and the route while a fit runs."""
import threading
import urllib.request

import numpy as np
import pytest

from dscar.scheduler.dashboard import ROUTE, Collector

A, B = "tcp://127.0.0.1:1001", "tcp://127.0.0.1:1002"
T = 1_700_000_000.0


def snap(clock, stage, t, *, job="lasso-1", metrics=None, events=(), n_events=None, workers=None, queue=None,
         checkpoints=(), objectives=(), n_objectives=None):
    ws = workers or {A: {"live": True, "shards_done": 2, "speed": 10.0, "mean_step_s": 0.1, "straggler": None,
                         "batch_scale": 1.0},
                     B: {"live": True, "shards_done": 1, "speed": 3.0, "mean_step_s": 0.3, "straggler": "transient",
                         "batch_scale": 1.0}}
    return {"job": job, "time": T + t, "clock": clock, "stage": stage, "data_phase": None, "recovering": False,
            "error": None, "metrics": metrics or {}, "workers": ws,
            "queue": queue or {"todo": 1, "doing": 2, "done": 5, "backups": 1}, "checkpoints": list(checkpoints),
            "events": list(events), "n_events": len(events) if n_events is None else n_events,
            "objectives": [list(o) for o in objectives],
            "n_objectives": len(objectives) if n_objectives is None else n_objectives}


START = {"time": T, "clock": 0, "kind": "job-started", "workers": [A, B]}
LOST = {"time": T + 2.0, "clock": 3, "kind": "worker-lost", "worker": B}
DONE = {"time": T + 2.5, "clock": 3, "kind": "recovery-done", "worker": B}
CKPT = {"time": T + 1.0, "clock": 1, "kind": "checkpoint-published", "version": 1, "bytes": 80}


def test_collector_keeps_the_objective_of_every_completed_clock():
    c = Collector(sample_every=0.0)
    c.ingest(snap(1, "shards", 0.1, events=[START]))
    c.ingest(snap(1, "done", 0.5, metrics={"objective": 5.0}, events=[START], objectives=[(1, 5.0)]))
    c.ingest(snap(2, "shards", 0.6, events=[START, CKPT], checkpoints=[{"version": 1, "clock": 1, "bytes": 80}],
                  objectives=[(1, 5.0)]))
    # clock 2 ended between two snapshots (snapshots are rate-limited): its objective still arrives
    c.ingest(snap(3, "done", 3.0, metrics={"objective": float("nan"), "skipped": 1.0},
                  events=[START, CKPT, LOST, DONE], checkpoints=[{"version": 1, "clock": 1, "bytes": 80}],
                  objectives=[(2, 4.0)], n_objectives=2))  # a skipped clock has no objective
    c.ingest({"job": None, "time": T + 9})  # the job ended: the page keeps showing it
    s = c.sources()
    assert s["objective"] == {"clock": [1, 2], "objective": [5.0, 4.0]}
    assert s["events"]["row"] == ["checkpoint", "loss", "recovery"] and s["events"]["x"] == [1.0, 2.5, 2.5]
    assert s["workers"]["worker"] == ["w0", "w1"] and s["workers"]["state"] == ["ok", "transient"]
    gone = Collector()
    gone.ingest(snap(4, "shards", 4.0, events=[START, LOST], workers={
        A: {"live": True, "shards_done": 3, "speed": 1.0, "straggler": None}}))
    assert gone.sources()["workers"]["state"] == ["ok", "lost"]  # still listed once the coordinator forgets it
    assert s["workers"]["shards_done"] == [2, 1] and s["workers"]["color"][1] == "#d62728"
    assert s["queue"] == {"status": ["todo", "doing", "done", "backups"], "count": [1, 2, 5, 1]}
    assert s["checkpoints"] == {"version": [1], "clock": [1], "bytes": [80], "age_s": [2.0]}
    # throughput: one sample per worker per snapshot, at seconds since the job started; stragglers stand out
    tp = s["throughput"]
    assert tp["t"][:2] == pytest.approx([0.1, 0.1]) and tp["worker"][:2] == ["w0", "w1"]
    assert tp["size"][:2] == [6, 11] and tp["line"][1] == "#d62728"
    assert "worker-lost" in s["log"]["line"][1] and len(s["log"]["line"]) == 4
    assert c.header().startswith("job lasso-1 | clock 3 | stage done | workers 2 live, 1 straggler(s), 1 lost, "
                                 "1 recovery(ies)")


def test_collector_takes_only_new_events_and_resets_for_a_new_job():
    c = Collector()
    c.ingest(snap(1, "shards", 0.1, events=[START, CKPT]))
    c.ingest(snap(1, "shards", 0.2, events=[CKPT, LOST], n_events=3))  # the snapshot holds the newest only
    assert [e["kind"] for e in c.events] == ["job-started", "checkpoint-published", "worker-lost"]
    c.ingest(snap(1, "shards", 0.3, events=[CKPT, LOST], n_events=3))  # nothing new
    assert len(c.events) == 3
    c.ingest(snap(1, "done", 0.4, job="lasso-2", metrics={"objective": 1.0}, events=[START], objectives=[(1, 1.0)]))
    assert c.job == "lasso-2" and len(c.events) == 1 and c.sources()["objective"]["clock"] == [1]
    assert Collector().header().startswith("no dscar job")


def test_the_bokeh_document_holds_the_collectors_figures():
    pytest.importorskip("bokeh")
    from bokeh.document import Document

    from dscar.scheduler.dashboard import PLUGIN_NAME, dscar_doc

    c = Collector(sample_every=0.0)
    c.ingest(snap(1, "done", 0.5, metrics={"objective": 5.0}, events=[START, CKPT], objectives=[(1, 5.0)]))

    class Plugin:
        collector = c

    class Scheduler:
        plugins = {PLUGIN_NAME: Plugin()}

    doc = Document()
    dscar_doc(Scheduler(), {}, doc)
    assert doc.get_model_by_name("dscar-objective").data["objective"] == [5.0]
    assert doc.get_model_by_name("dscar-events").data["row"] == ["checkpoint"]
    assert doc.get_model_by_name("dscar-workers").data["worker"] == ["w0", "w1"]
    assert "clock 1 | stage done" in doc.get_model_by_name("dscar-header").text
    assert "checkpoint-published" in doc.get_model_by_name("dscar-log-table").text  # the tables are rendered
    c.ingest(snap(2, "shards", 0.9, events=[START, CKPT, LOST], objectives=[(1, 5.0)]))
    doc.session_callbacks[0].callback()  # the periodic refresh
    assert "worker-lost" in doc.get_model_by_name("dscar-log-table").text  # and refreshed
    assert "objective 5" in doc.get_model_by_name("dscar-header").text  # between clock ends: the last one's
    assert len(doc.session_callbacks) == 1  # refreshed periodically


def _collector_state(dask_scheduler):
    from dscar.scheduler.dashboard import PLUGIN_NAME

    c = dask_scheduler.plugins[PLUGIN_NAME].collector
    return {"job": c.job, "objective": dict(c.objective), "running": bool(getattr(
        dask_scheduler.plugins["dscar-coordinator"], "jobs", {})), "sources": c.sources()}


@pytest.mark.timeout(180)
def test_the_route_answers_while_a_fit_runs_and_holds_its_figures():
    pytest.importorskip("bokeh")
    import dscar
    from dscar.algorithms.datasets import make_classification
    from dscar.algorithms.mlr import MLRSGD
    from dscar.scheduler.dashboard import page_url

    X, y, _ = make_classification(4000, 20, 4, seed=0)
    with dscar.Cluster(n_workers=2) as cl:
        url = page_url(cl.client)
        assert url and url.endswith(ROUTE)
        out = {}
        # tol below any change: the fit runs all its clocks, long enough to be seen running
        algo = MLRSGD(4, tol=1e-300, patience=1)
        th = threading.Thread(target=lambda: out.update(res=dscar.fit(algo, {"X": X, "y": y}, cl, n_shards=8, max_clocks=60,
                                                                       progress=False)))
        th.start()
        try:
            seen_running = None
            while th.is_alive():  # wait on the collector's state: a clock's objective while the job runs
                st = cl.client.run_on_scheduler(_collector_state)
                if st["running"] and len(st["objective"]) >= 2:
                    seen_running = st
                    break
            assert seen_running is not None, "the fit ended before the page saw two clocks"
            with urllib.request.urlopen(url, timeout=30) as r:
                html = r.read().decode()
                assert r.status == 200
            assert "bokeh" in html.lower() and "dscar" in html
        finally:
            th.join()
        res = out["res"]
        want = {r.clock: r.objective for r in res.history}
        st = cl.client.run_on_scheduler(_collector_state)
        while len(st["objective"]) < len(want):  # the collector's snapshots are SNAPSHOT_EVERY_S apart: its last one
            st = cl.client.run_on_scheduler(_collector_state)
    assert st["job"] == seen_running["job"] and st["job"].startswith("mlr-")
    assert st["objective"] == pytest.approx(want)  # every clock's objective, as the driver saw it
    src = st["sources"]
    assert src["objective"]["clock"] == sorted(want) and np.isfinite(src["objective"]["objective"]).all()
    assert sorted(src["workers"]["worker"]) == ["w0", "w1"] and sum(src["queue"]["count"][:3]) == 8
