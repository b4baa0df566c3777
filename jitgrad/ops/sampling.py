"""Random sampling: the in-place initialisers (uniform_, normal_, bernoulli_, random_,
exponential_), torch.bernoulli / multinomial / normal, the *_like factories, and the
`generator=` keyword on rand / randn.

With a jitgrad.Generator, uniform draws are PyTorch's own numbers (24 bits of a 32-bit
output for float32, 53 bits of a 64-bit one for float64, as torch's CPU kernels); normal
and exponential draws are transforms of those uniforms, so they are reproducible from a
seed but are not torch's numbers. Without a generator every draw comes from the global
generator (graph/tensor.py's `_rng`), as randn does.

PyTorch gives these samplers a zero gradient (UniformBackward0, NormalBackward*...): the
results here carry the same zero gradient, recorded as a copy or a where(False, ...)."""
import numpy as np

from jitgrad._core import dtype as _dt
from jitgrad.graph import random as _random
from jitgrad.graph import tensor as _t
from jitgrad.graph.random import Generator, weighted_draws
from jitgrad.graph.tensor import Tensor, scalar_name
from jitgrad.ops import functional as F
from jitgrad.ops import inplace

default_generator = Generator()


def _uniform(n, npd, generator):
    """n uniform numbers in [0, 1) of dtype npd."""
    if generator is None:
        return _t._rng[0].random(n).astype(npd)
    if npd == np.float32:
        return ((generator.random32(n) & np.uint64((1 << 24) - 1)).astype(np.float64) * 2.0 ** -24).astype(npd)
    return generator.uniform64(n).astype(npd)


def _standard_normal(n, npd, generator):
    if generator is None:
        return _t._rng[0].standard_normal(n).astype(npd)
    u1, u2 = generator.uniform64(n), generator.uniform64(n)
    return (np.sqrt(-2.0 * np.log1p(-u1)) * np.cos(2.0 * np.pi * u2)).astype(npd)


def _float_only(t, kernel):
    if t._data.dtype.kind != "f":
        raise NotImplementedError(f"\"{kernel}\" not implemented for '{scalar_name(t._data.dtype)}'")


def _fill_with(t, values):
    """t overwritten in place with values (a numpy array of t's shape): version bump, the
    leaf check and a zero gradient come from copy_."""
    src = F._wrap(values.reshape(t._data.shape).astype(t._data.dtype, copy=False))
    if type(t._data) is not np.ndarray:
        src = src.to(t.device)
    return inplace.copy_(t, src)


def _check_gen(generator, fn):
    _random._check_generator(generator, fn)


def uniform_(t, from_=0.0, to=1.0, *, generator=None, **kw):
    from_ = kw.pop("from", from_)
    _check_gen(generator, "uniform_")
    _float_only(t, "check_uniform_bounds")
    if from_ > to:
        raise RuntimeError(f"uniform_ expects to return a [from, to) range, but found from={from_} > to={to}")
    u = _uniform(t._data.size, np.float64 if t._data.dtype == np.float64 else np.float32, generator)
    return _fill_with(t, from_ + (to - from_) * u.astype(np.float64))


def normal_(t, mean=0.0, std=1.0, *, generator=None):
    _check_gen(generator, "normal_")
    _float_only(t, "normal_kernel_cpu")
    if std < 0:
        raise RuntimeError(f"normal expects std >= 0.0, but found std {std}")
    return _fill_with(t, mean + std * _standard_normal(t._data.size, np.float64, generator))


def exponential_(t, lambd=1.0, *, generator=None):
    _check_gen(generator, "exponential_")
    if t._data.dtype.kind != "f":
        raise RuntimeError("Exponential distribution is a continuous probability distribution. dtype must be a "
                           f"floating point but you specified {scalar_name(t._data.dtype)}")
    if not lambd > 0:
        raise RuntimeError(f"exponential_ expects lambda > 0.0, but found lambda={lambd}")
    return _fill_with(t, -np.log1p(-_uniform(t._data.size, np.float64, generator)) / lambd)


def _probabilities(p, fn):
    if isinstance(p, Tensor):
        return _tensor_probabilities(p._array())
    if not 0 <= p <= 1:
        raise RuntimeError(f"{fn} expects p to be in [0, 1], but got p={p}")
    return np.float64(p)


def _tensor_probabilities(arr):
    """A tensor p's values (checked when drawn: a replay checks that call's)."""
    arr = np.asarray(arr, dtype=np.float64)
    if np.any(~((arr >= 0) & (arr <= 1))):
        raise RuntimeError("Expected p_in >= 0 && p_in <= 1 to be true, but got false.")
    return arr


