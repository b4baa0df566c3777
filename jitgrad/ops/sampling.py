"""Random sampling: the in-place initialisers (uniform_, normal_, bernoulli_, random_,
exponential_), torch.bernoulli / multinomial / normal, the *_like factories, and the
`generator=` keyword on rand / randn.

Every draw is PyTorch's CPU draw (graph/random.Generator over _core/rng.Engine): the given
generator's or torch.default_generator's, with torch's transforms, and written in the order
torch's TensorIterator visits the elements (memory order: a transposed tensor is filled along
its storage). A CUDA tensor's numbers are drawn on the host from the same stream.

PyTorch gives these samplers a zero gradient (UniformBackward0, NormalBackward*...): the
results here carry the same zero gradient, recorded as a copy or a where(False, ...)."""
import math

import numpy as np

from jitgrad._core import device as _device
from jitgrad._core import dtype as _dt
from jitgrad._core.rng import contiguous as _contiguous
from jitgrad._core.rng import laid_out as _laid_out
from jitgrad.graph import random as _random
from jitgrad.graph import tensor as _t
from jitgrad.graph.random import Generator, default_generator, weighted_draws  # noqa: F401
from jitgrad.graph.tensor import Tensor, scalar_name
from jitgrad.ops import functional as F
from jitgrad.ops import inplace


def _gen(generator, dev):
    """The generator a draw on device dev uses."""
    return _t.stream(dev) if generator is None else generator


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
    arr = t._data
    return _fill_with(t, _laid_out(arr, _gen(generator, t.device).uniform(arr.size, arr.dtype, float(from_), float(to))))


def normal_(t, mean=0.0, std=1.0, *, generator=None):
    _check_gen(generator, "normal_")
    _float_only(t, "normal_kernel_cpu")
    if std < 0:
        raise RuntimeError(f"normal expects std >= 0.0, but found std {std}")
    arr = t._data
    values = _gen(generator, t.device).normal(arr.size, arr.dtype, float(mean), float(std), _contiguous(arr))
    return _fill_with(t, _laid_out(arr, values))


def exponential_(t, lambd=1.0, *, generator=None):
    _check_gen(generator, "exponential_")
    if t._data.dtype.kind != "f":
        raise RuntimeError("Exponential distribution is a continuous probability distribution. dtype must be a "
                           f"floating point but you specified {scalar_name(t._data.dtype)}")
    if not lambd > 0:
        raise RuntimeError(f"exponential_ expects lambda > 0.0, but found lambda={lambd}")
    arr = t._data
    return _fill_with(t, _laid_out(arr, _gen(generator, t.device).exponential(arr.size, float(lambd)).astype(arr.dtype)))


def _probabilities(p, fn):
    if isinstance(p, Tensor):
        return _tensor_probabilities(p._array())
    if not 0 <= p <= 1:
        raise RuntimeError(f"{fn} expects p to be in [0, 1], but got p={p}")
    return np.float64(p)


def _tensor_probabilities(arr):
    """A tensor p's values in its own dtype (checked when drawn: a replay checks that call's)."""
    arr = np.asarray(arr)
    if arr.dtype.kind != "f":
        arr = arr.astype(np.float64)
    if np.any(~((arr >= 0) & (arr <= 1))):
        raise RuntimeError("Expected p_in >= 0 && p_in <= 1 to be true, but got false.")
    return arr


def _bernoulli_draws(arr, probs, generator, dev):
    """torch's bernoulli kernels over an output laid out as arr: `uniform < p`, the uniform a
    double for a double (or scalar) p, a float (24 bits) for a float p."""
    probs = np.asarray(probs)
    npd = np.float64 if probs.dtype == np.float64 else np.float32
    u = _laid_out(arr, _gen(generator, dev).uniform(int(np.prod(arr.shape)), npd))
    return u < np.broadcast_to(probs.astype(npd, copy=False), arr.shape)


