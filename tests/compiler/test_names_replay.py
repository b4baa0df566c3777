"""jitgrad.compile traces issue 26's ops without a graph break (the causal mask and the padding
value are made by Python instructions at each replay) and replays a training step that uses
them as eager jitgrad runs it: scaled_dot_product_attention (causal and masked), diag,
diag_embed, tile, F.pad (constant with a value, reflect), rms_norm, repeat_interleave."""
import numpy as np
import pytest

import jitgrad
import jitgrad.nn.functional as F


def step(q, k, v, w, m):
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True) + F.scaled_dot_product_attention(q, k, v, m)
    z = jitgrad.diag(y.sum((0, 2))) @ w
    z = F.pad(z, (1, 1), mode="reflect") + F.pad(z, (1, 1), value=0.5) + jitgrad.diag_embed(w[0], 2)[:4]
    z = z + jitgrad.tile(w, (1, 1)).sum() + F.rms_norm(y, (3,)).repeat_interleave(2, dim=-1).sum()
    loss = (z * z).sum()
    loss.backward()
    return loss


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_replays_as_eager(dtype):
    rng = np.random.default_rng(0)
    shapes = ((2, 4, 3), (2, 4, 3), (2, 4, 3), (4, 5), (4, 4))
    compiled = jitgrad.compile(step)
    for _ in range(3):
        arrays = [rng.standard_normal(s) for s in shapes]
        outs = []
        for fn in (step, compiled):
            ts = [jitgrad.tensor(a, dtype=getattr(jitgrad, dtype), requires_grad=k < 4) for k, a in enumerate(arrays)]
            loss = fn(*ts)
            outs.append([loss.detach().numpy()] + [t.grad.numpy() for t in ts[:4]])
        tol = dict(rtol=1e-10, atol=1e-10) if dtype == "float64" else dict(rtol=2e-4, atol=2e-4)
        for a, b in zip(*outs):
            np.testing.assert_allclose(b, a, **tol)
    args = [jitgrad.tensor(rng.standard_normal(s), requires_grad=k < 4) for k, s in enumerate(shapes)]
    assert jitgrad.compiler.explain(step, *args).graph_break_count == 0
