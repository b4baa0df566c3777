"""Random draws in a compiled step: a replay draws again, from the generator's state at that
point of the call, exactly what the eager step draws, and leaves the generator where eager
leaves it. A random op the replay cannot draw again (an in-place fill) breaks the recording:
the step runs eagerly. Never the first call's numbers again.

The table runs each random op of jitgrad (test_the_table_covers_every_random_op keeps it
complete) in a step, compiled and eager, from the same seeds of the global generator and of
a jitgrad.Generator, over several calls (reseeded in the middle), and compares the values
and the generators' next numbers.
"""
import inspect

import numpy as np
import pytest
from compile_helpers import assert_plan, breaks, close, close_params, entries

import jitgrad
import jitgrad.nn.functional as F
from jitgrad.compiler.api import _Eager, _Entry
from jitgrad.func import vmap
from jitgrad.utils.checkpoint import checkpoint

f64 = jitgrad.float64


def _sig(x):
    return jitgrad.sigmoid(x)


# name -> (step(x, g): the step, with x a (3, 4) tensor and g a jitgrad.Generator;
#          True when the step is replayed, False when it breaks and runs eagerly)
CASES = {
    "rand": (lambda x, g: x + jitgrad.rand(3, 4, dtype=x.dtype), True),
    "randn": (lambda x, g: x + jitgrad.randn(3, 4, dtype=x.dtype), True),
    "rand generator=": (lambda x, g: x + jitgrad.rand(3, 4, dtype=x.dtype, generator=g), True),
    "randn generator=": (lambda x, g: x * jitgrad.randn((3, 4), generator=g, dtype=x.dtype), True),
    "rand_like": (lambda x, g: x + jitgrad.rand_like(x), True),
    "randn_like": (lambda x, g: x + jitgrad.randn_like(x), True),
    "randint": (lambda x, g: x + jitgrad.randint(0, 10, (3, 4)), True),
    "randint generator=": (lambda x, g: x + jitgrad.randint(-5, 5, (3, 4), generator=g), True),
    "randint high only": (lambda x, g: jitgrad.randint(7, (5,), generator=g), True),
    "randint_like": (lambda x, g: x + jitgrad.randint_like(x, 3, 9), True),
    "randperm": (lambda x, g: jitgrad.randperm(6), True),
    "randperm generator=": (lambda x, g: jitgrad.randperm(6, generator=g), True),
    "x[randperm(n)] shuffle": (lambda x, g: x[jitgrad.randperm(3)] * 2.0, True),
    "x[randperm(n, generator=)]": (lambda x, g: x[:, jitgrad.randperm(4, generator=g)] - x, True),
    "bernoulli": (lambda x, g: x * jitgrad.bernoulli(_sig(x)), True),
    "bernoulli generator=": (lambda x, g: jitgrad.bernoulli(_sig(x), generator=g), True),
    "bernoulli p float": (lambda x, g: jitgrad.bernoulli(x, 0.3, generator=g), True),
    "bernoulli p tensor": (lambda x, g: jitgrad.bernoulli(x, _sig(x) * 0.5), True),
    "Tensor.bernoulli": (lambda x, g: _sig(x).bernoulli(generator=g), True),
    "multinomial": (lambda x, g: jitgrad.multinomial(jitgrad.softmax(x, 1), 2), True),
    "multinomial replacement": (lambda x, g: jitgrad.multinomial(jitgrad.softmax(x, 1), 6, True, generator=g),
                                True),
    "multinomial 1-d": (lambda x, g: jitgrad.multinomial(_sig(x[0]), 3, generator=g), True),
    "Tensor.multinomial": (lambda x, g: _sig(x).multinomial(5, replacement=True), True),
    "normal(mean tensor, std)": (lambda x, g: jitgrad.normal(x, 0.5), True),
    "normal(mean, std tensor)": (lambda x, g: jitgrad.normal(1.0, _sig(x), generator=g), True),
    "normal(mean tensor, std tensor)": (lambda x, g: jitgrad.normal(x, _sig(x)), True),
    "normal(mean, std, size)": (lambda x, g: x + jitgrad.normal(0.0, 2.0, (3, 4), dtype=x.dtype, generator=g),
                                True),
    "dropout": (lambda x, g: F.dropout(x, 0.4), True),
    "nn.Dropout": (lambda x, g: jitgrad.nn.Dropout(0.5)(x), True),
    "manual_seed in the step": (lambda x, g: (jitgrad.manual_seed(3), x + jitgrad.rand_like(x))[1], True),
    "Generator.manual_seed in the step": (lambda x, g: x + jitgrad.randn(3, 4, dtype=x.dtype,
                                                                          generator=g.manual_seed(9)), True),
    "a Generator made in the step": (lambda x, g: x + jitgrad.rand(3, 4, dtype=x.dtype,
                                                                   generator=jitgrad.Generator()), True),
    "Generator get_state / set_state": (lambda x, g: _draw_twice(x, g), True),
    # the global generator's state saved and restored: vmap's "same" randomness over chunks
    "vmap same, in chunks": (lambda x, g: vmap(lambda r: r + jitgrad.rand(4, dtype=r.dtype), randomness="same",
                                               chunk_size=1)(x), True),
    "vmap different": (lambda x, g: vmap(lambda r: r * jitgrad.randn(4, dtype=r.dtype),
                                         randomness="different")(x), True),
    "checkpoint(dropout)": (lambda x, g: checkpoint(lambda y: F.dropout(y, 0.5) * 2.0, x, use_reentrant=False),
                            True),
    # in place: not replayed; the step runs eagerly (and so draws what eager draws)
    "uniform_": (lambda x, g: x + jitgrad.zeros_like(x).uniform_(-1, 1, generator=g), False),
    "normal_": (lambda x, g: x + jitgrad.zeros_like(x).normal_(generator=g), False),
    "exponential_": (lambda x, g: x + jitgrad.zeros_like(x).exponential_(generator=g), False),
    "bernoulli_": (lambda x, g: x + jitgrad.zeros_like(x).bernoulli_(0.5, generator=g), False),
    "random_": (lambda x, g: x + jitgrad.zeros_like(x).random_(0, 5, generator=g), False),
    "nn.init.uniform_": (lambda x, g: x + jitgrad.nn.init.uniform_(jitgrad.zeros_like(x)), False),
    "nn.init.normal_": (lambda x, g: x + jitgrad.nn.init.normal_(jitgrad.zeros_like(x)), False),
    "nn.init.kaiming_uniform_": (lambda x, g: x + jitgrad.nn.init.kaiming_uniform_(jitgrad.zeros_like(x)), False),
    "nn.init.kaiming_normal_": (lambda x, g: x + jitgrad.nn.init.kaiming_normal_(jitgrad.zeros_like(x)), False),
    "nn.init.xavier_uniform_": (lambda x, g: x + jitgrad.nn.init.xavier_uniform_(jitgrad.zeros_like(x)), False),
    "nn.init.xavier_normal_": (lambda x, g: x + jitgrad.nn.init.xavier_normal_(jitgrad.zeros_like(x)), False),
}


