"""Argument validation of every optimizer (and the LR schedulers over them), against torch.

Each case builds an optimizer (or adds a parameter group) with one bad argument: a negative
learning rate, epsilon, weight decay, momentum, alpha or beta, a non-leaf or non-tensor
parameter, params in a set, a parameter in two groups. jitgrad must raise torch's exception
type with a message that starts like torch's, or accept what torch accepts (see
tests/nn/test_nn_validation.py for the comparison)."""
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from oracle_errors import same_error  # noqa: E402

import jitgrad  # noqa: E402


def ps(T, n=2):
    return [T.ones(2, requires_grad=True) for _ in range(n)]


OPTIMIZERS = ("SGD", "Adam", "AdamW", "RMSprop", "Adadelta")
BAD_HYPERPARAMETERS = {
    "SGD": [dict(lr=-0.1), dict(momentum=-1.0), dict(weight_decay=-1e-3), dict(nesterov=True),
            dict(nesterov=True, momentum=0.9, dampening=0.1), dict(lr=float("nan")), dict(lr=0.0, momentum=0.0)],
    "Adam": [dict(lr=-0.1), dict(eps=-1e-8), dict(betas=(1.0, 0.999)), dict(betas=(-0.1, 0.999)),
             dict(betas=(0.9, 1.0)), dict(betas=(0.9, -1.0)), dict(weight_decay=-1.0), dict(lr=float("nan")),
             dict(lr=-1.0, eps=-1.0), dict(eps=0.0, weight_decay=0.0)],
    "AdamW": [dict(lr=-0.1), dict(eps=-1e-8), dict(betas=(1.0, 0.999)), dict(betas=(0.9, 2.0)),
              dict(weight_decay=-1.0), dict(weight_decay=0.0)],
    "RMSprop": [dict(lr=-0.1), dict(eps=-1e-8), dict(momentum=-0.5), dict(weight_decay=-1.0), dict(alpha=-0.9),
                dict(alpha=0.0, momentum=0.0)],
    "Adadelta": [dict(lr=-0.1), dict(rho=1.5), dict(rho=-0.1), dict(eps=-1e-6), dict(weight_decay=-1.0),
                 dict(rho=0.0, eps=0.0)],
}
HYPER = {f"{name}({', '.join(f'{k}={v}' for k, v in kw.items())})": (name, kw)
         for name, kws in BAD_HYPERPARAMETERS.items() for kw in kws}


@pytest.mark.parametrize("case", list(HYPER))
def test_hyperparameters_checked_as_torch(case):
    name, kw = HYPER[case]
    same_error(lambda T: getattr(T.optim, name)(ps(T), **kw))


def _non_leaf(T):
    return (T.ones(2, requires_grad=True) * 2,)


def _retained_non_leaf(T):
    t = T.ones(2, requires_grad=True) * 2
    t.retain_grad()
    return (t,)


PARAMS = {
    "a tensor": lambda T: T.ones(2, requires_grad=True),
    "an empty list": lambda T: [],
    "a non-leaf": lambda T: list(_non_leaf(T)),
    "a non-leaf that retains its grad": lambda T: list(_retained_non_leaf(T)),
    "a non-tensor": lambda T: [T.ones(2, requires_grad=True), 3.0],
    "a set": lambda T: {T.ones(2, requires_grad=True)},
    "a group with a set": lambda T: [{"params": {T.ones(2, requires_grad=True)}}],
    "a group without requires_grad": lambda T: [T.ones(2)],
    "a group with a tensor": lambda T: [{"params": T.ones(2, requires_grad=True)}],
    "one param in two groups": lambda T: (lambda p: [{"params": [p]}, {"params": [p, T.ones(1)]}])(
        T.ones(2, requires_grad=True)),
    "a group's own negative lr": lambda T: [{"params": ps(T), "lr": -1.0}],
    "a generator": lambda T: (p for p in ps(T)),
    "named parameters": lambda T: [("a", T.ones(2, requires_grad=True)), ("b", T.ones(1, requires_grad=True))],
    "some named parameters": lambda T: [("a", T.ones(2, requires_grad=True)), T.ones(1, requires_grad=True)],
    "named and unnamed groups": lambda T: [{"params": [("a", T.ones(2, requires_grad=True))]},
                                           {"params": [T.ones(1, requires_grad=True)]}],
}
CONSTRUCT = {f"{opt} over {what}": (opt, what) for opt in OPTIMIZERS for what in PARAMS}


