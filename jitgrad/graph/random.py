"""torch.Generator, randperm and randint, drawing the same numbers as PyTorch's CPU generator.

A torch.Generator is a 32-bit Mersenne Twister seeded with the low 32 bits of its seed
(PyTorch's default seed when none is given), and randperm / randint reduce its raw
outputs modulo a range. numpy's MT19937 with its legacy seeding is the same engine, so
`randperm(n, generator=Generator().manual_seed(s))` is torch's permutation: a DataLoader
shuffled with a seeded generator visits the samples in the order PyTorch's does.

Without a generator these draw from the global generator (graph/tensor.py's `_rng`), as
randn does; those numbers are jitgrad's own, not PyTorch's.
"""
import numpy as np

from jitgrad._core import device as _device
from jitgrad._core.capture import state as _cap
from jitgrad.graph.tensor import (
    Tensor,
    _dtype_arg,
    _is_int,
    _rng,
    _size_arg,
    _tname,
    drawn,
    from_numpy,
    place,
    replayed,
)

DEFAULT_SEED = 67280421310721  # what torch seeds a new Generator with
_UINT64 = 1 << 64


class Generator:
    """torch.Generator for the CPU: manual_seed, initial_seed, seed, get_state/set_state."""

    def __init__(self, device="cpu"):
        dev = _device.check(device, "Generator")
        if dev.type != "cpu":
            raise RuntimeError("jitgrad's Generator draws on the cpu only (a CUDA tensor's random numbers are "
                               "drawn on the host)")
        self.device = dev
        self.manual_seed(DEFAULT_SEED)

    def manual_seed(self, seed):
        if isinstance(seed, bool) or not _is_int(seed):
            raise RuntimeError(f"manual_seed expected a long, but got {_tname(seed)}")
        seed = int(seed)
        if not -(1 << 63) <= seed < _UINT64:
            raise ValueError("Overflow when unpacking long long")
        self._reseed(seed)
        replayed(lambda: self._reseed(seed), "Generator.manual_seed")
        return self

    def _reseed(self, seed):
        self._seed = seed % _UINT64  # torch keeps a negative seed as its unsigned 64-bit value
        self._mt = np.random.MT19937(0)
        self._mt._legacy_seeding(self._seed & 0xFFFFFFFF)  # init_genrand: torch's engine, seeded alike

    def initial_seed(self):
        return self._seed

    def seed(self):
        """Seed from the operating system's entropy, as torch's seed(); returns that seed."""
        s = int(np.random.SeedSequence().entropy % (1 << 63))
        self._reseed(s)
        replayed(self.seed, "Generator.seed")  # (a new seed at every replay, as eager's)
        return s

    def get_state(self):
        """The generator's state as an int64 tensor: the seed, the position, the 624 words.
        (torch's is a 5056-byte uint8 tensor; the two do not mix.)"""
        def state():
            st = self._mt.state["state"]
            seed = self._seed - _UINT64 if self._seed >= 1 << 63 else self._seed
            return (np.concatenate([[seed, st["pos"]], st["key"].astype(np.int64)]),)
        return drawn(state)  # (a jitgrad.compile replay reads the state then)

    def set_state(self, new_state):
        arr = new_state._data if isinstance(new_state, Tensor) else None
        if arr is None or arr.shape != (626,) or arr.dtype != np.int64:
            raise RuntimeError("Generator.set_state expects the int64 tensor of 626 elements that get_state "
                               "returns")
        self._load(arr)
        if _cap.on and _cap.mine():  # replayed with the state tensor's value then
            _cap.rec.python(lambda a: (self._load(a), ())[1], (new_state,), (), "Generator.set_state")
        return self

    def _load(self, arr):
        self._seed = int(arr[0]) % _UINT64
        self._mt.state = {"bit_generator": "MT19937", "state": {"key": arr[2:].astype(np.uint32), "pos": int(arr[1])}}

    def random32(self, n):
        """n raw 32-bit outputs (torch's random())."""
        return self._mt.random_raw(n).astype(np.uint64)

    def random64(self, n):
        """n 64-bit outputs, each two 32-bit ones, the first the high half (torch's random64())."""
        raw = self._mt.random_raw(2 * n).astype(np.uint64)
        return (raw[0::2] << np.uint64(32)) | raw[1::2]

    def uniform64(self, n):
        """n doubles in [0, 1): the low 53 bits of random64() scaled (torch's uniform for double)."""
        return (self.random64(n) & np.uint64((1 << 53) - 1)).astype(np.float64) * 2.0 ** -53

    def __repr__(self):
        return f"<jitgrad.Generator object at {id(self):#x}>"


