"""jitgrad.optim (SGD, Adam, AdamW): parameter trajectories, state and API against torch 2.13.

Every comparison test runs the same code with both libraries (``T`` is ``jitgrad`` or ``torch``)
from identical initial weights (copied in from numpy arrays) and compares values, gradients and
parameter trajectories (float64 to 1e-10 unless stated, float32 with float32 tolerance).  Tests of
random behaviour (initialisation bounds, dropout masks) run once per library, so torch also has to
pass them.
"""

import numpy as np
import pytest
from conftest import F_, both, make_mlp, mlp_arrays, optim_, snap, ten, to_np

torch = pytest.importorskip("torch")



# ============================================================================= 7. optim

def mlp_data(dtype=np.float64):
    r = np.random.default_rng(21)
    return r.normal(size=(16, 4)).astype(dtype), r.normal(size=(16, 2)).astype(dtype)


def raw_mlp(T, arrays, dtype):
    """The 4-8-2 MLP as four leaf tensors (so the optimizer tests don't depend on nn)."""
    return [ten(T, arrays[k], dtype, rg=True) for k in ("0.weight", "0.bias", "2.weight", "2.bias")]


def raw_forward(T, params, x):
    w1, b1, w2, b2 = params
    h = (x @ w1.t() + b1).relu()
    return h @ w2.t() + b2


OPT_CONFIGS = {
    "sgd": ("SGD", dict(lr=0.1)),
    "sgd_momentum": ("SGD", dict(lr=0.1, momentum=0.9)),
    "sgd_nesterov": ("SGD", dict(lr=0.1, momentum=0.9, nesterov=True)),
    "sgd_weight_decay": ("SGD", dict(lr=0.1, weight_decay=0.01)),
    "sgd_momentum_weight_decay": ("SGD", dict(lr=0.05, momentum=0.9, weight_decay=0.05)),
    "adam": ("Adam", dict(lr=0.01)),
    "adam_default_lr": ("Adam", dict()),
    "adam_weight_decay": ("Adam", dict(lr=0.01, weight_decay=0.01)),
    "adam_betas_eps": ("Adam", dict(lr=0.02, betas=(0.8, 0.95), eps=1e-6)),
    "adamw": ("AdamW", dict(lr=0.01, weight_decay=0.01)),
    "adamw_default_wd": ("AdamW", dict(lr=0.01)),
    "adamw_strong_wd": ("AdamW", dict(lr=0.05, weight_decay=0.5)),
}


