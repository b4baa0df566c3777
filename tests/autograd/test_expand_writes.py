"""Writes into an expand() result: PyTorch refuses those that reach one memory location
through two elements and allows the rest (a single element, advanced indexing)."""
import numpy as np
import pytest
import torch

import jitgrad

OVERLAP = "unsupported operation: more than one element of the written-to tensor refers to a single memory location"


def _expanded(lib):
    return lib.ones(3, 1).clone().expand(3, 4)


@pytest.mark.parametrize("write", [
    lambda g: g.__setitem__((0, 1), 2.0),
    lambda g: g.__setitem__(([0, 2], [1, 3]), 5.0),
    lambda g: g[1, 2].mul_(3.0),
    lambda g: g[2].__getitem__(0).div_(0.0),
    lambda g: g[0].zero_(),
    lambda g: g[1:].fill_(7.0),
], ids=["element", "advanced", "element-view-op", "nan", "zero", "fill"])
def test_allowed_writes_reach_every_alias(write):
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's deprecation warning for index_put_ on an expanded tensor
        g, e = _expanded(jitgrad), _expanded(torch)
        write(g)
        write(e)
    np.testing.assert_array_equal(np.array(g.tolist()), np.array(e.tolist()))


def jitgrad_or_torch(g):
    return torch if isinstance(g, torch.Tensor) else jitgrad


@pytest.mark.parametrize("write", [
    lambda g: g.__setitem__(0, 2.0),
    lambda g: g.__setitem__((slice(None), slice(0, 2)), 2.0),
    lambda g: g.add_(1.0),
    lambda g: g[0].mul_(2.0),
    lambda g: g[0].copy_(jitgrad_or_torch(g).arange(4.0)),
], ids=["row", "slice", "whole", "row-view-op", "copy"])
def test_overlapping_writes_raise_and_change_nothing(write):
    for lib in (torch, jitgrad):
        g = _expanded(lib)
        with pytest.raises(RuntimeError, match=OVERLAP):
            write(g)
        assert g.tolist() == [[1.0] * 4] * 3
