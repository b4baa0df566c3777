"""Real programs (issue 27), written once against ``T`` (jitgrad or torch):

* ode_demo: the training loop of torchdiffeq's examples/ode_demo.py. The data are the
  spiral ``dy/dt = (y**3) @ A`` (A = [[-0.1, 2], [-2, -0.1]]) from y0 = [2, 0], solved with
  dopri5 at 1000 times in [0, 25] (``true_y``); the model is its ODEFunc, ``y**3`` through
  a 2-50-2 tanh MLP (weights N(0, 0.1), biases 0); a step draws 20 start points (numpy, as
  the demo), solves 10 time points from each with ``odeint`` (dopri5) or ``odeint_adjoint``,
  takes the mean absolute error, backward, RMSprop lr 1e-3. The demo's
  visualisation and its running-average bookkeeping are left out.
  torchdiffeq runs on jitgrad unmodified through the import shim (``import_torchdiffeq``).
* small GPT: a training loop of nanoGPT (karpathy/nanoGPT's model.py and train.py, written
  again here against ``T``): 2 layers, n_embd 32, 4 heads, block 16, vocabulary 65,
  batch 8, no bias, no dropout, causal ``scaled_dot_product_attention``, tied lm_head /
  token embedding, the GPT-2 init; per step a random batch of the corpus (numpy, as
  train.py's get_batch), the loss, backward, ``clip_grad_norm_(1.0)``, AdamW
  (weight decay 0.1 on matrices only, as configure_optimizers; lr 1e-3, betas (0.9, 0.99))
  and ``zero_grad(set_to_none=True)``. The corpus is 20k random tokens.

Both libraries start from the same weights (numpy arrays, or torch's initial state
dict) and see the same batches, so their losses agree to float32 rounding: ``losses``
runs a few steps of each for side_by_side.py to compare before it times them.
"""
import importlib
import importlib.util
import math
import sys

import numpy as np

# --- torchdiffeq's examples/ode_demo.py (its defaults)
ODE_DATA_SIZE = 1000
ODE_BATCH_TIME = 10
ODE_BATCH_SIZE = 20
ODE_LR = 1e-3
ODE_HIDDEN = 50
# --- the small GPT
GPT_CONFIG = dict(n_layer=2, n_head=4, n_embd=32, block_size=16, vocab_size=65, bias=False)
GPT_BATCH = 8
GPT_LR = 1e-3
GPT_BETAS = (0.9, 0.99)
GPT_WEIGHT_DECAY = 0.1
GPT_GRAD_CLIP = 1.0
GPT_CORPUS = 20_000

TORCHDIFFEQ_MISSING = "skipped: torchdiffeq not installed (pip install --no-deps torchdiffeq==0.2.5)"


# ------------------------------------------------------------------ torchdiffeq

def _modules(prefix):
    return {k: m for k, m in sys.modules.items() if k == prefix or k.startswith(prefix + ".")}


def import_torchdiffeq(jitgrad=None):
    """A fresh import of torchdiffeq bound to real torch, or (``jitgrad`` given) to jitgrad
    through its import shim; None where torchdiffeq is not installed.

    torchdiffeq binds ``torch`` only in its modules' top-level imports (none inside
    functions), so a copy imported while the shim is installed keeps jitgrad after the shim
    is gone and a copy imported without it keeps real torch: both live in one process, and
    the two libraries' steps can take turns in one timing loop. The ``torchdiffeq*``
    entries of sys.modules are put back as they were afterwards.
    """
    if importlib.util.find_spec("torchdiffeq") is None:
        return None
    # imported first, outside the shim: torchdiffeq's scipy solvers must not bind jitgrad
    for dep in ("scipy.integrate",):
        try:
            importlib.import_module(dep)
        except ImportError:
            pass
    saved = _modules("torchdiffeq")
    for k in saved:
        del sys.modules[k]
    try:
        if jitgrad is None:
            mod = importlib.import_module("torchdiffeq")
        else:
            with jitgrad.install_as_torch():
                mod = importlib.import_module("torchdiffeq")
    finally:
        fresh = _modules("torchdiffeq")
        for k in fresh:
            del sys.modules[k]
        sys.modules.update(saved)
    got = str(fresh["torchdiffeq._impl.odeint"].torch.__version__)
    if (jitgrad is not None) != got.endswith("+jitgrad"):
        raise RuntimeError(f"torchdiffeq imported against the wrong library (its torch is {got})")
    return mod


def ode_weights(seed=0):
    """ODEFunc's initial weights, torch's (out, in) layout: N(0, 0.1) weights, zero biases."""
    rng = np.random.default_rng(seed)
    return [(rng.normal(0.0, 0.1, (ODE_HIDDEN, 2)).astype(np.float32), np.zeros(ODE_HIDDEN, np.float32)),
            (rng.normal(0.0, 0.1, (2, ODE_HIDDEN)).astype(np.float32), np.zeros(2, np.float32))]


