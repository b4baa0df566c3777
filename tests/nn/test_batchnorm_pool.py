"""nn.BatchNorm1d/2d, nn.GroupNorm, nn.AvgPool2d, nn.AdaptiveAvgPool2d, nn.Softmax, nn.Identity
and their functional forms against torch 2.13, in float64: values, gradients (plain backward:
the compiled kernel; create_graph: the Tensor-level rule, and the second derivative), running
statistics, node names, forward-mode tangents, reprs and errors."""
import warnings

import numpy as np
import pytest
from conftest import F_, LIBS, both, err_of, nn_, set_param, ten

import jitgrad

torch = pytest.importorskip("torch")


def _grads(T, y, ins, g):
    """Plain gradients, the same through create_graph, and a second derivative."""
    plain = T.autograd.grad(y, ins, ten(T, g), retain_graph=True, allow_unused=True)
    graph = T.autograd.grad(y, ins, ten(T, g), create_graph=True, allow_unused=True)
    used = [d for d in graph if d is not None and d.requires_grad]
    # (torch's eval-mode batch norm without weight returns a gradient that requires grad but
    # does not depend on the inputs; jitgrad's does not require grad: no second derivative)
    second = T.autograd.grad(sum((d * d).sum() for d in used), ins, allow_unused=True) if used else [None] * len(ins)
    return dict(plain=list(plain), graph=[None if d is None else d.detach() for d in graph], second=list(second))


# ============================================================================= batch norm
@pytest.mark.parametrize("shape", [(4, 3), (4, 3, 5), (3, 3, 4, 2)], ids=["2d", "3d", "4d"])
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("training", [True, False])
def test_functional_batch_norm(shape, affine, training):
    r = np.random.default_rng(1)
    x = r.normal(size=shape) * 2 + 0.5
    w, b = r.uniform(0.5, 1.5, 3), r.normal(size=3)
    rm, rv = r.normal(size=3), r.uniform(0.5, 2.0, 3)
    g = r.normal(size=shape)

    def run(T):
        xt = ten(T, x, rg=True)
        ins = [xt] + ([ten(T, w, rg=True), ten(T, b, rg=True)] if affine else [])
        mean, var = ten(T, rm), ten(T, rv)
        y = F_(T).batch_norm(xt, mean, var, *(ins[1:] or [None, None]), training=training, momentum=0.3, eps=1e-3)
        return dict(y=y.detach(), node=type(y.grad_fn).__name__, mean=mean, var=var, versions=mean._version,
                    **_grads(T, y, ins, g))
    both(run)


@pytest.mark.parametrize("cls,shape", [("BatchNorm1d", (5, 4)), ("BatchNorm1d", (5, 4, 3)),
                                       ("BatchNorm2d", (3, 4, 3, 2))])
@pytest.mark.parametrize("momentum", [0.1, None])
def test_module_trains_then_evaluates(cls, shape, momentum):
    """Three training steps (running statistics, num_batches_tracked, the cumulative average
    for momentum=None), then eval(), which normalises with the running statistics."""
    r = np.random.default_rng(2)
    xs = [r.normal(size=shape) * (i + 1) + i for i in range(4)]
    w, b = r.uniform(0.5, 1.5, 4), r.normal(size=4)

    def run(T):
        m = getattr(nn_(T), cls)(4, momentum=momentum, dtype=T.float64)
        set_param(T, m.weight, w)
        set_param(T, m.bias, b)
        out = {}
        for i, x in enumerate(xs):
            if i == 3:
                m.eval()
            xt = ten(T, x, rg=True)
            y = m(xt)
            (y * y).sum().backward()
            out[i] = dict(y=y.detach(), gx=xt.grad, node=type(y.grad_fn).__name__, mean=m.running_mean.clone(),
                          var=m.running_var.clone(), n=int(m.num_batches_tracked), training=m.training)
        out["gw"], out["gb"] = m.weight.grad, m.bias.grad
        out["buffers"] = sorted(n for n, _ in m.named_buffers())
        out["state"] = sorted(m.state_dict())
        return out
    both(run)


@pytest.mark.parametrize("training", [True, False])
def test_module_without_running_stats(training):
    """track_running_stats=False: no buffers, the batch's statistics in eval too."""
    x = np.random.default_rng(3).normal(size=(4, 3, 2, 2))

    def run(T):
        m = nn_(T).BatchNorm2d(3, affine=False, track_running_stats=False, dtype=T.float64)
        m.train(training)
        xt = ten(T, x, rg=True)
        y = m(xt)
        (y ** 3).sum().backward()
        return dict(y=y.detach(), gx=xt.grad, buffers=list(m.named_buffers()), params=list(m.parameters()),
                    mean=m.running_mean is None)
    both(run)


