"""issue 26's names on CUDA tensors against the CPU: diag / diag_embed / tile (their gathers and
scatter read positions uploaded to the device), F.pad in each mode, scaled_dot_product_attention
(causal, masks), repeat_interleave, rms_norm; forward and backward."""
import numpy as np
import pytest
from test_nn_linalg import check

import jitgrad
import jitgrad.nn.functional as F

rng = np.random.default_rng(0)


@pytest.mark.parametrize("fn,shapes", [
    (lambda x: jitgrad.diag(x, 1), [(3,)]), (lambda x: jitgrad.diag(x, -1), [(3, 4)]),
    (lambda x: jitgrad.diag_embed(x, 1, 0, 2), [(2, 3)]), (lambda x: jitgrad.tile(x, (2, 1, 2)), [(2, 3)]),
    (lambda x: F.pad(x, (1, 2, -1, 1), value=0.5), [(2, 3, 4)]), (lambda x: F.pad(x, (1, 2), mode="reflect"), [(2, 3, 4)]),
    (lambda x: F.pad(x, (1, 2, 2, 1), mode="replicate"), [(2, 3, 4)]),
    (lambda x: F.pad(x, (1, 2), mode="circular"), [(2, 3, 4)]),
    (lambda x: x.repeat_interleave(2, dim=1), [(2, 3)]), (lambda x: F.rms_norm(x, (4,)), [(2, 3, 4)]),
    (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), [(2, 5, 4), (2, 5, 4), (2, 5, 3)]),
    (lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), [(2, 5, 4), (2, 6, 4), (2, 6, 3),
                                                                             (5, 6)]),
])
def test_against_cpu(fn, shapes):
    check(fn, *[rng.standard_normal(s) for s in shapes])   # (float32 rounding: the CPU tests hold it to torch)
