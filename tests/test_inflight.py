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
        inflight.cancel("tcp://a", generation=1)
        with pytest.raises(ConnectionError, match="tcp://a is gone"):
            await a
        assert not b.done()
        other.set_result({"status": "OK"})
        assert await b == {"status": "OK"}
        inflight.cancel("tcp://a", generation=1)  # nothing waits any more: a no-op

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


def test_a_message_to_a_lost_target_fails_at_once_until_a_worker_joins_there_again():
    """A stale reference (an owner map or memory buddy taken before the loss) must not wait out the
    deadline of a message to a hung worker (bench.chaos: 10 s per message)."""
    async def main():
        inflight = Inflight()
        sent = []

        async def answer():
            sent.append(True)
            return {"status": "OK"}

        inflight.cancel("tcp://a", generation=1)
        with pytest.raises(ConnectionError, match="tcp://a is gone"):
            await inflight.call("tcp://a", answer(), timeout=3600)  # never sent, no deadline waited
        assert sent == [] and await inflight.call("tcp://b", answer(), timeout=3600) == {"status": "OK"}
        inflight.revive("tcp://a", generation=2)  # a worker restarted at that address
        assert await inflight.call("tcp://a", answer(), timeout=3600) == {"status": "OK"}
        # a join can overtake the loss before it (two messages): the older loss then changes nothing
        inflight.revive("tcp://c", generation=4)
        inflight.cancel("tcp://c", generation=3)
        assert await inflight.call("tcp://c", answer(), timeout=3600) == {"status": "OK"}
        inflight.cancel("tcp://c", generation=5)
        with pytest.raises(ConnectionError):
            await inflight.call("tcp://c", answer(), timeout=3600)

    asyncio.run(main())


def test_a_broken_connection_names_the_peer_it_could_not_reach():
    """A clock end that failed reading a dead worker's rows must say which worker (``PeerUnreachable``):
    the coordinator then tells a loss it has not noticed yet from a failure of the step itself."""
    from dscar.inflight import PeerUnreachable

    async def main():
        inflight = Inflight()

        async def broken():
            raise OSError("Connection reset by peer")

        with pytest.raises(PeerUnreachable, match="tcp://a could not be reached: OSError") as info:
            await inflight.call("tcp://a", broken(), timeout=3600)
        assert info.value.address == "tcp://a" and isinstance(info.value, ConnectionError)
        inflight.cancel("tcp://a", generation=1)
        with pytest.raises(PeerUnreachable, match="tcp://a is gone"):
            await inflight.call("tcp://a", broken(), timeout=3600)

    asyncio.run(main())
