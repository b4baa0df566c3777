"""jitgrad.compile never replays what eager would not compute: what a step reaches by name
(globals, closure cells, modules, optimizers, object attributes) changing between calls.

Each test runs one program three ways, each in a namespace of its own (`World`): compiled
jitgrad, eager jitgrad and PyTorch (the oracle: float64, rtol 1e-6). Some steps run, then
something the step reads is changed in all three, then more steps: the compiled one must
agree with the others at every step (the outputs, the parameters and their .grad), and it
must replay again after recording the change once (`recordings`).
"""
import numpy as np
import pytest
import torch
from compile_helpers import close

import jitgrad

LIBS = (("compiled", jitgrad), ("eager", jitgrad), ("torch", torch))
RTOL_TORCH = 1e-6


def fill(T, module, seed):
    """Float64 parameters drawn from `seed`, the same for jitgrad and torch."""
    rng = np.random.default_rng(seed)
    with T.no_grad():
        for _, p in sorted(module.named_parameters()):
            p.copy_(T.tensor(rng.uniform(-1, 1, tuple(p.shape))))
    return module


def mlp(T, seed=0):
    nn = T.nn
    return fill(T, nn.Sequential(nn.Linear(3, 5, dtype=T.float64), nn.Tanh(), nn.Linear(5, 2, dtype=T.float64)), seed)


class World:
    """`src` run with jitgrad (compiled and eager) and torch. setup(T, ns) fills each
    namespace first; `step` is then the function src defines, or, compile_model=True, src's
    step is left eager and calls `cmodel`: compile(ns["model"]) in the compiled world."""

    def __init__(self, src, setup, watch, compile_model=False):
        self.ns, self.watch = {}, watch
        for name, T in LIBS:
            ns = {"__name__": f"{name}_world", "T": T, "nn": T.nn, "F": T.nn.functional, "np": np}
            setup(T, ns)
            if compile_model:
                ns["cmodel"] = jitgrad.compile(ns["model"]) if name == "compiled" else ns["model"]
            exec(compile(src, f"<{name} world>", "exec"), ns)  # noqa: S102
            self.ns[name] = ns
        ns = self.ns["compiled"]
        self.compiled = ns["cmodel"]._compiled if compile_model else jitgrad.compile(ns["step"])
        if not compile_model:
            ns["step"] = self.compiled
        self.seen = []  # every cache entry the compiled function made (held: ids stay unique)
        self.calls = 0

    @property
    def recordings(self):
        return len(self.seen)

    def change(self, fn):
        """fn(T, ns) in each world."""
        for name, T in LIBS:
            fn(T, self.ns[name])

    def call(self, *arrays, same=()):
        """One step in each world with these arguments (new tensors each call; positions in
        `same` pass the tensor of the position before them again), compared."""
        outs, args = {}, {}
        for name, T in LIBS:
            ts = []
            for i, a in enumerate(arrays):
                ts.append(ts[-1] if i in same else T.tensor(a))
            args[name] = ts
            outs[name] = self.ns[name]["step"](*ts)
        for e in self.compiled.cache.values():
            if all(e is not s for s in self.seen):
                self.seen.append(e)
        self.calls += 1
        self.compare(outs, f"call {self.calls}")
        return outs["compiled"]

    def compare(self, outs, msg):
        """The step's result in each world (outs), and the watched tensors and their .grad."""
        close(outs["compiled"], outs["eager"], msg=msg)
        _torch_close(outs["torch"], outs["eager"], msg)
        watched = [self.watch(self.ns[name]) for name, _ in LIBS]
        assert len({len(ts) for ts in watched}) == 1, f"{msg}: watched {[len(ts) for ts in watched]} tensors"
        for k, (c, e, t) in enumerate(zip(*watched)):
            close(c, e, msg=f"{msg}: watched tensor {k}")
            _torch_close(t, e, f"{msg}: watched tensor {k}")
            assert (c.grad is None) == (e.grad is None) == (t.grad is None), f"{msg}: watched tensor {k}'s .grad"
            if e.grad is not None:
                close(c.grad, e.grad, msg=f"{msg}: watched tensor {k}'s .grad")
                _torch_close(t.grad, e.grad, f"{msg}: watched tensor {k}'s .grad")

    def run(self, n, rng, shapes=((4, 3), (4, 2))):
        for _ in range(n):
            self.call(*(rng.uniform(-1, 1, s) for s in shapes))