def _draw_twice(x, g):
    """The same numbers twice: the state is read before the first draw and restored after it."""
    state = g.get_state()
    a = jitgrad.rand(3, 4, dtype=x.dtype, generator=g)
    g.set_state(state)
    return x + a - jitgrad.rand(3, 4, dtype=x.dtype, generator=g) + g.get_state()[1:2].to(x.dtype)  # (its position)


def _calls(step, g, dtype, n=5, reseed_at=3):
    """n calls of step from seed 0 (global) and 1 (g), both reseeded before call `reseed_at`;
    the values each call returned, then the generators' next numbers."""
    jitgrad.manual_seed(0)
    g.manual_seed(1)
    got = []
    for k in range(n):
        if k == reseed_at:
            jitgrad.manual_seed(40)
            g.manual_seed(41)
        x = jitgrad.tensor(np.linspace(-1.0, 1.0, 12).reshape(3, 4) * (k + 1) / 3, dtype=dtype)
        got.append(np.array(step(x, g).detach().numpy(), copy=True))
    return got, jitgrad.rand(3, dtype=f64).numpy().tolist(), g.random32(3).tolist()


@pytest.mark.parametrize("name", list(CASES))
def test_a_compiled_step_draws_what_the_eager_step_draws(name):
    step, replayed = CASES[name]
    for dtype in (jitgrad.float64, jitgrad.float32):
        g = jitgrad.Generator()
        want, want_global, want_g = _calls(step, g, dtype)
        c = jitgrad.compile(step)
        got, got_global, got_g = _calls(c, g, dtype)
        # (the draws are the same numbers; ops on them round as the compiled kernels do)
        close(got, want, str(dtype).split(".")[-1], f"{name}, {dtype}")
        assert got_global == want_global, f"{name}, {dtype}: the global generator moved otherwise"
        assert got_g == want_g, f"{name}, {dtype}: the Generator moved otherwise"
        if replayed:
            assert_plan(c)
        else:
            assert [type(e) for e in entries(c)] == [_Eager], f"{name}: {entries(c)}"
    if name not in ("manual_seed in the step", "Generator.manual_seed in the step", "a Generator made in the step",
                    "Generator get_state / set_state"):
        assert not all(np.array_equal(got[0], a) for a in got[1:3]), f"{name}: the same numbers every call"


