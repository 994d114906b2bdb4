"""The coordinator's own waits: a change wakes them, a timeout ends them, and a cancelled long poll
takes no other poll of its worker with it (``Coordinator._wait_change``, ``Coordinator._wait_poll``).

They run on a coordinator that was never started (no scheduler): only the attributes these waits use."""
from __future__ import annotations

import asyncio

import pytest

from dscar.core.events import EventLog
from dscar.core.wake import WaitLine, Woken
from dscar.scheduler.coordinator import Coordinator
from dscar.scheduler.elastic import Elastic

pytestmark = pytest.mark.pure


def _bare() -> Coordinator:
    c = Coordinator.__new__(Coordinator)
    c.jobs = {}
    c.wakes = c.poll_wakes = 0
    c._changed = asyncio.Event()
    c._change_waits = set()
    c._driver_waits = set()
    c._events_heard = 0
    c._line = WaitLine()
    c._polls = {}
    c.elastic = Elastic(c)  # (no job: nobody stands by)
    c._ticker = asyncio.get_running_loop().create_future()  # (a ticker "runs": none is started)
    return c


def test_a_change_wakes_the_waits_and_a_timeout_ends_them_leaving_nothing_behind():
    async def main():
        c = _bare()
        waits = [asyncio.ensure_future(c._wait_change(30.0)) for _ in range(3)]
        await asyncio.sleep(0)
        assert len(c._change_waits) == 3
        c._wake()
        assert await asyncio.gather(*waits) == [True] * 3
        assert await c._wait_change(0.01) is False  # nothing changed
        assert await c._wait_change(0.0) is False
        late = asyncio.ensure_future(c._wait_change(30.0))
        await asyncio.sleep(0)
        late.cancel()
        with pytest.raises(asyncio.CancelledError):
            await late
        assert not c._change_waits  # (timed out and cancelled waits are forgotten, not resolved later)
        dashboard_event = c._changed
        c._wake()
        assert dashboard_event.is_set() and c._changed is not dashboard_event  # the dashboard's event still moves

    asyncio.run(main())


class _Job:
    def __init__(self):
        self.log = EventLog(lambda: 0)
        self.events = self.log.events


def test_a_workers_own_progress_wakes_a_drivers_wait_only_when_it_added_events():
    """A grant or a commit that completes nothing (``driver=False``) wakes the coordinator's own waits
    (the ticker's backups turn due with it) but a driver's long poll only if it added events; any other
    change wakes every wait."""
    async def main():
        c = _bare()
        c.jobs = {"j": _Job()}
        own = asyncio.ensure_future(c._wait_change(30.0))
        driver = asyncio.ensure_future(c._wait_change(30.0, driver=True))
        await asyncio.sleep(0)
        c._wake(polls=False, driver=False)
        assert await own is True
        await asyncio.sleep(0)
        assert not driver.done()
        c.jobs["j"].events.append({"kind": "shard-moved"})
        c._wake(polls=False, driver=False)
        assert await driver is True
        driver = asyncio.ensure_future(c._wait_change(30.0, driver=True))
        await asyncio.sleep(0)
        c._wake(polls=False, driver=False)
        await asyncio.sleep(0)
        assert not driver.done()  # (that event was heard already)
        c._wake()
        assert await driver is True
        assert not c._driver_waits and not c._change_waits

    asyncio.run(main())


def test_a_poll_is_woken_with_its_woken_or_leaves_the_line_at_its_timeout():
    async def main():
        c = _bare()
        poll = asyncio.ensure_future(c._wait_poll("w1", 30.0))
        await asyncio.sleep(0)
        assert "w1" in c._line
        c._wake(everyone=True)
        woken = await poll
        assert isinstance(woken, Woken) and woken.worker == "w1" and c.poll_wakes == 1
        assert await c._wait_poll("w1", 0.01) is None
        assert "w1" not in c._line and "w1" not in c._polls

    asyncio.run(main())


def test_a_cancelled_poll_leaves_another_poll_of_the_same_worker_waiting_for_its_wake():
    """Two polls of one worker share its wake; a poll whose caller went away (its comm closed) is
    cancelled, and the other still gets the wake. (Awaiting the shared future directly would cancel it.)"""
    async def main():
        c = _bare()
        first = asyncio.ensure_future(c._wait_poll("w1", 30.0))
        second = asyncio.ensure_future(c._wait_poll("w1", 30.0))
        await asyncio.sleep(0)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        assert not c._polls["w1"].done()
        c._wake(everyone=True)
        woken = await asyncio.wait_for(second, 5.0)
        assert isinstance(woken, Woken) and woken.worker == "w1"

    asyncio.run(main())
