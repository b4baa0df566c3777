"""Issue 8, class 3 (and the optimizer part of class 12): every array the compiled optimizer
step reads or writes has the parameter's shape and dtype, checked where the addresses are
cached, and the cache notices when any of those arrays is replaced. Against torch 2.13:
load_state_dict from another model or another dtype, p.data replaced after the state
exists, gradients assigned through .data, and optimizer-in-backward (step and zero_grad
from post-accumulate-grad hooks)."""
import numpy as np
import pytest
from conftest import both, to_np

torch = pytest.importorskip("torch")

OPTS = [("SGD", {"lr": 0.1, "momentum": 0.9}), ("Adam", {"lr": 0.05}),
        ("AdamW", {"lr": 0.05, "weight_decay": 0.1, "amsgrad": True})]
IDS = [n for n, _ in OPTS]


# -- optimizer-in-backward (class 12) -------------------------------------------------------

@pytest.mark.parametrize("name,kw", OPTS[:2], ids=IDS[:2])
def test_step_and_zero_grad_from_post_accumulate_grad_hooks(name, kw):
    """torch's optimizer-in-backward pattern, one optimizer per parameter, over a small MLP.
    A leaf's hook runs while the sweep is still going: the rows next to it (W.t(), the
    matmul) are not leaves and must not be taken for ones."""
    r = np.random.default_rng(8)
    w1, b1, w2, x = r.normal(size=(4, 3)), r.normal(size=4), r.normal(size=(2, 4)), r.normal(size=(5, 3))

    def run(T):
        ps = [T.tensor(a, requires_grad=True) for a in (w1, b1, w2)]
        opts = {p: getattr(T.optim, name)([p], **kw) for p in ps}

        def hook(p):
            opts[p].step()
            opts[p].zero_grad()

        for p in ps:
            p.register_post_accumulate_grad_hook(hook)
        out = []
        for _ in range(3):
            loss = (T.tanh(T.tensor(x) @ ps[0].t() + ps[1]) @ ps[2].t()).pow(2).sum()
            loss.backward()
            out.append([p.detach().clone() for p in ps] + [[p.grad for p in ps]])
        return out

    both(run)


# -- helpers -----------------------------------------------------------------------------

def _outcome(fn):
    """fn()'s result, or the (type, message) of what it raised: both libraries must agree."""
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        return (type(e).__name__, str(e))
    return None


def _snapshot(opt, ps):
    """The parameters and every state tensor, as numpy copies."""
    st = [{k: to_np(v) if hasattr(v, "detach") else v for k, v in opt.state[p].items()} for p in ps if p in opt.state]
    return [to_np(p) for p in ps], st


def _unchanged(before, after):
    (ps0, st0), (ps1, st1) = before, after
    assert len(st0) == len(st1)
    for a, b in zip(ps0, ps1):
        np.testing.assert_array_equal(a, b)
    for s0, s1 in zip(st0, st1):
        assert s0.keys() == s1.keys()
        for k in s0:
            np.testing.assert_array_equal(s0[k], s1[k])


def _grads(T, ps, s):
    for p in ps:
        n = int(np.prod(tuple(p.shape)))
        p.grad = T.tensor(np.sin(np.arange(n) * 0.7 + s).reshape(tuple(p.shape)), dtype=p.dtype)


def _train(T, opt, ps, steps, start=0):
    out = []
    for s in range(start, start + steps):
        _grads(T, ps, s)
        opt.step()
        out.append([p.detach().clone() for p in ps])
    return out


def _failed_step(T, opt, ps):
    """Step, expecting torch's error; returns it, and for jitgrad checks the step changed nothing
    (torch may have updated the parameters before the one that failed)."""
    before = _snapshot(opt, ps)
    err = _outcome(opt.step)
    if T is not torch:
        _unchanged(before, _snapshot(opt, ps))
    return err


# -- load_state_dict -------------------------------------------------------------------------

@pytest.mark.parametrize("name,kw", OPTS, ids=IDS)
def test_load_state_dict_from_float64_into_float32_casts_state(name, kw):
    """torch casts floating state to the parameter's dtype (not 'step'); before, float64
    state under a float32 parameter was read by the kernel as float32 (NaN parameters)."""
    r = np.random.default_rng(3)
    w, b = r.normal(size=(3, 4)), r.normal(size=4)

    def run(T):
        src = [T.tensor(a, requires_grad=True) for a in (w, b)]
        o64 = getattr(T.optim, name)(src, **kw)
        _train(T, o64, src, 3)
        dst = [T.tensor(a, dtype=T.float32, requires_grad=True) for a in (w, b)]
        o32 = getattr(T.optim, name)(dst, **kw)
        o32.load_state_dict(o64.state_dict())
        dtypes = [sorted((k, str(v.dtype).split(".")[-1]) for k, v in o32.state[p].items()
                         if k != "step") for p in dst]
        return dtypes, _train(T, o32, dst, 3, start=3)

    both(run, "float32")


@pytest.mark.parametrize("name,kw", OPTS, ids=IDS)
def test_load_state_dict_from_another_model_raises_at_step(name, kw):
    """State of another model's shapes loads (as in torch); the step raises torch's error
    instead of reading past the smaller arrays (heap corruption before), and changes nothing."""
    def run(T):
        big = [T.ones(2, dtype=T.float64, requires_grad=True), T.ones(5, dtype=T.float64, requires_grad=True)]
        ob = getattr(T.optim, name)(big, **kw)
        _train(T, ob, big, 2)
        small = [T.ones(2, dtype=T.float64, requires_grad=True), T.ones(3, dtype=T.float64, requires_grad=True)]
        opt = getattr(T.optim, name)(small, **kw)
        opt.load_state_dict(ob.state_dict())
        _grads(T, small, 5)
        return _failed_step(T, opt, small)

    j, _ = both(run)
    assert j[0] == "RuntimeError" and j[1].startswith("The size of tensor a (5) must match")