def bernoulli_(t, p=0.5, *, generator=None):
    _check_gen(generator, "bernoulli_")
    probs = np.broadcast_to(_probabilities(p, "bernoulli_"), t._data.shape)
    return _fill_with(t, _uniform(t._data.size, np.float64, generator).reshape(t._data.shape) < probs)


def random_(t, from_=None, to=None, *, generator=None, **kw):
    """random_(to) or random_(from, to): integers in [from, to); random_() draws from
    [0, 2**mantissa] for floats (torch's range), [0, max] for integers."""
    from_ = kw.pop("from", from_)
    _check_gen(generator, "random_")
    if to is None and from_ is not None:
        from_, to = 0, from_
    if from_ is None:
        from_ = 0
        kind = t._data.dtype
        to = {np.dtype(np.float32): (1 << 24) + 1, np.dtype(np.float64): (1 << 53) + 1,
              np.dtype(np.bool_): 2}.get(kind, None)
        to = int(np.iinfo(kind).max) + 1 if to is None else to
    if from_ >= to:
        raise RuntimeError(f"random_ expects 'from' to be less than 'to', but got from={from_} >= to={to}")
    span = int(to) - int(from_)
    n = t._data.size
    if generator is None:
        values = _t._rng[0].integers(from_, to, n)
    else:
        raw = generator.random64(n) if span >= 1 << 32 else generator.random32(n)
        values = (raw % np.uint64(span)).astype(np.int64) + int(from_)
    return _fill_with(t, values)


def fill_diagonal_(t, fill_value, wrap=False):
    if isinstance(fill_value, Tensor) and fill_value._data.ndim == 0:
        fill_value = fill_value.item()  # torch takes a 0-d tensor as the number
    if not isinstance(fill_value, (int, float, bool)):
        raise TypeError(f"fill_diagonal_(): argument 'fill_value' (position 1) must be Number, not "
                        f"{type(fill_value).__name__}")
    shape = t._data.shape
    if len(shape) < 2:
        raise RuntimeError("dimensions must larger than 1")
    if len(shape) > 2 and len(set(shape)) != 1:
        raise RuntimeError("all dimensions of input must be of equal length")
    mask = np.zeros(shape, dtype=bool)
    np.fill_diagonal(mask, True, wrap=wrap)
    inplace.setitem(t, np.nonzero(mask), fill_value)
    return t


def _zero_grad_to(out, *inputs):
    """out, recorded so that each input requiring grad gets a zero gradient through it."""
    for x in inputs:
        if isinstance(x, Tensor) and x.requires_grad:
            out = F.where(_t.tensor(False), x, out)  # (a factory's False: a constant of a compiled step)
    return out


def bernoulli(input, p=None, *, generator=None):
    _check_gen(generator, "bernoulli")
    if not isinstance(input, Tensor):
        raise TypeError(f"bernoulli(): argument 'input' (position 1) must be Tensor, not {type(input).__name__}")
    _float_only(input, "bernoulli_tensor_cpu_self_")
    shape, npd, dev = input._data.shape, input._data.dtype, input.device
    if isinstance(p, Tensor):
        source = p
    elif p is None:
        source = input
    else:
        source, q = (), _probabilities(p, "bernoulli")

    def draw(*probs):  # (the probabilities' tensor, when they are one)
        probs = _tensor_probabilities(probs[0]) if probs else q
        return (_t.place((_uniform(int(np.prod(shape)), np.float64, generator).reshape(shape) < probs)
                         .astype(npd), dev),)
    out = _t.drawn(draw, (source,) if isinstance(source, Tensor) else ())
    return _zero_grad_to(out, input)


def multinomial(input, num_samples, replacement=False, *, generator=None):
    _check_gen(generator, "multinomial")
    if input._data.ndim not in (1, 2):
        raise RuntimeError("prob_dist must be 1 or 2 dim")
    if input._data.dtype.kind != "f":
        raise RuntimeError(f"multinomial only supports floating-point dtypes for input, got: "
                           f"{scalar_name(input._data.dtype)}")
    if num_samples <= 0:
        raise RuntimeError("cannot sample n_sample <= 0 samples")
    shape, dev = input._data.shape[:-1] + (num_samples,), input.device

    def draw(weights):
        rows = np.atleast_2d(np.asarray(weights, dtype=np.float64))
        if not np.all((rows >= 0) & np.isfinite(rows)):
            raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
        out = np.stack([weighted_draws(r, num_samples, replacement, generator) for r in rows]).astype(np.int64)
        return (_t.place(out.reshape(shape), dev),)
    return _t.drawn(draw, (input,))