def _torch_close(t, j, msg):
    np.testing.assert_allclose(t.detach().numpy(), j.detach().numpy(), rtol=RTOL_TORCH, atol=1e-12, err_msg=msg)


def model_params(ns):
    return list(ns["model"].parameters())


TRAIN = """
def step(x, y):
    opt.zero_grad()
    loss = ((model(x) - y) ** 2).mean()
    loss.backward()
    opt.step()
    return loss
"""


def setup_train(T, ns, seed=0):
    ns["model"] = mlp(T, seed)
    ns["opt"] = T.optim.SGD(ns["model"].parameters(), lr=0.1, momentum=0.9)


# -- modules -------------------------------------------------------------------------------------------------------


def test_a_submodule_replaced_or_removed(rng):
    w = World(TRAIN, setup_train, model_params)
    w.run(3, rng)
    w.change(lambda T, ns: ns["model"].__setitem__(1, T.nn.ReLU()))
    w.run(3, rng)
    # a new head: not in the optimizer, so its .grad accumulates over the steps, as eager's
    w.change(lambda T, ns: ns["model"].__setitem__(2, fill(T, T.nn.Linear(5, 2, dtype=T.float64), 7)))
    w.run(3, rng)
    w.change(lambda T, ns: ns["model"].__delitem__(1))
    w.run(3, rng)
    assert w.recordings == 4


NET = """
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(3, 4, dtype=T.float64)
        self.head = nn.Linear(4, 2, dtype=T.float64)
        self.register_buffer("shift", T.zeros(4, dtype=T.float64))
        self.alpha = 0.5
        self.bn = nn.BatchNorm1d(2, dtype=T.float64)

    def forward(self, x):
        return self.bn(self.head((self.body(x) + self.shift).tanh() * self.alpha))

def step(x, y):
    opt.zero_grad()
    loss = ((model(x) - y) ** 2).mean()
    loss.backward()
    opt.step()
    return loss
"""


def setup_net(T, ns):
    exec(compile(NET, "<net>", "exec"), ns)  # noqa: S102  (the class, with this world's T)
    ns["model"] = fill(T, ns["Net"](), 3)
    ns["model"].bn.eval()  # (running statistics read, not updated: replayable)
    ns["opt"] = T.optim.SGD(ns["model"].parameters(), lr=0.1)


@pytest.mark.parametrize("what", ["buffer", "plain attribute", "running_mean", "new head attribute"])
def test_a_module_attribute_reassigned(rng, what):
    changes = {
        "buffer": lambda T, ns: setattr(ns["model"], "shift", T.tensor([0.5, -0.25, 1.0, 0.0], dtype=T.float64)),
        "plain attribute": lambda T, ns: setattr(ns["model"], "alpha", 2.0),
        "running_mean": lambda T, ns: setattr(ns["model"].bn, "running_mean", T.tensor([0.3, -0.7], dtype=T.float64)),
        "new head attribute": lambda T, ns: setattr(ns["model"], "head", fill(T, T.nn.Linear(4, 2, dtype=T.float64),
                                                                                 11)),
    }
    w = World(NET, setup_net, model_params)
    w.run(3, rng)
    w.change(changes[what])
    w.run(3, rng)
    assert w.recordings == 2


def _add_hooks(T, ns):
    m = ns["model"]
    ns["handles"] = [m[0].register_forward_hook(lambda mod, args, out: out * 2.0),
                     m[2].register_forward_pre_hook(lambda mod, args: (args[0] - 0.5,))]