def test_load_state_dict_group_mismatch_raises_and_changes_nothing():
    """torch's ValueErrors; the first group's options were updated before the second group's
    size was compared."""
    def run(T):
        a, b, c = (T.ones(2, requires_grad=True) for _ in range(3))
        opt = T.optim.SGD([{"params": [a]}, {"params": [b]}], lr=0.1)
        other = T.optim.SGD([{"params": [a], "lr": 0.5}, {"params": [b, c]}], lr=0.1)
        one = T.optim.SGD([a, b], lr=0.1)
        return (_outcome(lambda: opt.load_state_dict(other.state_dict())),
                _outcome(lambda: opt.load_state_dict(one.state_dict())), [g["lr"] for g in opt.param_groups])

    both(run)


# -- arrays replaced after the state exists ------------------------------------------------------

@pytest.mark.parametrize("name,kw", OPTS, ids=IDS)
def test_param_data_replaced_by_larger_array(name, kw):
    """p.data grows after the state was made at the old size: torch's size error (a segfault
    before: the cached addresses were rebuilt but the state was read at the new size)."""
    def run(T):
        ps = [T.ones(3, dtype=T.float64, requires_grad=True), T.ones(4, dtype=T.float64, requires_grad=True)]
        opt = getattr(T.optim, name)(ps, **kw)
        _train(T, opt, ps, 2)
        ps[1].data = T.ones(4000, dtype=T.float64)
        ps[1].grad = None
        _grads(T, ps, 7)
        return _failed_step(T, opt, ps)

    j, _ = both(run)
    assert j == ("RuntimeError",
                 "The size of tensor a (4) must match the size of tensor b (4000) at non-singleton dimension 0")


@pytest.mark.parametrize("name,kw", OPTS, ids=IDS)
def test_param_data_replaced_by_float32_array(name, kw):
    """p.data becomes float32 under float64 state: torch's SGD computes in float64 and
    rounds; Adam's lerp_ raises. Before, the kernel read the float64 state as float32."""
    def run(T):
        ps = [T.tensor([0.5, -1.0, 2.0], dtype=T.float64, requires_grad=True)]
        opt = getattr(T.optim, name)(ps, **kw)
        _train(T, opt, ps, 2)
        ps[0].data = ps[0].data.float()
        ps[0].grad = None
        _grads(T, ps, 3)
        err = _failed_step(T, opt, ps) if name != "SGD" else _outcome(opt.step)
        return err, None if err else ps[0].detach().clone()  # torch's AdamW shrank it before raising

    both(run, "float32")


FAILS = {("larger", n) for n in IDS} | {("not-broadcast", n) for n in IDS} | {("float32", "Adam"), ("float32", "AdamW")}


# (a float32 gradient for SGD was already cast to the parameter's dtype, as torch computes it)
GRAD_CASES = [(g, n, kw) for g in ("larger", "float32", "broadcast", "not-broadcast") for n, kw in OPTS
              if (g, n) != ("float32", "SGD")]


@pytest.mark.parametrize("grad,name,kw", GRAD_CASES, ids=[f"{g}-{n}" for g, n, _ in GRAD_CASES])
def test_grad_data_replaced(name, kw, grad):
    """p.grad.data assigned past the setter's checks: torch's error, or (a gradient that
    broadcasts, another float dtype for SGD) torch's result. Never a read past the gradient."""
    def run(T):
        ps = [T.tensor([0.5, -1.0, 2.0, 0.25], dtype=T.float64, requires_grad=True)]
        opt = getattr(T.optim, name)(ps, **kw)
        _train(T, opt, ps, 2)
        _grads(T, ps, 3)
        g = ps[0].grad
        g.data = {"larger": T.ones(4000, dtype=T.float64), "float32": g.data.float(),
                  "broadcast": T.tensor([0.3], dtype=T.float64), "not-broadcast": T.ones(2, 4, dtype=T.float64)}[grad]
        err = _failed_step(T, opt, ps) if (grad, name) in FAILS else _outcome(opt.step)
        # after an error torch's AdamW has already shrunk the parameter; jitgrad changed nothing
        return err, None if err else ps[0].detach().clone()

    both(run)


def test_sgd_momentum_buffer_that_broadcasts_runs_as_torch():
    """A loaded (1,)-buffer with a (1,)-gradient under a (4,)-parameter: torch broadcasts in
    its in-place ops and runs; so does the numpy path (the kernel takes only exact fits)."""
    def run(T):
        src = [T.tensor([0.5], dtype=T.float64, requires_grad=True)]
        o1 = T.optim.SGD(src, lr=0.1, momentum=0.9)
        _train(T, o1, src, 2)
        p = T.tensor([0.5, -1.0, 2.0, 0.25], dtype=T.float64, requires_grad=True)
        opt = T.optim.SGD([p], lr=0.1, momentum=0.9)
        opt.load_state_dict(o1.state_dict())
        out = []
        for s in range(3):
            p.grad = T.zeros(4, dtype=T.float64)
            p.grad.data = T.tensor([0.1 * s + 0.2], dtype=T.float64)
            opt.step()
            out.append([p.detach().clone(), opt.state[p]["momentum_buffer"].clone()])
        return out

    both(run)