def ode_true_y(T, tdq):
    """The demo's data: the spiral solved with dopri5 at ODE_DATA_SIZE times (numpy)."""
    true_a = T.tensor([[-0.1, 2.0], [-2.0, -0.1]])

    class Lambda(T.nn.Module):
        def forward(self, t, y):
            return T.mm(y ** 3, true_a)

    with T.no_grad():
        y = tdq.odeint(Lambda(), T.tensor([[2.0, 0.0]]), T.linspace(0.0, 25.0, ODE_DATA_SIZE), method="dopri5")
    return y.numpy().copy()


def ode_batches(n, seed=1):
    """n batches of start indices, as the demo's get_batch draws them."""
    rng = np.random.default_rng(seed)
    return [rng.choice(np.arange(ODE_DATA_SIZE - ODE_BATCH_TIME, dtype=np.int64), ODE_BATCH_SIZE, replace=False)
            for _ in range(n)]


def ode_setup(T, tdq, true_y, weights, batches, adjoint=False):
    """The demo's model, optimizer and data (not timed): the state ode_steps trains on."""
    nn = T.nn

    class ODEFunc(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(2, ODE_HIDDEN), nn.Tanh(), nn.Linear(ODE_HIDDEN, 2))

        def forward(self, t, y):
            return self.net(y ** 3)

    func = ODEFunc()
    with T.no_grad():
        for lin, (w, b) in zip((func.net[0], func.net[2]), weights):
            lin.weight.copy_(T.tensor(w))
            lin.bias.copy_(T.tensor(b))
    opt = T.optim.RMSprop(func.parameters(), lr=ODE_LR)
    t = T.linspace(0.0, 25.0, ODE_DATA_SIZE)
    odeint = tdq.odeint_adjoint if adjoint else tdq.odeint
    return T, odeint, func, opt, T.tensor(true_y), t, batches


def ode_steps(state):
    """The demo's training iterations, one per batch; their losses."""
    T, odeint, func, opt, true_y, t, batches = state
    losses = []
    for s_np in batches:
        opt.zero_grad()
        s = T.from_numpy(s_np)
        batch_y0 = true_y[s]
        batch_t = t[:ODE_BATCH_TIME]
        batch_y = T.stack([true_y[s + i] for i in range(ODE_BATCH_TIME)], dim=0)
        pred_y = odeint(func, batch_y0, batch_t, method="dopri5")
        loss = T.mean(T.abs(pred_y - batch_y))
        loss.backward()
        opt.step()
        losses.append(loss)
    return losses


# ------------------------------------------------------------------ small GPT

_GPT_CLASSES = {}


