"""Seeded draws are PyTorch's CPU numbers, bit for bit.

One table of random ops run after the same seed in torch and in jitgrad, in float32 and
float64, for sizes on both sides of torch's algorithm switches (normal_fill from 16 elements
on a contiguous tensor, the scalar Box-Muller with its cached second sample below; a 64-bit
word for integer ranges of 2**32 or more), contiguous and strided outputs; then the
generator's state (torch's byte layout, both ways), Generator objects, fork_rng, the nn.init
initialisers and layers' default weights, and a compiled step's draws."""
import numpy as np
import pytest

import jitgrad

torch = pytest.importorskip("torch")

SEEDS = (0, 7, 2 ** 40 + 3)   # (torch seeds its Mersenne Twister with the low 32 bits)
SIZES = (1, 2, 15, 16, 17, 33, 1000)
DTYPES = ("float32", "float64")


def _np(x):
    if isinstance(x, (list, tuple)):
        return [_np(v) for v in x]
    return x.detach().numpy() if hasattr(x, "detach") else np.asarray(x)


def _same(f, seed):
    got = []
    for lib in (torch, jitgrad):
        lib.manual_seed(seed)
        got.append(_np(f(lib)))
    return got


def _assert_bitwise(want, got, what):
    if isinstance(want, list):
        assert len(want) == len(got), what
        for w, g in zip(want, got):
            _assert_bitwise(w, g, what)
        return
    assert want.shape == got.shape, f"{what}: shape {got.shape} != {want.shape}"
    assert want.dtype == got.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    same = (want == got) | (np.isnan(want) & np.isnan(got)) if want.dtype.kind == "f" else want == got
    assert same.all(), f"{what}: {int((~same).sum())} of {want.size} differ, first {got[~same][:3]} != " \
                       f"{want[~same][:3]}"


def _d(lib, name):
    return getattr(lib, name)


# name -> f(lib, n, dtype name): each draw twice or after another draw, so that the state a
# draw leaves behind (the cached normal among it) is checked as well as its numbers
FLOAT_DRAWS = {
    "rand": lambda L, n, d: [L.rand(n, dtype=_d(L, d)), L.rand(3, dtype=_d(L, d))],
    "randn": lambda L, n, d: [L.randn(n, dtype=_d(L, d)), L.randn(1, dtype=_d(L, d)), L.randn(n, dtype=_d(L, d))],
    "randn 2-d": lambda L, n, d: L.randn(2, n, dtype=_d(L, d)),
    "normal_": lambda L, n, d: [L.empty(n, dtype=_d(L, d)).normal_(1.5, 0.25), L.randn(2, dtype=_d(L, d))],
    "normal_ transposed": lambda L, n, d: L.empty(n, 3, dtype=_d(L, d)).t().normal_(-2.0, 3.0),
    "uniform_": lambda L, n, d: L.empty(n, dtype=_d(L, d)).uniform_(-0.37, 0.61),
    "uniform_ transposed": lambda L, n, d: L.empty(n, 3, dtype=_d(L, d)).t().uniform_(-2, 3),
    "uniform_ sliced": lambda L, n, d: L.zeros(n, 4, dtype=_d(L, d))[:, ::2].uniform_(),
    "exponential_": lambda L, n, d: L.empty(n, dtype=_d(L, d)).exponential_(2.5),
    "bernoulli(p tensor)": lambda L, n, d: L.bernoulli(L.linspace(0, 1, n, dtype=_d(L, d))),
    "bernoulli(input, p)": lambda L, n, d: L.bernoulli(L.zeros(n, dtype=_d(L, d)), 0.3),
    "bernoulli_(p)": lambda L, n, d: L.empty(n, dtype=_d(L, d)).bernoulli_(0.6),
    "bernoulli_(p tensor)": lambda L, n, d: L.empty(n, dtype=_d(L, d)).bernoulli_(L.full((n,), 0.4, dtype=_d(L, d))),
    "F.dropout": lambda L, n, d: L.nn.functional.dropout(L.ones(n, 2, dtype=_d(L, d)), 0.3),
    "nn.Dropout transposed": lambda L, n, d: L.nn.Dropout(0.5)(L.ones(n, 3, dtype=_d(L, d)).t()),
    "rand_like": lambda L, n, d: L.rand_like(L.zeros(n, dtype=_d(L, d))),
    "randn_like": lambda L, n, d: L.randn_like(L.zeros(n, dtype=_d(L, d))),
    "normal(tensor, tensor)": lambda L, n, d: L.normal(L.linspace(-1, 1, n, dtype=_d(L, d)),
                                                       L.linspace(0.1, 2, n, dtype=_d(L, d))),
    "normal(tensor, float)": lambda L, n, d: L.normal(L.linspace(-1, 1, n, dtype=_d(L, d)), 0.7),
    "normal(float, tensor)": lambda L, n, d: L.normal(0.2, L.linspace(0.1, 2, n, dtype=_d(L, d))),
    "normal(float, float, size)": lambda L, n, d: L.normal(0.2, 1.3, (n,), dtype=_d(L, d)),
    "random_()": lambda L, n, d: L.empty(n, dtype=_d(L, d)).random_(),
    "random_(from, to)": lambda L, n, d: L.empty(n, dtype=_d(L, d)).random_(-3, 40),
    "multinomial": lambda L, n, d: L.multinomial(L.linspace(0.1, 1, n, dtype=_d(L, d)), min(n, 3)),
    "multinomial(1)": lambda L, n, d: L.multinomial(L.rand(4, n, dtype=_d(L, d)) + 0.01, 1),
    "multinomial(replacement)": lambda L, n, d: L.multinomial(L.linspace(0.1, 1, n, dtype=_d(L, d)), 5, True),
}


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", FLOAT_DRAWS)
def test_float_draws_are_torchs(name, dtype, seed):
    for n in SIZES:
        want, got = _same(lambda L: FLOAT_DRAWS[name](L, n, dtype), seed)
        _assert_bitwise(want, got, f"{name}, {dtype}, n={n}, seed={seed}")


