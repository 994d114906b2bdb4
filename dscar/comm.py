"""The connection pool of dscar's own messages to workers (driver, coordinator, workers).

distributed retries a refused connection until its connect timeout (30 s by default), and a
worker that just died refuses connections: a message to it would hold a clock for 30 s. dscar's
messages go through pools that give up connecting after ``CONNECT_TIMEOUT_S``; a live worker
accepts a connection in milliseconds, even on a busy machine.
"""
from __future__ import annotations

from typing import Any

from distributed.core import ConnectionPool

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
