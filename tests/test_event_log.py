"""The job's event log is bounded by its reader (``dscar.core.events.EventLog``): the coordinator drops
the events below the driver's cursor, keeping the newest ``KEEP_NEWEST`` and those a recovery pinned,
and nothing the driver has not received is dropped. Pure rules first (a model checked against every
sequence Hypothesis makes up), then a fit on an in-process cluster: the scheduler holds a few events
at a time while the driver's result has every one, in order, once."""
from __future__ import annotations

import collections

from hypothesis import given, settings
from hypothesis import strategies as st

import dscar
from dscar.core import events as events_mod
from dscar.core.events import EventLog
from conftest import RowCounter, assert_exactly_once, row_data


def _log(keep: int) -> EventLog:
    return EventLog(lambda: 7, keep_newest=keep)


def test_trim_keeps_the_newest_and_what_the_reader_lacks():
    log = _log(keep=3)
    for i in range(10):
        log.add(float(i), "e", n=i)
    assert log.trim(2) == 2 and log.first == 2 and log.count == 10
    assert [e["n"] for e in log.since(0)] == list(range(2, 10))  # (a cursor below ``first``: the held ones)
    assert [e["n"] for e in log.since(5)] == [5, 6, 7, 8, 9]
    assert log.trim(10) == 5 and [e["n"] for e in log.events] == [7, 8, 9]  # the newest 3 stay
    assert log.trim(4) == 0  # (a cursor that went back drops nothing)
    assert log.since(log.count) == [] and log.events[0]["clock"] == 7


def test_a_pin_keeps_its_events_until_unpinned():
    log = _log(keep=0)
    log.add(0.0, "before")
    at = log.pin()
    assert at == 1
    log.add(1.0, "during")
    log.add(2.0, "during")
    assert log.trim(3) == 1 and [e["kind"] for e in log.since(at)] == ["during", "during"]
    log.unpin(at)
    assert log.trim(3) == 2 and log.events == [] and log.count == 3


@settings(max_examples=200, deadline=None)
@given(keep=st.integers(0, 5),
       steps=st.lists(st.one_of(st.tuples(st.just("add"), st.integers(1, 4)),
                                st.tuples(st.just("read"), st.integers(0, 3)),
                                st.just(("pin", 0)), st.just(("unpin", 0))), max_size=60))
def test_a_reader_gets_every_event_once_in_order(keep, steps):
    """A driver that reads from its cursor on, then moves the cursor (trimming there, as the
    coordinator's wait does), gets the whole log; the held events are the newest ``keep``, those
    from the oldest pin and those it has not read, never more than that."""
    log, whole, got, pins = _log(keep), [], [], []
    for op, n in steps:
        if op == "add":
            for _ in range(n):
                log.add(0.0, "e", n=len(whole))
                whole.append(len(whole))
        elif op == "read":
            log.trim(len(got))
            got += [e["n"] for e in log.since(len(got))][: n or None]
        elif op == "pin":
            pins.append(log.pin())
        elif pins:
            log.unpin(pins.pop(0))
        floor = min([len(got), max(0, len(whole) - keep), *pins])
        assert log.first <= floor and [e["n"] for e in log.events] == whole[log.first:]
    log.trim(len(got))
    got += [e["n"] for e in log.since(len(got))]
    assert got == whole


def _trims(monkeypatch) -> list[tuple[int, int, int]]:
    """Record each trim of a job's log: ``(upto, first after it, count)``."""
    seen: list[tuple[int, int, int]] = []
    trim = EventLog.trim

    def recorded(self, upto):
        out = trim(self, upto)
        seen.append((int(upto), self.first, self.count))
        return out

    monkeypatch.setattr(EventLog, "trim", recorded)
    return seen


def test_the_scheduler_holds_a_few_events_and_the_driver_gets_them_all(inproc, monkeypatch, tmp_path):
    """With a checkpoint every clock (two events a clock) and ``KEEP_NEWEST`` = 4, each wait of the driver
    leaves the scheduler's log holding only what the driver has not read and the newest 4, however far
    behind the driver is; the driver's result has the job's 25 events, each once and in order."""
    monkeypatch.setattr(events_mod, "KEEP_NEWEST", 4)
    trims = _trims(monkeypatch)
    res = dscar.fit(RowCounter(), row_data(40), inproc, progress=False, n_shards=8, max_clocks=12, policies=[],
                    checkpoint=dscar.CheckpointConfig(url=str(tmp_path), every=1, fraction=1.0))
    assert_exactly_once(res, 40)
    kinds = collections.Counter(e["kind"] for e in res.events)
    assert kinds["checkpoint-started"] == kinds["checkpoint-published"] == 12 and kinds["job-started"] == 1
    times = [e["time"] for e in res.events]
    assert times == sorted(times)
    assert len({(e["kind"], e["time"], e.get("version")) for e in res.events}) == len(res.events)
    assert trims and max(first for _, first, _ in trims) > 0, trims  # (the log was cut: none are without the trim)
    for upto, first, count in trims:  # (no pin here: a recovery's would hold more)
        assert min(upto, count - 4) <= first <= upto, (upto, first, count)  # nothing the driver lacks goes
