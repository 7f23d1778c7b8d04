"""The object-store weight format: one flat buffer whose views give back the state dict exactly."""

import pickle

import numpy as np
import pytest
import torch

from tgc_rl.weight_sync.flat import FlatWeights, named_tensors, weights_nbytes


def _state():
    g = torch.Generator().manual_seed(0)
    return {
        "a.weight": torch.randn(3, 5, generator=g).to(torch.bfloat16),
        "b.bias": torch.randn(7, generator=g),
        "c.scale": torch.tensor(2.5),
        "d.ids": torch.arange(6, dtype=torch.int64).reshape(2, 3),
        "e.view": torch.randn(4, 6, generator=g)[:, ::2],  # non-contiguous
    }


def test_flat_weights_round_trip_every_dtype_and_shape_exactly():
    state = _state()
    back = FlatWeights.from_state_dict(state).to_state_dict()
    assert list(back) == list(state)
    for k, v in state.items():
        assert back[k].dtype == v.dtype and back[k].shape == v.shape
        assert torch.equal(back[k], v)


def test_flat_weights_survive_pickling_as_one_buffer():
    flat = FlatWeights.from_state_dict(_state())
    data = pickle.dumps(flat, protocol=5)
    assert len(data) < flat.buffer.nbytes + 2048  # the bytes plus a small index, no per-tensor pickling
    back = pickle.loads(data)
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(back.items(), flat.items(), strict=True))


def test_views_of_a_read_only_buffer_share_its_memory():
    flat = FlatWeights.from_state_dict(_state())
    flat.buffer.setflags(write=False)  # as the object store hands it out
    name, view = next(flat.items())
    assert view.data_ptr() == flat.buffer.ctypes.data  # a view, not a copy
    assert weights_nbytes(flat) == sum(v.numel() * v.element_size() for v in _state().values())


def test_tensor_offsets_are_aligned_for_any_dtype_view():
    flat = FlatWeights.from_state_dict(_state())
    assert all(e.offset % 64 == 0 for e in flat.entries)
    assert isinstance(flat.buffer, np.ndarray) and flat.buffer.dtype == np.uint8


def test_a_non_tensor_value_is_refused_with_its_name():
    with pytest.raises(TypeError, match="weights\\['x'\\]"):
        FlatWeights.from_state_dict({"x": [1.0, 2.0]})


def test_unknown_weights_container_names_the_fix():
    with pytest.raises(TypeError, match="publish_weights"):
        list(named_tensors([("a", torch.zeros(1))]))