def normal(mean=0.0, std=1.0, size=None, *, generator=None, dtype=None, device=None, requires_grad=False):
    """normal(mean, std) with either a Tensor, or normal(mean: float, std: float, size)."""
    _check_gen(generator, "normal")
    tensors = [x for x in (mean, std) if isinstance(x, Tensor)]
    decides = mean if isinstance(mean, Tensor) else std  # the tensor whose dtype the draws take
    if isinstance(decides, Tensor) and decides._data.dtype.kind != "f":  # torch draws floats only
        raise _dt.not_implemented("normal_kernel_cpu", decides._data.dtype)
    if not tensors:
        if size is None:
            raise TypeError("normal() received an invalid combination of arguments - got (float, float), "
                            "but expected (float mean, float std, tuple of ints size)")
        if std < 0:
            raise RuntimeError(f"normal expects std >= 0.0, but found std {std}")
        shape, npd, dev = _t.factory_args((size,), dtype, device, "normal", "normal_kernel_cpu")
        return _t.drawn(lambda: (_t.place((mean + std * _standard_normal(int(np.prod(shape)), np.float64, generator)
                                           ).reshape(shape).astype(npd), dev),), (), requires_grad)
    if not isinstance(std, Tensor) and std < 0:
        raise RuntimeError(f"normal expects std >= 0.0, but found std {std}")
    npd, dev = tensors[0]._data.dtype, tensors[0].device
    shape = np.broadcast_shapes(*(x._data.shape if isinstance(x, Tensor) else () for x in (mean, std)))
    m_is, s_is = isinstance(mean, Tensor), isinstance(std, Tensor)

    def draw(*arrays):  # the tensor ones of mean and std, in that order
        m = arrays[0] if m_is else mean
        s = arrays[-1] if s_is else std
        if s_is and np.any(s < 0):
            raise RuntimeError("normal expects all elements of std >= 0.0")
        eps = _standard_normal(int(np.prod(shape)), np.float64, generator).reshape(shape)
        return (_t.place(np.asarray(m + s * eps).astype(npd), dev),)
    out = _t.drawn(draw, tuple(tensors))
    return _zero_grad_to(out, mean, std)


def _random_factory(base, draw, fn, kernel):
    """rand / randn with the generator= keyword; the global generator's path is base's (a
    draw with a Generator leaves the global one untouched, as in torch)."""
    def make(*size, generator=None, dtype=None, device=None, requires_grad=False, **kw):
        _check_gen(generator, fn)
        if generator is None:
            return base(*size, dtype=dtype, device=device, requires_grad=requires_grad, **kw)
        shape, npd, dev = _t.factory_args(size, dtype, device, fn, kernel)
        return _t.drawn(lambda: (_t.place(draw(int(np.prod(shape)), npd, generator).reshape(shape), dev),), (),
                        requires_grad)
    make.__name__ = fn
    return make


rand = _random_factory(_t.rand, _uniform, "rand", "check_uniform_bounds")
randn = _random_factory(_t.randn, _standard_normal, "randn", "normal_kernel_cpu")


def randint_like(input, low=0, high=None, *, dtype=None, device=None, requires_grad=False):
    if high is None:
        low, high = 0, low
    if (dtype or input.dtype) is _dt.bool_ and high > 2:
        raise RuntimeError("to - 1 is out of bounds for bool")
    return _random.randint(low, high, tuple(input._data.shape), dtype=dtype or input.dtype,
                           device=device or input.device, requires_grad=requires_grad)


def manual_seed(seed):
    """Seeds the global draws and returns torch.default_generator, as torch does."""
    _t.manual_seed(seed)
    return default_generator.manual_seed(seed)


METHODS = {"uniform_": uniform_, "normal_": normal_, "exponential_": exponential_, "bernoulli_": bernoulli_,
           "random_": random_, "fill_diagonal_": fill_diagonal_,
           "bernoulli": bernoulli, "multinomial": multinomial}
FUNCTIONS = {"bernoulli": bernoulli, "multinomial": multinomial, "normal": normal, "rand": rand, "randn": randn,
             "randint_like": randint_like, "manual_seed": manual_seed, "default_generator": default_generator}
