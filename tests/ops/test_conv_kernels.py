"""The compiled conv and pool loops (kernels/conv.py) against their numpy forms, over many
random geometries: strides, paddings and dilations that put whole rows and columns of
windows in the padding, kernels as large as the padded input, and ceil-mode pooling.
The numpy forms are what runs under NUMBA_DISABLE_JIT; test_conv_pool.py holds both to torch."""
import numpy as np
import pytest

from jitgrad.kernels import conv as K
from jitgrad.nn.conv import _pool_out

rng = np.random.default_rng(11)


def random_conv_geom():
    n, cg, groups = rng.integers(1, 3), rng.integers(1, 4), rng.integers(1, 3)
    kh, kw = rng.integers(1, 5, 2)
    sh, sw, dh, dw = rng.integers(1, 4, 4)
    pt, pl = rng.integers(0, 4, 2)
    h, w = rng.integers(1, 9, 2)
    # the padded input must hold one dilated kernel
    h = max(h, dh * (kh - 1) + 1 - pt)
    w = max(w, dw * (kw - 1) + 1 - pl)
    pb, pr = rng.integers(0, 4, 2)
    ho = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
    wo = (w + pl + pr - dw * (kw - 1) - 1) // sw + 1
    cout = groups * rng.integers(1, 3)
    return np.array([n, cg * groups, h, w, cout, cg, kh, kw, sh, sw, pt, pl, dh, dw, groups, ho, wo], np.int64)


@pytest.mark.parametrize("seed", range(40))
def test_im2col_and_col2im_match_numpy(seed):
    geom = random_conv_geom()
    n, c, h, w, _, cg, kh, kw = geom[:8]
    ho, wo = geom[15:]
    x = rng.standard_normal(n * c * h * w)
    base = (n - 1) * c * h * w + (c - cg) * h * w  # the last sample's last group
    got = np.full((cg * kh * kw, ho * wo), np.nan)
    want = np.full_like(got, np.nan)
    K._im2col_nb(x, base, geom, got)
    K._im2col_np(x, base, geom, want)
    np.testing.assert_array_equal(got, want)
    cols = rng.standard_normal(got.shape)
    dx_got, dx_want = np.ones_like(x), np.ones_like(x)
    K._col2im_add_nb(cols, dx_got, base, geom)
    K._col2im_add_np(cols, dx_want, base, geom)
    np.testing.assert_allclose(dx_got, dx_want, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("seed", range(30))
def test_max_pool_matches_numpy(seed):
    planes, h, w = rng.integers(1, 4), rng.integers(1, 9), rng.integers(1, 9)
    kh, kw = rng.integers(1, 4, 2)
    sh, sw, dh, dw = rng.integers(1, 3, 4)
    ph, pw = rng.integers(0, kh // 2 + 1), rng.integers(0, kw // 2 + 1)
    h = max(h, dh * (kh - 1) + 1 - 2 * ph)  # the padded input holds one dilated window
    w = max(w, dw * (kw - 1) + 1 - 2 * pw)
    ceil = bool(rng.integers(0, 2))
    ho, wo = _pool_out(h, kh, sh, ph, dh, ceil), _pool_out(w, kw, sw, pw, dw, ceil)
    x = rng.standard_normal(planes * h * w)
    x[rng.random(x.size) < 0.1] = np.nan
    x[rng.random(x.size) < 0.1] = -np.inf
    pgeom = np.array([planes, h, w, kh, kw, sh, sw, ph, pw, dh, dw, ho, wo], np.int64)
    (o1, a1), (o2, a2) = K._pool_nb(x, pgeom), K._pool_np(x, pgeom)
    np.testing.assert_array_equal(o1, o2)
    np.testing.assert_array_equal(a1, a2)
