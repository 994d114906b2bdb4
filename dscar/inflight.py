"""Messages that fail over at once when their target is known to be gone (asyncio only, no Dask).

A dead or hung server never answers, so a message to it waits out its deadline, and so does
whatever waits on that message (a clock). When the cluster learns the target is gone (the
scheduler removed it), ``Inflight.cancel`` makes every message still waiting on it raise a
``ConnectionError`` now, which callers already treat as an unreachable target.
"""
from __future__ import annotations

import asyncio
from typing import Any, Awaitable


class Inflight:
    """Messages waiting for an answer, by target address."""

    def __init__(self) -> None:
        #: address -> the messages to it still waiting for an answer
        self._waiting: dict[str, set[asyncio.Future]] = {}
        #: messages cancelled because their target is gone (not because their caller was)
        self._gone: set[asyncio.Future] = set()

    async def call(self, address: str, message: Awaitable[Any], timeout: float) -> Any:
        """Await ``message`` (a call to ``address``) for at most ``timeout`` seconds; a
        ``ConnectionError`` at once if ``cancel(address)`` is called meanwhile."""
        task = asyncio.ensure_future(asyncio.wait_for(message, timeout))
        self._waiting.setdefault(address, set()).add(task)
        try:
            return await task
        except asyncio.CancelledError:
            if task in self._gone:  # cancelled by ``cancel``, not because the caller was cancelled
                raise ConnectionError(f"{address} is gone") from None
            raise
        finally:
            self._waiting.get(address, set()).discard(task)
            self._gone.discard(task)

    def cancel(self, address: str) -> None:
        """``address`` is gone: every message waiting for it fails now."""
        for task in self._waiting.pop(address, ()):
            self._gone.add(task)
            task.cancel()