@pytest.mark.parametrize("case", list(CONSTRUCT))
def test_params_checked_as_torch(case):
    opt, what = CONSTRUCT[case]
    same_error(lambda T: getattr(T.optim, opt)(PARAMS[what](T), lr=0.1))


def _add_group(T, group):
    p = ps(T)
    T.optim.SGD(p, lr=0.1).add_param_group(group(T, p))


ADD = {
    "a list": lambda T, p: [T.ones(2, requires_grad=True)],
    "a group repeating a param": lambda T, p: {"params": [p[0]]},
    "a group with a non-leaf": lambda T, p: {"params": list(_non_leaf(T))},
    "a group with a set": lambda T, p: {"params": {T.ones(2, requires_grad=True)}},
    "a group with a non-tensor": lambda T, p: {"params": ["w"]},
    "a new group": lambda T, p: {"params": [T.ones(2, requires_grad=True)], "momentum": 0.5},
}


@pytest.mark.parametrize("case", list(ADD))
def test_add_param_group_checked_as_torch(case):
    same_error(lambda T: _add_group(T, ADD[case]))


def test_duplicate_params_in_a_group_warn_as_torch():
    for T in (torch, jitgrad):
        p = T.ones(2, requires_grad=True)
        with pytest.warns(UserWarning, match="^optimizer contains a parameter group with duplicate parameters"):
            T.optim.SGD([p, p], lr=0.1)


def test_a_param_in_two_groups_is_not_updated_twice():
    """Was: accepted, and each step moved the parameter by 2 lr grad."""
    p = jitgrad.ones(1, requires_grad=True)
    with pytest.raises(ValueError, match="^some parameters appear in more than one parameter group$"):
        jitgrad.optim.SGD([{"params": [p]}, {"params": [p]}], lr=0.1)
    opt = jitgrad.optim.SGD([p], lr=0.1)
    with pytest.raises(ValueError, match="^some parameters appear in more than one parameter group$"):
        opt.add_param_group({"params": [p]})
    assert len(opt.param_groups) == 1


def test_sgd_default_lr_is_torchs():
    for T in (torch, jitgrad):
        assert T.optim.SGD(ps(T), momentum=0.9).param_groups[0]["lr"] == 1e-3


SCHEDULERS = {
    "StepLR over a non-optimizer": lambda T: T.optim.lr_scheduler.StepLR(3, step_size=1),
    "CosineAnnealingLR over a non-optimizer": lambda T: T.optim.lr_scheduler.CosineAnnealingLR([], T_max=2),
    "StepLR resumed without initial_lr": lambda T: T.optim.lr_scheduler.StepLR(T.optim.SGD(ps(T)), step_size=1,
                                                                              last_epoch=3),
    "StepLR(step_size=0)": lambda T: T.optim.lr_scheduler.StepLR(T.optim.SGD(ps(T)), step_size=0).step(),
    "CosineAnnealingLR(T_max=0)": lambda T: T.optim.lr_scheduler.CosineAnnealingLR(T.optim.SGD(ps(T)), T_max=0).step(),
}


@pytest.mark.parametrize("case", list(SCHEDULERS))
def test_schedulers_checked_as_torch(case):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        same_error(SCHEDULERS[case])


def _named_step(T):
    T.manual_seed(0)
    m = T.nn.Linear(3, 2).double()
    with T.no_grad():
        m.weight.copy_(T.arange(6.0, dtype=T.float64).reshape(2, 3) / 10)
        m.bias.fill_(0.5)
    opt = T.optim.Adam(m.named_parameters(), lr=0.1)
    m(T.ones(4, 3, dtype=T.float64)).pow(2).sum().backward()
    opt.step()
    sd = opt.state_dict()
    return m.weight.detach().numpy().tolist(), sd["param_groups"][0]["param_names"], sorted(sd["state"])


def test_named_parameters_as_torch():
    """torch 2.x optimizers take model.named_parameters() and keep the names in the state dict."""
    (jw, jnames, jstate), (tw, tnames, tstate) = _named_step(jitgrad), _named_step(torch)
    np.testing.assert_allclose(jw, tw, rtol=1e-6, atol=1e-12)
    assert (jnames, jstate) == (tnames, tstate) == (["weight", "bias"], [0, 1])