def bernoulli_(t, p=0.5, *, generator=None):
    _check_gen(generator, "bernoulli_")
    return _fill_with(t, _bernoulli_draws(t._data, _probabilities(p, "bernoulli_"), generator, t.device))


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
    arr = t._data
    # torch: `word % span + from`, a 64-bit word for a span of 2**32 or more (random_()'s
    # int64 and double ranges among them)
    return _fill_with(t, _laid_out(arr, _gen(generator, t.device).integers(arr.size, int(from_), int(to) - int(from_))))


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
    npd, dev = input._data.dtype, input.device
    if isinstance(p, Tensor):
        source = p
    elif p is None:
        source = input
    else:
        source, q = (), _probabilities(p, "bernoulli")

    def draw(*arrays):  # (the input's array, then the probabilities' when they are a tensor)
        probs = _tensor_probabilities(arrays[-1]) if len(arrays) > 1 else q
        return (_t.place(_bernoulli_draws(arrays[0], probs, generator, dev).astype(npd), dev),)
    # (the result is empty_like(input): laid out as the input, which the draw reads for that)
    out = _t.drawn(draw, (input, source) if isinstance(source, Tensor) else (input,))
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
        rows = np.atleast_2d(np.asarray(weights))
        if not np.all((rows >= 0) & np.isfinite(rows)):
            raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
        gen = _gen(generator, dev)
        if replacement and num_samples > 1:
            out = np.stack([weighted_draws(r.astype(np.float64), num_samples, True, gen) for r in rows])
        else:
            # torch's race: q = empty_like(input).exponential_(1), then the top num_samples of
            # input / q per row (one exponential_ over the whole input, in its dtype)
            for r in rows:
                weighted_draws(r.astype(np.float64), num_samples, False, None, check_only=True)
            q = gen.exponential(rows.size, 1.0).astype(rows.dtype).reshape(rows.shape)
            keys = rows / q
            out = (np.argmax(keys, axis=1)[:, None] if num_samples == 1
                   else np.argsort(-keys, axis=1, kind="stable")[:, :num_samples])
        return (_t.place(out.astype(np.int64).reshape(shape), dev),)
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
        n = int(np.prod(shape))
        return _t.drawn(lambda: (_t.place(_gen(generator, dev).normal(n, npd, float(mean), float(std)).reshape(shape),
                                          dev),), (), requires_grad)
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
        # torch: output.normal_(0, std) then add_(mean) for a number std, otherwise
        # output.normal_(0, 1).mul_(std).add_(mean): each step in the output's dtype
        n = int(np.prod(shape))
        if s_is:
            out = _gen(generator, dev).normal(n, npd).reshape(shape) * np.asarray(s, npd)
        else:
            out = _gen(generator, dev).normal(n, npd, 0.0, float(s)).reshape(shape)
        return (_t.place(np.asarray(out + np.asarray(m, npd), npd), dev),)
    out = _t.drawn(draw, tuple(tensors))
    return _zero_grad_to(out, mean, std)


def _random_factory(draw, fn, kernel):
    """rand / randn with the generator= keyword (a fresh tensor: contiguous)."""
    def make(*size, generator=None, dtype=None, device=None, requires_grad=False, out=None, **kw):
        _check_gen(generator, fn)
        if out is not None or kw:
            raise TypeError(f"{fn}() got an unexpected keyword argument '{next(iter(kw), 'out')}'")
        shape, npd, dev = _t.factory_args(size, dtype, device, fn, kernel)
        n = math.prod(shape)
        return _t.drawn(lambda: (_t.place(draw(_gen(generator, dev), n, npd).reshape(shape), dev),), (), requires_grad)
    make.__name__ = fn
    return make


rand = _random_factory(lambda g, n, npd: g.uniform(n, npd), "rand", "check_uniform_bounds")
randn = _random_factory(lambda g, n, npd: g.normal(n, npd), "randn", "normal_kernel_cpu")


def _random_like(factory, fn):
    def make(input, *, generator=None, dtype=None, device=None, requires_grad=False, layout=None,
             memory_format=None):
        if not isinstance(input, Tensor):
            raise TypeError(f"{fn}(): argument 'input' (position 1) must be Tensor, not {type(input).__name__}")
        return factory(*input._data.shape, generator=generator, dtype=dtype or input.dtype,
                       device=device or input.device, requires_grad=requires_grad)
    make.__name__ = fn
    return make


rand_like = _random_like(rand, "rand_like")
randn_like = _random_like(randn, "randn_like")


def randint_like(input, low=0, high=None, *, generator=None, dtype=None, device=None, requires_grad=False,
                 layout=None, memory_format=None):
    if high is None:
        low, high = 0, low
    if (dtype or input.dtype) is _dt.bool_ and high > 2:
        raise RuntimeError("to - 1 is out of bounds for bool")
    return _random.randint(low, high, tuple(input._data.shape), generator=generator, dtype=dtype or input.dtype,
                           device=device or input.device, requires_grad=requires_grad)


def manual_seed(seed):
    """Seeds torch.default_generator (and the CUDA stream) and returns it, as torch does."""
    return _t.manual_seed(seed)


def seed():
    """torch.seed(): the default generator seeded from the system's entropy; that seed."""
    s = default_generator.seed()
    _t.stream(_device.device("cuda")).manual_seed(s)  # (torch seeds every device with it)
    return s


def initial_seed():
    return default_generator.initial_seed()


def get_rng_state():
    """torch.get_rng_state(): the default generator's state, torch's uint8 tensor."""
    return default_generator.get_state()


def set_rng_state(new_state):
    default_generator.set_state(new_state)


METHODS = {"uniform_": uniform_, "normal_": normal_, "exponential_": exponential_, "bernoulli_": bernoulli_,
           "random_": random_, "fill_diagonal_": fill_diagonal_,
           "bernoulli": bernoulli, "multinomial": multinomial}
FUNCTIONS = {"bernoulli": bernoulli, "multinomial": multinomial, "normal": normal, "rand": rand, "randn": randn,
             "randint_like": randint_like, "rand_like": rand_like, "randn_like": randn_like,
             "manual_seed": manual_seed, "seed": seed, "initial_seed": initial_seed, "get_rng_state": get_rng_state,
             "set_rng_state": set_rng_state, "default_generator": default_generator}