@pytest.mark.parametrize("compile_model", [False, True], ids=["compile(step)", "compile(model)"])
def test_forward_hooks_added_and_removed_on_a_child(rng, compile_model):
    src = TRAIN.replace("model(x)", "cmodel(x)") if compile_model else TRAIN
    w = World(src, setup_train, model_params, compile_model=compile_model)
    w.run(2, rng)
    w.change(_add_hooks)
    w.run(3, rng)
    w.change(lambda T, ns: ns["handles"].pop().remove())  # the pre-hook
    w.run(2, rng)
    w.change(lambda T, ns: ns["handles"].pop().remove())
    w.run(2, rng)
    assert w.recordings == 4


def test_compiled_model_with_a_child_replaced(rng):
    w = World(TRAIN.replace("model(x)", "cmodel(x)"), setup_train, model_params, compile_model=True)
    w.run(3, rng)
    w.change(lambda T, ns: ns["model"].__setitem__(1, T.nn.Sigmoid()))
    w.run(3, rng)
    w.change(lambda T, ns: setattr(ns["model"][0], "bias", T.nn.Parameter(T.tensor([1.0, 2.0, 3.0, 4.0, 5.0], dtype=T.float64))))
    w.run(3, rng)
    assert w.recordings == 3


def test_train_eval_round_trip_records_once_per_mode_change(rng):
    """model.train() on a module already training changes nothing: the plan still replays."""
    w = World(NET, setup_net, model_params)
    w.run(2, rng)
    w.change(lambda T, ns: ns["model"].body.train())
    w.run(2, rng)
    assert w.recordings == 1
    w.change(lambda T, ns: ns["model"].body.eval())
    w.run(2, rng)
    assert w.recordings == 2


# -- globals and closure cells ---------------------------------------------------------------------------------------

GLOBAL_W = """
def step(x):
    loss = ((x @ w).tanh() ** 2).sum() * scale
    loss.backward()
    return loss
"""

CELL_W = """
def make(w, scale):
    def step(x):
        loss = ((x @ w).tanh() ** 2).sum() * scale
        loss.backward()
        return loss

    def rebind(new=None, new_scale=None):
        nonlocal w, scale
        w = w if new is None else new
        scale = scale if new_scale is None else new_scale
    return step, rebind

step, rebind = make(w, scale)
"""


def setup_w(T, ns):
    ns["w"] = ns["w0"] = T.nn.Parameter(T.tensor(np.linspace(-1, 1, 6).reshape(3, 2)))
    ns["w1"] = T.nn.Parameter(T.tensor(np.linspace(0.5, -1.5, 6).reshape(3, 2)))
    ns["scale"] = 1.0


@pytest.mark.parametrize("how", ["global", "closure"])
def test_a_parameter_rebound_gets_the_gradient(rng, how):
    """w = another Parameter: the new one gets .grad (the old keeps what it had)."""
    w = World(GLOBAL_W if how == "global" else CELL_W, setup_w, lambda ns: [ns["w0"], ns["w1"]])
    w.run(3, rng, shapes=((4, 3),))
    if how == "global":
        w.change(lambda T, ns: ns.__setitem__("w", ns["w1"]))
    else:
        w.change(lambda T, ns: ns["rebind"](new=ns["w1"]))
    w.run(3, rng, shapes=((4, 3),))
    assert w.recordings == 2
    if how == "global":  # a Python number the step reads, rebound
        w.change(lambda T, ns: ns.__setitem__("scale", 3.0))
    else:
        w.change(lambda T, ns: ns["rebind"](new_scale=3.0))
    w.run(3, rng, shapes=((4, 3),))
    assert w.recordings == 3


def test_the_model_and_the_optimizer_rebound(rng):
    """A new fold of cross-validation, then a frozen restart (lr=0), then Adam."""
    w = World(TRAIN, setup_train, model_params)
    w.run(3, rng)

    def new_fold(T, ns):
        ns["model"] = mlp(T, 5)
        ns["opt"] = T.optim.SGD(ns["model"].parameters(), lr=0.2)
    w.change(new_fold)
    w.run(3, rng)
    w.change(lambda T, ns: ns.__setitem__("opt", T.optim.SGD(ns["model"].parameters(), lr=0.0)))
    w.run(3, rng)
    w.change(lambda T, ns: ns.__setitem__("opt", T.optim.Adam(ns["model"].parameters(), lr=0.01)))
    w.run(3, rng)
    assert w.recordings == 4


