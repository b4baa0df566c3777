"""F.pad: constant padding of any trailing dims (a negative pad crops), and the reflect /
replicate / circular modes of torch's supported ranks. Every mode is one of indexing's two
primitives at positions computed on the host: constant padding scatters the (cropped) input
into the padded shape (ConstantPadNdBackward0; a nonzero value is added where nothing was
placed), the other modes gather from the input under torch's node names."""
import operator

import numpy as np

from jitgrad._core.capture import state as _cap
from jitgrad.gpu.array import DeviceArray
from jitgrad.graph.tensor import Tensor, place
from jitgrad.graph.tensor import wrap as _wrap
from jitgrad.ops.nn import CONSTANT_PAD_ND, INDEX, PAD_SPECS, _pad_source
from jitgrad.ops.shape import index_flat, index_put_flat, narrow

_SUPPORTED = ("Supported combinations for non-constant padding:\n"
              "  - 2D or 3D input: padding size = 2 (pads last dimension)\n"
              "  - 3D or 4D input: padding size = 4 (pads last 2 dimensions)\n"
              "  - 4D or 5D input: padding size = 6 (pads last 3 dimensions)")


def _pads(pad, ndim):
    if not isinstance(pad, (tuple, list)):
        raise TypeError(f"pad(): argument 'pad' (position 2) must be tuple of ints, not {type(pad).__name__}")
    for k, p in enumerate(pad):
        if isinstance(p, (bool, np.bool_)) or not hasattr(p, "__index__"):
            raise TypeError(f"pad(): argument 'pad' (position 2) must be tuple of ints, but found element of type "
                            f"{type(p).__name__} at pos {k}")
    pad = tuple(operator.index(p) for p in pad)
    if len(pad) % 2:
        raise RuntimeError("Padding length must be divisible by 2")
    if len(pad) // 2 > ndim:
        raise RuntimeError(f"Padding length should be less than or equal to two times the input dimension but got "
                           f"padding length {len(pad)} and input of dimension {ndim}")
    # (lo, hi) of each padded dim, first dim first (pad lists the last dim first)
    return [(pad[2 * k], pad[2 * k + 1]) for k in range(len(pad) // 2)][::-1]


def _on(x, idx):
    return DeviceArray.from_host(idx) if type(x._data) is DeviceArray else idx


def _flat(shape, sources):
    """Flat index in an array of `shape` of each element of the grid whose trailing dims
    read the given per-dim source positions (leading dims whole)."""
    k = len(sources)
    lead = shape[:len(shape) - k]
    grids = np.ix_(*[np.arange(n) for n in lead], *sources)
    flat = 0
    for g, n in zip(grids, shape):
        flat = flat * n + g
    return np.asarray(flat, dtype=np.int64).reshape(-1), tuple(lead) + tuple(s.size for s in sources)


def _constant(x, pairs, value):
    shape = tuple(x.shape)
    off = len(shape) - len(pairs)
    for k, (lo, hi) in enumerate(pairs):  # negative pads crop first (torch narrows)
        d = off + k
        if lo < 0 or hi < 0:
            start = -lo if lo < 0 else 0
            x = narrow(x, d, start, x.shape[d] - start - (-hi if hi < 0 else 0))
    shape = tuple(x.shape)
    pairs = [(max(lo, 0), max(hi, 0)) for lo, hi in pairs]
    out_shape = shape[:off] + tuple(n + lo + hi for n, (lo, hi) in zip(shape[off:], pairs))
    dest, _ = _flat(out_shape, [np.arange(lo, lo + n) for n, (lo, _) in zip(shape[off:], pairs)])
    if x.dtype.np.kind != "f":   # no graph for integers and bools: torch pads them as well
        out = np.full(out_shape, value or 0, dtype=x.dtype.np)
        out.reshape(-1)[dest] = x.numpy().reshape(-1)
        return _wrap(place(out, x.device))
    res = index_put_flat(x, _on(x, dest), out_shape, CONSTANT_PAD_ND)
    if value:
        dt, dev = x.dtype.np, x.device

        def fill():  # value where nothing was placed
            empty = np.full(out_shape, value, dtype=dt)
            empty.reshape(-1)[dest] = 0
            return (place(empty, dev),)
        (filled,) = (_wrap(a) for a in fill())
        if _cap.on and _cap.mine():  # jitgrad.compile: a Python instruction makes it at each replay
            _cap.rec.python(fill, (), (filled,), "padding value")
        res = res + filled
    return res


def pad(input, pad, mode="constant", value=None):
    if not isinstance(input, Tensor):
        raise TypeError(f"pad(): argument 'input' (position 1) must be Tensor, not {type(input).__name__}")
    pairs = _pads(pad, input.ndim)
    if mode == "constant":
        return _constant(input, pairs, value)
    if mode not in ("reflect", "replicate", "circular"):
        raise NotImplementedError(f"Unrecognised padding mode {mode}")
    if value is not None and value != 0:
        raise RuntimeError(f'Padding mode "{mode}" doesn\'t take in value argument')
    k = len(pairs)
    if not (1 <= k <= 3 and input.ndim in (k + 1, k + 2)):
        raise NotImplementedError(f"Padding size {2 * k} is not supported for {input.ndim}D input tensor.\n"
                                  + _SUPPORTED)
    shape = tuple(input.shape)
    spatial = shape[-k:]
    for d, (n, (lo, hi)) in enumerate(zip(spatial, pairs)):
        if mode == "reflect" and (lo >= n or hi >= n):
            dim = input.ndim - k + d
            raise RuntimeError(f"Argument #{4 + 2 * (k - 1 - d)}: Padding size should be less than the corresponding "
                               f"input dimension, but got: padding ({lo}, {hi}) at dimension {dim} of input "
                               f"{list(shape)}")
        if mode == "circular" and (lo > n or hi > n):
            raise RuntimeError("Padding value causes wrapping around more than once.")
        if mode != "circular" and (n + lo + hi) <= 0:
            raise RuntimeError(f"input tensor is too small for padding: output size {n + lo + hi}")
    sources = [_pad_source(n, lo, hi, mode) for n, (lo, hi) in zip(spatial, pairs)]
    idx, out_shape = _flat(shape, sources)
    return index_flat(input, _on(input, idx), out_shape, PAD_SPECS.get((mode, k), INDEX))
