"""Messages that fail over at once when their target is gone (``dscar.inflight``, no cluster)."""
import asyncio

import pytest

from dscar.inflight import Inflight


def test_cancel_fails_the_messages_waiting_for_that_target_only():
    async def main():
        inflight = Inflight()
        never = asyncio.get_running_loop().create_future()  # a hung peer: no answer, ever
        other = asyncio.get_running_loop().create_future()
        a = asyncio.ensure_future(inflight.call("tcp://a", never, timeout=3600))
        b = asyncio.ensure_future(inflight.call("tcp://b", other, timeout=3600))
        await asyncio.sleep(0)  # both are waiting
        inflight.cancel("tcp://a")
        with pytest.raises(ConnectionError, match="tcp://a is gone"):
            await a
        assert not b.done()
        other.set_result({"status": "OK"})
        assert await b == {"status": "OK"}
        inflight.cancel("tcp://a")  # nothing waits any more: a no-op

    asyncio.run(main())


def test_a_deadline_and_the_callers_own_cancellation_are_not_taken_for_a_lost_target():
    async def main():
        inflight = Inflight()
        with pytest.raises(asyncio.TimeoutError):
            await inflight.call("tcp://a", asyncio.get_running_loop().create_future(), timeout=0.01)
        task = asyncio.ensure_future(inflight.call("tcp://a", asyncio.get_running_loop().create_future(), 3600))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert inflight._waiting["tcp://a"] == set()  # nothing left behind

    asyncio.run(main())
