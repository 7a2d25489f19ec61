"""[Note: DCP without numpy] in runtime/run/checkpoint.py: with numpy missing, the object collectives DCP plans with
still turn their byte tensors back into the objects sent. CI's venv has numpy (the hf extra brings it), so the
test hides it: `import numpy` fails while the context is entered, as it does where numpy is not installed."""

from __future__ import annotations

import sys

import pytest
import torch
import torch.distributed.distributed_c10d as c10d

from runtime.run.checkpoint import _object_collectives


def test_the_object_collectives_decode_without_numpy(monkeypatch):
    sent = {"plan": [1, 2.5, "three"], "shape": torch.Size([4, 8])}
    tensor, size = c10d._object_to_tensor(sent, torch.device("cpu"), None)
    original = c10d._tensor_to_object
    monkeypatch.setitem(sys.modules, "numpy", None)  # `import numpy` raises ImportError
    with _object_collectives():
        assert c10d._tensor_to_object is not original  # the no-numpy conversion is in place
        assert c10d._tensor_to_object(tensor, size, None) == sent
    assert c10d._tensor_to_object is original  # and taken out again


def test_with_numpy_nothing_is_changed():
    pytest.importorskip("numpy", reason="numpy is not installed (the hf extra brings it)")
    original = c10d._tensor_to_object
    with _object_collectives():
        assert c10d._tensor_to_object is original
