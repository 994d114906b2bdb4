"""Arrays in dscar's messages: many small arrays as one bytes frame.

distributed serializes each array of a message on its own (a header and a frame each, some 15 µs
at both ends); a small model's tables or a pass's staged updates are dozens of arrays of a few
dozen values, where that is most of a message's cost. ``encode`` joins arrays that are small in
all into one ``bytes`` with a header of dtypes and shapes; larger ones travel as they are
(distributed sends them as zero-copy frames). ``decode`` reads either form.
"""
from __future__ import annotations

from typing import Any

import numpy as np

#: arrays of at most this many bytes in all are joined into one frame
PACK_BYTES = 64 * 1024


#: every array starts at a multiple of this many bytes (aligned reads of mixed dtypes)
ALIGN = 8


def layout(arrays: list) -> tuple[bytes, list[list]]:
    """The arrays' bytes one after another (C order, each at a multiple of ``ALIGN``) and where
    each is: ``[offset, nbytes, dtype, shape]``; the total is padded to ``ALIGN`` too, so layouts
    concatenate without losing alignment. The one raw layout of messages and checkpoint files."""
    chunks, where, size = [], [], 0
    for a in arrays:
        a = np.asarray(a)  # tobytes() writes C order, views and 0-d arrays included
        data = a.tobytes()
        where.append([size, len(data), a.dtype.str, list(a.shape)])
        pad = -len(data) % ALIGN
        chunks += [data, b"\0" * pad]
        size += len(data) + pad
    return b"".join(chunks), where


def read_array(buf, where: list) -> np.ndarray:
    """The array at ``where`` (``layout``'s) in ``buf``, a view; ``ValueError`` if it does not fit."""
    try:
        offset, n, dtype, shape = where
        dt = np.dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64))
    except (TypeError, ValueError) as e:
        raise ValueError(f"malformed array entry {where!r}: {e}") from None
    if dt.hasobject or offset < 0 or n != dt.itemsize * count or offset + n > len(buf):
        raise ValueError(f"array entry {where!r} does not fit a buffer of {len(buf)} bytes")
    return np.frombuffer(buf, dtype=dt, count=count, offset=offset).reshape(shape)


def pack(arrays: list[np.ndarray]) -> dict[str, Any]:
    """``{"blob": bytes, "meta": [where, ...]}``: the arrays in ``layout``."""
    blob, where = layout(arrays)
    return {"blob": blob, "meta": where}


def unpack(msg: dict[str, Any]) -> list[np.ndarray]:
    """The arrays of a ``pack`` message, writable (a caller may update them in place)."""
    buf = bytearray(msg["blob"])
    return [read_array(buf, w) for w in msg["meta"]]


def encode(arrays: list) -> dict[str, Any]:
    """Arrays for a message: packed when small (``PACK_BYTES``), else each as its own frames."""
    from distributed.protocol import to_serialize

    if sum(int(a.nbytes) for a in arrays) <= PACK_BYTES:
        return pack(arrays)
    return {"arrays": [to_serialize(a) for a in arrays]}


def decode(msg: dict[str, Any]) -> list[np.ndarray]:
    """The arrays of an ``encode`` message."""
    if "blob" in msg:
        return unpack(msg)
    return [np.asarray(a) for a in msg["arrays"]]
