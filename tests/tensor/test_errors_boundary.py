"""Issue 8, classes 10 and 12: where user values enter (factories, operators, backward's
arguments, devices) jitgrad raises PyTorch's exception type with the start of its message,
and in-place overwrites, inference_mode and saved_tensors_hooks keep their state exact."""
import math

import numpy as np
import pytest
from conftest import capture

import jitgrad

torch = pytest.importorskip("torch")


def _t(lib, data, **kw):
    return lib.tensor(data, **kw)


# name -> fn(lib): run with lib = jitgrad and lib = torch; both must raise the same type and
# the messages must start alike
CASES = {
    "arange_zero_step": lambda L: L.arange(0, 1, 0),
    "arange_sign": lambda L: L.arange(1, 0),
    "arange_none": lambda L: L.arange(None),
    "arange_inf": lambda L: L.arange(0, math.inf),
    "backward_list_gradient": lambda L: (_t(L, [1., 2.], requires_grad=True) * 2).backward([1., 1.]),
    "backward_str_gradient": lambda L: (_t(L, [1., 2.], requires_grad=True) * 2).backward("a"),
    "grad_list_grad_outputs": lambda L: L.autograd.grad(_t(L, [1., 2.], requires_grad=True) * 2,
                                                        _t(L, [1.], requires_grad=True), [1., 1.]),
    "tensor_overflow": lambda L: L.tensor([2 ** 70]),
    "tensor_overflow_scalar": lambda L: L.tensor(2 ** 70),
    "tensor_overflow_uint64": lambda L: L.tensor([2 ** 63]),
    "tensor_overflow_int64_dtype": lambda L: L.tensor([2 ** 70], dtype=L.int64),
    "tensor_none": lambda L: L.tensor(None),
    "tensor_none_inside": lambda L: L.tensor([1, None]),
    "tensor_str": lambda L: L.tensor("a"),
    "tensor_ragged": lambda L: L.tensor([[1, 2], [3]]),
    "tensor_dict": lambda L: L.tensor({1: 2}),
    "tensor_str_dtype": lambda L: L.tensor([1.], dtype="float32"),
    "expand_leading_minus_one": lambda L: _t(L, [1., 2., 3.]).expand(-1, 3),
    "expand_inner_minus_two": lambda L: _t(L, [1.]).expand(-2),
    "expand_float": lambda L: _t(L, [1.]).expand(2.5),
    "eye_int_requires_grad": lambda L: L.eye(3, dtype=L.int64, requires_grad=True),
    "requires_grad_str": lambda L: _t(L, [1.]).requires_grad_("a"),
    "randn_int": lambda L: L.randn(3, dtype=L.int64),
    "rand_bool": lambda L: L.rand(3, dtype=L.bool),
    "zeros_negative": lambda L: L.zeros(-1),
    "ones_negative": lambda L: L.ones(2, -3),
    "empty_negative": lambda L: L.empty(-1),
    "full_negative": lambda L: L.full((-1,), 1.),
    "eye_negative": lambda L: L.eye(-1),
    "eye_float": lambda L: L.eye(2.5),
    "zeros_float_size": lambda L: L.zeros(2.5),
    "zeros_none_size": lambda L: L.zeros(None),
    "zeros_str_dtype": lambda L: L.zeros(2, dtype="float32"),
    "full_int_size": lambda L: L.full(3, 1.),
    "full_none_value": lambda L: L.full((2,), None),
    "zeros_like_none": lambda L: L.zeros_like(None),
    "from_numpy_list": lambda L: L.from_numpy([1.]),
    "add_none": lambda L: _t(L, [1.]) + None,
    "radd_none": lambda L: None + _t(L, [1.]),
    "add_str": lambda L: _t(L, [1.]) + "a",
    "sub_none": lambda L: _t(L, [1.]) - None,
    "mul_none": lambda L: _t(L, [1.]) * None,
    "div_none": lambda L: _t(L, [1.]) / None,
    "rdiv_none": lambda L: None / _t(L, [1.]),
    "matmul_none": lambda L: _t(L, [1.]) @ None,
    "torch_add_none": lambda L: L.add(_t(L, [1.]), None),
    "torch_add_none_first": lambda L: L.add(None, None),
    "torch_mul_str": lambda L: L.mul(_t(L, [1.]), "a"),
    "torch_exp_none": lambda L: L.exp(None),
    "view_minus_two": lambda L: _t(L, [1., 2., 3., 4.]).view(-2, 2),
    "view_ambiguous": lambda L: L.zeros(0).view(0, -1),
    "reshape_str": lambda L: _t(L, [1., 2.]).reshape("a"),
    "flatten_reversed": lambda L: L.zeros(1, 1, 2).flatten(2, 0),
    "fill_tensor_not_0d": lambda L: _t(L, [1., 2.]).fill_(_t(L, [1., 2.])),
    "fill_none": lambda L: _t(L, [1.]).fill_(None),
    # devices: jitgrad is CPU-only, like a CPU build of torch
    "ones_cuda": lambda L: L.ones(3, device="cuda"),
    "ones_cuda0": lambda L: L.ones(3, device="cuda:0"),
    "zeros_cuda_device": lambda L: L.zeros(3, device=L.device("cuda")),
    "tensor_cuda": lambda L: L.tensor([1.], device="cuda"),
    "arange_cuda": lambda L: L.arange(3, device="cuda"),
    "eye_cuda": lambda L: L.eye(2, device="cuda"),
    "full_cuda": lambda L: L.full((2,), 1., device="cuda"),
    "randn_cuda": lambda L: L.randn(2, device="cuda"),
    "ones_like_cuda": lambda L: L.ones_like(_t(L, [1.]), device="cuda"),
    "as_tensor_cuda": lambda L: L.as_tensor([1.], device="cuda"),
    "to_cuda": lambda L: _t(L, [1.]).to("cuda"),
    "to_device_cuda": lambda L: _t(L, [1.]).to(device="cuda"),
    "method_cuda": lambda L: _t(L, [1.]).cuda(),
    "xpu": lambda L: L.ones(1, device="xpu"),
    "bad_device": lambda L: L.ones(3, device="foo"),
    "bad_device_upper": lambda L: L.ones(3, device="CPU"),
    "bad_device_index": lambda L: L.ones(3, device="cpu:x"),
    "bad_device_negative_index": lambda L: L.ones(3, device="cuda:-1"),
    "to_bad_device": lambda L: _t(L, [1.]).to("foo"),
    "int_device": lambda L: L.ones(3, device=0),
    "float_device": lambda L: L.ones(3, device=1.5),
}


