"""jitgrad.nn.Module and nn.Parameter: jitgrad against torch 2.13.

Every comparison test runs the same code with both libraries (``T`` is ``jitgrad`` or ``torch``)
from identical initial weights (copied in from numpy arrays) and compares values, gradients and
parameter trajectories (float64 to 1e-10 unless stated, float32 with float32 tolerance).  Tests of
random behaviour (initialisation bounds, dropout masks) run once per library, so torch also has to
pass them.
"""

import numpy as np
import pytest
from conftest import both, capture, make_mlp, mlp_arrays, nn_, set_param, snap, ten, to_np

torch = pytest.importorskip("torch")



def make_net(T):
    """The custom module: attributes fc1, act, a ModuleList and a plain Parameter."""
    nn = nn_(T)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(4, 8)
            self.act = nn.ReLU()
            self.layers = nn.ModuleList([nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 2)])
            self.scale = nn.Parameter(T.ones(2))

        def forward(self, x):
            x = self.act(self.fc1(x))
            for layer in self.layers:
                x = layer(x)
            return x * self.scale

    return Net()


def net_arrays(seed=1):
    r = np.random.default_rng(seed)
    return {
        "scale": r.uniform(0.5, 1.5, size=(2,)),
        "fc1.weight": r.normal(size=(8, 4)) * 0.5,
        "fc1.bias": r.normal(size=(8,)) * 0.3,
        "layers.0.weight": r.normal(size=(8, 8)) * 0.4,
        "layers.0.bias": r.normal(size=(8,)) * 0.3,
        "layers.2.weight": r.normal(size=(2, 8)) * 0.5,
        "layers.2.bias": r.normal(size=(2,)) * 0.3,
    }


def make_net64(T, arrays):
    m = make_net(T).to(T.float64)
    set_param(T, m.scale, arrays["scale"])
    set_param(T, m.fc1.weight, arrays["fc1.weight"])
    set_param(T, m.fc1.bias, arrays["fc1.bias"])
    set_param(T, m.layers[0].weight, arrays["layers.0.weight"])
    set_param(T, m.layers[0].bias, arrays["layers.0.bias"])
    set_param(T, m.layers[2].weight, arrays["layers.2.weight"])
    set_param(T, m.layers[2].bias, arrays["layers.2.bias"])
    return m


X4 = np.random.default_rng(7).normal(size=(5, 4))


# ============================================================================= 1. nn.Module API

def test_sequential_parameters_and_named_parameters():
    def run(T):
        nn = nn_(T)
        m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        params = list(m.parameters())
        named = list(m.named_parameters())
        return dict(
            names=[n for n, _ in named],
            shapes=[list(p.shape) for p in params],
            dtypes=[str(p.dtype).split(".")[-1] for p in params],
            same_objects=[p is q for (_, p), q in zip(named, params)],
            is_param=[isinstance(p, nn.Parameter) for p in params],
            is_tensor=[isinstance(p, T.Tensor) for p in params],
            requires_grad=[bool(p.requires_grad) for p in params],
            is_leaf=[bool(p.is_leaf) for p in params],
            first_layer_weight_is_param0=params[0] is m[0].weight,
        )

    j, t = both(run)
    assert t["names"] == ["0.weight", "0.bias", "2.weight", "2.bias"]


def test_custom_net_parameters_children_modules():
    def run(T):
        m = make_net(T)
        named = list(m.named_parameters())
        return dict(
            names=[n for n, _ in named],
            shapes=[list(p.shape) for _, p in named],
            n_params=len(list(m.parameters())),
            children=[type(c).__name__ for c in m.children()],
            modules=[type(c).__name__ for c in m.modules()],
            first_module_is_self=next(iter(m.modules())) is m,
            child_fc1_is_attr=next(iter(m.children())) is m.fc1,
            modulelist_len=len(m.layers),
            modulelist_index=m.layers[2] is list(m.layers)[2],
            scale_is_param=isinstance(m.scale, nn_(T).Parameter),
        )

    j, t = both(run)
    assert len(t["modules"]) == 7


def test_custom_net_forward_and_backward():
    a = net_arrays()

    def run(T):
        m = make_net64(T, a)
        x = ten(T, X4, rg=True)
        out = m(x)
        (out * ten(T, [[1.0, -2.0]] * 5)).sum().backward()
        return dict(out=out, x_grad=x.grad,
                    grads={n: p.grad for n, p in m.named_parameters()})

    both(run)


def test_sequential_indexing_len_and_forward():
    a = mlp_arrays()

    def run(T):
        m = make_mlp(T, a)
        x = ten(T, X4, rg=True)
        out = m(x)
        manual = m[2](m[1](m[0](x)))
        out.sum().backward()
        return dict(len=len(m), types=[type(c).__name__ for c in m], out=out, manual=manual,
                    x_grad=x.grad, g0=m[0].weight.grad, g2=m[2].bias.grad)

    both(run)