def test_batch_norm_saved_values_and_edges():
    x = np.random.default_rng(4).normal(size=(4, 2, 3))

    def run(T):
        xt = ten(T, x, rg=True)
        m = nn_(T).BatchNorm1d(2, dtype=T.float64)
        y = m(xt)
        fn = y.grad_fn
        m.eval()
        z = m(xt)
        m2 = nn_(T).BatchNorm1d(2, affine=False, dtype=T.float64)
        e = m2(xt)
        return dict(input=fn._saved_input is xt, mean=fn._saved_result1, invstd=fn._saved_result2,
                    weight=fn._saved_weight is m.weight, eps=fn._saved_eps,
                    edges=[None if n is None else type(n).__name__ for n, _ in fn.next_functions],
                    eval_edges=[None if n is None else type(n).__name__ for n, _ in z.grad_fn.next_functions],
                    bare_edges=[None if n is None else type(n).__name__ for n, _ in e.grad_fn.next_functions])
    both(run)


def test_batch_norm_float32():
    x = np.random.default_rng(5).normal(size=(8, 3, 4, 4)).astype(np.float32)

    def run(T):
        m = nn_(T).BatchNorm2d(3)
        xt = T.tensor(x, requires_grad=True)
        y = m(xt)
        (y * y * y).sum().backward()
        return dict(y=y.detach(), gx=xt.grad, gw=m.weight.grad, mean=m.running_mean, var=m.running_var,
                    dtype=str(y.dtype))
    both(run, dtype="float32")


# ============================================================================= group norm
@pytest.mark.parametrize("shape,groups", [((2, 6, 3, 4), 3), ((3, 4, 5), 2), ((2, 4), 4), ((2, 6, 2, 2), 1)])
@pytest.mark.parametrize("affine", [True, False])
def test_group_norm(shape, groups, affine):
    r = np.random.default_rng(6)
    c = shape[1]
    x, g = r.normal(size=shape) * 3 - 1, r.normal(size=shape)
    w, b = r.uniform(0.5, 1.5, c), r.normal(size=c)

    def run(T):
        m = nn_(T).GroupNorm(groups, c, eps=1e-4, affine=affine, dtype=T.float64)
        if affine:
            set_param(T, m.weight, w)
            set_param(T, m.bias, b)
        xt = ten(T, x, rg=True)
        y = m(xt)
        fn = y.grad_fn
        return dict(y=y.detach(), node=type(fn).__name__, mean=fn._saved_result1, rstd=fn._saved_result2,
                    repr=repr(m), **_grads(T, y, [xt] + list(m.parameters()), g))
    both(run)


# ============================================================================= average pooling
AVG = [dict(kernel_size=2), dict(kernel_size=3, stride=2, padding=1),
       dict(kernel_size=(3, 2), stride=(2, 1), padding=(1, 0), ceil_mode=True),
       dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
       dict(kernel_size=(2, 3), stride=2, padding=1, divisor_override=4),
       dict(kernel_size=3, stride=3, ceil_mode=True)]


@pytest.mark.parametrize("kw", AVG, ids=[str(i) for i in range(len(AVG))])
@pytest.mark.parametrize("shape", [(2, 3, 7, 6), (3, 5, 5)], ids=["4d", "3d"])
def test_avg_pool2d(kw, shape):
    x = np.random.default_rng(7).normal(size=shape)

    def run(T):
        xt = ten(T, x, rg=True)
        y = F_(T).avg_pool2d(xt, **kw)
        m = nn_(T).AvgPool2d(**kw)
        gy = np.cos(np.arange(y.numel())).reshape(tuple(y.shape))
        return dict(y=y.detach(), module=m(xt).detach(), node=type(y.grad_fn).__name__, **_grads(T, y * y, [xt], gy))
    both(run)


@pytest.mark.parametrize("size", [(3, 4), 2, (None, 3), (7, 9), 1, (1, 1), (5, 1)])
@pytest.mark.parametrize("shape", [(2, 3, 5, 6), (3, 4, 4)], ids=["4d", "3d"])
def test_adaptive_avg_pool2d(size, shape):
    """Windows [floor(o n / out), ceil((o + 1) n / out)), overlapping or repeated when the
    output is larger; a 1 x 1 output is torch's mean (MeanBackward1)."""
    x = np.random.default_rng(8).normal(size=shape)

    def run(T):
        xt = ten(T, x, rg=True)
        y = F_(T).adaptive_avg_pool2d(xt, size)
        m = nn_(T).AdaptiveAvgPool2d(size)
        gy = np.sin(np.arange(y.numel())).reshape(tuple(y.shape))
        return dict(y=y.detach(), module=m(xt).detach(), repr=repr(m), node=type(y.grad_fn).__name__,
                    **_grads(T, y * y, [xt], gy))
    both(run)


