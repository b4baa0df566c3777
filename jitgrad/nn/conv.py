"""2-D convolution and max pooling, as torch.nn.Conv2d / MaxPool2d and F.conv2d / F.max_pool2d.

Each op is one primitive of the engine, one graph node named like PyTorch's:

* conv2d: ConvolutionBackward0. The forward (im2col + gemm per sample and group) and the
  backward kernel, which gives input, weight and bias gradients in one row, are compiled
  (kernels/conv.py, k_conv). Under create_graph the backward is rebuilt from
  differentiable Tensor ops (rules.conv_rule), so double backward works.
* max_pool2d: MaxPool2DWithIndicesBackward0. The compiled forward keeps the argmax; the
  backward scatters the gradient there with the kernel max(dim) and indexing share.
"""

import numpy as np

from jitgrad._core import dtype as _dtype
from jitgrad._core.messages import c_name, scalar_name, size_str, tensor_type
from jitgrad.gpu.array import DeviceArray
from jitgrad.graph.tensor import Tensor, empty, zeros
from jitgrad.nn import init
from jitgrad.nn.module import Module
from jitgrad.nn.parameter import Parameter

# the primitives' forwards, each beside its entry in ops/nn.py
from jitgrad.ops.nn import _max_pool2d_with_indices, _pad2d  # noqa: F401
from jitgrad.ops.nn import convolution as _convolution
from jitgrad.ops.shape import cat as _cat


def _pair(v, name="value"):
    if isinstance(v, (tuple, list)):
        if len(v) == 1:
            return (int(v[0]),) * 2
        if len(v) != 2:
            raise RuntimeError(f"expected {name} to be a single integer value or a list of 2 values to match "
                               f"the convolution dimensions, but got {name}={list(v)}")
        return (int(v[0]), int(v[1]))
    return (int(v), int(v))




# ============================================================================= conv2d

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


def _type_name(a):
    """torch's legacy type name of array a, which names the device: torch.cuda.FloatTensor
    (conv2d's checks compare them, so they catch mixed devices too)."""
    name = tensor_type(a.dtype)
    return name.replace("torch.", "torch.cuda.", 1) if isinstance(a, DeviceArray) else name


def _mkldnn(x, w, stride, dilation, groups):
    """Whether torch's CPU conv2d would take its mkldnn kernel (aten's use_mkldnn, with one
    thread): a float32 input, and a conv it finds worth it. Only the words of the dtype
    error depend on it."""
    if x.dtype != np.float32:
        return False
    try:
        strided, dilated = _pair(stride) != (1, 1), _pair(dilation) != (1, 1)
        groups = int(groups)
    except (TypeError, ValueError, RuntimeError):
        return False
    n = x.shape[0] if x.ndim == 4 else 1
    kh, kw = w.shape[2:]
    return (strided or dilated or n >= 16 or (kh, kw) != (1, 1)) and (
        groups > 1 or (kw > 3 and kh > 3) or n > 1 or x.size > 20480)


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """2-D cross-correlation of input (N, C, H, W) or (C, H, W) with weight (Cout, C/groups, kh, kw)."""
    if not isinstance(input, Tensor) or not isinstance(weight, Tensor):
        raise TypeError("conv2d(): argument 'input' and 'weight' must be Tensor")
    x, w = input._data, weight._data
    if x.dtype.kind == "b":
        raise _dtype.not_implemented("slow_conv2d_cpu", x.dtype)
    if x.ndim not in (3, 4):
        raise RuntimeError(f"Expected 3D (unbatched) or 4D (batched) input to conv2d, but got input of size: "
                           f"{size_str(x.shape)}")
    if w.ndim != 4:
        raise RuntimeError(f"weight should have at least three dimensions, got {w.ndim}" if w.ndim < 3 else
                           f"Expected {w.ndim}-dimensional input for {w.ndim}-dimensional weight "
                           f"{size_str(w.shape)}, but got {x.ndim}-dimensional input of size {size_str(x.shape)} instead")
    b = None if bias is None else bias._data
    if not any(isinstance(a, DeviceArray) for a in (x, w, b)):
        # torch's CPU conv2d checks the bias's dtype first, then the weight's, in words that
        # depend on the kernel it picks
        if b is not None and b.dtype != x.dtype:
            raise RuntimeError(f"Input type ({c_name(x.dtype)}) and bias type ({c_name(b.dtype)}) should be the same")
        if w.dtype != x.dtype and not _mkldnn(x, w, stride, dilation, groups):
            raise RuntimeError(f"expected scalar type {scalar_name(x.dtype)} but found {scalar_name(w.dtype)}")
    if _type_name(x) != _type_name(w):
        raise RuntimeError(f"Input type ({_type_name(x)}) and weight type "
                           f"({_type_name(w)}) should be the same or input should "
                           "be a MKLDNN tensor and weight is a dense tensor")
    if b is not None and _type_name(b) != _type_name(x):
        raise RuntimeError(f"Input type ({_type_name(x)}) and bias type "
                           f"({_type_name(b)}) should be the same")
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
    if min(kernel) <= 0:
        raise RuntimeError(f"kernel size should be greater than zero, but got kernel_height: {kernel[0]} "
                           f"kernel_width: {kernel[1]}")
    pads = _conv_pads(padding, kernel, dilation, stride)
    batched = x if x.ndim == 4 else x[None]
    cin = batched.shape[1]
    if w.shape[0] % groups:
        raise RuntimeError(f"Given groups={groups}, expected weight to be divisible by {groups} at dimension 0, "
                           f"but got weight of size {size_str(w.shape)} instead")
    if cin != w.shape[1] * groups:
        raise RuntimeError(f"Given groups={groups}, weight of size {size_str(w.shape)}, expected input"
                           f"{size_str(x.shape)} to have {w.shape[1] * groups} channels, but got {cin} channels instead")
    if bias is not None and tuple(bias._data.shape) != (w.shape[0],):
        raise RuntimeError(f"Given weight of size {size_str(w.shape)}, expected bias to be 1-dimensional with "
                           f"{w.shape[0]} elements, but got bias of size {size_str(bias._data.shape)} instead")
    hp = batched.shape[2] + pads[0] + pads[1]
    wp = batched.shape[3] + pads[2] + pads[3]
    ekh = dilation[0] * (kernel[0] - 1) + 1
    ekw = dilation[1] * (kernel[1] - 1) + 1
    if hp < ekh or wp < ekw:
        raise RuntimeError(f"Calculated padded input size per channel: ({hp} x {wp}). Kernel size: ({ekh} x {ekw}). "
                           "Kernel size can't be greater than actual input size")
    if x.ndim == 3:  # as PyTorch: unsqueeze, convolve, squeeze (SqueezeBackward1 on top)
        return _convolution(input.unsqueeze(0), weight, bias, stride, pads, dilation, groups).squeeze(0)
    return _convolution(input, weight, bias, stride, pads, dilation, groups)


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
        if self.padding_mode == "zeros":
            return conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)
        # as torch: pad in the given mode, then convolve without padding
        pads = _conv_pads(self.padding, self.kernel_size, self.dilation, self.stride)
        return conv2d(_pad2d(x, pads, self.padding_mode), self.weight, self.bias, self.stride, 0, self.dilation,
                      self.groups)

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