def gpt_class(T):
    """nanoGPT's GPT (model.py), written against T; one class per library."""
    if T.__name__ in _GPT_CLASSES:
        return _GPT_CLASSES[T.__name__]
    nn, F = T.nn, T.nn.functional

    class LayerNorm(nn.Module):
        def __init__(self, ndim, bias):
            super().__init__()
            self.weight = nn.Parameter(T.ones(ndim))
            self.bias = nn.Parameter(T.zeros(ndim)) if bias else None

        def forward(self, x):
            return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)

    class CausalSelfAttention(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.c_attn = nn.Linear(c["n_embd"], 3 * c["n_embd"], bias=c["bias"])
            self.c_proj = nn.Linear(c["n_embd"], c["n_embd"], bias=c["bias"])
            self.n_head, self.n_embd = c["n_head"], c["n_embd"]

        def forward(self, x):
            B, L, C = x.size()
            q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
            k = k.view(B, L, self.n_head, C // self.n_head).transpose(1, 2)
            q = q.view(B, L, self.n_head, C // self.n_head).transpose(1, 2)
            v = v.view(B, L, self.n_head, C // self.n_head).transpose(1, 2)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=True)
            y = y.transpose(1, 2).contiguous().view(B, L, C)
            return self.c_proj(y)

    class MLP(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.c_fc = nn.Linear(c["n_embd"], 4 * c["n_embd"], bias=c["bias"])
            self.gelu = nn.GELU()
            self.c_proj = nn.Linear(4 * c["n_embd"], c["n_embd"], bias=c["bias"])

        def forward(self, x):
            return self.c_proj(self.gelu(self.c_fc(x)))

    class Block(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.ln_1 = LayerNorm(c["n_embd"], c["bias"])
            self.attn = CausalSelfAttention(c)
            self.ln_2 = LayerNorm(c["n_embd"], c["bias"])
            self.mlp = MLP(c)

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.transformer = nn.ModuleDict(dict(
                wte=nn.Embedding(c["vocab_size"], c["n_embd"]),
                wpe=nn.Embedding(c["block_size"], c["n_embd"]),
                h=nn.ModuleList([Block(c) for _ in range(c["n_layer"])]),
                ln_f=LayerNorm(c["n_embd"], c["bias"]),
            ))
            self.lm_head = nn.Linear(c["n_embd"], c["vocab_size"], bias=False)
            self.transformer.wte.weight = self.lm_head.weight
            self.apply(self._init_weights)
            for pn, p in self.named_parameters():
                if pn.endswith("c_proj.weight"):
                    nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * c["n_layer"]))

        def _init_weights(self, module):
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)

        def forward(self, idx, targets):
            pos = T.arange(0, idx.size(1), dtype=T.long)
            x = self.transformer.wte(idx) + self.transformer.wpe(pos)
            for block in self.transformer.h:
                x = block(x)
            logits = self.lm_head(self.transformer.ln_f(x))
            return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)

        def configure_optimizers(self, weight_decay, learning_rate, betas):
            params = [p for p in self.parameters() if p.requires_grad]
            groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
                      {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
            return T.optim.AdamW(groups, lr=learning_rate, betas=betas)

    _GPT_CLASSES[T.__name__] = GPT
    return GPT


_GPT_INIT = {}


def gpt_init_state(T):
    """T's GPT after manual_seed(0), as numpy arrays: the initial weights (torch's, where
    both libraries run)."""
    if T.__name__ not in _GPT_INIT:
        T.manual_seed(0)
        model = gpt_class(T)(GPT_CONFIG)
        _GPT_INIT[T.__name__] = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    return _GPT_INIT[T.__name__]


def gpt_batches(n, seed=2):
    """n (x, y) batches of the corpus, as train.py's get_batch (numpy int64)."""
    rng = np.random.default_rng(seed)
    data = rng.integers(0, GPT_CONFIG["vocab_size"], size=GPT_CORPUS).astype(np.int64)
    bs = GPT_CONFIG["block_size"]
    out = []
    for _ in range(n):
        ix = rng.integers(0, len(data) - bs, size=GPT_BATCH)
        out.append((np.stack([data[i:i + bs] for i in ix]), np.stack([data[i + 1:i + 1 + bs] for i in ix])))
    return out


def gpt_setup(T, init, batches):
    """The model with the initial weights, its AdamW and the batches (not timed)."""
    model = gpt_class(T)(GPT_CONFIG)
    result = model.load_state_dict({k: T.tensor(v) for k, v in init.items()})
    assert not result.missing_keys and not result.unexpected_keys
    opt = model.configure_optimizers(GPT_WEIGHT_DECAY, GPT_LR, GPT_BETAS)
    return T, model, opt, batches


def gpt_steps(state):
    """train.py's iterations, one per batch; their losses."""
    T, model, opt, batches = state
    losses = []
    for x_np, y_np in batches:
        x, y = T.from_numpy(x_np), T.from_numpy(y_np)
        _, loss = model(x, y)
        loss.backward()
        T.nn.utils.clip_grad_norm_(model.parameters(), GPT_GRAD_CLIP)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss)
    return losses


# ------------------------------------------------------------------ rows

ROWS = (("ode_demo", "dopri5 step"), ("ode_demo", "adjoint step"), ("small GPT", "step"))


class Programs:
    """The real programs' setups per library: torchdiffeq imported for each, the data and
    initial weights shared. With torch given, torch makes the shared data (true_y) and
    initial weights; without (asv times jitgrad alone), jitgrad does."""

    def __init__(self, jitgrad, torch=None):
        self.libs = {"jitgrad": jitgrad}
        if torch is not None:
            self.libs["torch"] = torch
        self.ref = "torch" if torch is not None else "jitgrad"
        self.tdq = {lib: import_torchdiffeq(jitgrad if lib == "jitgrad" else None) for lib in self.libs}
        self._true_y = None

    def skipped(self, key):
        """Why row `key` cannot run here, or None."""
        if key[0] == "ode_demo" and self.tdq["jitgrad"] is None:
            return TORCHDIFFEQ_MISSING
        return None

    def true_y(self):
        """The data, solved once (by torch where present): every library trains on the same numbers."""
        if self._true_y is None:
            self._true_y = ode_true_y(self.libs[self.ref], self.tdq[self.ref])
        return self._true_y

    def setup(self, key, lib, steps):
        """setup() for `steps` iterations of row `key` on `lib`; each call builds the model
        afresh, so every timed run trains the same steps from the same weights."""
        T = self.libs[lib]
        if key[0] == "small GPT":
            init, batches = gpt_init_state(self.libs[self.ref]), gpt_batches(steps)
            return lambda: gpt_setup(T, init, batches)
        true_y, weights, batches = self.true_y(), ode_weights(), ode_batches(steps)
        adjoint = key[1] == "adjoint step"
        return lambda: ode_setup(T, self.tdq[lib], true_y, weights, batches, adjoint)

    @staticmethod
    def timed(key):
        """The timed function of row `key`: its steps, given setup()'s state."""
        return gpt_steps if key[0] == "small GPT" else ode_steps

    def losses(self, key, lib, steps):
        """The first `steps` losses of row `key` on `lib` (floats)."""
        return [v.item() for v in self.timed(key)(self.setup(key, lib, steps)())]