# ============================================================================= forward mode
FORWARD = {
    "bn_train": lambda T, x, w, b: F_(T).batch_norm(x, None, None, w, b, training=True),
    "bn_eval": lambda T, x, w, b: F_(T).batch_norm(x, ten(T, [0.1, 0.2, -0.3]), ten(T, [1.0, 2.0, 0.5]), w, b),
    "gn": lambda T, x, w, b: F_(T).group_norm(x, 3, w, b),
    "avg": lambda T, x, w, b: F_(T).avg_pool2d(x, 2, 1, 1) * w.sum() + b.sum(),
    "adaptive": lambda T, x, w, b: F_(T).adaptive_avg_pool2d(x, (2, 3)) * w.sum(),
}


@pytest.mark.parametrize("name", sorted(FORWARD))
@pytest.mark.parametrize("which", ["x", "w", "b", "all"])
def test_forward_mode(name, which):
    r = np.random.default_rng(9)
    arrays = [r.normal(size=(2, 3, 4, 3)), r.uniform(0.5, 1.5, 3), r.normal(size=3)]
    tangents = [r.normal(size=a.shape) for a in arrays]
    pick = {"x": [0], "w": [1], "b": [2], "all": [0, 1, 2]}[which]

    def run(T):
        fwAD = T.autograd.forward_ad
        with fwAD.dual_level():
            ins = [fwAD.make_dual(ten(T, a), ten(T, t)) if i in pick else ten(T, a)
                   for i, (a, t) in enumerate(zip(arrays, tangents))]
            y = FORWARD[name](T, *ins)
            primal, tangent = fwAD.unpack_dual(y)
            return dict(y=primal, t=tangent)
    both(run)


# ============================================================================= Softmax, Identity
def test_softmax_and_identity_modules():
    x = np.random.default_rng(10).normal(size=(2, 3, 4))

    def run(T):
        nn = nn_(T)
        xt = ten(T, x, rg=True)
        y = nn.Softmax(dim=1)(xt)
        (y[:, 0] * 2).sum().backward()
        ident = nn.Identity(54, unused=0.1)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            implicit = [nn.Softmax()(xt).detach(), nn.LogSoftmax()(xt[0]).detach(), F_(T).softmax(xt[0, 0]),
                        F_(T).log_softmax(xt)]
        logp = nn.LogSoftmax(dim=-1)(xt)
        return dict(y=y.detach(), gx=xt.grad, node=type(y.grad_fn).__name__, same=ident(xt) is xt,
                    reprs=[repr(nn.Softmax(dim=-1)), repr(nn.Softmax()), repr(ident), repr(nn.LogSoftmax(1))],
                    implicit=implicit, warned=[str(w.message) for w in seen],
                    # F's warnings point at the caller (torch's modules' at torch's module code)
                    at_caller=[w.filename == __file__ for w in seen[2:]],
                    logp=logp.detach(), logp_node=type(logp.grad_fn).__name__)
    both(run)


def test_module_reprs():
    def run(T):
        nn = nn_(T)
        return [repr(m) for m in (nn.BatchNorm2d(3), nn.BatchNorm1d(4, eps=1e-3, momentum=None, affine=False),
                                  nn.BatchNorm2d(2, track_running_stats=False, bias=False), nn.GroupNorm(2, 4),
                                  nn.GroupNorm(1, 3, affine=False), nn.AvgPool2d(3, 2, 1), nn.AvgPool2d((2, 3)),
                                  nn.AdaptiveAvgPool2d((1, 1)), nn.AdaptiveAvgPool2d(5))]
    both(run)