# ============================================================================= conv_transpose2d
# A composite, as the adjoint of conv2d is one: the transposed convolution of x is the direct
# convolution (stride 1) of x with (stride - 1) zeros put between its neighbours, padded by
# dilation * (kernel - 1) - padding (plus output_padding at the bottom / right), with the
# weight's in / out channels swapped per group and its taps flipped. So its backward, double
# backward, forward-mode rule, compiled kernel and vmap rule are conv2d's and the shape ops'.
# The zeros cost stride**2 more multiplies than a direct col2im kernel would; stride 1 (the
# usual upsampling-free case) inserts nothing.

def _stuff(x, dim, s):
    """x (batched, 4-D) with s - 1 zeros written between neighbours along dim (2 or 3)."""
    if s == 1:
        return x
    shape = tuple(x.shape)
    gap = list(shape)
    gap.insert(dim + 1, s - 1)
    filler = zeros(*gap, dtype=x.dtype, device=x.device)
    inter = _cat([x.unsqueeze(dim + 1), filler], dim + 1)          # (..., n, s, ...)
    merged = shape[:dim] + (shape[dim] * s,) + shape[dim + 1:]
    keep = [slice(None)] * 4
    keep[dim] = slice(0, (shape[dim] - 1) * s + 1)
    return inter.reshape(merged)[tuple(keep)]


def _append_zeros(x, dim, n):
    """x with n zeros after its end along dim."""
    if n == 0:
        return x
    shape = list(x.shape)
    shape[dim] = n
    return _cat([x, zeros(*shape, dtype=x.dtype, device=x.device)], dim)