def test_train_eval_flags():
    def run(T):
        m = make_net(T)
        seen = [[bool(x.training) for x in m.modules()]]
        r = m.eval()
        seen.append([bool(x.training) for x in m.modules()])
        r2 = m.train()
        seen.append([bool(x.training) for x in m.modules()])
        m.train(False)
        seen.append([bool(x.training) for x in m.modules()])
        m.layers.train()
        seen.append([bool(x.training) for x in m.modules()])
        return dict(seen=seen, eval_returns_self=r is m, train_returns_self=r2 is m)

    j, t = both(run)
    assert t["seen"][0] == [True] * 7 and t["seen"][1] == [False] * 7


@pytest.mark.parametrize("set_to_none", [None, True, False])
def test_module_zero_grad(set_to_none):
    a = mlp_arrays()

    def run(T):
        m = make_mlp(T, a)
        m(ten(T, X4)).sum().backward()
        before = [p.grad is not None for p in m.parameters()]
        if set_to_none is None:
            m.zero_grad()
        else:
            m.zero_grad(set_to_none=set_to_none)
        after = [snap(p.grad) for p in m.parameters()]
        # gradients accumulate again from the cleared state
        m(ten(T, X4)).sum().backward()
        return dict(before=before, after=after, again=[p.grad for p in m.parameters()])

    j, t = both(run)
    if set_to_none is False:
        assert all(g is not None for g in t["after"])
    else:
        assert all(g is None for g in t["after"])


def test_module_to_float64():
    def run(T):
        nn = nn_(T)
        m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        before = [str(p.dtype).split(".")[-1] for p in m.parameters()]
        r = m.to(T.float64)
        after = [str(p.dtype).split(".")[-1] for p in m.parameters()]
        out = m(ten(T, X4))
        return dict(before=before, after=after, returns_self=r is m,
                    still_params=[isinstance(p, nn.Parameter) and bool(p.requires_grad) and bool(p.is_leaf)
                                  for p in m.parameters()],
                    out_dtype=str(out.dtype).split(".")[-1])

    j, t = both(run)
    assert t["after"] == ["float64"] * 4


def test_module_to_float64_keeps_values():
    a = mlp_arrays(dtype=np.float32)

    def run(T):
        m = make_mlp(T, a, dtype="float32")
        m.to(T.float64)
        return [p for p in m.parameters()]

    both(run)


@pytest.mark.parametrize("which", ["sequential", "net"])
def test_state_dict_keys_and_values(which):
    def run(T):
        if which == "sequential":
            m = make_mlp(T, mlp_arrays())
        else:
            m = make_net64(T, net_arrays())
        sd = m.state_dict()
        return dict(keys=list(sd.keys()), values=[sd[k] for k in sd],
                    params=[p for _, p in m.named_parameters()],
                    requires_grad=[bool(v.requires_grad) for v in sd.values()])

    j, t = both(run)
    if which == "sequential":
        assert t["keys"] == ["0.weight", "0.bias", "2.weight", "2.bias"]


@pytest.mark.parametrize("which", ["sequential", "net"])
def test_load_state_dict_round_trip(which):
    def run(T):
        if which == "sequential":
            src = make_mlp(T, mlp_arrays())
            dst = make_mlp(T)              # default (random) initialisation
        else:
            src = make_net64(T, net_arrays())
            dst = make_net(T).to(T.float64)
        x = ten(T, X4)
        dst.load_state_dict(src.state_dict())
        out_src, out_dst = src(x), dst(x)
        # the loaded values are copies: changing the source afterwards leaves dst alone
        with T.no_grad():
            for p in src.parameters():
                p.mul_(3.0)
        out_dst_after = dst(x)
        return dict(out_src=out_src, out_dst=out_dst, out_dst_after=out_dst_after,
                    params=[p for p in dst.parameters()],
                    distinct=[p is not q for p, q in zip(dst.parameters(), src.parameters())])

    j, t = both(run)
    np.testing.assert_array_equal(to_np(j["out_src"]), to_np(j["out_dst"]))
    np.testing.assert_array_equal(to_np(j["out_dst"]), to_np(j["out_dst_after"]))


def test_load_state_dict_missing_key_raises():
    def run(T):
        src = make_mlp(T, mlp_arrays())
        dst = make_mlp(T)
        sd = src.state_dict()
        del sd["0.bias"]
        e = capture(dst.load_state_dict, sd)
        msg = "" if e is None else str(e)
        return dict(type=None if e is None else type(e).__name__,
                    first_line=msg.split("\n")[0].split(":")[0],
                    names_key='"0.bias"' in msg or "'0.bias'" in msg)

    j, t = both(run)
    assert t["type"] == "RuntimeError"
    assert t["first_line"] == "Error(s) in loading state_dict for Sequential"