class Config:
    def __init__(self, scale):
        self.scale = scale


OBJ = """
def step(x):
    loss = ((x @ holder.w).tanh() ** 2).sum() * holder.cfg.scale
    loss.backward()
    return loss
"""


def test_attributes_of_an_object_the_step_reads(rng):
    def setup(T, ns):
        setup_w(T, ns)
        ns["holder"] = Config(None)
        ns["holder"].w, ns["holder"].cfg = ns["w0"], Config(1.0)
    w = World(OBJ, setup, lambda ns: [ns["w0"], ns["w1"]])
    w.run(2, rng, shapes=((4, 3),))
    w.change(lambda T, ns: setattr(ns["holder"], "w", ns["w1"]))
    w.run(2, rng, shapes=((4, 3),))
    w.change(lambda T, ns: setattr(ns["holder"], "cfg", Config(2.0)))
    w.run(2, rng, shapes=((4, 3),))
    assert w.recordings == 3


TRAINER = """
def loss_fn(out, y):
    return ((out - y) ** 2).mean() * weight

def other_loss(out, y):
    return (out - y).abs().mean()

class Trainer:
    def __init__(self, model, opt):
        self.model, self.opt = model, opt

    def step(self, x, y):
        self.opt.zero_grad()
        loss = loss_fn(self.model(x), y)
        loss.backward()
        self.opt.step()
        return loss

weight = 1.0
trainer = Trainer(model, opt)
step = trainer.step
"""


def test_a_compiled_method_and_the_functions_it_calls(rng):
    """compile(trainer.step): its self's attributes, and the globals of the functions it calls."""
    w = World(TRAINER, setup_train, lambda ns: list(ns["trainer"].model.parameters()))
    w.run(2, rng)

    def new_model(T, ns):
        ns["trainer"].model = mlp(T, 4)
        ns["trainer"].opt = T.optim.SGD(ns["trainer"].model.parameters(), lr=0.3)
    for change in (new_model, lambda T, ns: ns.__setitem__("weight", 0.25),
                   lambda T, ns: ns.__setitem__("loss_fn", ns["other_loss"])):
        w.change(change)
        w.run(2, rng)
    assert w.recordings == 4


CALLABLE = """
class Step:
    def __init__(self, model, opt):
        self.model, self.opt = model, opt

    def __call__(self, x, y):
        self.opt.zero_grad()
        loss = ((self.model(x) - y) ** 2).mean()
        loss.backward()
        self.opt.step()
        return loss

stepper = step = Step(model, opt)
"""


def test_a_compiled_callable_object(rng):
    """compile(obj) of an object with __call__: the attributes its methods read."""
    w = World(CALLABLE, setup_train, lambda ns: list(ns["stepper"].model.parameters()))
    w.run(2, rng)

    def new_model(T, ns):
        ns["stepper"].model = mlp(T, 4)
        ns["stepper"].opt = T.optim.SGD(ns["stepper"].model.parameters(), lr=0.3)
    w.change(new_model)
    w.run(2, rng)
    assert w.recordings == 2


SETTER = """
class Scaler:
    def __init__(self):
        self.scale = 1.0

    def set_scale(self, s):
        self.scale = s

scaler = Scaler()
calls = 0

def step(x):
    global calls
    calls += 1
    loss = ((x @ w).tanh() ** 2).sum() * scaler.scale
    loss.backward()
    return loss
"""


