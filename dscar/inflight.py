"""Messages that fail over at once when their target is known to be gone (asyncio only, no Dask).

A dead or hung server never answers, so a message to it waits out its deadline, and so does
whatever waits on that message (a clock). When the cluster learns the target is gone (the
scheduler removed it), ``Inflight.cancel`` makes every message still waiting on it raise a
``ConnectionError`` now, which callers already treat as an unreachable target, and so does every
message sent to it later (a stale reference, such as an owner map taken before the loss) until
``revive`` says a worker joined at that address again.

Losses and joins carry a *generation* (the coordinator counts membership changes): the two reach a
worker as separate messages, and a join that overtakes the loss before it must still win.
"""
from __future__ import annotations

import asyncio
from typing import Any, Awaitable


class PeerUnreachable(ConnectionError):
    """A message to ``address`` failed because that worker could not be reached (gone, or its
    connection broke). It names the peer, so a step that failed on it (a clock end reading its
    rows) is told from one that failed on its own: the first is a loss not yet noticed."""

    def __init__(self, address: str, why: str):
        super().__init__(f"{address} {why}")
        #: the worker that could not be reached
        self.address = address


class Inflight:
    """Messages waiting for an answer, by target address, and the targets known to be gone."""

    def __init__(self) -> None:
        #: address -> the messages to it still waiting for an answer
        self._waiting: dict[str, set[asyncio.Future]] = {}
        #: messages cancelled because their target is gone (not because their caller was)
        self._gone: set[asyncio.Future] = set()
        #: address -> the generation of its newest loss: messages to it fail at once
        self._lost: dict[str, int] = {}
        #: address -> the generation of its newest join
        self._joined: dict[str, int] = {}

    async def call(self, address: str, message: Awaitable[Any], timeout: float | None) -> Any:
        """Await ``message`` (a call to ``address``) for at most ``timeout`` seconds; a
        ``PeerUnreachable`` (a ``ConnectionError``) at once if ``address`` is gone, when ``cancel(address)``
        is called meanwhile, or when the connection to it fails."""
        if address in self._lost:
            if asyncio.iscoroutine(message):
                message.close()  # never sent
            raise PeerUnreachable(address, "is gone")
        # the message as one task, cancelled by a timer at its deadline (``asyncio.wait_for`` in a task
        # was two tasks and a future a message: the coordinator sends one to every worker a clock)
        task = asyncio.ensure_future(message)
        expired: list[bool] = []
        timer = None if timeout is None else asyncio.get_running_loop().call_later(timeout, _expire, task, expired)
        self._waiting.setdefault(address, set()).add(task)
        try:
            return await task
        except asyncio.CancelledError:
            if task in self._gone:  # cancelled by ``cancel``, not because the caller was cancelled
                raise PeerUnreachable(address, "is gone") from None
            if expired and not asyncio.current_task().cancelling():  # its deadline, not its caller's end
                raise asyncio.TimeoutError(f"no answer from {address} in {timeout:g} s") from None
            raise
        except (PeerUnreachable, asyncio.TimeoutError):  # (a TimeoutError is an OSError: kept as it is)
            raise
        except OSError as e:  # (a broken connection: distributed's CommClosedError is an OSError)
            raise PeerUnreachable(address, f"could not be reached: {e!r}") from e
        finally:
            if timer is not None:
                timer.cancel()
            self._waiting.get(address, set()).discard(task)
            self._gone.discard(task)

    def is_gone(self, address: str) -> bool:
        """Whether messages to ``address`` fail at once (it was lost and has not joined again)."""
        return address in self._lost

    def cancel(self, address: str, generation: int) -> None:
        """``address`` is gone (as of ``generation``): every message waiting for it fails now, and
        every later one at once, unless a worker joined there in a later generation."""
        if self._joined.get(address, -1) > generation:
            return  # the join that followed this loss arrived first
        self._lost[address] = max(generation, self._lost.get(address, generation))
        for task in self._waiting.pop(address, ()):
            self._gone.add(task)
            task.cancel()

    def revive(self, address: str, generation: int) -> None:
        """A worker joined at ``address`` in ``generation`` (later than any loss it undoes):
        messages to it are sent again."""
        self._joined[address] = max(generation, self._joined.get(address, generation))
        if self._lost.get(address, generation) < generation:
            self._lost.pop(address, None)


def _expire(task: asyncio.Future, expired: list[bool]) -> None:
    """A message's deadline: cancel it, and say why (``Inflight.call`` raises ``TimeoutError``)."""
    if not task.done():
        expired.append(True)
        task.cancel()


async def timed_wait(fut: asyncio.Future, timeout: float, expired: Any) -> Any:
    """``fut``'s result, or ``expired`` once ``timeout`` seconds pass first (``fut`` then holds it too).
    Cancelling the caller cancels ``fut``. A timer, not ``asyncio.wait_for`` (a task a wait): the
    coordinator's long polls and the workers' waits for an apply run it several times a clock."""
    timer = asyncio.get_running_loop().call_later(max(timeout, 0.0), resolve, fut, expired)
    try:
        return await fut
    finally:
        timer.cancel()


def resolve(fut: asyncio.Future, value: Any) -> None:
    """Set ``fut``'s result to ``value`` unless it is done."""
    if not fut.done():
        fut.set_result(value)
