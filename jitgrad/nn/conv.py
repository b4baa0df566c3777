"""2-D convolution and max pooling, as torch.nn.Conv2d / MaxPool2d and F.conv2d / F.max_pool2d.

Each op is one custom autograd Function (one graph node, named like PyTorch's:
ConvolutionBackward0, MaxPool2DWithIndicesBackward0) computed in numpy:

* conv2d forward: im2col through a strided view of the zero-padded input, then one GEMM
  per group. Backward: grad_weight by GEMM against the saved columns, grad_input by a
  GEMM to columns then col2im as kh*kw strided slice additions, grad_bias by a sum.
* max_pool2d forward: the windows of the -inf padded input as a strided view, max over the
  kh*kw window planes (the first maximum, NaN propagating, as PyTorch). Backward scatter-adds the
  gradient to the argmax positions (np.bincount).

The backwards are once-differentiable (no double backward).
"""

import numpy as np
from numpy.lib.stride_tricks import as_strided

from .._tensor import Tensor, empty
from .. import _dtype
from ..autograd.function import Function, once_differentiable
from ..ops import functional as _F
from . import init
from .module import Module
from .parameter import Parameter

_TYPE = {"float32": "FloatTensor", "float64": "DoubleTensor", "float16": "HalfTensor"}


def _pair(v, name="value"):
    if isinstance(v, (tuple, list)):
        if len(v) == 1:
            return (int(v[0]),) * 2
        if len(v) != 2:
            raise RuntimeError(f"expected {name} to be a single integer value or a list of 2 values to match "
                               f"the convolution dimensions, but got {name}={list(v)}")
        return (int(v[0]), int(v[1]))
    return (int(v), int(v))


def _size(shape):
    return "[" + ", ".join(str(int(s)) for s in shape) + "]"


def _name(cls, name):
    """Give a Function's node and ctx classes PyTorch's node name."""
    for c in (cls._node_cls, cls._backward_cls):
        c.__name__ = c.__qualname__ = name
    return cls


# ============================================================================= conv2d

def _windows(xp, kh, kw, ho, wo, stride, dilation):
    """(N, C, kh, kw, Ho, Wo) view of the padded input xp."""
    n, c = xp.shape[:2]
    sn, sc, sh, sw = xp.strides
    return as_strided(xp, (n, c, kh, kw, ho, wo),
                      (sn, sc, sh * dilation[0], sw * dilation[1], sh * stride[0], sw * stride[1]),
                      writeable=False)


