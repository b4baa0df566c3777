"""optim.RMSprop against torch.optim.RMSprop (torch 2.13): parameter trajectories in float64
(to 1e-10) and float32, every option (alpha, eps, weight_decay, momentum, centered,
maximize), state dicts, errors. The compiled update runs in the normal pass and numpy's in
the NUMBA_DISABLE_JIT one; both are checked here, and numpy's also for arrays the kernel
does not take (a strided parameter)."""
import copy

import numpy as np
import pytest
from conftest import F_, both, err_of, make_mlp, mlp_arrays, optim_, ten, to_np

import jitgrad

torch = pytest.importorskip("torch")

CONFIGS = {
    "default": dict(),
    "lr_alpha": dict(lr=0.03, alpha=0.9),
    "eps": dict(lr=0.01, eps=1e-3),
    "weight_decay": dict(lr=0.01, weight_decay=0.1),
    "momentum": dict(lr=0.01, momentum=0.9),
    "centered": dict(lr=0.01, centered=True),
    "centered_momentum_wd": dict(lr=0.005, centered=True, momentum=0.5, weight_decay=0.01),
    # 1 - alpha >= 0.5: torch's lerp_ takes its other form (end - (end - self) * (1 - w))
    "centered_small_alpha": dict(lr=0.01, alpha=0.3, centered=True),
    "maximize": dict(lr=0.01, maximize=True, momentum=0.3),
}


def data(dtype):
    r = np.random.default_rng(3)
    return r.normal(size=(16, 4)).astype(dtype), r.normal(size=(16, 2)).astype(dtype)


def trajectory(T, kw, dtype="float64", steps=15):
    npd = np.float32 if dtype == "float32" else np.float64
    xa, ya = data(npd)
    model = make_mlp(T, mlp_arrays(dtype=npd), dtype)
    opt = optim_(T).RMSprop(model.parameters(), **kw)
    x, y = ten(T, xa, dtype), ten(T, ya, dtype)
    losses, traj = [], []
    for _ in range(steps):
        opt.zero_grad()
        loss = F_(T).mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach().clone())
        traj.append([p.detach().clone() for p in model.parameters()])
    return dict(losses=losses, traj=traj)


@pytest.mark.parametrize("config", list(CONFIGS))
def test_rmsprop_trajectory_float64(config):
    j, t = both(lambda T: trajectory(T, CONFIGS[config]))
    first, last = float(to_np(t["losses"][0])), float(to_np(t["losses"][-1]))
    assert last > first if CONFIGS[config].get("maximize") else last < first  # the run really trains


@pytest.mark.parametrize("config", ["default", "momentum", "centered_momentum_wd"])
def test_rmsprop_trajectory_float32(config):
    # (not centered_small_alpha: its variance estimate nears 0, and 1 / sqrt of it magnifies
    # the float32 roundings in which the two libraries' forward passes differ past the tolerance)
    both(lambda T: trajectory(T, CONFIGS[config], dtype="float32"), dtype="float32")


def test_rmsprop_state_and_state_dict():
    def run(T):
        out = trajectory(T, dict(lr=0.01, centered=True, momentum=0.9), steps=3)
        model = make_mlp(T, mlp_arrays())
        opt = T.optim.RMSprop(model.parameters(), lr=0.01, centered=True, momentum=0.9)
        F_(T).mse_loss(model(ten(T, data(np.float64)[0])), ten(T, data(np.float64)[1])).backward()
        opt.step()
        sd = opt.state_dict()
        state0 = sd["state"][0]
        group = {k: v for k, v in sd["param_groups"][0].items() if k not in ("params", "capturable", "foreach",
                                                                             "differentiable")}
        return (out["losses"], sorted(state0), float(state0["step"]), state0["square_avg"], state0["grad_avg"],
                state0["momentum_buffer"], group)
    both(run)


def test_rmsprop_resumes_from_a_loaded_state_dict():
    """Three steps, a state dict loaded into a new optimizer over a copy, three more: the
    same parameters as six steps in one go, and as torch's."""
    xa, ya = data(np.float64)

    def steps(T, model, opt, n):
        for _ in range(n):
            opt.zero_grad()
            F_(T).mse_loss(model(ten(T, xa)), ten(T, ya)).backward()
            opt.step()

    def run(T):
        kw = dict(lr=0.01, momentum=0.5, centered=True)
        a = make_mlp(T, mlp_arrays())
        opt_a = T.optim.RMSprop(a.parameters(), **kw)
        steps(T, a, opt_a, 3)
        b = make_mlp(T, {k: to_np(v) for k, v in a.state_dict().items()})
        opt_b = T.optim.RMSprop(b.parameters(), **kw)
        opt_b.load_state_dict(copy.deepcopy(opt_a.state_dict()))  # torch's shares the state tensors
        steps(T, a, opt_a, 3)
        steps(T, b, opt_b, 3)
        return [p.detach().clone() for p in a.parameters()], [p.detach().clone() for p in b.parameters()]
    j, t = both(run)
    for x, y in zip(*j):
        np.testing.assert_array_equal(to_np(x), to_np(y))


def test_rmsprop_on_a_strided_parameter():
    """A transposed parameter is an array the compiled kernel does not take: numpy updates it."""
    r = np.random.default_rng(1)
    wa, ga = r.normal(size=(4, 3)), r.normal(size=(3, 4))

    def run(T):
        w = ten(T, wa).t().requires_grad_()
        opt = T.optim.RMSprop([w], lr=0.1, centered=True, momentum=0.2)
        out = []
        for i in range(3):
            w.grad = ten(T, ga * (i + 1))
            opt.step()
            out.append(w.detach().clone())
        return out
    both(run)


BAD_ARGS = [dict(lr=-1.0), dict(eps=-1e-3), dict(momentum=-0.1), dict(weight_decay=-1.0), dict(alpha=-0.5)]


@pytest.mark.parametrize("kw", BAD_ARGS, ids=[next(iter(k)) for k in BAD_ARGS])
def test_rmsprop_argument_errors_are_torchs(kw):
    def call(T):
        T.optim.RMSprop([T.zeros(2, requires_grad=True)], **kw)
    assert err_of(call, jitgrad) == err_of(call, torch)


def test_rmsprop_gradient_that_does_not_fit_raises_torchs_error_and_changes_nothing():
    """torch's error; unlike torch, which has updated the parameters before the one that
    fails, jitgrad checks them all first (optim/_checks.py) and changes none."""
    def run(T):
        v = T.ones(2, requires_grad=True)
        w = T.ones(3, requires_grad=True)
        opt = T.optim.RMSprop([v, w], lr=0.1, centered=True)
        v.grad, w.grad = T.ones(2), T.ones(3)
        opt.step()
        before = v.detach().clone()
        w.grad.data = T.ones(4)
        return err_of(opt.step), before, v
    j, t = run(jitgrad), run(torch)
    assert j[0] == t[0]
    np.testing.assert_array_equal(to_np(j[1]), to_np(j[2]))


def test_differentiable_rmsprop_is_refused():
    with pytest.raises(NotImplementedError, match="differentiable=True"):
        jitgrad.optim.RMSprop([jitgrad.zeros(2, requires_grad=True)], differentiable=True)


def test_rmsprop_repr_lists_its_options():
    opt = jitgrad.optim.RMSprop([jitgrad.zeros(2, requires_grad=True)], lr=0.5)
    text = repr(opt)
    assert text.startswith("RMSprop (") and "    alpha: 0.99" in text and "    lr: 0.5" in text
