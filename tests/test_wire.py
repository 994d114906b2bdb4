"""Arrays in messages (``dscar.wire``): small ones joined into one frame, read back exactly."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from dscar import wire

DTYPES = st.sampled_from([np.float64, np.float32, np.int64, np.int32, np.uint8, np.bool_])
ARRAYS = DTYPES.flatmap(lambda dt: hnp.arrays(dt, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5)))


@given(st.lists(ARRAYS, max_size=8))
@settings(max_examples=200, deadline=None)
def test_pack_then_unpack_gives_the_same_arrays_writable(arrays):
    back = wire.unpack(wire.pack(arrays))
    assert len(back) == len(arrays)
    for a, b in zip(arrays, back):
        assert b.dtype == a.dtype and b.shape == a.shape
        np.testing.assert_array_equal(b, a)
        assert b.flags.writeable  # a receiver may update what it got in place


def test_pack_reads_non_contiguous_views_by_value():
    a = np.arange(24.0).reshape(4, 6)[:, ::2]
    (b,) = wire.unpack(wire.pack([a]))
    np.testing.assert_array_equal(b, a)


@pytest.mark.parametrize("n_bytes, packed", [(wire.PACK_BYTES, True), (wire.PACK_BYTES + 8, False)])
def test_encode_packs_small_arrays_only(n_bytes, packed):
    arrays = [np.ones(n_bytes // 8 - 1), np.ones(1)]
    from distributed.protocol import dumps, loads

    msg = wire.encode(arrays)
    assert ("blob" in msg) is packed
    for a, b in zip(arrays, wire.decode(loads(dumps(msg)))):  # as a peer reads the message
        np.testing.assert_array_equal(b, a)
