"""Meta tensors (shape and dtype, no data) against torch: Module.to("meta") and a deepcopy of
it as the ensembling tutorial uses them, factories and .to("meta"), what a meta tensor
reports (repr, shape, dtype, strides, device), functional_call on a meta module, and the
errors torch raises for reading values. Where torch computes an op on meta tensors (its
shape functions) jitgrad raises NotImplementedError: checked over a table of ops."""
import copy

import numpy as np
import pytest
import torch
from conftest import assert_close, err_of, same

import jitgrad


def both(run, dtype="float64"):
    j, t = run(jitgrad), run(torch)
    same(j, t, "jitgrad vs torch", dtype)
    return j


def describe(t):
    return (repr(t), str(t.device), t.is_meta, t.is_cpu, tuple(t.shape), str(t.dtype).split(".")[-1], t.stride(),
            t.numel(), t.dim(), t.requires_grad, t.is_leaf, t.grad_fn is None, t.get_device())


def net(T):
    m = T.nn.Sequential(T.nn.Linear(3, 4), T.nn.BatchNorm1d(4), T.nn.Linear(4, 2))
    with T.no_grad():
        r = np.random.default_rng(0)
        for p in m.parameters():
            p.copy_(T.tensor(r.standard_normal(tuple(p.shape)).astype(np.float32)))
    return m


def test_module_to_meta_after_deepcopy():
    def run(T):
        m = net(T)
        base = copy.deepcopy(m).to("meta")
        return ([(n, describe(p), type(p).__name__) for n, p in base.named_parameters()],
                [(n, describe(b)) for n, b in base.named_buffers()],
                [describe(p) for p in m.parameters()][0][1],  # the original stays on the cpu
                repr(base[0].weight), sorted(base.state_dict()))
    both(run)


@pytest.mark.parametrize("make", [
    lambda T: T.empty(2, 3, device="meta"),
    lambda T: T.zeros(4, dtype=T.float64, device="meta"),
    lambda T: T.ones((), device="meta"),
    lambda T: T.empty(0, 3, device="meta"),
    lambda T: T.full((2, 2), 7, dtype=T.int64, device="meta"),
    lambda T: T.randn(5, device="meta"),
    lambda T: T.tensor([1.0, 2.0], device="meta"),
    lambda T: T.arange(6.0).reshape(2, 3).to("meta"),
    lambda T: T.arange(6).to("meta"),
    lambda T: T.ones(2, 3).t().to("meta"),  # a dense layout keeps its strides, as torch's copy
    lambda T: T.ones(4, 6)[::2, 1:4].to("meta"),  # a strided one becomes contiguous
    lambda T: T.ones(2, 1, 3).permute(2, 1, 0).to("meta"),
    lambda T: T.ones(3, requires_grad=True).detach().to("meta"),
    lambda T: T.empty(2, 3, device="meta").to("meta"),
    lambda T: T.empty(2, device="meta").requires_grad_(),
    lambda T: copy.deepcopy(T.empty(2, 3, dtype=T.float64, device="meta")),
], ids=["empty", "zeros64", "scalar", "empty0", "full_int", "randn", "tensor", "to", "to_int", "to_transposed", "to_strided", "to_permuted",
        "detached", "meta_to_meta", "requires_grad", "deepcopy"])
def test_making_meta_tensors(make):
    both(lambda T: describe(make(T)))


def test_copy_to_meta_under_no_grad():
    def run(T):
        x = T.ones(3, requires_grad=True)
        with T.no_grad():
            y = x.to("meta")
        return describe(y)
    both(run)


def test_recorded_copy_to_meta_is_refused():
    # torch records ToCopyBackward0; jitgrad cannot differentiate on meta and says so
    x = jitgrad.ones(3, requires_grad=True)
    with pytest.raises(NotImplementedError, match="meta device for autograd"):
        x.to("meta")


@pytest.mark.parametrize("read", [
    lambda t: t.item(), lambda t: t.numpy(), lambda t: t.cpu(), lambda t: t.to("cpu"), lambda t: t.tolist(),
], ids=["item", "numpy", "cpu", "to_cpu", "tolist"])
def test_reading_values_raises_as_torch(read):
    both(lambda T: err_of(read, T.empty(2, 3, device="meta")))


def test_scalar_reads_raise_as_torch():
    both(lambda T: [err_of(f, T.empty((), device="meta")) for f in (lambda t: t.item(), float, int)])


@pytest.mark.parametrize("op", [
    lambda T, e: e + T.ones(2, 3), lambda T, e: e * 2, lambda T, e: e.exp(), lambda T, e: e.sum(),
    lambda T, e: e.t(), lambda T, e: e @ T.ones(3, 2), lambda T, e: T.ones(4, 2) @ e, lambda T, e: e[0],
    lambda T, e: e.reshape(6), lambda T, e: e.relu(), lambda T, e: e.clone(), lambda T, e: e.to(T.float64),
    lambda T, e: T.nn.functional.linear(T.ones(5, 3), e), lambda T, e: T.ones(2, 3).copy_(e),
    lambda T, e: T.nn.functional.conv2d(T.ones(1, 1, 4, 4), e.reshape(1, 1, 2, 3)),
], ids=["add", "mul", "exp", "sum", "t", "matmul", "rmatmul", "index", "reshape", "relu", "clone", "to_dtype",
        "linear", "copy_into", "conv2d"])
def test_ops_on_meta_raise_not_implemented(op):
    e = jitgrad.empty(2, 3, device="meta")
    with pytest.raises(NotImplementedError, match="Meta"):
        op(jitgrad, e)


def test_meta_module_runs_with_functional_call():
    def run(T):
        m = net(T).eval()
        base = copy.deepcopy(m).to("meta")
        state = {k: v.detach() for k, v in m.named_parameters()}
        state.update(dict(m.named_buffers()))
        x = T.tensor(np.random.default_rng(1).standard_normal((5, 3)).astype(np.float32))
        out = T.func.functional_call(base, state, (x,))
        return out, m(x), [describe(p) for p in base.parameters()]
    j = both(run, "float32")
    assert_close(j[0], j[1])


def test_meta_module_called_directly_raises():
    m = copy.deepcopy(net(jitgrad)).to("meta")
    with pytest.raises(NotImplementedError, match="Meta"):
        m(jitgrad.ones(2, 3))


def test_load_onto_meta():
    import io

    def run(T):
        buf = io.BytesIO()
        T.save({"w": T.ones(2, 3, dtype=T.float64), "n": 3}, buf)
        buf.seek(0)
        out = T.load(buf, map_location="meta")
        return describe(out["w"]), out["n"]
    both(run)