INT_DRAWS = {
    "randint": lambda L, n: L.randint(-5, 7, (n,)),
    "randint(high)": lambda L, n: L.randint(10, (n, 2)),
    "randint, a 64-bit range": lambda L, n: L.randint(-2 ** 40, 2 ** 40, (n,)),
    "randint int32": lambda L, n: L.randint(0, 1000, (n,), dtype=L.int32),
    "randint_like": lambda L, n: L.randint_like(L.zeros(n, 2), 3, 9),
    "randperm": lambda L, n: L.randperm(n),
    "random_() int64": lambda L, n: L.empty(n, dtype=L.int64).random_(),
    "random_() int32": lambda L, n: L.empty(n, dtype=L.int32).random_(),
    "random_(to) bool": lambda L, n: L.empty(n, dtype=L.bool).random_(2),
}


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", INT_DRAWS)
def test_integer_draws_are_torchs(name, seed):
    for n in SIZES:
        want, got = _same(lambda L: [INT_DRAWS[name](L, n), L.rand(2)], seed)
        _assert_bitwise(want, got, f"{name}, n={n}, seed={seed}")


def test_a_million_floats_are_torchs():
    """The bulk paths (no Python loop): a million draws of each kind, the same numbers."""
    n = 1_000_000
    for make in (lambda L: L.rand(n), lambda L: L.randn(n), lambda L: L.randn(n, dtype=L.float64),
                 lambda L: L.empty(n, dtype=L.float64).uniform_(-1, 2)):
        want, got = _same(make, 5)
        _assert_bitwise(want, got, "a million draws")


INITS = {
    "Linear(3, 4)": lambda L: list(L.nn.Linear(3, 4).parameters()),
    "Linear(30, 40)": lambda L: list(L.nn.Linear(30, 40).parameters()),
    "Linear float64": lambda L: list(L.nn.Linear(5, 6, dtype=L.float64).parameters()),
    "Conv2d(3, 8, 3)": lambda L: list(L.nn.Conv2d(3, 8, 3).parameters()),
    "Embedding(10, 5)": lambda L: list(L.nn.Embedding(10, 5).parameters()),
    "a Sequential": lambda L: list(L.nn.Sequential(L.nn.Linear(4, 8), L.nn.ReLU(), L.nn.LayerNorm(8),
                                                   L.nn.Linear(8, 2)).parameters()),
    "xavier_uniform_": lambda L: L.nn.init.xavier_uniform_(L.empty(5, 7), gain=1.3),
    "xavier_normal_": lambda L: L.nn.init.xavier_normal_(L.empty(5, 7)),
    "kaiming_uniform_": lambda L: L.nn.init.kaiming_uniform_(L.empty(6, 4, 3), nonlinearity="relu"),
    "kaiming_normal_": lambda L: L.nn.init.kaiming_normal_(L.empty(40, 7), mode="fan_out"),
    "uniform_": lambda L: L.nn.init.uniform_(L.empty(20, 3, dtype=L.float64), -2, 5),
    "normal_": lambda L: L.nn.init.normal_(L.empty(3, 20), 1.0, 0.02),
    "normal_ transposed": lambda L: L.nn.init.normal_(L.empty(20, 3).t(), 1.0, 0.02),
    "init with a generator": lambda L: L.nn.init.uniform_(L.empty(9), generator=L.Generator().manual_seed(4)),
}


