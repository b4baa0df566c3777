"""torch.Generator, torch.default_generator, randperm and randint: PyTorch's CPU stream.

A Generator is _core/rng.Engine (torch's Mersenne Twister and its transforms, bit for bit)
with torch's Python API on top: manual_seed / seed / initial_seed, get_state / set_state as
torch's 5056-byte uint8 tensor (a state saved by torch restores here and back), and the
recording hooks that let a jitgrad.compile replay change and read the stream where eager
does. `default_generator` is the global stream every draw without `generator=` uses
(graph/tensor.py's `_rng[0]`), so `manual_seed(s)` then any random op gives torch's numbers.
"""
import numpy as np

from jitgrad._core import device as _device
from jitgrad._core import rng as _engine
from jitgrad._core.capture import state as _cap
from jitgrad.graph import tensor as _t
from jitgrad.graph.tensor import Tensor, _dtype_arg, _is_int, _size_arg, _tname, drawn, place, replayed

DEFAULT_SEED = 67280421310721  # what torch seeds a new Generator with
_UINT64 = 1 << 64


class Generator(_engine.Engine):
    """torch.Generator for the CPU: manual_seed, initial_seed, seed, get_state/set_state."""

    def __init__(self, device="cpu"):
        dev = _device.check(device, "Generator")
        if dev.type != "cpu":
            raise RuntimeError("jitgrad's Generator draws on the cpu only (a CUDA tensor's random numbers are "
                               "drawn on the host)")
        self.device = dev
        super().__init__(DEFAULT_SEED)
        # (a Generator made inside a compiled step starts afresh at each replay, as eager's)
        replayed(lambda: self.reseed(DEFAULT_SEED), "Generator()")

    def manual_seed(self, seed):
        if isinstance(seed, bool) or not _is_int(seed):
            raise RuntimeError(f"manual_seed expected a long, but got {_tname(seed)}")
        seed = int(seed)
        if not -(1 << 63) <= seed < _UINT64:
            raise ValueError("Overflow when unpacking long long")
        seed %= _UINT64  # torch keeps a negative seed as its unsigned 64-bit value
        self.reseed(seed)
        replayed(lambda: self.reseed(seed), "Generator.manual_seed")
        return self

    def initial_seed(self):
        return self._seed

    def seed(self):
        """Seed from the operating system's entropy, as torch's seed(); returns that seed."""
        s = int(np.random.SeedSequence().entropy % _UINT64)
        self.reseed(s)
        replayed(self.seed, "Generator.seed")  # (a new seed at every replay, as eager's)
        return s

    def get_state(self):
        """The generator's state in torch's layout (CPUGeneratorImplState, 5056 bytes), one byte
        per element of an int64 tensor: jitgrad has no uint8 dtype yet (torch's is a uint8
        tensor of the same bytes; set_state takes either)."""
        return drawn(lambda: (self.state_bytes().astype(np.int64),))  # (a compiled replay reads it then)

    def set_state(self, new_state):
        arr = _state_bytes(new_state)
        self.load_bytes(arr)
        if _cap.on and _cap.mine() and isinstance(new_state, Tensor):  # replayed with the tensor's value then
            _cap.rec.python(lambda a: (self.load_bytes(_state_bytes(a)), ())[1], (new_state,), (),
                            "Generator.set_state")
        return self

    def uniform64(self, n):
        """n doubles in [0, 1) (torch's uniform_real_distribution<double>)."""
        return self.uniform(n, np.float64)

    def __repr__(self):
        return f"<jitgrad.Generator object at {id(self):#x}>"


# the streams of the draws made without a generator: seeded from the system's entropy at
# start-up, as torch seeds its default generators (an unseeded run differs from the last)
default_generator = Generator()
_t._rng[:] = [default_generator, Generator()]
for _g in _t._rng:
    _g.reseed(int(np.random.SeedSequence().entropy % _UINT64))