def _transposed_checks(x, w, b, stride, padding, output_padding, dilation, groups):
    """torch's checks of a transposed convolution (aten's ConvParams and conv_transpose's shape
    check), in its words; returns the output's spatial size."""
    if x.ndim not in (3, 4):
        raise RuntimeError(f"Expected 3D (unbatched) or 4D (batched) input to conv_transpose2d, but got input of "
                           f"size: {size_str(x.shape)}")
    if w.ndim != 4:
        raise RuntimeError(f"weight should have at least three dimensions, got {w.ndim}" if w.ndim < 3 else
                           f"Expected {w.ndim}-dimensional input for {w.ndim}-dimensional weight "
                           f"{size_str(w.shape)}, but got {x.ndim}-dimensional input of size {size_str(x.shape)} instead")
    if min(stride) <= 0:
        raise RuntimeError("non-positive stride is not supported")
    if min(padding) < 0:
        raise RuntimeError("negative padding is not supported")
    if min(output_padding) < 0:
        raise RuntimeError("negative output_padding is not supported")
    if min(dilation) <= 0:
        raise RuntimeError(f"dilation should be greater than zero, but got dilation_height: {dilation[0]}, "
                           f"dilation_width: {dilation[1]}")
    if groups <= 0:
        raise RuntimeError("non-positive groups is not supported")
    if any(op >= s and op >= d for op, s, d in zip(output_padding, stride, dilation)):
        raise RuntimeError(f"output padding must be smaller than either stride or dilation, but got "
                           f"output_padding_height: {output_padding[0]} output_padding_width: {output_padding[1]} "
                           f"stride_height: {stride[0]} stride_width: {stride[1]} dilation_height: {dilation[0]} "
                           f"dilation_width: {dilation[1]}")
    if w.shape[0] < groups:
        raise RuntimeError(f"Given groups={groups}, expected weight to be at least {groups} at dimension 0, but got "
                           f"weight of size {size_str(w.shape)} instead")
    if w.shape[0] % groups:
        # (torch's message prints the size in two brackets here)
        raise RuntimeError(f"Given groups={groups}, expected weight to be divisible by {groups} at dimension 0, "
                           f"but got weight of size [{size_str(w.shape)}] instead")
    cin = x.shape[-3]
    if cin != w.shape[0]:
        raise RuntimeError(f"Given transposed=1, weight of size {size_str(w.shape)}, expected input"
                           f"{size_str(x.shape if x.ndim == 4 else (1,) + tuple(x.shape))} to have {w.shape[0]} "
                           f"channels, but got {cin} channels instead")
    cout = w.shape[1] * groups
    if b is not None and tuple(b.shape) != (cout,):
        raise RuntimeError(f"Given transposed=1, weight of size {size_str(w.shape)}, expected bias to be "
                           f"1-dimensional with {cout} elements, but got bias of size {size_str(b.shape)} instead")
    size = tuple((n - 1) * s - 2 * p + d * (k - 1) + op + 1 for n, s, p, d, k, op in
                 zip(x.shape[-2:], stride, padding, dilation, w.shape[2:], output_padding))
    if min(size) < 1:
        raise RuntimeError(f"Given input size per channel: ({x.shape[-2]} x {x.shape[-1]}). Calculated output size "
                           f"per channel: ({size[0]} x {size[1]}). Output size is too small")
    return size