class _Convolution(Function):
    @staticmethod
    def forward(ctx, input, weight, bias, stride, pads, dilation, groups):
        x = input._data                    # (N, C, H, W): conv2d unsqueezes unbatched input
        w = weight._data
        n, c, h, wd = x.shape
        cout, cg, kh, kw = w.shape
        pt, pb, pl, pr = pads
        if pt or pb or pl or pr:
            xp = np.zeros((n, c, h + pt + pb, wd + pl + pr), dtype=x.dtype)
            xp[:, :, pt:pt + h, pl:pl + wd] = x
        else:
            xp = x
        hp, wp = xp.shape[2:]
        ho = (hp - dilation[0] * (kh - 1) - 1) // stride[0] + 1
        wo = (wp - dilation[1] * (kw - 1) - 1) // stride[1] + 1
        g = groups
        k = cg * kh * kw
        # im2col: (C, kh, kw, N, Ho, Wo) -> (G, Cg*kh*kw, N*Ho*Wo), one copy
        cols = _windows(xp, kh, kw, ho, wo, stride, dilation).transpose(1, 2, 3, 0, 4, 5).reshape(g, k, -1)
        wmat = w.reshape(g, cout // g, k)
        out = np.matmul(wmat, cols) if g > 1 else (wmat[0] @ cols[0])[None]
        out = out.reshape(cout, n, ho, wo).transpose(1, 0, 2, 3)
        if bias is not None:
            out = out + bias._data.reshape(1, -1, 1, 1)
        out = np.ascontiguousarray(out, dtype=x.dtype)
        # the im2col columns go through save_for_backward so that they are freed with the
        # rest of the graph's saved values after a backward without retain_graph; input is
        # saved too, only so that an in-place change to it is reported as torch does
        ctx.save_for_backward(input, weight, _F._wrap(cols))
        ctx.geom = ((n, c, h, wd), (hp, wp), (ho, wo), stride, pads, dilation, groups,
                    bias is not None)
        return _F._wrap(out)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        input, weight, cols = ctx.saved_tensors
        (n, c, h, wd), (hp, wp), (ho, wo), stride, pads, dilation, g, has_bias = ctx.geom
        w = weight._data
        cout, cg, kh, kw = w.shape
        go = grad_out._data
        dtype = w.dtype
        gmat = np.ascontiguousarray(go.transpose(1, 0, 2, 3), dtype=dtype).reshape(g, cout // g, -1)
        need = ctx.needs_input_grad
        gi = gw = gb = None
        if need[1]:
            cols = cols._data
            gw = np.matmul(gmat, cols.transpose(0, 2, 1)) if g > 1 else (gmat[0] @ cols[0].T)[None]
            gw = _F._wrap(gw.reshape(w.shape).astype(dtype, copy=False))
        if need[0]:
            wmat = w.reshape(g, cout // g, cg * kh * kw)
            gcols = np.matmul(wmat.transpose(0, 2, 1), gmat) if g > 1 else (wmat[0].T @ gmat[0])[None]
            gcols = gcols.reshape(c, kh, kw, n, ho, wo)
            gxp = np.zeros((n, c, hp, wp), dtype=dtype)
            gxp_t = gxp.transpose(1, 0, 2, 3)  # (C, N, Hp, Wp) view matching gcols' layout
            sh, sw = stride
            dh, dw = dilation
            for i in range(kh):
                r0 = i * dh
                for j in range(kw):
                    c0 = j * dw
                    gxp_t[:, :, r0:r0 + sh * (ho - 1) + 1:sh, c0:c0 + sw * (wo - 1) + 1:sw] += gcols[:, i, j]
            pt, pb, pl, pr = pads
            gx = gxp[:, :, pt:pt + h, pl:pl + wd]
            gi = _F._wrap(np.ascontiguousarray(gx))
        if has_bias and need[2]:
            gb = _F._wrap(go.sum(axis=(0, 2, 3)).astype(dtype, copy=False))
        return gi, gw, gb, None, None, None, None


_name(_Convolution, "ConvolutionBackward0")


def _conv_pads(padding, kernel, dilation, stride):
    """(top, bottom, left, right) for an int/tuple/'same'/'valid' padding."""
    if isinstance(padding, str):
        if padding == "valid":
            return (0, 0, 0, 0)
        if padding == "same":
            if stride != (1, 1):
                raise RuntimeError("padding='same' is not supported for strided convolutions")
            pads = []
            for k, d in zip(kernel, dilation):
                total = d * (k - 1)
                pads += [total // 2, total - total // 2]  # PyTorch puts the odd one at the end
            return tuple(pads)
        raise RuntimeError(f"Invalid padding string: '{padding}'")
    ph, pw = _pair(padding, "padding")
    if ph < 0 or pw < 0:
        raise RuntimeError("negative padding is not supported")
    return (ph, ph, pw, pw)


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """2-D cross-correlation of input (N, C, H, W) or (C, H, W) with weight (Cout, C/groups, kh, kw)."""
    if not isinstance(input, Tensor) or not isinstance(weight, Tensor):
        raise TypeError("conv2d(): argument 'input' and 'weight' must be Tensor")
    x, w = input._data, weight._data
    if x.ndim not in (3, 4):
        raise RuntimeError(f"Expected 3D (unbatched) or 4D (batched) input to conv2d, but got input of size: "
                           f"{_size(x.shape)}")
    if w.ndim != 4:
        raise RuntimeError(f"weight should have at least three dimensions, got {w.ndim}" if w.ndim < 3 else
                           f"Expected {w.ndim}-dimensional input for {w.ndim}-dimensional weight "
                           f"{_size(w.shape)}, but got {x.ndim}-dimensional input of size {_size(x.shape)} instead")
    if x.dtype != w.dtype:
        raise RuntimeError(f"Input type (torch.{_TYPE.get(x.dtype.name, x.dtype.name)}) and weight type "
                           f"(torch.{_TYPE.get(w.dtype.name, w.dtype.name)}) should be the same or input should "
                           "be a MKLDNN tensor and weight is a dense tensor")
    if bias is not None and bias._data.dtype != x.dtype:
        raise RuntimeError(f"Input type (torch.{_TYPE.get(x.dtype.name, x.dtype.name)}) and bias type "
                           f"(torch.{_TYPE.get(bias._data.dtype.name, bias._data.dtype.name)}) should be the same")
    if x.dtype.kind != "f":
        raise RuntimeError(f"\"conv2d\" not implemented for '{x.dtype.name}'")
    stride, dilation = _pair(stride, "stride"), _pair(dilation, "dilation")
    groups = int(groups)
    if min(stride) <= 0:
        raise RuntimeError("non-positive stride is not supported")
    if min(dilation) <= 0:
        raise RuntimeError("dilation should be greater than zero")
    if groups <= 0:
        raise RuntimeError("non-positive groups is not supported")
    kernel = tuple(w.shape[2:])
    pads = _conv_pads(padding, kernel, dilation, stride)
    batched = x if x.ndim == 4 else x[None]
    cin = batched.shape[1]
    if w.shape[0] % groups:
        raise RuntimeError(f"Given groups={groups}, expected weight to be divisible by {groups} at dimension 0, "
                           f"but got weight of size {_size(w.shape)} instead")
    if cin != w.shape[1] * groups:
        raise RuntimeError(f"Given groups={groups}, weight of size {_size(w.shape)}, expected input"
                           f"{_size(x.shape)} to have {w.shape[1] * groups} channels, but got {cin} channels instead")
    if bias is not None and tuple(bias._data.shape) != (w.shape[0],):
        raise RuntimeError(f"Given weight of size {_size(w.shape)}, expected bias to be 1-dimensional with "
                           f"{w.shape[0]} elements, but got bias of size {_size(bias._data.shape)} instead")
    hp = batched.shape[2] + pads[0] + pads[1]
    wp = batched.shape[3] + pads[2] + pads[3]
    ekh = dilation[0] * (kernel[0] - 1) + 1
    ekw = dilation[1] * (kernel[1] - 1) + 1
    if hp < ekh or wp < ekw:
        raise RuntimeError(f"Calculated padded input size per channel: ({hp} x {wp}). Kernel size: ({ekh} x {ekw}). "
                           "Kernel size can't be greater than actual input size")
    if x.ndim == 3:  # as PyTorch: unsqueeze, convolve, squeeze (SqueezeBackward1 on top)
        return _Convolution.apply(input.unsqueeze(0), weight, bias, stride, pads, dilation, groups).squeeze(0)
    return _Convolution.apply(input, weight, bias, stride, pads, dilation, groups)


class Conv2d(Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1,
                 bias=True, padding_mode="zeros", device=None, dtype=None):
        super().__init__()
        if groups <= 0:
            raise ValueError("groups must be a positive integer")
        if in_channels % groups != 0:
            raise ValueError("in_channels must be divisible by groups")
        if out_channels % groups != 0:
            raise ValueError("out_channels must be divisible by groups")
        if padding_mode not in ("zeros", "reflect", "replicate", "circular"):
            raise ValueError("padding_mode must be one of ['zeros', 'reflect', 'replicate', 'circular'], "
                             f"but got padding_mode='{padding_mode}'")
        if padding_mode != "zeros":
            raise NotImplementedError(f"jitgrad: Conv2d with padding_mode='{padding_mode}' is not supported")
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size = _pair(kernel_size, "kernel_size")
        self.stride = _pair(stride, "stride")
        self.dilation = _pair(dilation, "dilation")
        if isinstance(padding, str):
            if padding not in ("valid", "same"):
                raise ValueError(f"Invalid padding string {padding!r}, should be one of {{'valid', 'same'}}")
            if padding == "same" and any(s != 1 for s in self.stride):
                raise ValueError("padding='same' is not supported for strided convolutions")
            self.padding = padding
        else:
            self.padding = _pair(padding, "padding")
        self.groups = groups
        self.padding_mode = padding_mode
        self.transposed = False
        self.output_padding = (0, 0)
        dtype = dtype or _dtype.get_default_dtype()
        self.weight = Parameter(empty(out_channels, in_channels // groups, *self.kernel_size, dtype=dtype))
        if bias:
            self.bias = Parameter(empty(out_channels, dtype=dtype))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self):
        init.default_layer_init_(self.weight, self.bias)

    def forward(self, x):
        return conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)

    def extra_repr(self):
        s = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        if self.padding != (0, 0):
            s += f", padding={self.padding}"
        if self.dilation != (1, 1):
            s += f", dilation={self.dilation}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.bias is None:
            s += ", bias=False"
        if self.padding_mode != "zeros":
            s += f", padding_mode={self.padding_mode}"
        return s


# ============================================================================= max_pool2d

def _pool_out(size, k, s, p, d, ceil_mode):
    num = size + 2 * p - d * (k - 1) - 1
    out = (-(-num // s) if ceil_mode else num // s) + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1  # the last window must start inside the input or the left padding
    return out


class _MaxPool2DWithIndices(Function):
    @staticmethod
    def forward(ctx, input, kernel, stride, padding, dilation, out_size):
        x = input._data
        unbatched = x.ndim == 3
        if unbatched:
            x = x[None]
        n, c, h, w = x.shape
        (kh, kw), (sh, sw), (ph, pw), (dh, dw), (ho, wo) = kernel, stride, padding, dilation, out_size
        # the padded extent the windows reach (ceil_mode may reach past the right padding)
        hp = max(h + 2 * ph, (ho - 1) * sh + dh * (kh - 1) + 1)
        wp = max(w + 2 * pw, (wo - 1) * sw + dw * (kw - 1) + 1)
        if hp != h or wp != w:
            xp = np.full((n, c, hp, wp), -np.inf, dtype=x.dtype)
            xp[:, :, ph:ph + h, pw:pw + w] = x
        else:
            xp = x
        # the windows as (kh*kw, N, C, Ho, Wo) planes (one copy): max over the planes, then
        # the first plane equal to it (the first maximum); a NaN wins, the last one as in
        # PyTorch's CPU kernel (val > max || isnan(val))
        sn, sc, s_h, s_w = xp.strides
        planes = np.ascontiguousarray(as_strided(xp, (kh, kw, n, c, ho, wo),
                                                 (s_h * dh, s_w * dw, sn, sc, s_h * sh, s_w * sw),
                                                 writeable=False)).reshape(kh * kw, n, c, ho, wo)
        out = planes.max(axis=0)
        arg = np.full(out.shape, kh * kw - 1, dtype=np.int64)
        for o in range(kh * kw - 2, -1, -1):
            arg[planes[o] == out] = o
        nan = out != out
        if nan.any():
            for o in range(kh * kw):
                arg[nan & (planes[o] != planes[o])] = o
        ki, kj = np.divmod(arg, kw)
        rows = np.arange(ho).reshape(-1, 1) * sh - ph + ki * dh
        cols = np.arange(wo) * sw - pw + kj * dw
        idx = (rows * w + cols).astype(np.int64)
        if unbatched:
            out, idx = out[0], idx[0]
        ctx.geom = (unbatched, (n, c, h, w))
        ctx.idx = idx
        indices = _F._wrap(np.ascontiguousarray(idx))
        ctx.mark_non_differentiable(indices)
        return _F._wrap(np.ascontiguousarray(out)), indices

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out, grad_idx):
        unbatched, (n, c, h, w) = ctx.geom
        go = grad_out._data
        idx = ctx.idx
        if unbatched:
            go, idx = go[None], idx[None]
        base = (np.arange(n * c, dtype=np.int64) * (h * w)).reshape(n, c, 1, 1)
        g = np.bincount((idx + base).ravel(), weights=go.ravel(), minlength=n * c * h * w)
        g = g.astype(go.dtype, copy=False).reshape(n, c, h, w)
        if unbatched:
            g = g[0]
        return _F._wrap(g), None, None, None, None, None


_name(_MaxPool2DWithIndices, "MaxPool2DWithIndicesBackward0")


def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    """Max over kh x kw windows of input (N, C, H, W) or (C, H, W)."""
    x = input._data
    if x.ndim not in (3, 4) or x.size == 0 and x.ndim == 3:
        raise RuntimeError("non-empty 3D or 4D (batch mode) tensor expected for input")
    kernel = _pair(kernel_size, "kernel_size")
    stride = kernel if stride is None or (isinstance(stride, (tuple, list)) and len(stride) == 0) else \
        _pair(stride, "stride")
    padding, dilation = _pair(padding, "padding"), _pair(dilation, "dilation")
    if min(kernel) <= 0:
        raise RuntimeError(f"kernel size should be greater than zero, but got kH: {kernel[0]} kW: {kernel[1]}")
    if min(stride) <= 0:
        raise RuntimeError(f"stride should be greater than zero, but got dH: {stride[0]} dW: {stride[1]}")
    if min(dilation) <= 0:
        raise RuntimeError(f"dilation should be greater than zero, but got dilationH: {dilation[0]} "
                           f"dilationW: {dilation[1]}")
    for p, k, d in zip(padding, kernel, dilation):
        if p < 0 or p > (d * (k - 1) + 1) // 2:
            raise RuntimeError(f"pad should be at most half of effective kernel size, but got pad={p}, "
                               f"kernel_size={k} and dilation={d}")
    h, w = x.shape[-2:]
    ho = _pool_out(h, kernel[0], stride[0], padding[0], dilation[0], ceil_mode)
    wo = _pool_out(w, kernel[1], stride[1], padding[1], dilation[1], ceil_mode)
    if ho < 1 or wo < 1:
        c = x.shape[-3]
        raise RuntimeError(f"Given input size: ({c}x{h}x{w}). Calculated output size: ({c}x{ho}x{wo}). "
                           "Output size is too small")
    out, idx = _MaxPool2DWithIndices.apply(input, kernel, stride, padding, dilation, (ho, wo))
    return (out, idx) if return_indices else out


class MaxPool2d(Module):
    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, return_indices=False, ceil_mode=False):
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = stride if stride is not None else kernel_size
        self.padding, self.dilation = padding, dilation
        self.return_indices, self.ceil_mode = return_indices, ceil_mode

    def forward(self, x):
        return max_pool2d(x, self.kernel_size, self.stride, self.padding, self.dilation,
                          ceil_mode=self.ceil_mode, return_indices=self.return_indices)

    def extra_repr(self):
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
                f"dilation={self.dilation}, ceil_mode={self.ceil_mode}")
