"""Module traversal and state dicts with shared tensors and modules, as torch: a tied weight
(GPT's lm_head.weight = wte.weight) has both keys in state_dict, in torch's order, so that
torch checkpoints of weight-tied models load strictly; named_parameters / named_buffers /
named_modules deduplicate unless remove_duplicate=False; jitgrad.save / load keeps the tie;
nn.DataParallel wraps a module under `module.` and calls it."""
import numpy as np
import pytest

import jitgrad

torch = pytest.importorskip("torch")


def tied(T):
    class LM(T.nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = T.nn.Embedding(5, 3)
            self.norm = T.nn.BatchNorm1d(3)
            self.block = T.nn.Sequential(T.nn.Linear(3, 3), T.nn.ReLU())
            self.again = self.block   # a shared submodule: its tensors under two prefixes
            self.lm_head = T.nn.Linear(3, 5, bias=False)
            self.wte.weight = self.lm_head.weight
            self.register_buffer("scratch", T.zeros(2), persistent=False)
            self.register_buffer("empty", None)
    return LM()


def names(pairs):
    return [n for n, _ in pairs]


def test_state_dict_keys_and_order_match_torch():
    t, j = tied(torch), tied(jitgrad)
    assert list(j.state_dict()) == list(t.state_dict())
    assert "lm_head.weight" in j.state_dict() and "again.0.weight" in j.state_dict()
    assert list(j.state_dict(prefix="model.")) == list(t.state_dict(prefix="model."))
    sd = j.state_dict(keep_vars=True)
    assert sd["lm_head.weight"] is sd["wte.weight"] is j.lm_head.weight


@pytest.mark.parametrize("method", ["named_parameters", "named_buffers", "named_modules"])
@pytest.mark.parametrize("remove_duplicate", [True, False])
def test_named_members_dedup_as_torch(method, remove_duplicate):
    t, j = tied(torch), tied(jitgrad)
    kw = dict(remove_duplicate=remove_duplicate)
    assert names(getattr(j, method)(**kw)) == names(getattr(t, method)(**kw))
    assert names(getattr(j, method)(prefix="p", **kw)) == names(getattr(t, method)(prefix="p", **kw))
    assert len(list(j.parameters())) == len(list(t.parameters()))


def test_torch_checkpoint_of_a_tied_model_loads_strictly():
    t, j = tied(torch), tied(jitgrad)
    with torch.no_grad():
        t.lm_head.weight.normal_()
    sd = {k: jitgrad.tensor(v.numpy()) for k, v in t.state_dict().items()}
    result = j.load_state_dict(sd)
    assert result.missing_keys == [] and result.unexpected_keys == []
    assert repr(result) == repr(t.load_state_dict(t.state_dict())) == "<All keys matched successfully>"
    assert j.wte.weight is j.lm_head.weight   # still tied, with torch's values
    np.testing.assert_array_equal(j.wte.weight.detach().numpy(), t.wte.weight.detach().numpy())
    # a checkpoint without the second name is incomplete for torch too: strict loading names it
    del sd["lm_head.weight"]
    with pytest.raises(RuntimeError, match='Missing key\\(s\\) in state_dict: "lm_head.weight"'):
        j.load_state_dict(sd)
    with pytest.raises(RuntimeError, match="Error\\(s\\) in loading state_dict for LM"):
        t.load_state_dict({k: torch.tensor(v.numpy()) for k, v in sd.items()})
    partial = j.load_state_dict(sd, strict=False)
    assert partial.missing_keys == ["lm_head.weight"]
    assert repr(partial) == "_IncompatibleKeys(missing_keys=['lm_head.weight'], unexpected_keys=[])"  # torch's


def test_error_order_is_torchs():
    for T in (torch, jitgrad):
        m = T.nn.Linear(2, 2)
        sd = {"weight": T.zeros(3, 3), "extra": T.zeros(1)}
        with pytest.raises(RuntimeError) as e:
            m.load_state_dict(sd)
        lines = str(e.value).split("\n\t")
        assert lines[1].startswith("Missing key(s)") and lines[2].startswith("Unexpected key(s)")
        assert lines[3].startswith("size mismatch for weight")


def test_save_load_round_trip_keeps_the_tie(tmp_path):
    j = tied(jitgrad)
    path = tmp_path / "tied.jg"
    jitgrad.save(j.state_dict(), path)
    sd = jitgrad.load(path)
    assert list(sd) == list(j.state_dict())
    assert sd["wte.weight"].data_ptr() == sd["lm_head.weight"].data_ptr()   # one storage, as torch.load gives
    fresh = tied(jitgrad)
    fresh.load_state_dict(sd)
    np.testing.assert_array_equal(fresh.lm_head.weight.detach().numpy(), j.lm_head.weight.detach().numpy())


def test_data_parallel_on_one_device_calls_the_module():
    for T in (torch, jitgrad):
        inner = T.nn.Linear(2, 3)
        dp = T.nn.DataParallel(inner)
        # with a device (CI's CUDA simulator too) torch's DataParallel takes device 0 and moves the module there
        assert dp.module is inner and dp.device_ids == ([0] if T.cuda.is_available() else [])
        assert list(dp.state_dict()) == ["module.weight", "module.bias"]
        assert names(dp.named_parameters()) == ["module.weight", "module.bias"]
        x = T.ones(4, 2)
        on = next(inner.parameters()).device  # the module's device after wrapping (the inputs go there)
        np.testing.assert_array_equal(dp(x).detach().cpu().numpy(), inner(x.to(on)).detach().cpu().numpy())
        assert repr(dp).startswith("DataParallel(\n  (module): Linear(")
    assert jitgrad.nn.parallel.DataParallel is jitgrad.nn.DataParallel
    # a checkpoint saved from the wrapped model loads into a wrapped one
    src = torch.nn.DataParallel(torch.nn.Linear(2, 3))
    dst = jitgrad.nn.DataParallel(jitgrad.nn.Linear(2, 3))
    dst.load_state_dict({k: jitgrad.tensor(v.numpy()) for k, v in src.state_dict().items()})
    np.testing.assert_array_equal(dst.module.weight.detach().cpu().numpy(), src.module.weight.detach().numpy())