def _check_generator(generator, fn):
    if generator is not None and not isinstance(generator, Generator):
        raise TypeError(f"{fn}() received an invalid combination of arguments - got generator={_tname(generator)}")


def _permutation(n, generator):
    if generator is None:
        return _rng[0].permutation(n)
    perm = np.arange(n, dtype=np.int64)
    if n < 2:
        return perm
    # torch's loop: for i, swap i with i + (random() % (n - i)); random64() for a huge n
    raw = generator.random32(n - 1) if n < (1 << 32) // 20 else generator.random64(n - 1)
    offsets = (raw % np.arange(n, 1, -1, dtype=np.uint64)).astype(np.int64).tolist()
    p = perm.tolist()
    for i, z in enumerate(offsets):
        j = i + z
        p[i], p[j] = p[j], p[i]
    return np.array(p, dtype=np.int64)


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
    return drawn(lambda: (place(_permutation(n, generator).astype(npd), dev),), (), requires_grad)


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
        if generator is None:
            values = _rng[0].integers(low, high, count)
        else:
            raw = generator.random64(count) if span >= 1 << 32 else generator.random32(count)
            values = (raw % np.uint64(span)).astype(np.int64) + low   # torch: random() % range + from
        return (place(values.reshape(shape).astype(npd), dev),)
    return drawn(draw, (), requires_grad)


def weighted_draws(weights, num_samples, replacement, generator):
    """Indices drawn with probability proportional to `weights` (a float64 array), as
    torch.multinomial. With replacement and a Generator these are torch's draws (a uniform
    double per sample, searched in the normalised cumulative sums) for two samples or more;
    without replacement or for one sample, torch runs an exponential race whose exponentials
    it draws its own way, so those indices are jitgrad's (same distribution, other numbers)."""
    if np.any(~(weights >= 0)):   # NaN included, as in torch
        raise RuntimeError("invalid multinomial distribution (encountering probability entry < 0)")
    if np.any(np.isinf(weights)):
        raise RuntimeError("invalid multinomial distribution (encountering probability entry = infinity or NaN)")
    if weights.sum() <= 0:
        raise RuntimeError("invalid multinomial distribution (sum of probabilities <= 0)")
    if not replacement and num_samples > len(weights):
        raise RuntimeError("cannot sample n_sample > prob_dist.size(-1) samples without replacement")
    draw = generator.uniform64 if generator is not None else _rng[0].random
    if replacement and num_samples > 1:
        cumulative = np.cumsum(weights)
        return np.searchsorted(cumulative / cumulative[-1], draw(num_samples), side="left")
    # weights / Exp(1) noise: its top num_samples are a draw without replacement
    keys = weights / -np.log1p(-draw(len(weights)))
    return np.argsort(-keys, kind="stable")[:num_samples]


# --- torch.get_rng_state / set_rng_state over the global generator ---------------------------------------
# A stand-in kept small on purpose: the global generator is numpy's PCG64 (graph/tensor.py's `_rng`), so its
# state is saved as an int64 tensor of its six words (state and increment as 64-bit halves, the buffered
# 32-bit draw). torch's is a 5056-byte uint8 tensor of its Mersenne Twister; the two do not mix.
_MASK64 = (1 << 64) - 1


def _signed(u):
    return u - (1 << 64) if u >= 1 << 63 else u


def get_rng_state():
    """The default generator's state, for set_rng_state to draw the same numbers again."""
    st = _rng[0].bit_generator.state
    if st["bit_generator"] != "PCG64":
        raise RuntimeError(f"get_rng_state: unexpected global generator {st['bit_generator']}")
    s, inc = st["state"]["state"], st["state"]["inc"]
    words = [s >> 64, s & _MASK64, inc >> 64, inc & _MASK64, st["has_uint32"], st["uinteger"]]
    return from_numpy(np.array([_signed(w) for w in words], dtype=np.int64))


def set_rng_state(new_state):
    """Restore a state get_rng_state returned."""
    arr = new_state._data if isinstance(new_state, Tensor) else None
    if arr is None or not isinstance(arr, np.ndarray) or arr.shape != (6,) or arr.dtype != np.int64:
        raise RuntimeError("set_rng_state expects the int64 tensor of 6 elements that jitgrad's get_rng_state "
                           "returns (jitgrad's default generator is not torch's Mersenne Twister)")
    w = [int(v) & _MASK64 for v in arr]
    _rng[0].bit_generator.state = {"bit_generator": "PCG64",
                                   "state": {"state": (w[0] << 64) | w[1], "inc": (w[2] << 64) | w[3]},
                                   "has_uint32": w[4], "uinteger": w[5]}