def test_state_the_step_assigns_is_its_own_and_a_setter_is_not(rng):
    """`calls += 1` in the step is its own counter (not guarded: a recording of another
    signature does not invalidate the first's plan); an attribute a method assigns between
    calls (set_scale) is what the step reads (guarded)."""
    w = World(SETTER, setup_w, lambda ns: [ns["w0"]])
    w.run(2, rng, shapes=((4, 3),))
    w.run(2, rng, shapes=((5, 3),))
    w.run(2, rng, shapes=((4, 3),))
    assert w.recordings == 2 and w.ns["compiled"]["calls"] == 2
    w.change(lambda T, ns: ns["scaler"].set_scale(2.5))
    w.run(2, rng, shapes=((4, 3),))
    assert w.recordings == 3


ITEMS = """
def step(x):
    loss = ((x @ ws[0]).tanh() ** 2).sum() * cfg["scale"]
    loss.backward()
    return loss
"""


def test_items_of_a_list_and_a_dict_the_step_reads(rng):
    def setup(T, ns):
        setup_w(T, ns)
        ns["ws"], ns["cfg"] = [ns["w0"]], {"scale": 1.0}
    w = World(ITEMS, setup, lambda ns: [ns["w0"], ns["w1"]])
    w.run(2, rng, shapes=((4, 3),))
    for change in (lambda T, ns: ns["cfg"].__setitem__("scale", 3.0),
                   lambda T, ns: ns["ws"].__setitem__(0, ns["w1"]),
                   lambda T, ns: ns["cfg"].__setitem__("unread", 1)):  # (another key: the dict changed)
        w.change(change)
        w.run(2, rng, shapes=((4, 3),))
    assert w.recordings == 4


# -- optimizer parameter groups ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("frozen", [False, True], ids=["trained", "frozen"])
@pytest.mark.parametrize("opt", ["SGD", "Adam"])
def test_optimizer_parameter_groups_changed(rng, opt, frozen):
    """Fine-tuning: the head first (the body frozen, or getting gradients it does not use);
    then the body unfrozen with add_param_group; then a group's parameters replaced and
    appended to."""
    def setup(T, ns):
        ns["model"] = mlp(T, 1)
        ns["model"][0].requires_grad_(not frozen)
        kw = {"momentum": 0.9} if opt == "SGD" else {}
        ns["opt"] = getattr(T.optim, opt)(ns["model"][2].parameters(), lr=0.05, **kw)

    def unfreeze(T, ns):
        ns["model"][0].requires_grad_(True)
        ns["opt"].add_param_group({"params": ns["model"][0].parameters(), "lr": 0.02})
    w = World(TRAIN, setup, model_params)
    w.run(3, rng)
    w.change(unfreeze)
    w.run(3, rng)
    w.change(lambda T, ns: ns["opt"].param_groups[1].__setitem__("params", [ns["model"][0].weight]))
    w.run(3, rng)
    w.change(lambda T, ns: ns["opt"].param_groups[1]["params"].append(ns["model"][0].bias))
    w.run(3, rng)
    w.change(lambda T, ns: ns["opt"].param_groups[0].__setitem__("lr", 0.2))  # read live: no new recording needed
    w.run(3, rng)


# -- arguments -----------------------------------------------------------------------------------------------------------

ALIAS = """
def step(q, k):
    loss = ((q * k.tanh()).sum(1) ** 2).mean()
    loss.backward()
    return loss
"""


def test_aliased_arguments(rng):
    """f(x, x) (self-attention) then f(x, y): y is used, and each gets its .grad."""
    def setup(T, ns):
        ns["x"] = T.tensor(rng_x, requires_grad=True)
        ns["y"] = T.tensor(rng_y, requires_grad=True)
    rng_x, rng_y = rng.uniform(-1, 1, (4, 3)), rng.uniform(-1, 1, (4, 3))
    w = World(ALIAS, setup, lambda ns: [ns["x"], ns["y"]])
    for names in (("x", "x"), ("x", "x"), ("x", "y"), ("x", "y"), ("y", "y"), ("y", "x"), ("x", "x")):
        w.compare({n: w.ns[n]["step"](w.ns[n][names[0]], w.ns[n][names[1]]) for n, _ in LIBS}, str(names))
    assert len(w.compiled.cache) == 2  # (x, x) and (x, y): (y, y) is (x, x)'s pattern, (y, x) (x, y)'s


