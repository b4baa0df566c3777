"""torch.nn.grad: the gradients of conv2d with respect to its input and its weight, as
functions of the output's gradient (what a custom Function's backward calls).

Both are composites of differentiable ops, so they can themselves be differentiated:
the input's gradient is the transposed convolution, with the output_padding that gives
back input_size; the weight's is a convolution of the input with the output's gradient
as the filter (stride and dilation swapping roles), one group per conv group.
"""
from jitgrad.nn.conv import _pair, conv2d, conv_transpose2d


def conv2d_input(input_size, weight, grad_output, stride=1, padding=0, dilation=1, groups=1):
    """The gradient of conv2d(input, weight, ...) with respect to an input of input_size."""
    stride, padding, dilation = _pair(stride, "stride"), _pair(padding, "padding"), _pair(dilation, "dilation")
    input_size = [int(v) for v in input_size]
    if len(input_size) != grad_output.ndim:
        raise ValueError(f"input_size must have {grad_output.ndim} elements (got {len(input_size)})")
    kernel = tuple(weight.shape[2:])
    mins = [(grad_output.shape[-2 + d] - 1) * stride[d] - 2 * padding[d] + dilation[d] * (kernel[d] - 1) + 1
            for d in range(2)]
    spatial = input_size[-2:]
    if any(not lo <= n < lo + stride[d] for d, (n, lo) in enumerate(zip(spatial, mins))):
        raise ValueError(f"requested an output size of {spatial}, but valid sizes range from {mins} to "
                         f"{[lo + s - 1 for lo, s in zip(mins, stride)]} (for an input of "
                         f"{list(grad_output.shape[-2:])})")
    output_padding = tuple(n - lo for n, lo in zip(spatial, mins))
    return conv_transpose2d(grad_output, weight, None, stride, padding, output_padding, groups, dilation)


def conv2d_weight(input, weight_size, grad_output, stride=1, padding=0, dilation=1, groups=1):
    """The gradient of conv2d(input, weight, ...) with respect to a weight of weight_size."""
    stride, padding, dilation = _pair(stride, "stride"), _pair(padding, "padding"), _pair(dilation, "dilation")
    cout, cg, kh, kw = (int(v) for v in weight_size)
    x = input if input.ndim == 4 else input.unsqueeze(0)
    g = grad_output if grad_output.ndim == 4 else grad_output.unsqueeze(0)
    n, c, h, w = x.shape
    m = cout // groups
    # channels of a group become the batch, samples the channels: (Cg, G*N, H, W)
    xs = x.reshape(n, groups, cg, h, w).permute(2, 1, 0, 3, 4).reshape(cg, groups * n, h, w)
    # the output's gradient is the filter, one group per conv group: (G*M, N, Ho, Wo)
    gs = g.reshape(n, groups, m, g.shape[2], g.shape[3]).permute(1, 2, 0, 3, 4).reshape(groups * m, n, g.shape[2],
                                                                                          g.shape[3])
    out = conv2d(xs, gs, None, dilation, padding, stride, groups)      # (Cg, G*M, >=kh, >=kw)
    return out[:, :, :kh, :kw].transpose(0, 1)
