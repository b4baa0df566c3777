"""The optimizers' updates, compiled: one pass over a parameter's elements, no temporaries.

jitgrad/optim/_kernels.py documents them (the order of operations is torch's); they sit
in the kernels layer so that jitgrad.compile's fused replay of a training step (engine/
replayer.py) can call them from the same compiled function as the backward sweep.
"""
import math

from numba import njit

from jitgrad.kernels.pointers import view

_jit = njit(cache=True, nogil=True, error_model="numpy")
# a per-parameter update is inlined into its *_all loop (its only caller) rather than compiled
# as a function of its own: one compilation instead of two at an optimizer's first step
# (Adam's: 0.9 s -> 0.7 s on a 2-core machine)
_inline = njit(cache=True, nogil=True, error_model="numpy", inline="always")


@_inline
def adam(d, g, m, v, vmax, sc, decoupled, amsgrad):
    one_b1, b2, one_b2, eps, wd, step_size, bc2_sqrt, shrink = sc[0], sc[1], sc[2], sc[3], sc[4], sc[5], sc[6], sc[7]
    for i in range(d.shape[0]):
        gi = g[i]
        if wd != 0:
            if decoupled:
                d[i] = d[i] * shrink
            else:
                gi = gi + wd * d[i]
        m[i] = m[i] + (gi - m[i]) * one_b1          # torch: exp_avg.lerp_(grad, 1 - beta1)
        v[i] = v[i] * b2 + one_b2 * gi * gi
        if amsgrad:
            if v[i] > vmax[i]:
                vmax[i] = v[i]
            denom = math.sqrt(vmax[i]) / bc2_sqrt + eps
        else:
            denom = math.sqrt(v[i]) / bc2_sqrt + eps
        d[i] = d[i] - step_size * (m[i] / denom)


@_jit
def adam_all(ptrs, sizes, sc, like, decoupled, amsgrad):
    """ptrs[p]: param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq addresses; sc[p] its scalars."""
    for p in range(sizes.size):
        n = sizes[p]
        adam(view(ptrs[p, 0], n, like), view(ptrs[p, 1], n, like), view(ptrs[p, 2], n, like),
              view(ptrs[p, 3], n, like), view(ptrs[p, 4], n, like), sc[p], decoupled, amsgrad)


@_inline
def sgd(d, g, buf, sc, first, momentum, nesterov):
    lr, wd, mom, one_damp = sc[0], sc[1], sc[2], sc[3]
    for i in range(d.shape[0]):
        gi = g[i]
        if wd != 0:
            gi = gi + wd * d[i]
        if momentum:
            if first:                                   # torch: buf = clone(grad)
                buf[i] = gi
            else:
                buf[i] = buf[i] * mom + one_damp * gi
            gi = gi + mom * buf[i] if nesterov else buf[i]
        d[i] = d[i] - lr * gi


@_jit
def sgd_all(ptrs, sizes, sc, like, momentum, nesterov):
    """ptrs[p]: param, grad, momentum buffer (or param) addresses; sc[p]: lr, wd, momentum,
    1 - dampening, and 1 where the buffer was just created (torch clones the gradient)."""
    for p in range(sizes.size):
        n = sizes[p]
        sgd(view(ptrs[p, 0], n, like), view(ptrs[p, 1], n, like), view(ptrs[p, 2], n, like), sc[p],
             sc[p, 4] != 0, momentum, nesterov)


@_inline
def rmsprop(d, g, sq, gavg, buf, sc, centered, momentum):
    alpha, one_alpha, lerp_rest, eps, wd, mom, neg_lr = sc[0], sc[1], sc[2], sc[3], sc[4], sc[5], sc[6]
    for i in range(d.shape[0]):
        gi = g[i]
        if wd != 0:
            gi = gi + wd * d[i]
        s = sq[i] * alpha + one_alpha * gi * gi       # torch: square_avg.mul_(alpha).addcmul_(grad, grad)
        sq[i] = s
        if centered:                                  # torch: grad_avg.lerp_(grad, 1 - alpha)
            a = gavg[i]
            a = a + one_alpha * (gi - a) if one_alpha < 0.5 else gi - (gi - a) * lerp_rest
            gavg[i] = a
            avg = math.sqrt(s - a * a) + eps
        else:
            avg = math.sqrt(s) + eps
        if momentum:
            b = buf[i] * mom + gi / avg
            buf[i] = b
            d[i] = d[i] + neg_lr * b
        else:
            d[i] = d[i] + neg_lr * gi / avg


@_jit
def rmsprop_all(ptrs, sizes, sc, like, centered, momentum):
    """ptrs[p]: param, grad, square_avg, grad_avg, momentum_buffer addresses (an unused
    state's is square_avg's); sc[p]: alpha, 1 - alpha, what lerp's second form multiplies by
    (1 - (1 - alpha), rounded as torch's lerp does it), eps, weight_decay, momentum, -lr."""
    for p in range(sizes.size):
        n = sizes[p]
        rmsprop(view(ptrs[p, 0], n, like), view(ptrs[p, 1], n, like), view(ptrs[p, 2], n, like),
                view(ptrs[p, 3], n, like), view(ptrs[p, 4], n, like), sc[p], centered, momentum)