def test_aliased_keyword_arguments(rng):
    x, y = (jitgrad.tensor(rng.uniform(-1, 1, (4, 3))) for _ in range(2))
    f = jitgrad.compile(lambda q, k: (q * k.tanh()).sum())
    for a, b in ((x, x), (x, x), (x, y), (x, y), (y, y)):
        close(f(q=a, k=b), (a * b.tanh()).sum())


# -- state the step keeps ------------------------------------------------------------------------------------------------

KEEP = """
class Holder:
    pass

h0 = T.zeros(3, dtype=T.float64)  # (kept: the first call's input is alive when the recording ends)
state = Holder()
state.h = h0

def step_attribute(x):
    state.h = (state.h * 0.5 + x).tanh()
    return state.h.sum()

h = h0

def step_global(x):
    global h
    h = (h * 0.5 + x).tanh()
    return h.sum()

class Rnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.h = h0

    def forward(self, x):
        self.h = (self.h * 0.5 + x).tanh()
        return self.h.sum()

rnn = Rnn()

def step_module(x):
    return rnn(x)

history = []

def step_list(x):
    out = (x * 2.0).tanh()
    history.append(out)
    return out.sum()

class Diff(nn.Module):
    def forward(self, x):
        out = x - self.prev if hasattr(self, "prev") else x
        self.prev = x
        return (out ** 2).sum()

diff = Diff()

def step_argument(x):
    return diff(x)
"""


@pytest.mark.parametrize("where", ["attribute", "global", "module", "list", "argument"])
def test_a_step_that_keeps_a_tensor_it_made_runs_eagerly(rng, where):
    """The step carries state across calls in a Python name or list (a tensor it made, or
    was given): a replay would not update it."""
    def setup(T, ns):
        exec(compile(KEEP, "<keep>", "exec"), ns)  # noqa: S102
        ns["step"] = ns[f"step_{where}"]
    w = World("", setup, lambda ns: ns["history"])
    w.run(4, rng, shapes=((3,),))
    (entry,) = w.compiled.cache.values()
    why = "given to it as an argument" if where == "argument" else "keeps a tensor it made"
    assert type(entry).__name__ == "_Eager" and why in entry.breaks[0][0]


# -- randomized --------------------------------------------------------------------------------------------------------

RANDOM = """
def step(x, y):
    opt.zero_grad()
    loss = ((model(x) * scale - y) ** 2).mean()
    loss.backward()
    opt.step()
    return loss
"""


def test_random_changes_between_steps(rng):
    """A training loop with a random change (or none) before each step."""
    nn_acts = ("Tanh", "ReLU", "Sigmoid")

    def setup(T, ns):
        nn = T.nn
        ns["model"] = fill(T, nn.Sequential(nn.Linear(3, 4, dtype=T.float64), nn.Tanh(),
                                            nn.Linear(4, 4, dtype=T.float64), nn.Tanh(),
                                            nn.Linear(4, 2, dtype=T.float64)), 2)
        ns["opt"] = T.optim.SGD(ns["model"].parameters(), lr=0.1)
        ns["scale"], ns["handles"] = 1.0, []

    def pick(options):
        return options[rng.integers(len(options))]

    def change():
        kind = pick(["activation", "hook", "prehook", "unhook", "optimizer", "layer", "scale", "lr", "none", "none"])
        if kind == "activation":
            i, act = pick([1, 3]), pick(nn_acts)
            return lambda T, ns: ns["model"].__setitem__(i, getattr(T.nn, act)())
        if kind in ("hook", "prehook"):
            i, c = pick([0, 2, 4]), float(rng.uniform(0.5, 1.5))
            if kind == "hook":
                return lambda T, ns: ns["handles"].append(
                    ns["model"][i].register_forward_hook(lambda m, a, out: out * c))
            return lambda T, ns: ns["handles"].append(
                ns["model"][i].register_forward_pre_hook(lambda m, a: (a[0] + c,)))
        if kind == "unhook":
            return lambda T, ns: ns["handles"] and ns["handles"].pop(0).remove()
        if kind == "optimizer":
            lr, mom = pick([0.0, 0.05, 0.1]), pick([0.0, 0.9])
            return lambda T, ns: ns.__setitem__("opt", T.optim.SGD(ns["model"].parameters(), lr=lr, momentum=mom))
        if kind == "layer":
            seed = int(rng.integers(100))
            return lambda T, ns: ns["model"].__setitem__(2, fill(T, T.nn.Linear(4, 4, dtype=T.float64), seed))
        if kind == "scale":
            s = pick([0.5, 1.0, 2.0])
            return lambda T, ns: ns.__setitem__("scale", s)
        if kind == "lr":
            lr = pick([0.01, 0.1])
            return lambda T, ns: ns["opt"].param_groups[0].__setitem__("lr", lr)
        return lambda T, ns: None

    w = World(RANDOM, setup, model_params)
    for _ in range(30):
        w.change(change())
        w.run(1, rng)
    assert w.recordings < w.calls  # some steps replayed