@pytest.mark.parametrize("name", INITS)
def test_initialisers_and_default_weights_are_torchs(name):
    for seed in (0, 1):
        want, got = _same(INITS[name], seed)
        _assert_bitwise(want, got, name)


def test_the_state_is_torchs_bytes_both_ways():
    for lib in (torch, jitgrad):
        lib.manual_seed(123)
    want, got = _np(torch.get_rng_state()), _np(jitgrad.get_rng_state())
    assert got.size == 5056 and (got.astype(np.uint8) == want).all()   # just seeded: next = 0
    for lib in (torch, jitgrad):
        lib.rand(700)
        lib.randn(3, dtype=lib.float64)   # leaves a cached normal
    assert (_np(jitgrad.get_rng_state()).astype(np.uint8) == _np(torch.get_rng_state())).all()
    # a state saved by torch continues torch's stream here, cached normal included, and back
    saved = torch.get_rng_state()
    want = [torch.randn(1, dtype=torch.float64), torch.rand(5)]
    jitgrad.manual_seed(0)
    jitgrad.set_rng_state(saved)
    got = [jitgrad.randn(1, dtype=jitgrad.float64), jitgrad.rand(5)]
    _assert_bitwise(_np(want), _np(got), "torch's state restored in jitgrad")
    torch.set_rng_state(torch.from_numpy(_np(jitgrad.get_rng_state()).astype(np.uint8)))
    _assert_bitwise(_np(torch.randn(20)), _np(jitgrad.randn(20)), "jitgrad's state restored in torch")


def test_state_save_and_restore():
    jitgrad.manual_seed(3)
    jitgrad.randn(5)
    state = jitgrad.get_rng_state()
    a = [jitgrad.randn(7), jitgrad.rand(2), jitgrad.randperm(9)]
    jitgrad.rand(100)
    jitgrad.set_rng_state(state)
    b = [jitgrad.randn(7), jitgrad.rand(2), jitgrad.randperm(9)]
    _assert_bitwise(_np(a), _np(b), "restored")
    assert jitgrad.initial_seed() == 3
    with pytest.raises(TypeError, match="expected a torch.ByteTensor, but got list"):
        jitgrad.set_rng_state([1, 2])
    with pytest.raises(TypeError, match="RNG state must be a torch.ByteTensor"):
        jitgrad.set_rng_state(jitgrad.zeros(5056))
    with pytest.raises(RuntimeError, match="Expected a CPUGeneratorImplState of size 5056 but found the input RNG "
                                           "state size to be 10"):
        jitgrad.set_rng_state(jitgrad.zeros(10, dtype=jitgrad.int64))


def test_generator_objects():
    for lib in (torch, jitgrad):
        assert lib.Generator().initial_seed() == 67280421310721
        lib.manual_seed(0)
    gt, gj = torch.Generator().manual_seed(-1), jitgrad.Generator().manual_seed(-1)
    assert gj.initial_seed() == gt.initial_seed() == 2 ** 64 - 1
    for make in (lambda L, g: L.randn(20, generator=g), lambda L, g: L.rand(3, dtype=L.float64, generator=g),
                 lambda L, g: L.randperm(10, generator=g), lambda L, g: L.randint(0, 5, (4,), generator=g),
                 lambda L, g: L.empty(4).normal_(generator=g), lambda L, g: L.bernoulli(L.full((6,), 0.5), generator=g),
                 lambda L, g: L.multinomial(L.ones(5), 2, generator=g)):
        _assert_bitwise(_np(make(torch, gt)), _np(make(jitgrad, gj)), "with a generator")
    # a generator's draws leave the default stream alone
    _assert_bitwise(_np(torch.rand(4)), _np(jitgrad.rand(4)), "the default stream after a generator's draws")
    st, sj = gt.get_state(), gj.get_state()
    assert (_np(sj).astype(np.uint8) == _np(st)).all()
    a = jitgrad.randn(3, generator=gj)
    assert (jitgrad.randn(3, generator=gj.set_state(sj)) == a).all()
    s = gj.seed()
    assert gj.initial_seed() == s and 0 <= s < 2 ** 64
    assert jitgrad.seed() == jitgrad.initial_seed()