# A CPU-only torch refuses cuda; so does jitgrad without a GPU. With one (or the simulator,
# as in CI) jitgrad computes there: tests/cuda/test_device_errors.py checks the no-GPU
# errors in a process without the simulator.
_NEEDS_NO_GPU = {name for name in CASES if "cuda" in name and name != "bad_device_negative_index"}
if jitgrad.cuda.is_available():
    CASES = {k: v for k, v in CASES.items() if k not in _NEEDS_NO_GPU}


@pytest.mark.parametrize("name", sorted(CASES))
def test_error_matches_torch(name):
    fn = CASES[name]
    te = capture(lambda: fn(torch))
    je = capture(lambda: fn(jitgrad))
    assert te is not None, "torch did not raise: the case is wrong"
    assert je is not None, f"jitgrad did not raise (torch raised {type(te).__name__}: {te})"
    assert isinstance(je, type(te)), f"{type(je).__name__}: {je}  vs torch {type(te).__name__}: {te}"
    tmsg, jmsg = str(te), str(je)
    k = min(30, len(tmsg))
    assert jmsg[:k] == tmsg[:k], f"\njitgrad: {jmsg!r}\ntorch:   {tmsg!r}"


@pytest.mark.parametrize("dev", ["cpu", "cpu:0", None])
def test_cpu_devices_keep_working(dev):
    for make in (lambda d: jitgrad.ones(2, device=d), lambda d: jitgrad.tensor([1., 2.], device=d),
                 lambda d: jitgrad.zeros_like(jitgrad.ones(2), device=d), lambda d: jitgrad.ones(2).to(d)):
        assert make(dev).tolist() == [1., 2.] or make(dev).shape == (2,)
    d = jitgrad.device("cpu")
    assert jitgrad.ones(2, device=d).device == d
    assert str(jitgrad.ones(1).device) == str(torch.ones(1).device)
    assert repr(jitgrad.device("cpu:0")) == repr(torch.device("cpu:0"))
    assert jitgrad.ones(1, device=torch.device("cpu")).shape == (1,)  # a torch.device is read by its name


# --- class 12: in-place overwrites --------------------------------------------------------
@pytest.mark.parametrize("op", ["fill", "zero", "copy"])
def test_overwrite_drops_nan_and_inf(op):
    bad = [math.nan, math.inf, -math.inf, 1.0]

    def run(L):
        x = L.tensor(bad, dtype=L.float64)
        if op == "fill":
            x.fill_(2.5)
        elif op == "zero":
            x.zero_()
        else:
            x.copy_(L.tensor([1., 2., 3., 4.], dtype=L.float64))
        return x.tolist()
    assert run(jitgrad) == run(torch)