def conv_transpose2d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    """The transposed 2-D convolution (the gradient of conv2d with respect to its input) of
    input (N, Cin, H, W) or (Cin, H, W) with weight (Cin, Cout/groups, kh, kw)."""
    if not isinstance(input, Tensor) or not isinstance(weight, Tensor):
        raise TypeError("conv_transpose2d(): argument 'input' and 'weight' must be Tensor")
    stride, padding = _pair(stride, "stride"), _pair(padding, "padding")
    output_padding, dilation = _pair(output_padding, "output_padding"), _pair(dilation, "dilation")
    groups = int(groups)
    _transposed_checks(input, weight, bias, stride, padding, output_padding, dilation, groups)
    xd, wdt = input._data.dtype, weight._data.dtype
    if xd.kind != "f" and xd != np.int64:      # torch's CPU kernel has float and int64 forms
        raise _dtype.not_implemented("slow_conv_transpose2d_out_cpu", xd)
    if wdt != xd:
        raise RuntimeError(f"expected scalar type {scalar_name(xd)} but found {scalar_name(wdt)}")
    if xd.kind != "f":
        raise RuntimeError(f"\"conv_transpose2d\" not implemented for '{xd.name}'")
    x = input if input.ndim == 4 else input.unsqueeze(0)
    cin, m, kh, kw = weight.shape
    # the direct conv's weight (Cout, Cin/groups, kh, kw), taps flipped
    wd = weight.reshape(groups, cin // groups, m, kh, kw).transpose(1, 2).reshape(groups * m, cin // groups, kh, kw)
    wd = wd.flip((2, 3))
    x = _stuff(_stuff(x, 2, stride[0]), 3, stride[1])
    # padding of the stuffed input per side, lo before and hi = lo + output_padding after: a
    # negative one crops the input; the direct conv pads both sides by max(lo, 0), and what
    # hi has beyond that is written as zero rows / columns at the end (so that conv2d's node
    # stays the output's, ConvolutionBackward0 as torch's)
    pads = []
    for dim, (p, op, d, k) in enumerate(zip(padding, output_padding, dilation, (kh, kw)), start=2):
        lo = d * (k - 1) - p
        hi = lo + op
        n = x.shape[dim]
        if lo < 0 or hi < 0:
            x = x.narrow(dim, max(0, -lo), n - max(0, -lo) - max(0, -hi))
        x = _append_zeros(x, dim, max(hi, 0) - max(lo, 0))
        pads.append(max(lo, 0))
    out = conv2d(x, wd, bias, 1, tuple(pads), dilation, groups)
    return out if input.ndim == 4 else out.squeeze(0)


def _output_padding(input, output_size, stride, padding, kernel_size, dilation):
    """torch's ConvTranspose*d._output_padding: the output_padding that gives output_size."""
    if output_size is None:
        return None
    k = 2
    output_size = [int(v) for v in output_size]
    if len(output_size) not in (k, k + 2, k + (input.ndim - 2)):
        raise ValueError(f"ConvTranspose2D: for {input.ndim}D input, output_size must have {k} or {k + 2} "
                         f"elements (got {len(output_size)})")
    output_size = output_size[-k:]
    mins = [(input.shape[input.ndim - k + d] - 1) * stride[d] - 2 * padding[d] +
            (dilation[d] if dilation is not None else 1) * (kernel_size[d] - 1) + 1 for d in range(k)]
    maxs = [mins[d] + stride[d] - 1 for d in range(k)]
    for size, lo, hi in zip(output_size, mins, maxs):
        if size < lo or size > hi:
            raise ValueError(f"requested an output size of {output_size}, but valid sizes range from {mins} to "
                             f"{maxs} (for an input of {list(input.shape[2:])})")
    return tuple(size - lo for size, lo in zip(output_size, mins))


class ConvTranspose2d(Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, output_padding=0, groups=1,
                 bias=True, dilation=1, padding_mode="zeros", device=None, dtype=None):
        super().__init__()
        if groups <= 0:
            raise ValueError("groups must be a positive integer")
        if in_channels % groups != 0:
            raise ValueError("in_channels must be divisible by groups")
        if out_channels % groups != 0:
            raise ValueError("out_channels must be divisible by groups")
        if padding_mode != "zeros":
            raise ValueError(f'Only "zeros" padding mode is supported for {type(self).__name__}')
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size = _pair(kernel_size, "kernel_size")
        self.stride, self.padding = _pair(stride, "stride"), _pair(padding, "padding")
        self.dilation, self.output_padding = _pair(dilation, "dilation"), _pair(output_padding, "output_padding")
        self.groups, self.padding_mode, self.transposed = groups, padding_mode, True
        dtype = dtype or _dtype.get_default_dtype()
        self.weight = Parameter(empty(in_channels, out_channels // groups, *self.kernel_size, dtype=dtype))
        if bias:
            self.bias = Parameter(empty(out_channels, dtype=dtype))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self):
        init.default_layer_init_(self.weight, self.bias)

    def forward(self, input, output_size=None):
        op = _output_padding(input, output_size, self.stride, self.padding, self.kernel_size, self.dilation)
        return conv_transpose2d(input, self.weight, self.bias, self.stride, self.padding,
                                self.output_padding if op is None else op, self.groups, self.dilation)

    def extra_repr(self):
        s = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        if self.padding != (0, 0):
            s += f", padding={self.padding}"
        if self.dilation != (1, 1):
            s += f", dilation={self.dilation}"
        if self.output_padding != (0, 0):
            s += f", output_padding={self.output_padding}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.bias is None:
            s += ", bias=False"
        return s


# ============================================================================= max_pool2d

def _pool_out(size, k, s, p, d, ceil_mode):
    num = size + 2 * p - d * (k - 1) - 1
    out = (-(-num // s) if ceil_mode else num // s) + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1  # the last window must start inside the input or the left padding
    return out


def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    """Max over kh x kw windows of input (N, C, H, W) or (C, H, W)."""
    x = input._data
    if x.dtype.kind == "b":
        raise _dtype.not_implemented("max_pool2d", x.dtype)
    if x.ndim not in (3, 4) or x.size == 0 and x.ndim == 3:
        raise RuntimeError("non-empty 3D or 4D (batch mode) tensor expected for input")
    kernel = _pair(kernel_size, "kernel_size")
    stride = kernel if stride is None or (isinstance(stride, (tuple, list)) and len(stride) == 0) else \
        _pair(stride, "stride")
    padding, dilation = _pair(padding, "padding"), _pair(dilation, "dilation")
    if 0 in stride:  # torch checks this first (a zero kernel_size is also the default stride)
        raise RuntimeError("stride should not be zero")
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
    out, idx = _max_pool2d_with_indices(input, kernel, stride, padding, dilation, (ho, wo))
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
