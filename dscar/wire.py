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


def pack(arrays: list[np.ndarray]) -> dict[str, Any]:
    """``{"blob": bytes, "meta": [[dtype, shape], ...]}``: the arrays' bytes one after another."""
    arrays = [np.asarray(a) for a in arrays]  # tobytes() writes C order, views and 0-d arrays included
    return {"blob": b"".join(a.tobytes() for a in arrays), "meta": [[a.dtype.str, list(a.shape)] for a in arrays]}


def unpack(msg: dict[str, Any]) -> list[np.ndarray]:
    """The arrays of a ``pack`` message, writable (a caller may update them in place)."""
    buf = bytearray(msg["blob"])
    out, offset = [], 0
    for dtype, shape in msg["meta"]:
        dt = np.dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64))
        out.append(np.frombuffer(buf, dtype=dt, count=count, offset=offset).reshape(shape))
        offset += count * dt.itemsize
    return out


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