def test_empty_zero_is_zero():
    x = jitgrad.empty(4, 4)
    x._data[...] = np.nan  # what empty may hold
    assert x.zero_().tolist() == [[0.0] * 4] * 4


@pytest.mark.parametrize("op", ["fill", "zero", "fill_tensor", "copy"])
def test_overwrite_in_graph_gradient(op):
    """The old value (NaN, inf included) gets an exact zero gradient, the value the gradient
    of where it lands; torch's node names."""
    def run(L):
        a = L.tensor([1., math.nan, math.inf], dtype=L.float64, requires_grad=True)
        v = L.tensor(3., dtype=L.float64, requires_grad=True)
        s = L.tensor([1., 2., 3.], dtype=L.float64, requires_grad=True)
        y = a * 2
        if op == "fill":
            y.fill_(2.0)
        elif op == "zero":
            y.zero_()
        elif op == "fill_tensor":
            y.fill_(v)
        else:
            y.copy_(s)
        name = type(y.grad_fn).__name__
        (y * L.tensor([1., 2., math.inf], dtype=L.float64)).sum().backward() if op in ("fill", "zero") \
            else (y * L.tensor([1., 2., 4.], dtype=L.float64)).sum().backward()
        grads = [None if t.grad is None else t.grad.tolist() for t in (a, v, s)]
        return y.tolist(), name, grads
    jy, jname, jgrads = run(jitgrad)
    ty, tname, tgrads = run(torch)
    assert jname == tname
    np.testing.assert_array_equal(jy, ty)
    for jg, tg in zip(jgrads, tgrads):
        assert (jg is None) == (tg is None)
        if jg is not None:
            np.testing.assert_array_equal(jg, tg)


# --- class 12: grad modes ------------------------------------------------------------------
def test_inference_mode_false_inside_inference_mode():
    def run(L):
        x = L.ones(2, requires_grad=True)
        with L.inference_mode():
            with L.inference_mode(False):
                inner = (L.is_inference_mode_enabled(), L.is_grad_enabled(), (x * 2).grad_fn is not None)
            after = (L.is_inference_mode_enabled(), L.is_grad_enabled())
        with L.no_grad(), L.inference_mode(False):
            nested = (L.is_inference_mode_enabled(), L.is_grad_enabled())
        return inner, after, nested, (L.is_inference_mode_enabled(), L.is_grad_enabled())
    assert run(jitgrad) == run(torch)


# --- class 12: the saved_tensors_hooks stack ------------------------------------------------
def _stack():
    from jitgrad.graph import record
    return record._saved_hooks.stack, record._packing[0]


def test_saved_hooks_left_open_in_unpack_hook_do_not_outlive_backward():
    before = _stack()
    x = jitgrad.tensor([1., 2.], requires_grad=True)
    opened = []

    def unpack(v):
        cm = jitgrad.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t)
        cm.__enter__()  # never exited
        opened.append(cm)
        return v
    with jitgrad.autograd.graph.saved_tensors_hooks(lambda t: t, unpack):
        y = (x * x).sum()
    y.backward()
    assert opened
    assert _stack() == before
    z = (x * x).sum()  # later ops save as usual and run compiled
    z.backward()
    assert x.grad.tolist() == [4., 8.]


def test_saved_hooks_exit_pops_the_innermost_as_torch():
    # torch's stack has no owners: a context left open inside another is popped by the
    # outer's exit, and the outer's own entry stays (torch 2.13 does the same); the next
    # exit, whoever makes it, pops that
    before = _stack()
    hooks = jitgrad.autograd.graph.saved_tensors_hooks
    with pytest.raises(ValueError), hooks(lambda t: t, lambda t: t):
        hooks(lambda t: t, lambda t: t).__enter__()  # left open inside
        raise ValueError
    assert len(_stack()[0]) == len(before[0]) + 1
    hooks(lambda t: t, lambda t: t).__exit__()
    assert _stack() == before
    outer, inner = hooks(lambda t: t, lambda t: t), hooks(lambda t: t, lambda t: t)
    with outer:
        with inner:
            assert len(_stack()[0]) == len(before[0]) + 2
        assert len(_stack()[0]) == len(before[0]) + 1
        with outer:  # the same object entered twice
            assert len(_stack()[0]) == len(before[0]) + 2
        assert len(_stack()[0]) == len(before[0]) + 1
    assert _stack() == before