def _state_bytes(state):
    """A state's 5056 bytes: get_state's int64 tensor, or torch's own uint8 tensor (or array)."""
    if isinstance(state, Tensor):
        arr = state._array()
    elif hasattr(state, "__array__") and hasattr(state, "dtype"):  # a real torch.ByteTensor, a numpy array
        arr = np.asarray(state)
    else:
        raise TypeError(f"expected a torch.ByteTensor, but got {_tname(state)}")
    if arr.dtype.kind not in "iu":
        raise TypeError("RNG state must be a torch.ByteTensor")
    if arr.size != _engine.STATE_BYTES:
        raise RuntimeError(f"Expected a CPUGeneratorImplState of size {_engine.STATE_BYTES} but found the input "
                           f"RNG state size to be {arr.size}")
    arr = arr.ravel()
    if arr.dtype != np.uint8:
        if np.any((arr < 0) | (arr > 255)):
            raise RuntimeError("RNG state must be a torch.ByteTensor: its values are bytes, 0 to 255")
        arr = arr.astype(np.uint8)
    return arr


def _check_generator(generator, fn):
    if generator is not None and not isinstance(generator, Generator):
        raise TypeError(f"{fn}() received an invalid combination of arguments - got generator={_tname(generator)}")


def _permutation(n, generator, dev):
    return (generator or _t.stream(dev)).permutation(n)


def randperm(n, *, generator=None, dtype=None, device=None, requires_grad=False):
    """A random permutation of 0..n-1 (int64 unless dtype says otherwise)."""
    if isinstance(n, bool) or not _is_int(n):
        raise TypeError(f"randperm(): argument 'n' (position 1) must be int, not {_tname(n)}")
    _check_generator(generator, "randperm")
    if n < 0:
        raise RuntimeError(f"Trying to create tensor with negative dimension {n}: [{n}]")
    npd = _dtype_arg(dtype, "randperm") or np.dtype(np.int64)
    dev = _device.check(device, "randperm")
    n = int(n)
    return drawn(lambda: (place(_permutation(n, generator, dev).astype(npd), dev),), (), requires_grad)


def randint(*args, size=None, generator=None, dtype=None, device=None, requires_grad=False):
    """randint(high, size) or randint(low, high, size): integers in [low, high), int64 unless
    dtype says otherwise."""
    if size is not None:
        args = args + (size,)
    if len(args) == 2:
        low, (high, size) = 0, args
    elif len(args) == 3:
        low, high, size = args
    else:
        raise TypeError(f"randint() takes 2 or 3 positional arguments (high, size or low, high, size) but "
                        f"{len(args)} were given")
    for name, v in (("low", low), ("high", high)):
        if isinstance(v, bool) or not _is_int(v):
            raise TypeError(f"randint(): argument '{name}' must be int, not {_tname(v)}")
    _check_generator(generator, "randint")
    low, high = int(low), int(high)
    if low >= high:
        raise RuntimeError(f"random_ expects 'from' to be less than 'to', but got from={low} >= to={high}")
    shape = _size_arg((size,), "randint")
    npd = _dtype_arg(dtype, "randint") or np.dtype(np.int64)
    dev = _device.check(device, "randint")
    count = int(np.prod(shape))
    span = high - low

    def draw():
        values = (generator or _t.stream(dev)).integers(count, low, span)  # torch: random() % range + from
        return (place(values.reshape(shape).astype(npd), dev),)
    return drawn(draw, (), requires_grad)


def weighted_draws(weights, num_samples, replacement, generator, check_only=False):
    """Indices drawn with probability proportional to `weights` (a float64 array), as
    torch.multinomial of a float64 row. With replacement (two samples or more) a uniform
    double per sample is searched in the normalised cumulative sums; otherwise torch's race:
    the top num_samples of weights / Exp(1) draws (exponential_ over the row)."""
    if np.any(~(weights >= 0)):   # NaN included, as in torch
        raise RuntimeError("invalid multinomial distribution (encountering probability entry < 0)")
    if np.any(np.isinf(weights)):
        raise RuntimeError("invalid multinomial distribution (encountering probability entry = infinity or NaN)")
    if weights.sum() <= 0:
        raise RuntimeError("invalid multinomial distribution (sum of probabilities <= 0)")
    if not replacement and num_samples > len(weights):
        raise RuntimeError("cannot sample n_sample > prob_dist.size(-1) samples without replacement")
    if check_only:
        return None
    gen = generator or default_generator
    if replacement and num_samples > 1:
        cumulative = np.cumsum(weights)
        return np.searchsorted(cumulative / cumulative[-1], gen.uniform64(num_samples), side="left")
    keys = weights / gen.exponential(len(weights), 1.0)
    return np.argmax(keys)[None] if num_samples == 1 else np.argsort(-keys, kind="stable")[:num_samples]
