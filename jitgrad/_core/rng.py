"""PyTorch's CPU random stream, bit for bit: the engine under torch.Generator.

torch's CPU generator (CPUGeneratorImpl) is a 32-bit Mersenne Twister seeded by init_genrand
with the low 32 bits of the seed. numpy's MT19937 with its legacy seeding is the same engine
and hands out its raw 32-bit words in bulk (random_raw), carrying its state between calls,
so a million draws are one C call, not a Python loop. On top of the words, torch's transforms
(aten/src/ATen/core/TransformationHelper.h, DistributionsHelper.h, native/cpu/
DistributionTemplates.h and DistributionKernels.cpp, avx_mathfun.h, TensorFactories.cpp's
randperm) are rebuilt here, in the order torch applies them, each checked bit for bit against
torch 2.13 (tests/ops/test_rng_vs_torch.py):

- uniform: float32 keeps 24 bits of a 32-bit word, float64 53 bits of a 64-bit one (two
  words, the first the high half); `x * (to - from) + from` is one fused multiply-add in
  torch's build, so it is one here (llvm.fma in numba; exact emulations under
  NUMBA_DISABLE_JIT);
- normal, numel >= 16 and contiguous: normal_fill draws all uniforms first and turns each
  block of 16 into 8 Box-Muller pairs (the tail block redrawn); float32 runs the AVX2 kernel
  of avx_mathfun.h (its Cephes polynomials, with the FMAs GCC fused; torch's AVX512 build
  uses that kernel too), float64 the C library's log / cos / sin;
- normal otherwise: normal_distribution<double>, Box-Muller on two doubles whose sine half is
  cached in the generator for the next scalar draw (also across calls and dtypes);
- exponential: -1 / lambda * log1p(-u) on a double; bernoulli: a double (or, for a float
  tensor p, a float) uniform below p;
- integers: `word % range + from`, a 64-bit word when the range needs it.

The C library calls (log, log1p, sin, cos) go through numba or Python's math, both the
system's libm, as torch's kernels' (numpy's own SIMD log differs in the last bit)."""
import math

import numba
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

f32, f64, u64 = np.float32, np.float64, np.uint64
STATE_BYTES = 5056  # torch's CPUGeneratorImplState
_M24, _M53 = u64((1 << 24) - 1), u64((1 << 53) - 1)


# ---------------------------------------------------------------- libm (numba: the C library's)

@numba.njit(cache=True)
def _box_muller(u1, u2):
    """normal_distribution<double>: r = sqrt(-2 log1p(-u2)), theta = 2 pi u1; (r cos, r sin)."""
    n = len(u1)
    c = np.empty(n)
    s = np.empty(n)
    for i in range(n):
        r = math.sqrt(-2.0 * math.log1p(-u2[i]))
        theta = 2.0 * math.pi * u1[i]
        c[i] = r * math.cos(theta)
        s[i] = r * math.sin(theta)
    return c, s


