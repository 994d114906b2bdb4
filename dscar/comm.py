"""The connection pool of dscar's own messages to workers (driver, coordinator, workers).

distributed retries a refused connection until its connect timeout (30 s by default), and a
worker that just died refuses connections: a message to it would hold a clock for 30 s. dscar's
messages go through pools that give up connecting after ``CONNECT_TIMEOUT_S``; a live worker
accepts a connection in milliseconds, even on a busy machine.
"""
from __future__ import annotations

from typing import Any

import asyncio
import inspect

from distributed.core import ConnectionPool
from distributed.protocol.core import dumps, loads

#: connecting to a worker: a dead one refuses at once, and distributed retries until this
CONNECT_TIMEOUT_S = 3.0


def fast_fail_pool(connection_args: dict[str, Any], server: Any = None, limit: int = 256,
                   metadata_only: bool = False) -> ConnectionPool:
    """A connection pool whose connects give up after ``CONNECT_TIMEOUT_S`` (call ``await pool.start()``).

    ``metadata_only``: every message through it is small (the coordinator's). distributed otherwise
    walks each outgoing message with ``dask.sizeof`` (Python, every element) to decide whether to
    serialize it in a thread; for a few hundred bytes that walk is the dearest part of the send, and
    Dask's scheduler turns it off for its own rpc in the same way."""
    return ConnectionPool(limit=limit, connection_args=connection_args, timeout=CONNECT_TIMEOUT_S, server=server,
                          allow_offload=not metadata_only)


def local_scheduler_handler(client: Any, name: str) -> Any:
    """The scheduler's handler ``name`` where the scheduler runs on ``client``'s own event loop (an embedded
    cluster: dscar's default), else None. A message from the client to it would cross a socket twice through
    that same loop, the scheduler's, which every grant and commit needs; called directly it does not."""
    scheduler = getattr(getattr(client, "cluster", None), "scheduler", None)
    if scheduler is None or getattr(scheduler, "loop", None) is not client.loop:
        return None
    return getattr(scheduler, "handlers", {}).get(name)


async def call_local(handler: Any, address: str, **kw: Any) -> Any:
    """``handler`` (``local_scheduler_handler``) called as a message would call it, its answer as a message
    to ``address`` (the scheduler's) would bring it: over a network transport serialized and read back (lists
    as tuples, no object shared with the scheduler), in-process (``inproc://``) as it is, as Dask passes it.
    As with a message, the handler runs to its end though the caller stops waiting (its own task, shielded)."""
    out = handler(comm=None, **kw)
    if inspect.isawaitable(out):
        out = await asyncio.shield(asyncio.ensure_future(out))
    return out if address.startswith("inproc://") else loads(dumps(out))