def test_the_table_covers_every_random_op():
    """Every public function, Tensor method and nn.init initialiser that takes a generator=
    or draws is in the table, so that a new random op gets its replay checked."""
    drawing = {"rand", "randn", "rand_like", "randn_like", "randint", "randint_like", "randperm", "bernoulli",
               "multinomial", "normal", "uniform_", "normal_", "exponential_", "bernoulli_", "random_", "dropout"}
    found = set()
    for owner in (jitgrad, jitgrad.Tensor, F, jitgrad.nn.init):
        for name in dir(owner):
            fn = getattr(owner, name, None)
            if not callable(fn) or isinstance(fn, type):
                continue
            try:
                params = inspect.signature(fn).parameters
            except (TypeError, ValueError):
                continue
            if "generator" in params or name in drawing or (owner is jitgrad.nn.init and name.endswith("_")
                                                            and name not in ("constant_", "zeros_", "ones_",
                                                                             "default_layer_init_")):
                found.add(name)
    covered = {name.split(" ")[0].split(".")[-1].split("(")[0] for name in CASES}
    assert found - covered == set(), f"random ops the table does not run: {sorted(found - covered)}"


def test_a_training_step_with_random_ops_trains_as_eager():
    """Shuffle, noise, a Bernoulli mask and dropout in a step with backward and SGD: the
    losses and weights over the calls are eager's."""
    def make():
        jitgrad.manual_seed(11)
        lin = jitgrad.nn.Linear(4, 4).double()
        return lin, jitgrad.optim.SGD(lin.parameters(), lr=0.1)

    def step_of(lin, opt, g):
        def step(x):
            h = lin(x[jitgrad.randperm(x.shape[0], generator=g)] + 0.1 * jitgrad.randn_like(x))
            h = F.dropout(h * jitgrad.bernoulli(_sig(h), generator=g), 0.3)
            loss = (jitgrad.normal(h, 0.1) ** 2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss
        return step
    runs = []
    for compiled in (False, True):
        lin, opt = make()
        g = jitgrad.Generator().manual_seed(5)
        step = step_of(lin, opt, g)
        f = jitgrad.compile(step) if compiled else step
        jitgrad.manual_seed(1)
        losses = [f(jitgrad.tensor(np.linspace(-1, 1, 20).reshape(5, 4) * (k + 1), dtype=f64)).item()
                  for k in range(4)]
        runs.append((losses, lin.weight.detach().numpy().copy(), g.random32(1)[0], f))
    (le, we, ge, _), (lc, wc, gc, c) = runs
    np.testing.assert_allclose(lc, le, rtol=1e-12)
    np.testing.assert_allclose(wc, we, rtol=1e-12)
    assert ge == gc
    assert_plan(c)
    assert len(set(le)) == 4


def test_a_draw_checks_the_values_of_each_call():
    """bernoulli's probabilities are checked at every replay, as eager checks them."""
    c = jitgrad.compile(lambda p: jitgrad.bernoulli(p))
    c(jitgrad.tensor([0.2, 0.9], dtype=f64))
    c(jitgrad.tensor([0.2, 0.9], dtype=f64))
    assert type(entries(c)[0]) is _Entry
    with pytest.raises(RuntimeError, match="Expected p_in >= 0 && p_in <= 1"):
        c(jitgrad.tensor([0.2, 1.5], dtype=f64))


def test_a_random_tensor_requiring_grad_made_in_the_step_breaks():
    """A new leaf at every call cannot be replayed: the step runs eagerly."""
    def step(x):
        w = jitgrad.randn(3, 4, dtype=f64, requires_grad=True)
        (w * x).sum().backward()
        return w.grad * w.detach()
    c = jitgrad.compile(step)
    x = jitgrad.ones(3, 4, dtype=f64)
    jitgrad.manual_seed(2)
    got = [c(x).numpy() for _ in range(3)]
    jitgrad.manual_seed(2)
    want = [step(x).numpy() for _ in range(3)]
    np.testing.assert_array_equal(got, want)
    assert breaks(c)


def test_a_compiled_module_with_dropout_draws_a_new_mask_per_call():
    """compile(model) (graph mode, backward outside): each call's dropout mask is the one
    eager draws, and training follows eager's."""
    def make():
        jitgrad.manual_seed(3)
        return jitgrad.nn.Sequential(jitgrad.nn.Linear(4, 5), jitgrad.nn.Dropout(0.4), jitgrad.nn.Tanh()).double()
    runs = []
    for compiled in (False, True):
        m = make()
        f = jitgrad.compile(m) if compiled else m
        opt = jitgrad.optim.SGD(m.parameters(), lr=0.1)
        jitgrad.manual_seed(9)
        outs = []
        for k in range(4):
            out = f(jitgrad.tensor(np.linspace(-1, 1, 12).reshape(3, 4) * (k + 1), dtype=f64))
            outs.append(out.detach().numpy().copy())
            (out * out).sum().backward()
            opt.step()
            opt.zero_grad()
        runs.append((m, f, outs))
    (me, _, oe), (mc, fc, oc) = runs
    close(oc, oe, msg="outputs")
    close_params(list(mc.parameters()), list(me.parameters()))
    assert_plan(fc._compiled)
    assert not np.array_equal(oe[1] == 0, oe[2] == 0)
