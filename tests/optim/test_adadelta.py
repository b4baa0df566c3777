"""optim.Adadelta against torch.optim.Adadelta: parameters and state after several steps
(float32 and float64, weight decay, maximize, two groups, StepLR), a state dict round
trip, and torch's errors for bad hyperparameters and a state that does not fit."""
import numpy as np
import pytest

import jitgrad

torch = pytest.importorskip("torch")

CONFIGS = [{}, {"lr": 0.5, "rho": 0.8, "eps": 1e-4, "weight_decay": 0.1}, {"maximize": True}, {"rho": 0.0},
           {"rho": 1.0}]


def _run(T, dtype, kw, steps=5, scheduler=False):
    rng = np.random.default_rng(0)
    w0 = [rng.standard_normal(s).astype(dtype) for s in ((3, 4), (5,))]
    grads = [[rng.standard_normal(w.shape).astype(dtype) for w in w0] for _ in range(steps)]
    ps = [T.tensor(w, requires_grad=True) for w in w0]
    opt = T.optim.Adadelta([{"params": [ps[0]]}, {"params": [ps[1]], "lr": 0.3}], **kw)
    sched = T.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7) if scheduler else None
    for gs in grads:
        for p, g in zip(ps, gs):
            p.grad = T.tensor(g)
        opt.step()
        if sched:
            sched.step()
    state = opt.state_dict()["state"]
    return [p.detach().numpy() for p in ps] + [state[i][k].numpy() for i in (0, 1) for k in ("square_avg",
                                                                                              "acc_delta")]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("kw", CONFIGS)
def test_steps_match_torch(dtype, kw):
    tol = 1e-6 if dtype == "float32" else 1e-14
    for a, e in zip(_run(jitgrad, dtype, kw), _run(torch, dtype, kw)):
        np.testing.assert_allclose(a, e, rtol=tol, atol=tol)


def test_with_step_lr():
    for a, e in zip(_run(jitgrad, "float64", {}, scheduler=True), _run(torch, "float64", {}, scheduler=True)):
        np.testing.assert_allclose(a, e, rtol=1e-14, atol=1e-14)


def test_state_dict_round_trip_continues_as_torch():
    out = []
    for T in (torch, jitgrad):
        p = T.tensor(np.linspace(-1, 1, 6), requires_grad=True)
        opt = T.optim.Adadelta([p], lr=0.7)
        for k in range(3):
            p.grad = T.tensor(np.full(6, 0.1 * (k + 1)))
            opt.step()
        sd = opt.state_dict()
        steps = float(sd["state"][0]["step"])
        q = T.tensor(p.detach().numpy().copy(), requires_grad=True)
        opt2 = T.optim.Adadelta([q], lr=0.1)
        opt2.load_state_dict(sd)
        q.grad = T.tensor(np.full(6, -0.2))
        opt2.step()
        out.append((q.detach().numpy(), opt2.param_groups[0]["lr"], steps))
    np.testing.assert_allclose(out[1][0], out[0][0], rtol=1e-14)
    assert out[1][1] == out[0][1] == 0.7
    assert out[1][2] == out[0][2] == 3.0


@pytest.mark.parametrize("kw", [{"lr": -1.0}, {"rho": 1.5}, {"rho": -0.1}, {"eps": -1e-6}, {"weight_decay": -1}])
def test_bad_hyperparameters(kw):
    msgs = []
    for T in (torch, jitgrad):
        with pytest.raises(ValueError) as e:
            T.optim.Adadelta([T.zeros(2, requires_grad=True)], **kw)
        msgs.append(str(e.value))
    assert msgs[1] == msgs[0]


def test_state_that_does_not_fit_raises_and_changes_nothing():
    msgs = []
    for T in (torch, jitgrad):
        p = T.zeros(3, requires_grad=True)
        opt = T.optim.Adadelta([p])
        p.grad = T.ones(3)
        opt.step()
        q = T.zeros(4, requires_grad=True)
        opt2 = T.optim.Adadelta([q])
        opt2.load_state_dict(opt.state_dict())      # another model's state
        q.grad = T.ones(4)
        with pytest.raises(RuntimeError) as e:
            opt2.step()
        msgs.append(str(e.value))
        assert q.detach().numpy().tolist() == [0.0] * 4
    assert msgs[1] == msgs[0]