# ============================================================================= errors
ERRORS = {
    "bn_one_value": lambda T: F_(T).batch_norm(T.ones(1, 3), None, None, training=True),
    "bn_module_one_value": lambda T: nn_(T).BatchNorm1d(3)(T.ones(1, 3)),
    "bn2d_rank": lambda T: nn_(T).BatchNorm2d(3)(T.ones(4, 3)),
    "bn1d_rank": lambda T: nn_(T).BatchNorm1d(3)(T.ones(4, 3, 2, 2)),
    "bn_channels": lambda T: nn_(T).BatchNorm1d(3)(T.ones(4, 4)),
    "bn_weight": lambda T: F_(T).batch_norm(T.ones(4, 3), T.zeros(3), T.ones(3), T.ones(4)),
    "bn_bias": lambda T: F_(T).batch_norm(T.ones(4, 3), T.zeros(3), T.ones(3), None, T.ones(2)),
    "bn_eval_no_stats": lambda T: F_(T).batch_norm(T.ones(2, 3), None, None, training=False),
    "bn_long": lambda T: F_(T).batch_norm(T.ones(2, 3, dtype=T.long), None, None, training=True),
    "bn_1d_input": lambda T: F_(T).batch_norm(T.ones(3), None, None, training=True),
    "gn_module_groups": lambda T: nn_(T).GroupNorm(4, 6),
    "gn_groups": lambda T: F_(T).group_norm(T.ones(2, 6, 3), 4),
    "gn_weight": lambda T: F_(T).group_norm(T.ones(2, 6, 3), 3, T.ones(4)),
    "gn_rank": lambda T: F_(T).group_norm(T.ones(3), 1),
    "avg_pad": lambda T: F_(T).avg_pool2d(T.ones(1, 1, 3, 3), 2, padding=2),
    "avg_stride": lambda T: F_(T).avg_pool2d(T.ones(1, 1, 3, 3), 2, stride=0),
    "avg_too_small": lambda T: F_(T).avg_pool2d(T.ones(1, 1, 3, 3), 4),
    "avg_kernel": lambda T: F_(T).avg_pool2d(T.ones(1, 1, 3, 3), (2, 2, 2)),
    "avg_divisor": lambda T: F_(T).avg_pool2d(T.ones(1, 1, 3, 3), 2, divisor_override=0),
    "adaptive_size": lambda T: F_(T).adaptive_avg_pool2d(T.ones(2, 3, 4, 4), (2,)),
    "adaptive_rank": lambda T: F_(T).adaptive_avg_pool2d(T.ones(3, 3), 2),
}


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_errors_like_torch(name):
    got, want = err_of(ERRORS[name], jitgrad), err_of(ERRORS[name], torch)
    assert want is not None
    assert got == want


@LIBS
def test_running_stats_keep_their_version(T):
    """torch updates the running statistics without moving their version counters, so a
    graph that saved them is not invalidated by the next training step."""
    m = nn_(T).BatchNorm1d(2, dtype=T.float64)
    x = ten(T, np.random.default_rng(11).normal(size=(3, 2)), rg=True)
    before = (m.running_mean._version, m.running_var._version)
    y = m(x)
    m(x)
    y.sum().backward()
    assert (m.running_mean._version, m.running_var._version) == before == (1, 1)  # reset_parameters' zero_ / fill_


# ============================================================================= jitgrad.compile
def _replay_case(modules, dtype):
    from compiler.test_nn_replay import Scale, with_sgd

    def make():
        jitgrad.manual_seed(5)
        return with_sgd(jitgrad.nn.Sequential(Scale((3, 4, 6, 5), dtype), *modules(getattr(jitgrad, dtype))),
                        momentum=0.9)
    return make


REPLAYS = {
    "group_norm_pools": lambda dt: [jitgrad.nn.GroupNorm(2, 4, dtype=dt), jitgrad.nn.AvgPool2d(3, 2, 1, True, False),
                                    jitgrad.nn.AdaptiveAvgPool2d((2, 3))],
    "batch_norm_no_stats": lambda dt: [jitgrad.nn.BatchNorm2d(4, affine=False, track_running_stats=False, dtype=dt),
                                       jitgrad.nn.AvgPool2d(2, divisor_override=3)],
    "batch_norm_eval": lambda dt: [jitgrad.nn.BatchNorm2d(4, dtype=dt).eval()],
}


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("name", sorted(REPLAYS))
def test_compile_replays_as_eager(name, dtype):
    """A training step through the new primitives replays (forward kernels: kernels/forward_nn.py)
    as eager runs it, call after call."""
    from compiler.test_nn_replay import compare, data, train

    def step(state, x):
        out = state[0](x)
        return train(state, (out * out).sum()), out
    compare(_replay_case(REPLAYS[name], dtype), step, data(np.random.default_rng(12), (3, 4, 6, 5), dtype), dtype)


def test_compile_falls_back_for_running_stats_updates():
    """Training batch norm updates its running statistics in place: a graph break, then the
    step runs eagerly, with the same results and statistics."""
    from compiler.test_nn_replay import compare, data, train

    def step(state, x):
        out = state[0](x)
        return train(state, (out * out).sum()), state[0][1].running_mean.clone()
    make = _replay_case(lambda dt: [jitgrad.nn.BatchNorm2d(4, dtype=dt)], "float64")
    from compiler.test_nn_replay import only_entry
    c = compare(make, step, data(np.random.default_rng(13), (3, 4, 6, 5), "float64"), "float64", breaks=ANY_BREAKS)
    assert "batch_norm updates its running statistics in place" in [r for r, _ in only_entry(c).breaks]


class _AnyBreaks(list):
    """compare(breaks=...) that accepts the breaks it finds (the module's num_batches_tracked
    update breaks too); the test then looks for batch norm's own."""
    def __eq__(self, other):
        return True


ANY_BREAKS = _AnyBreaks()