# -- the mechanism: a generation counter, one compare per call ------------------------------------------------------


def _containers():
    nn = jitgrad.nn
    return nn.Sequential(nn.Linear(2, 2), nn.Tanh(), nn.ModuleList([nn.Linear(2, 2)]),
                         nn.ModuleDict({"a": nn.ReLU()}), nn.ParameterList([nn.Parameter(jitgrad.ones(2))]),
                         nn.ParameterDict({"p": nn.Parameter(jitgrad.ones(2))}), nn.BatchNorm1d(2))


MUTATIONS = {
    "parameter assigned": lambda m: setattr(m[0], "weight", jitgrad.nn.Parameter(jitgrad.ones(2, 2))),
    "parameter set to None": lambda m: setattr(m[0], "bias", None),
    "register_parameter": lambda m: m[0].register_parameter("extra", jitgrad.nn.Parameter(jitgrad.ones(1))),
    "buffer assigned": lambda m: setattr(m[6], "running_mean", jitgrad.zeros(2)),
    "register_buffer": lambda m: m[1].register_buffer("b", jitgrad.ones(1)),
    "plain attribute": lambda m: setattr(m[1], "scale", 2.0),
    "plain attribute deleted": lambda m: (setattr(m[1], "s", 1), delattr(m[1], "s")),
    "submodule assigned": lambda m: setattr(m[1], "inner", jitgrad.nn.ReLU()),
    "submodule deleted": lambda m: delattr(m, "1"),
    "add_module": lambda m: m.add_module("extra", jitgrad.nn.ReLU()),
    "Sequential[i] =": lambda m: m.__setitem__(1, jitgrad.nn.ReLU()),
    "del Sequential[i]": lambda m: m.__delitem__(1),
    "Sequential.insert": lambda m: m.insert(0, jitgrad.nn.ReLU()),
    "Sequential.append": lambda m: m.append(jitgrad.nn.ReLU()),
    "ModuleList.append": lambda m: m[2].append(jitgrad.nn.ReLU()),
    "ModuleList.extend": lambda m: m[2].extend([jitgrad.nn.ReLU()]),
    "ModuleDict[k] =": lambda m: m[3].__setitem__("a", jitgrad.nn.Tanh()),
    "ModuleDict.pop": lambda m: m[3].pop("a"),
    "ModuleDict.clear": lambda m: m[3].clear(),
    "ModuleDict.update": lambda m: m[3].update({"b": jitgrad.nn.Tanh()}),
    "ParameterList[i] =": lambda m: m[4].__setitem__(0, jitgrad.nn.Parameter(jitgrad.zeros(2))),
    "ParameterList.append": lambda m: m[4].append(jitgrad.nn.Parameter(jitgrad.zeros(2))),
    "ParameterDict[k] =": lambda m: m[5].__setitem__("p", jitgrad.nn.Parameter(jitgrad.zeros(2))),
    "_modules written directly": lambda m: m._modules.__setitem__("1", jitgrad.nn.ReLU()),
    "_modules.move_to_end": lambda m: m._modules.move_to_end("0"),
    "_buffers.pop": lambda m: m[6]._buffers.pop("running_var"),
    "_parameters.setdefault": lambda m: m[0]._parameters.setdefault("new", jitgrad.nn.Parameter(jitgrad.ones(1))),
    "module.double()": lambda m: m.double(),
    "eval()": lambda m: m.eval(),
    "a child's train(False)": lambda m: m[0].train(False),
    "forward hook": lambda m: m[0].register_forward_hook(lambda *a: None),
    "forward pre-hook": lambda m: m[2][0].register_forward_pre_hook(lambda *a: None),
}