def test_forward_hooks_called_and_output_replaced():
    a = mlp_arrays()

    def run(T):
        m = make_mlp(T, a)
        lin = m[0]
        calls = []

        def pre(mod, args):
            calls.append(("pre", mod is lin, type(args).__name__, len(args), snap(args[0])))

        def post(mod, args, out):
            calls.append(("post", mod is lin, type(args).__name__, len(args), snap(out)))
            return out * 2

        h1 = lin.register_forward_pre_hook(pre)
        h2 = lin.register_forward_hook(post)
        x = ten(T, X4, rg=True)
        y = lin(x)
        out = m(x)
        out.sum().backward()
        return dict(calls=calls, y=y, out=out, x_grad=x.grad, w_grad=lin.weight.grad,
                    removable=callable(getattr(h1, "remove", None)) and callable(getattr(h2, "remove", None)))

    j, t = both(run)
    assert [c[0] for c in t["calls"]] == ["pre", "post", "pre", "post"]


@pytest.mark.parametrize("ret", ["tuple", "tensor"])
def test_forward_pre_hook_replaces_input(ret):
    a = mlp_arrays()

    def run(T):
        m = make_mlp(T, a)
        lin = m[0]

        def pre(mod, args):
            new = args[0] * 3
            return (new,) if ret == "tuple" else new

        lin.register_forward_pre_hook(pre)
        x = ten(T, X4, rg=True)
        out = lin(x)
        out.sum().backward()
        return dict(out=out, x_grad=x.grad)

    both(run)


def test_forward_hook_handle_remove():
    a = mlp_arrays()

    def run(T):
        m = make_mlp(T, a)
        calls = []
        h1 = m.register_forward_pre_hook(lambda mod, args: calls.append("pre"))
        h2 = m.register_forward_hook(lambda mod, args, out: calls.append("post"))
        x = ten(T, X4)
        m(x)
        h1.remove()
        h2.remove()
        out = m(x)
        return dict(calls=calls, out=out)

    j, t = both(run)
    assert t["calls"] == ["pre", "post"]


def test_call_runs_forward_of_custom_module():
    def run(T):
        nn = nn_(T)

        class Double(nn.Module):
            def forward(self, x, k=1.0):
                return x * 2 + k

        d = Double()
        return dict(out=d(ten(T, [1.0, 2.0]), k=0.5), fwd=d.forward(ten(T, [1.0, 2.0])),
                    params=len(list(d.parameters())), training=bool(d.training))

    both(run)


def test_repr_of_modules():
    def run(T):
        nn = nn_(T)
        return dict(
            linear=str(nn.Linear(4, 8)),
            linear_repr=repr(nn.Linear(4, 8)),
            relu=str(nn.ReLU()),
            seq=str(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))),
        )

    j, t = both(run)
    assert t["linear"] == "Linear(in_features=4, out_features=8, bias=True)"


# ============================================================================= 2. nn.Parameter

def test_parameter_basics():
    def run(T):
        nn = nn_(T)
        base = ten(T, [1.0, -2.0, 3.0])
        p = nn.Parameter(base)
        q = nn.Parameter(ten(T, [1.0, 2.0]), requires_grad=False)
        (p * p).sum().backward()
        return dict(is_tensor=isinstance(p, T.Tensor), is_param=isinstance(p, nn.Parameter),
                    rg=bool(p.requires_grad), leaf=bool(p.is_leaf), q_rg=bool(q.requires_grad),
                    values=snap(p), grad=p.grad, dtype=str(p.dtype).split(".")[-1],
                    base_not_param=not isinstance(base, nn.Parameter))

    j, t = both(run)
    assert t["rg"] is True and t["q_rg"] is False


def test_parameter_repr():
    def run(T):
        nn = nn_(T)
        p = nn.Parameter(ten(T, [1.0, 2.0]))
        return dict(starts=repr(p).startswith("Parameter containing:"), full=repr(p))

    j, t = both(run)
    assert t["starts"] is True


def test_parameter_registers_on_assignment():
    def run(T):
        nn = nn_(T)
        m = nn.Module()
        m.w = nn.Parameter(ten(T, [[1.0, 2.0]]))
        m.plain = ten(T, [5.0], rg=True)        # a plain tensor is not a parameter
        m.sub = nn.Linear(2, 3)
        m.b = nn.Parameter(ten(T, [0.5]))
        return dict(names=[n for n, _ in m.named_parameters()],
                    first_is_w=next(iter(m.parameters())) is m.w,
                    sd_keys=list(m.state_dict().keys()))

    j, t = both(run)
    assert t["names"] == ["w", "b", "sub.weight", "sub.bias"]