@numba.njit(cache=True)
def _u53(raw):
    """uniform_real<double>'s [0, 1): 53 bits of each pair of words, the first the high half
    (one pass: numpy's five operations cost more on the small arrays most draws are)."""
    out = np.empty(raw.shape[0] // 2)
    for i in range(out.shape[0]):
        out[i] = np.float64(((raw[2 * i] << np.uint64(32)) | raw[2 * i + 1]) & np.uint64(0x1FFFFFFFFFFFFF)) * 2.0 ** -53
    return out


@numba.njit(cache=True)
def _u24(raw):
    """uniform_real<float>'s [0, 1): 24 bits of each word."""
    out = np.empty(raw.shape[0], np.float32)
    for i in range(raw.shape[0]):
        out[i] = np.float32(raw[i] & np.uint64(0xFFFFFF)) * np.float32(2.0 ** -24)
    return out


_JIT = not numba.config.DISABLE_JIT  # (without it, numpy's whole-array operations instead)


@numba.njit(cache=True)
def _fill16_f64(u1, u2):
    """normal_fill_16<double> before the scaling: radius = sqrt(-2 log(1 - u)), theta = 2 pi u."""
    n = u1.shape[0]
    c = np.empty(n)
    s = np.empty(n)
    for i in range(n):
        radius = math.sqrt(-2.0 * math.log(1.0 - u1[i]))
        theta = 2.0 * math.pi * u2[i]
        c[i] = radius * math.cos(theta)
        s[i] = radius * math.sin(theta)
    return c, s


@numba.njit(cache=True)
def _log1m(u):
    """log1p(-u), the exponential's log (torch 2.13's CPU transform)."""
    out = np.empty(u.shape[0])
    for i in range(u.shape[0]):
        out[i] = math.log1p(-u[i])
    return out


@numba.njit(cache=True)
def _shuffle(perm, offsets):
    """randperm_cpu's loop: swap i with i + offsets[i]."""
    for i in range(offsets.shape[0]):
        j = i + offsets[i]
        perm[i], perm[j] = perm[j], perm[i]


# ---------------------------------------------------------------- exact fused multiply-add

def fma32(a, b, c):
    """a * b + c rounded once, for float32 values: the product is exact in float64, and the
    one case where rounding the float64 sum to float32 rounds twice (a float32 midpoint) is
    settled by the sum's exact error."""
    p = np.asarray(a, f32).astype(f64) * np.asarray(b, f32).astype(f64)
    c = np.asarray(c, f32).astype(f64)
    s = p + c
    bb = s - p
    err = (p - (s - bb)) + (c - bb)
    mid = (np.asarray(s).view(u64) & u64((1 << 29) - 1)) == u64(1 << 28)
    fix = mid & (err != 0)
    if np.any(fix):
        s = np.where(fix, np.nextafter(s, s + err), s)
    return np.asarray(s).astype(f32)


def _two_prod(a, b):
    p = a * b
    sp = 134217729.0  # Veltkamp split: 2**27 + 1
    ca, cb = sp * a, sp * b
    ah, bh = ca - (ca - a), cb - (cb - b)
    al, bl = a - ah, b - bh
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


def _two_sum(a, b):
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def fma64(a, b, c):
    """a * b + c rounded once, for float64 (Boldo and Melquiond's emulation: the exact
    product and sum as pairs, the low parts added with rounding to odd, then one rounding)."""
    a, b, c = (np.asarray(x, f64) for x in (a, b, c))
    uh, ul = _two_prod(a, b)
    th, tl = _two_sum(c, uh)
    v, e = _two_sum(tl, ul)
    odd = (np.asarray(v).view(u64) & u64(1)) == u64(1)
    v = np.where((e != 0) & ~odd, np.nextafter(v, v + e), v)  # round to odd
    out = th + v
    finite = np.isfinite(out) & np.isfinite(a * b)  # (the pairs are for finite values)
    return np.where(finite, out, a * b + c)


# ---------------------------------------------------------------- avx_mathfun.h in float32
# torch's normal_fill_16_AVX2 (also the AVX512 build's: normal_stub is not given an AVX512
# kernel), lane by lane: Julien Pommier's Cephes polynomials in float32, with every
# `a = a * b; a = a + c` that GCC contracted into one FMA done as one (_fma32).

_F = np.float32
_LOG_P = tuple(_F(v) for v in (7.0376836292E-2, -1.1514610310E-1, 1.1676998740E-1, -1.2420140846E-1,
                               1.4249322787E-1, -1.6668057665E-1, 2.0000714765E-1, -2.4999993993E-1,
                               3.3333331174E-1))
_LOG_Q1, _LOG_Q2, _SQRTHF = _F(-2.12194440e-4), _F(0.693359375), _F(0.707106781186547524)
_DP1, _DP2, _DP3 = _F(-0.78515625), _F(-2.4187564849853515625e-4), _F(-3.77489497744594108e-8)
_SIN_P = (_F(-1.9515295891E-4), _F(8.3321608736E-3), _F(-1.6666654611E-1))
_COS_P = (_F(2.443315711809948E-005), _F(-1.388731625493765E-003), _F(4.166664568298827E-002))
_FOPI, _TWO_PI = _F(1.27323954473516), _F(2.0 * math.pi)
_HALF, _ONE, _MINUS_TWO, _MINUS_HALF = _F(0.5), _F(1.0), _F(-2.0), _F(-0.5)


@intrinsic
def _hw_fma(typingctx, a, b, c):
    """llvm.fma: one rounding, in hardware where the CPU has FMA (libm's fma otherwise)."""
    if not (a == b == c and isinstance(a, types.Float)):
        return None

    def codegen(context, builder, signature, args):
        t = args[0].type
        name = "llvm.fma.f32" if a.bitwidth == 32 else "llvm.fma.f64"
        return builder.call(cgutils.get_or_insert_function(builder.module, ir.FunctionType(t, [t, t, t]), name), args)
    return a(a, b, c), codegen


@numba.njit(cache=True)
def _fma32(a, b, c):
    """a * b + c for float32 values, rounded once."""
    return _hw_fma(np.float32(a), np.float32(b), np.float32(c))


if numba.config.DISABLE_JIT:  # (an intrinsic runs compiled only)
    def _fma32(a, b, c):
        """a * b + c rounded once, for float32 values: the product is exact in float64, and
        rounding the float64 sum s to float32 rounds twice only when s is halfway between two
        float32s; then the sum's exact error (TwoSum) decides the side."""
        p, cc = float(a) * float(b), float(c)
        s = p + cc
        bb = s - p
        err = (p - (s - bb)) + (cc - bb)
        r = np.float32(s)
        t = 2.0 * s - float(r)   # (exact) r's neighbour on s's other side, when s is halfway
        if err != 0.0 and t != s and float(np.float32(t)) == t:
            return np.float32(t) if (err > 0.0) == (t > s) else r
        return r


@numba.njit(cache=True)
def _affine_kernel(x, a, b):
    for i in range(x.shape[0]):
        x[i] = _hw_fma(x[i], a, b)


def affine(x, a, b):
    """x * a + b rounded once per element (torch's fused `x * (to - from) + from` and
    `x * std + mean`), for a float32 or float64 array x and numbers a, b of its dtype."""
    x = np.ascontiguousarray(x)
    a, b = x.dtype.type(a), x.dtype.type(b)
    if numba.config.DISABLE_JIT:  # (the intrinsic runs compiled only)
        return (fma32 if x.dtype == f32 else fma64)(x, np.full(x.shape, a), np.full(x.shape, b))
    out = x.copy()
    _affine_kernel(out.reshape(-1), a, b)
    return out


@numba.njit(cache=True)
def _log256(x):
    m, ex = math.frexp(x)   # (x > 0 and normal here: the exponent and mantissa bits' split)
    e = np.float32(ex)
    x = np.float32(m)
    if x < _SQRTHF:
        x = x - _ONE + x
        e = e - _ONE
    else:
        x = x - _ONE
    z = x * x
    y = _LOG_P[0]
    for k in range(1, 9):
        y = _fma32(y, x, _LOG_P[k])
    y = y * x
    y = _fma32(y, z, e * _LOG_Q1)
    y = _fma32(z, _MINUS_HALF, y)
    x = x + y
    return _fma32(e, _LOG_Q2, x)


@numba.njit(cache=True)
def _sincos256(x):
    sign_sin = x < 0
    x = abs(x)
    j = np.int32(x * _FOPI)   # truncation, as cvttps
    j = (j + 1) & ~1
    y = np.float32(j)
    x = _fma32(y, _DP1, x)
    x = _fma32(y, _DP2, x)
    x = _fma32(y, _DP3, x)
    sign_sin = sign_sin != ((j & 4) != 0)
    sign_cos = ((~(j - 2)) & 4) != 0
    z = x * x
    yc = _fma32(_fma32(_COS_P[0], z, _COS_P[1]), z, _COS_P[2])
    yc = yc * z
    yc = _fma32(yc, z, z * _MINUS_HALF) + _ONE
    ys = _fma32(_fma32(_SIN_P[0], z, _SIN_P[1]), z, _SIN_P[2])
    ys = _fma32(ys * z, x, x)
    if (j & 2) == 0:
        s, c = ys, yc
    else:
        s, c = yc, ys
    return (-s if sign_sin else s), (-c if sign_cos else c)


@numba.njit(cache=True)
def _fill16_f32(data, mean, std):
    """normal_fill_16_AVX2 on each block of 16 float32 uniforms, in place."""
    for b in range(0, data.shape[0] - 15, 16):
        for j in range(8):
            u1 = _ONE - data[b + j]
            radius = np.float32(math.sqrt(_MINUS_TWO * _log256(u1)))
            s, c = _sincos256(_TWO_PI * data[b + j + 8])
            data[b + j] = _fma32(radius * c, std, mean)
            data[b + j + 8] = _fma32(radius * s, std, mean)


def _np_fma_c(a, b, c):
    return fma32(a, b, np.broadcast_to(f32(c), np.shape(a)))


def _np_log256(x):
    """log256_ps over a float32 array; the compiler fused each `y = y * x; y = y + p` into one FMA."""
    invalid = x <= 0
    x = np.maximum(x, np.array(0x00800000, np.int32).view(f32))
    xi = x.view(np.int32)
    e = ((xi.view(np.uint32) >> 23).astype(np.int32) - 0x7f).astype(f32) + f32(1)
    x = ((xi & np.int32(~0x7f800000)) | np.array(0.5, f32).view(np.int32)).view(f32)
    mask = x < f32(0.707106781186547524)
    tmp = np.where(mask, x, f32(0))
    x = x - f32(1)
    e = e - mask.astype(f32)
    x = x + tmp
    z = x * x
    y = np.full_like(x, f32(7.0376836292E-2))
    for p in (-1.1514610310E-1, 1.1676998740E-1, -1.2420140846E-1, 1.4249322787E-1, -1.6668057665E-1,
              2.0000714765E-1, -2.4999993993E-1, 3.3333331174E-1):
        y = _np_fma_c(y, x, p)
    y = y * x
    y = fma32(y, z, e * f32(-2.12194440e-4))
    y = fma32(z, np.full_like(z, f32(-0.5)), y)
    x = x + y
    x = fma32(e, np.full_like(e, f32(0.693359375)), x)
    return np.where(invalid, f32(np.nan), x)


def _np_sincos256(x):
    """sincos256_ps over a float32 array, fused as the compiler fused it."""
    sign_sin = np.signbit(x)
    x = np.abs(x)
    j = (x * f32(1.27323954473516)).astype(np.int32)  # cvtt: truncation
    j = (j + 1) & ~1
    y = j.astype(f32)
    for dp in (-0.78515625, -2.4187564849853515625e-4, -3.77489497744594108e-8):
        x = fma32(y, np.full_like(y, f32(dp)), x)
    sign_sin = sign_sin ^ ((j & 4) != 0)
    sign_cos = ((~(j - 2)) & 4) != 0
    poly = (j & 2) == 0
    z = x * x
    yc = np.full_like(z, f32(2.443315711809948E-005))
    yc = _np_fma_c(yc, z, -1.388731625493765E-003)
    yc = _np_fma_c(yc, z, 4.166664568298827E-002)
    yc = yc * z
    yc = fma32(yc, z, z * f32(-0.5))
    yc = yc + f32(1)
    ys = np.full_like(z, f32(-1.9515295891E-4))
    ys = _np_fma_c(ys, z, 8.3321608736E-3)
    ys = _np_fma_c(ys, z, -1.6666654611E-1)
    ys = fma32(ys * z, x, x)
    s = np.where(poly, ys, yc)
    c = np.where(poly, yc, ys)
    return np.where(sign_sin, -s, s), np.where(sign_cos, -c, c)


def _np_fill16_f32(data, mean, std):
    """_fill16_f32 with numpy arrays: the kernel when numba compiles nothing
    (NUMBA_DISABLE_JIT), and the reference the compiled kernel is tested against."""
    full = data.shape[0] // 16 * 16
    blocks = data[:full].reshape(-1, 16)
    u1 = f32(1) - blocks[:, :8]
    radius = np.sqrt(f32(-2) * _np_log256(u1))
    s, c = _np_sincos256(f32(2.0 * math.pi) * blocks[:, 8:])
    m, sd = np.full(c.shape, f32(mean)), np.full(c.shape, f32(std))
    data[:full] = np.concatenate([fma32(radius * c, sd, m), fma32(radius * s, sd, m)], axis=1).ravel()


# ---------------------------------------------------------------- where the draws go

def contiguous(arr):
    """torch's is_contiguous for a tensor's array (a CUDA array: taken as contiguous)."""
    return type(arr) is not np.ndarray or arr.flags.c_contiguous


def laid_out(arr, flat):
    """flat (the draws, in the order torch's TensorIterator visits arr's elements) as an
    array of arr's shape. TensorIterator walks the dimensions by stride, largest outermost:
    a transposed tensor is filled along its storage."""
    if contiguous(arr) or arr.ndim < 2:
        return flat.reshape(arr.shape)
    perm = sorted(range(arr.ndim), key=lambda d: -abs(arr.strides[d]) if arr.shape[d] > 1 else 0)
    out = np.empty(arr.shape, flat.dtype)
    np.transpose(out, perm)[...] = flat.reshape([arr.shape[d] for d in perm])
    return out


def layout_of(arr):
    """A stand-in for arr in laid_out: its shape and strides, no memory of its own (so a
    recorded draw keeps this, not the array)."""
    shape = tuple(arr.shape)
    if type(arr) is np.ndarray and not arr.flags.c_contiguous:
        base, strides = np.empty(1, arr.dtype), arr.strides
    else:  # bytes laid out in C order
        base, strides = np.empty(1, np.uint8), tuple(int(np.prod(shape[i + 1:])) for i in range(len(shape)))
    return np.lib.stride_tricks.as_strided(base, shape, strides, writeable=False)


# ---------------------------------------------------------------- the engine

class Engine:
    """One stream of torch's CPU generator: the Mersenne Twister, the cached normal, the seed."""

    def __init__(self, seed):
        self._mt = np.random.MT19937(0)
        self.reseed(seed)

    def reseed(self, seed):
        self._seed = seed
        self._mt._legacy_seeding(seed & 0xFFFFFFFF)  # init_genrand
        self._normal = None   # torch's next_double_normal_sample
        self._fresh = True    # (torch's state says next=0 until the first word is drawn)

    # raw words
    def random32(self, n):
        """n raw 32-bit outputs (torch's random()), as uint64."""
        self._fresh = False
        return self._mt.random_raw(n)   # (a uint64 array)

    def random64(self, n):
        """n 64-bit outputs, each two 32-bit ones, the first the high half (torch's random64())."""
        raw = self.random32(2 * n)
        return (raw[0::2] << u64(32)) | raw[1::2]

    # uniform_real_distribution
    def uniform(self, n, npd, from_=0.0, to=1.0):
        """n draws in [from, to) of dtype npd, torch's uniform_real: float64 from 53 bits of a
        64-bit word, float32 (and float16: 11 bits) from a 32-bit one, in float arithmetic."""
        npd = np.dtype(npd)
        if n <= 16 and (from_, to) == (0.0, 1.0) and npd != np.float16:
            return np.array(self._small_uniform(n, npd == f64), npd)
        if npd == f64:
            x = _u53(self.random32(2 * n)) if _JIT else (self.random64(n) & _M53).astype(f64) * 2.0 ** -53
            return x if (from_, to) == (0.0, 1.0) else affine(x, f64(to) - f64(from_), f64(from_))
        bits = 11 if npd == np.float16 else 24
        if _JIT and bits == 24:
            x = _u24(self.random32(n))
        else:
            x = (self.random32(n) & u64((1 << bits) - 1)).astype(f32) * f32(2.0 ** -bits)
        if (from_, to) != (0.0, 1.0):
            lo, hi = npd.type(from_), npd.type(to)
            x = affine(x, f32(npd.type(hi - lo)), f32(lo))
        return x.astype(npd, copy=False)

    def _small_uniform(self, n, double):
        """The same draws as a list of Python floats (exact: at most 53 bits each), for a few
        of them without numpy's per-operation cost."""
        w = self.random32(2 * n if double else n).tolist()
        if double:
            return [(((w[i] << 32) | w[i + 1]) & 0x1FFFFFFFFFFFFF) * 2.0 ** -53 for i in range(0, 2 * n, 2)]
        return [(x & 0xFFFFFF) * 2.0 ** -24 for x in w]

    # normal
    def normal_scalar(self, n, mean=0.0, std=1.0):
        """n draws of normal_distribution<double> (float64), one after the other, with the
        cached second Box-Muller sample used first and the last one left cached."""
        head = []
        if n and self._normal is not None:
            head, self._normal = [self._normal], None
        pairs = (n - len(head) + 1) // 2
        if pairs <= 8:  # (Python's math is the same libm, without numba's or numpy's per-call cost)
            u = self._small_uniform(2 * pairs, True)
            for i in range(0, 2 * pairs, 2):
                r = math.sqrt(-2.0 * math.log1p(-u[i + 1]))
                theta = 2.0 * math.pi * u[i]
                head += (r * math.cos(theta), r * math.sin(theta))
            out = np.array(head[:n])
            if len(head) > n:
                self._normal = head[n]
        else:
            u = self.uniform(2 * pairs, f64)
            c, s = _box_muller(u[0::2], u[1::2])
            out = np.empty(len(head) + 2 * pairs)
            out[:len(head)] = head
            out[len(head)::2], out[len(head) + 1::2] = c, s
            if len(out) > n:
                self._normal = float(out[n])
            out = out[:n]
        if (mean, std) != (0.0, 1.0):
            out = affine(out, std, mean)
        return out

    def normal_fill(self, n, npd, mean=0.0, std=1.0):
        """normal_fill (n >= 16, a contiguous tensor of dtype npd)."""
        u = self.uniform(n, npd)
        full = n // 16 * 16
        tail = self.uniform(16, npd) if n % 16 else None
        if npd == f32:
            fill = _np_fill16_f32 if numba.config.DISABLE_JIT else _fill16_f32
            fill(u, f32(mean), f32(std))   # (its first n // 16 blocks)
            if tail is not None:
                fill(tail, f32(mean), f32(std))
                u[n - 16:] = tail
            return u
        out = np.empty(n, npd)
        out[:full] = self._fill16_f64(u[:full].reshape(-1, 16), mean, std).ravel()
        if tail is not None:
            out[n - 16:] = self._fill16_f64(tail.reshape(1, 16), mean, std).ravel()
        return out

    @staticmethod
    def _fill16_f64(blocks, mean, std):
        c, s = _fill16_f64(np.ascontiguousarray(blocks[:, :8]).ravel(), np.ascontiguousarray(blocks[:, 8:]).ravel())
        c, s = c.reshape(-1, 8), s.reshape(-1, 8)
        if (mean, std) != (0.0, 1.0):
            c, s = affine(c, std, mean), affine(s, std, mean)
        return np.concatenate([c, s], axis=1)

    def normal(self, n, npd, mean=0.0, std=1.0, contiguous=True):
        """normal_kernel: n draws of dtype npd into a tensor laid out contiguously or not."""
        if n >= 16 and contiguous and npd in (f32, f64):
            return self.normal_fill(n, np.dtype(npd), mean, std)
        return self.normal_scalar(n, mean, std).astype(npd)

    # the rest
    def integers(self, n, low, span):
        """random_(from, to): `word % span + from`, a 64-bit word when span needs it."""
        raw = self.random64(n) if span >= 1 << 32 else self.random32(n)
        return (raw % u64(span)).astype(np.int64) + np.int64(low)

    def exponential(self, n, lambd):
        """exponential_distribution<double>: -1 / lambda * log1p(-u)."""
        return (-1.0 / lambd) * _log1m(self.uniform(n, f64))

    def permutation(self, n):
        """randperm_cpu: for i, swap i with i + (random() % (n - i)); random64() for a huge n."""
        perm = np.arange(n, dtype=np.int64)
        if n < 2:
            return perm
        raw = self.random32(n - 1) if n < (1 << 32) // 20 else self.random64(n - 1)
        _shuffle(perm, (raw % np.arange(n, 1, -1, dtype=u64)).astype(np.int64))
        return perm

    # state
    def snapshot(self):
        return (self._seed, self._mt.state, self._normal, self._fresh)

    def restore(self, snap):
        self._seed, state, self._normal, self._fresh = snap
        self._mt.state = state

    def state_bytes(self):
        """torch's CPUGeneratorImplState: THGeneratorState (seed, left, seeded, next, the
        624 words as uint64, normal_x/y/rho, normal_is_valid), then the float cache."""
        st = self._mt.state["state"]
        pos = int(st["pos"])
        buf = bytearray(STATE_BYTES)
        nxt = 0 if self._fresh else pos
        np.frombuffer(buf, "<u8", 1, 0)[0] = self._seed
        np.frombuffer(buf, "<i4", 2, 8)[:] = (625 - pos, 1)
        np.frombuffer(buf, "<u8", 1, 16)[0] = nxt
        np.frombuffer(buf, "<u8", 624, 24)[:] = st["key"]
        if self._normal is not None:
            np.frombuffer(buf, "<f8", 1, 5024)[0] = self._normal   # normal_y
            np.frombuffer(buf, "<i4", 1, 5040)[0] = 1
        return np.frombuffer(bytes(buf), np.uint8)

    def load_bytes(self, arr):
        """The inverse of state_bytes; also takes torch's legacy 5048-byte state."""
        buf = np.ascontiguousarray(arr, np.uint8).tobytes()
        left = int(np.frombuffer(buf, "<i4", 1, 8)[0])
        nxt = int(np.frombuffer(buf, "<u8", 1, 16)[0])
        if not 1 <= left <= 624 or nxt > 624:
            raise RuntimeError("The RNG state is invalid: its position is out of range")
        key = np.frombuffer(buf, "<u8", 624, 24)
        if np.any(key >> u64(32)):
            raise RuntimeError("The RNG state is invalid: its words do not fit 32 bits")
        self._seed = int(np.frombuffer(buf, "<u8", 1, 0)[0])
        self._mt.state = {"bit_generator": "MT19937", "state": {"key": key.astype(np.uint32), "pos": 625 - left}}
        valid = int(np.frombuffer(buf, "<i4", 1, 5040)[0])
        self._normal = float(np.frombuffer(buf, "<f8", 1, 5024)[0]) if valid else None
        self._fresh = left == 1 and nxt == 0