def trajectory(T, name, kw, dtype="float64", steps=20):
    xa, ya = mlp_data(np.float32 if dtype == "float32" else np.float64)
    params = raw_mlp(T, mlp_arrays(dtype=np.float32 if dtype == "float32" else np.float64), dtype)
    opt = getattr(optim_(T), name)(params, **kw)
    x, y = ten(T, xa, dtype), ten(T, ya, dtype)
    traj, losses = [], []
    for _ in range(steps):
        opt.zero_grad()
        loss = ((raw_forward(T, params, x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.detach().clone())
        traj.append([p.detach().clone() for p in params])
    return dict(traj=traj, losses=losses,
                leaves=[bool(p.is_leaf) and bool(p.requires_grad) and p.grad_fn is None for p in params])


@pytest.mark.parametrize("config", list(OPT_CONFIGS))
def test_optimizer_trajectory_float64(config):
    name, kw = OPT_CONFIGS[config]
    j, t = both(lambda T: trajectory(T, name, kw))
    # the run really trains
    assert float(to_np(t["losses"][-1])) < float(to_np(t["losses"][0]))


@pytest.mark.parametrize("config", ["sgd_momentum", "adam", "adamw"])
def test_optimizer_trajectory_float32(config):
    name, kw = OPT_CONFIGS[config]
    both(lambda T: trajectory(T, name, kw, dtype="float32"), dtype="float32")


@pytest.mark.parametrize("config", ["sgd_momentum", "adam", "adamw"])
def test_optimizer_with_module_parameters(config):
    """The same training with nn.Sequential and model.parameters()."""
    name, kw = OPT_CONFIGS[config]
    xa, ya = mlp_data()

    def run(T):
        m = make_mlp(T, mlp_arrays())
        opt = getattr(optim_(T), name)(m.parameters(), **kw)
        x, y = ten(T, xa), ten(T, ya)
        traj = []
        for _ in range(10):
            opt.zero_grad()
            F_(T).mse_loss(m(x), y).backward()
            opt.step()
            traj.append([p.detach().clone() for p in m.parameters()])
        return traj

    both(run)


@pytest.mark.parametrize("opt_name", ["SGD", "Adam", "AdamW"])
@pytest.mark.parametrize("set_to_none", [None, True, False])
def test_optimizer_zero_grad(opt_name, set_to_none):
    xa, ya = mlp_data()

    def run(T):
        params = raw_mlp(T, mlp_arrays(), "float64")
        opt = getattr(optim_(T), opt_name)(params, lr=0.01)
        ((raw_forward(T, params, ten(T, xa)) - ten(T, ya)) ** 2).mean().backward()
        before = [snap(p.grad) for p in params]
        if set_to_none is None:
            opt.zero_grad()
        else:
            opt.zero_grad(set_to_none=set_to_none)
        return dict(before=before, after=[snap(p.grad) for p in params])

    j, t = both(run)
    if set_to_none is False:
        assert all(g is not None and not to_np(g).any() for g in t["after"])
    else:
        assert all(g is None for g in t["after"])


@pytest.mark.parametrize("opt_name", ["SGD", "Adam", "AdamW"])
def test_optimizer_param_groups(opt_name):
    def run(T):
        params = raw_mlp(T, mlp_arrays(), "float64")
        opt = getattr(optim_(T), opt_name)(params, lr=0.03)
        pg = opt.param_groups
        g = pg[0]
        return dict(is_list=isinstance(pg, list), n=len(pg), is_dict=isinstance(g, dict),
                    has_keys="params" in g and "lr" in g, lr=g["lr"],
                    params_are_given=isinstance(g["params"], list) and len(g["params"]) == 4
                    and all(a is b for a, b in zip(g["params"], params)))

    j, t = both(run)
    assert t["lr"] == 0.03


@pytest.mark.parametrize("config", ["sgd_momentum", "adam"])
def test_optimizer_changing_lr_takes_effect(config):
    name, kw = OPT_CONFIGS[config]
    xa, ya = mlp_data()

    def run(T):
        params = raw_mlp(T, mlp_arrays(), "float64")
        opt = getattr(optim_(T), name)(params, **kw)
        x, y = ten(T, xa), ten(T, ya)
        traj = []
        for step in range(12):
            if step == 4:
                opt.param_groups[0]["lr"] = 0.5 * kw["lr"]
            if step == 8:
                for group in opt.param_groups:
                    group["lr"] = 0.0
            opt.zero_grad()
            ((raw_forward(T, params, x) - y) ** 2).mean().backward()
            opt.step()
            traj.append([p.detach().clone() for p in params])
        return traj

    j, t = both(run)
    if config == "sgd_momentum":
        # lr 0 freezes SGD (the update is lr * buf)
        for a, b in zip(j[-1], j[8]):
            np.testing.assert_array_equal(to_np(a), to_np(b))


@pytest.mark.parametrize("opt_name", ["Adam", "AdamW", "SGD"])
def test_optimizer_state_dict_round_trip(opt_name):
    """A fresh optimizer loaded from another's state_dict continues exactly as the original would have.

    (torch's load_state_dict may share the state tensors with the source optimizer, so the source is
    not stepped after the hand-over; an uninterrupted reference run gives the expected trajectory.)
    """
    kw = dict(lr=0.01, weight_decay=0.01) if opt_name != "SGD" else dict(lr=0.1, momentum=0.9)
    xa, ya = mlp_data()

    def run(T):
        optim = optim_(T)
        x, y = ten(T, xa), ten(T, ya)

        def step(params, opt):
            opt.zero_grad()
            ((raw_forward(T, params, x) - y) ** 2).mean().backward()
            opt.step()
            return [p.detach().clone() for p in params]

        # reference: 10 uninterrupted steps
        pr = raw_mlp(T, mlp_arrays(), "float64")
        opt_r = getattr(optim, opt_name)(pr, **kw)
        ref = [step(pr, opt_r) for _ in range(10)]
        # 5 steps, then hand over to a fresh optimizer (other lr) on a copy of the weights
        pa = raw_mlp(T, mlp_arrays(), "float64")
        opt_a = getattr(optim, opt_name)(pa, **kw)
        for _ in range(5):
            step(pa, opt_a)
        pb = [ten(T, to_np(p), rg=True) for p in pa]
        opt_b = getattr(optim, opt_name)(pb, lr=0.5)
        opt_b.load_state_dict(opt_a.state_dict())
        lr_b = opt_b.param_groups[0]["lr"]
        params_b_kept = all(a is b for a, b in zip(opt_b.param_groups[0]["params"], pb))
        cont = [step(pb, opt_b) for _ in range(5)]
        return dict(ref=ref[5:], cont=cont, lr_b=lr_b, params_b_kept=params_b_kept)

    j, t = both(run)
    assert t["lr_b"] == kw["lr"] and t["params_b_kept"] is True
    for ra, rb in zip(j["ref"], j["cont"]):
        for a, b in zip(ra, rb):
            np.testing.assert_allclose(to_np(b), to_np(a), rtol=1e-13, atol=1e-15)


def test_adam_state_dict_structure():
    xa, ya = mlp_data()

    def run(T):
        params = raw_mlp(T, mlp_arrays(), "float64")
        opt = optim_(T).Adam(params, lr=0.01)
        for _ in range(3):
            opt.zero_grad()
            ((raw_forward(T, params, ten(T, xa)) - ten(T, ya)) ** 2).mean().backward()
            opt.step()
        sd = opt.state_dict()
        st = sd["state"]
        return dict(top=sorted(sd.keys()), state_keys=sorted(st.keys()),
                    per_param=[sorted(st[k].keys()) for k in sorted(st)],
                    steps=[float(st[k]["step"]) for k in sorted(st)],
                    exp_avg=[st[k]["exp_avg"] for k in sorted(st)],
                    exp_avg_sq=[st[k]["exp_avg_sq"] for k in sorted(st)],
                    group_params=sd["param_groups"][0]["params"], group_lr=sd["param_groups"][0]["lr"])

    j, t = both(run)
    assert t["state_keys"] == [0, 1, 2, 3] and t["steps"] == [3.0] * 4