@pytest.mark.parametrize("what", sorted(MUTATIONS))
def test_every_way_to_change_a_module_moves_the_generation(what):
    from jitgrad._core.capture import generation
    m = _containers()
    before = generation[0]
    MUTATIONS[what](m)
    assert generation[0] != before


def test_hook_removal_moves_the_generation_and_using_a_module_does_not():
    from jitgrad._core.capture import generation
    m = _containers()
    handle = m[0].register_forward_hook(lambda *a: None)
    before = generation[0]
    handle.remove()
    assert generation[0] != before
    x = jitgrad.ones(3, 2, requires_grad=True)
    before = generation[0]
    m[0](x)
    m[6](x)          # a BatchNorm in training updates its statistics in place
    m[2][0](x)
    m.train()        # already training: nothing changes
    list(m.parameters()), m.state_dict(), m[0].weight, repr(m)
    x.register_hook(lambda g: g)  # a tensor's hook is not a module's
    assert generation[0] == before


def test_a_replay_compares_one_integer_for_the_modules(rng, monkeypatch):
    """Replays do not look at the modules while nothing moved the generation; after a change
    elsewhere (another module made) one call looks, finds nothing of its own changed, and
    replays."""
    from jitgrad.compiler import guards
    w = World(TRAIN, setup_train, model_params)
    w.run(2, rng)
    looked = []
    real = guards._state
    monkeypatch.setattr(guards, "_state", lambda m: looked.append(m) or real(m))
    w.run(3, rng)
    assert looked == []
    jitgrad.nn.Linear(2, 2)  # moves the generation
    w.run(3, rng)
    assert len(looked) == len(list(w.ns["compiled"]["model"].modules()))
    assert w.recordings == 1


def test_fullgraph_raises_for_a_step_that_keeps_a_tensor():
    state = Config(jitgrad.zeros(3, dtype=jitgrad.float64))
    h0 = state.scale  # noqa: F841  (alive: the first call's input)

    def step(x):
        state.scale = (state.scale * 0.5 + x).tanh()
        return state.scale.sum()
    with pytest.raises(RuntimeError, match="keeps a tensor it made in scale"):
        jitgrad.compile(step, fullgraph=True)(jitgrad.ones(3, dtype=jitgrad.float64))


GIVEN = """
def step(x):
    loss = (x * w).tanh().sum()
    loss.backward()
    return loss
"""


def test_an_argument_the_step_also_reads_by_name(rng):
    """step(w) where the step reads w too: the recording cannot tell the two apart, so the
    step runs eagerly (a replay of step(v) would read v where the step reads w)."""
    def setup(T, ns):
        setup_w(T, ns)
        ns["w"] = ns["w0"] = T.nn.Parameter(T.tensor(np.linspace(-1, 1, 3)))
        ns["w1"] = T.nn.Parameter(T.tensor(np.linspace(2, 1, 3)))
    w = World(GIVEN, setup, lambda ns: [ns["w0"], ns["w1"]])
    for name in ("w0", "w0", "w1", "w1"):
        w.compare({n: w.ns[n]["step"](w.ns[n][name]) for n, _ in LIBS}, name)
    (entry,) = w.compiled.cache.values()
    assert "given to it as an argument" in entry.breaks[0][0]
