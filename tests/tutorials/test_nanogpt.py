"""nanoGPT's model (karpathy/nanoGPT model.py, ported in nanogpt_model.py with its MIT
licence) runs unmodified on jitgrad: the same source is executed once against torch and once
with `import jitgrad as torch`. From the same weights (torch's state_dict, with both names of
the tied lm_head / wte weight, loaded strictly), the two must agree on the forward pass, the
loss, every gradient, three steps of the AdamW that configure_optimizers builds (it reads
inspect.signature(torch.optim.AdamW)), greedy generate, and crop_block_size. Both attention
paths run: F.scaled_dot_product_attention(is_causal=True) and, with that name hidden as on
an old torch, the written-out masked softmax over the registered tril buffer."""
import inspect
import os
import sys
import types

import numpy as np
import pytest

import jitgrad

torch = pytest.importorskip("torch")

_SOURCE_PATH = os.path.join(os.path.dirname(__file__), "nanogpt_model.py")
_SWAPS = (("import torch\n", "import jitgrad as torch\n"), ("import torch.nn as nn\n", "import jitgrad.nn as nn\n"),
          ("from torch.nn import functional as F\n", "from jitgrad.nn import functional as F\n"))


def load_model_module(lib):
    """nanogpt_model.py executed against torch, or against jitgrad through the import swap."""
    with open(_SOURCE_PATH, encoding="utf-8") as f:
        src = f.read()
    if lib == "jitgrad":
        for old, new in _SWAPS:
            assert old in src
            src = src.replace(old, new)
    mod = types.ModuleType(f"nanogpt_model_{lib}")
    mod.__file__ = _SOURCE_PATH
    sys.modules[mod.__name__] = mod  # (dataclass looks its module up)
    try:
        exec(compile(src, _SOURCE_PATH, "exec"), mod.__dict__)
    finally:
        del sys.modules[mod.__name__]
    return mod


def config(mod, **kw):
    base = dict(block_size=8, vocab_size=19, n_layer=2, n_head=2, n_embd=8, dropout=0.0, bias=True)
    base.update(kw)
    return mod.GPTConfig(**base)


def pair(flash=True, **kw):
    """(torch GPT, jitgrad GPT) with the same weights: torch's state_dict loaded strictly."""
    mods = load_model_module("torch"), load_model_module("jitgrad")
    torch.manual_seed(0)
    tm = mods[0].GPT(config(mods[0], **kw))
    jm = mods[1].GPT(config(mods[1], **kw))
    sd = tm.state_dict()
    assert "lm_head.weight" in sd and "transformer.wte.weight" in sd   # torch keeps both names of the tie
    result = jm.load_state_dict({k: jitgrad.tensor(v.numpy()) for k, v in sd.items()})
    assert not result.missing_keys and not result.unexpected_keys
    assert list(jm.state_dict()) == list(sd)
    assert jm.transformer.wte.weight is jm.lm_head.weight
    return tm, jm


def batches(n, vocab=19, b=3, t=8, seed=1):
    rng = np.random.default_rng(seed)
    return [(rng.integers(0, vocab, size=(b, t)), rng.integers(0, vocab, size=(b, t))) for _ in range(n)]


def close(j, t, tol=2e-5):
    np.testing.assert_allclose(j.detach().numpy(), t.detach().numpy(), rtol=tol, atol=tol)


@pytest.fixture(params=["flash", "manual"])
def attention(request, monkeypatch):
    """'manual': F.scaled_dot_product_attention hidden from both libraries, as on torch < 2.0."""
    if request.param == "manual":
        monkeypatch.delattr(torch.nn.functional, "scaled_dot_product_attention")
        monkeypatch.delattr(jitgrad.nn.functional, "scaled_dot_product_attention")
    return request.param


def test_forward_backward_and_adamw_steps_match_torch(attention, capsys):
    tm, jm = pair()
    assert jm.transformer.h[0].attn.flash == (attention == "flash") == tm.transformer.h[0].attn.flash
    assert jm.get_num_params() == tm.get_num_params()
    assert [n for n, _ in jm.named_parameters()] == [n for n, _ in tm.named_parameters()]
    opts = [m.configure_optimizers(0.1, 1e-2, (0.9, 0.95), "cpu") for m in (tm, jm)]
    assert [len(g["params"]) for g in opts[1].param_groups] == [len(g["params"]) for g in opts[0].param_groups]
    for x, y in batches(3):
        out = []
        for T, m, opt in zip((torch, jitgrad), (tm, jm), opts):
            logits, loss = m(T.tensor(x), T.tensor(y))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            out.append((logits, loss, {n: p.grad for n, p in m.named_parameters()}))
            opt.step()
        close(out[1][0], out[0][0])
        close(out[1][1], out[0][1])
        for n, g in out[0][2].items():
            close(out[1][2][n], g, 1e-4)
    for (n, p), (_, q) in zip(tm.named_parameters(), jm.named_parameters()):
        close(q, p, 1e-4)
    printed = capsys.readouterr().out
    for line in ("num decayed parameter tensors: 10, with 1,752 parameters", "using fused AdamW: False",
                 "num non-decayed parameter tensors: 18, with 224 parameters"):
        assert printed.count(line) == 2   # torch's and jitgrad's run print the same