def test_fork_rng():
    jitgrad.manual_seed(5)
    with jitgrad.random.fork_rng():
        inside = jitgrad.randn(4)
        jitgrad.manual_seed(99)
        jitgrad.rand(3)
    torch.manual_seed(5)
    _assert_bitwise(_np(torch.randn(4)), _np(inside), "inside fork_rng")
    # the block's draws and its reseed are forgotten: the same numbers again
    _assert_bitwise(_np(inside), _np(jitgrad.randn(4)), "after fork_rng: the state from before the block")
    assert jitgrad.random.initial_seed() == 5
    with jitgrad.random.fork_rng(enabled=False):
        jitgrad.rand(1)
    torch.rand(1)
    _assert_bitwise(_np(torch.rand(2)), _np(jitgrad.rand(2)), "fork_rng(enabled=False) forks nothing")


def test_a_compiled_step_draws_torchs_numbers():
    """jitgrad.compile replays each draw at its point of the step: the numbers of an eager
    torch step, call after call, and the stream where torch's is afterwards."""
    def step(x):
        return x * jitgrad.nn.functional.dropout(jitgrad.ones_like(x), 0.25) + jitgrad.randn(3, 17)

    def torch_step(x):
        return x * torch.nn.functional.dropout(torch.ones_like(x), 0.25) + torch.randn(3, 17)

    compiled = jitgrad.compile(step)
    jitgrad.manual_seed(2)
    torch.manual_seed(2)
    for k in range(3):
        x = np.full((3, 17), float(k + 1), np.float32)
        _assert_bitwise(_np(torch_step(torch.from_numpy(x))), _np(compiled(jitgrad.tensor(x))), f"call {k}")
    _assert_bitwise(_np(torch.rand(3)), _np(jitgrad.rand(3)), "the stream after the compiled calls")


def test_cuda_seeding_leaves_the_cpu_stream_alone():
    """torch.cuda.manual_seed seeds the CUDA generators only: the CPU numbers stay torch's."""
    jitgrad.manual_seed(8)
    torch.manual_seed(8)
    jitgrad.cuda.manual_seed(1)
    torch.cuda.manual_seed(1)
    _assert_bitwise(_np(torch.randn(5)), _np(jitgrad.randn(5)), "after cuda.manual_seed")


def test_the_compiled_avx_kernel_matches_its_numpy_reference():
    """normal_fill's float32 kernel twice: numba lane by lane with a hardware FMA, and numpy
    over arrays with an emulated one (the kernel when numba compiles nothing); both are
    torch's numbers, checked here on 2**18 uniforms and odd means and scales."""
    import numba

    from jitgrad._core import rng

    u = rng.Engine(11).uniform(1 << (12 if numba.config.DISABLE_JIT else 18), np.float32)
    for mean, std in ((0.0, 1.0), (3.3, 0.7), (-1e3, 1e-3)):
        a, b = u.copy(), u.copy()
        rng._fill16_f32(a, np.float32(mean), np.float32(std))
        rng._np_fill16_f32(b, np.float32(mean), np.float32(std))
        _assert_bitwise(b, a, f"mean {mean}, std {std}")


def test_data_loading_draws_torchs_order():
    """An unseeded-generator shuffle after manual_seed, random_split and the weighted sampler
    (both ways) visit torch's order and leave the stream where torch's is."""
    from torch.utils import data as td

    from jitgrad.utils import data as jd

    runs = {
        "DataLoader(shuffle=True)": lambda L, D: [b[0].tolist() for b in D.DataLoader(
            D.TensorDataset(L.arange(20)), batch_size=4, shuffle=True)],
        "random_split": lambda L, D: [list(s) for s in D.random_split(range(10), [3, 7])],
        "WeightedRandomSampler": lambda L, D: [list(D.WeightedRandomSampler([0.1, 0.5, 2, 1, 0.3], 4, replacement=r))
                                               for r in (True, False)],
    }
    for name, run in runs.items():
        torch.manual_seed(6)
        jitgrad.manual_seed(6)
        assert run(jitgrad, jd) == run(torch, td), name
        _assert_bitwise(_np(torch.rand(3)), _np(jitgrad.rand(3)), f"the stream after {name}")