def test_generate_and_crop_block_size_match_torch(attention):
    tm, jm = pair()
    for m in (tm, jm):
        m.eval()
    start = np.array([[1, 2, 3], [4, 5, 6]])
    # top_k=1 leaves one token with probability 1: multinomial's draw is determined
    gen = [m.generate(T.tensor(start), 7, temperature=0.8, top_k=1) for T, m in ((torch, tm), (jitgrad, jm))]
    np.testing.assert_array_equal(gen[1].numpy(), gen[0].numpy())   # past block_size: the context is cropped
    for m in (tm, jm):
        m.crop_block_size(4)
    assert tuple(jm.transformer.wpe.weight.shape) == (4, 8)
    assert list(jm.state_dict()) == list(tm.state_dict())
    if attention == "manual":
        assert tuple(jm.transformer.h[0].attn.bias.shape) == (1, 1, 4, 4)
    idx = np.array([[7, 8, 9, 10]])
    close(jm(jitgrad.tensor(idx))[0], tm(torch.tensor(idx))[0])
    with pytest.raises(AssertionError, match="block size is only 4"):
        jm(jitgrad.tensor(np.zeros((1, 5), dtype=np.int64)))
    gen = [m.generate(T.tensor(idx), 3, top_k=1) for T, m in ((torch, tm), (jitgrad, jm))]
    np.testing.assert_array_equal(gen[1].numpy(), gen[0].numpy())
    # sampling: tokens of the vocabulary, the prompt kept
    jitgrad.manual_seed(3)
    out = jm.generate(jitgrad.tensor(idx), 4, top_k=5)
    assert tuple(out.shape) == (1, 8) and out.dtype == jitgrad.int64
    assert (out[:, :4] == jitgrad.tensor(idx)).all() and ((out >= 0) & (out < 19)).all()


def test_dropout_training_without_bias_and_checkpoint_round_trip(tmp_path):
    tm, jm = pair(dropout=0.2, bias=False)
    assert jm.transformer.ln_f.bias is None and "transformer.ln_f.bias" not in jm.state_dict()
    opt = jm.configure_optimizers(0.1, 3e-3, (0.9, 0.95), "cpu")
    (x, y), = batches(1)
    jm.train()
    losses = []
    for _ in range(4):
        _, loss = jm(jitgrad.tensor(x), jitgrad.tensor(y))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert np.isfinite(losses).all()
    # checkpoint: both names of the tied weight written and read back, strict loading into a new model
    path = tmp_path / "ckpt.jg"
    jitgrad.save({"model": jm.state_dict(), "optimizer": opt.state_dict()}, path)
    ck = jitgrad.load(path)
    assert ck["model"]["lm_head.weight"].data_ptr() == ck["model"]["transformer.wte.weight"].data_ptr()
    mod = load_model_module("jitgrad")
    fresh = mod.GPT(config(mod, dropout=0.2, bias=False))
    fresh.load_state_dict(ck["model"])
    assert fresh.transformer.wte.weight is fresh.lm_head.weight
    for m in (jm, fresh):
        m.eval()   # dropout off: the same function
    close(fresh(jitgrad.tensor(x), jitgrad.tensor(y))[1], jm(jitgrad.tensor(x), jitgrad.tensor(y))[1], 1e-6)
    # and the model, trained on jitgrad, loads strictly into torch's nanoGPT
    tfresh = load_model_module("torch").GPT(config(load_model_module("torch"), dropout=0.2, bias=False))
    tfresh.load_state_dict({k: torch.tensor(v.numpy()) for k, v in jm.state_dict().items()})
    tfresh.eval()
    close(jm(jitgrad.tensor(x), jitgrad.tensor(y))[1], tfresh(torch.tensor(x), torch.tensor(y))[1])


def test_adamw_takes_torchs_implementation_flags():
    """configure_optimizers(device_type="cuda") passes fused=True when AdamW's signature names it."""
    assert "fused" in inspect.signature(jitgrad.optim.AdamW).parameters
    p = [jitgrad.zeros(3, requires_grad=True)]
    for kw in (dict(fused=True), dict(foreach=True), dict(foreach=False, fused=False)):
        jitgrad.optim.AdamW(p, **kw)
        jitgrad.optim.Adam(p, **kw)
    with pytest.raises(RuntimeError, match="`fused` and `foreach` cannot be `True` together."):
        jitgrad.optim.AdamW(p, fused=True, foreach=True)
    with pytest.raises(NotImplementedError, match="differentiable"):
        jitgrad.optim.AdamW(p, differentiable=True)
