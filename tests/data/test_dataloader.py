"""jitgrad.utils.data against torch.utils.data (torch 2.13): the same code runs with both
libraries (T is jitgrad or torch) and must give the same batches, in the same order: a
shuffle with a seeded Generator included, since jitgrad's Generator draws torch's numbers."""
import collections
import warnings

import numpy as np
import pytest
from conftest import both, err_of

import jitgrad
from jitgrad.utils.data import collate as jcollate

torch = pytest.importorskip("torch")
tcollate = pytest.importorskip("torch.utils.data._utils.collate")

Point = collections.namedtuple("Point", "x y")


def ints(batches):
    """A pass of a loader as nested lists (tensors as lists), for exact comparison."""
    def conv(b):
        if hasattr(b, "tolist") and not isinstance(b, np.ndarray):
            return ("tensor", str(b.dtype).split(".")[-1], b.tolist())
        if isinstance(b, dict):
            return {k: conv(v) for k, v in b.items()}
        if isinstance(b, (list, tuple)):
            return (type(b).__name__, [conv(v) for v in b])
        return b
    return [conv(b) for b in batches]


def pairs(T, n=10):
    return T.utils.data.TensorDataset(T.arange(n, dtype=T.float64) * 0.5, T.arange(n))


@pytest.mark.parametrize("n", [1, 2, 7, 100, 1000])
@pytest.mark.parametrize("seed", [0, 1, 12345, 2**40 + 3, -5])
def test_randperm_with_a_seeded_generator_is_torchs(n, seed):
    def run(T):
        g = T.Generator().manual_seed(seed)
        return [T.randperm(n, generator=g).tolist() for _ in range(2)], g.initial_seed()
    both(run)


def test_a_new_generator_has_torchs_default_seed():
    both(lambda T: (T.Generator().initial_seed(), T.randperm(20, generator=T.Generator()).tolist()))


@pytest.mark.parametrize("args", [(10, (3, 4)), (-3, 5, (7,)), (0, 2**34, (5,)), (2**40, 2**40 + 3, (4,))])
def test_randint_with_a_seeded_generator_is_torchs(args):
    def run(T):
        out = T.randint(*args, generator=T.Generator().manual_seed(7))
        return out.dtype == T.int64, out.tolist()
    both(run)


def test_randint_and_randperm_take_dtype():
    both(lambda T: (T.randperm(5, dtype=T.float64, generator=T.Generator().manual_seed(3)),
                    T.randint(4, (2, 2), dtype=T.float32, generator=T.Generator().manual_seed(3))))


@pytest.mark.parametrize("case", ["neg_n", "low_ge_high", "float_seed", "str_seed", "big_seed"])
def test_generator_errors_are_torchs(case):
    calls = {
        "neg_n": lambda T: T.randperm(-1),
        "low_ge_high": lambda T: T.randint(5, 3, (2,)),
        "float_seed": lambda T: T.Generator().manual_seed(1.5),
        "str_seed": lambda T: T.Generator().manual_seed("a"),
        "big_seed": lambda T: T.Generator().manual_seed(2**64),
    }
    assert err_of(calls[case], jitgrad) == err_of(calls[case], torch)


def test_generator_state_round_trips():
    g = jitgrad.Generator().manual_seed(11)
    jitgrad.randperm(5, generator=g)
    state = g.get_state()
    first = jitgrad.randperm(30, generator=g).tolist()
    jitgrad.randperm(30, generator=g)
    assert jitgrad.randperm(30, generator=g.set_state(state)).tolist() == first
    assert g.initial_seed() == 11
    with pytest.raises(TypeError, match="RNG state must be a torch.ByteTensor"):
        g.set_state(jitgrad.zeros(5056))
    with pytest.raises(RuntimeError, match="Expected a CPUGeneratorImplState of size 5056"):
        g.set_state(jitgrad.zeros(3, dtype=jitgrad.int64))


def test_without_a_generator_the_global_seed_decides():
    jitgrad.manual_seed(4)
    a = jitgrad.randperm(50).tolist(), jitgrad.randint(0, 9, (6,)).tolist()
    jitgrad.manual_seed(4)
    assert (jitgrad.randperm(50).tolist(), jitgrad.randint(0, 9, (6,)).tolist()) == a
    assert sorted(a[0]) == list(range(50)) and all(0 <= v < 9 for v in a[1])


@pytest.mark.parametrize("kw", [dict(), dict(batch_size=3), dict(batch_size=3, drop_last=True),
                                dict(batch_size=4, shuffle=True), dict(batch_size=3, shuffle=True, drop_last=True),
                                dict(batch_size=None), dict(batch_size=20, shuffle=True),
                                dict(batch_size=2, shuffle=False, num_workers=2),
                                dict(batch_size=3, shuffle=True, num_workers=1, persistent_workers=True)])
def test_loader_batches_are_torchs(kw):
    def run(T):
        gen = T.Generator().manual_seed(99) if kw.get("shuffle") else None
        dl = T.utils.data.DataLoader(pairs(T), generator=gen, **kw)
        return len(dl), ints(dl), ints(dl)   # two epochs: a shuffle draws a new order each
    both(run)


def test_shuffle_order_matches_torch_over_epochs_with_a_training_loop():
    """Minibatch SGD on a linear model with shuffled batches: the same loss curve as torch."""
    r = np.random.default_rng(0)
    xa, ya, wa = r.normal(size=(37, 3)), r.normal(size=(37, 1)), r.normal(size=(3, 1))

    def run(T):
        ds = T.utils.data.TensorDataset(T.tensor(xa), T.tensor(ya))
        dl = T.utils.data.DataLoader(ds, batch_size=8, shuffle=True, generator=T.Generator().manual_seed(5))
        w = T.tensor(wa, requires_grad=True)
        opt = T.optim.SGD([w], lr=0.1)
        losses = []
        for _ in range(3):
            for x, y in dl:
                opt.zero_grad()
                loss = ((x @ w - y) ** 2).mean()
                loss.backward()
                opt.step()
                losses.append(loss.item())
        return T.tensor(losses), w   # compared to float64 tolerance
    both(run)


@pytest.mark.parametrize("kw", [dict(replacement=True, num_samples=70), dict(replacement=True),
                                dict(num_samples=23), dict(num_samples=4)])
def test_random_sampler_is_torchs(kw):
    def run(T):
        s = T.utils.data.RandomSampler(range(10), generator=T.Generator().manual_seed(2), **kw)
        return len(s), list(s), list(s)
    both(run)


def test_subset_random_sampler_and_batch_sampler_are_torchs():
    def run(T):
        data = T.utils.data
        sub = data.SubsetRandomSampler([3, 5, 8, 13, 21], generator=T.Generator().manual_seed(8))
        bs = data.BatchSampler(sub, 2, False)
        dl = data.DataLoader(pairs(T, 25), batch_sampler=bs)
        return list(sub), len(bs), ints(dl), list(data.BatchSampler(data.SequentialSampler(range(7)), 3, True))
    both(run)


def test_sampler_argument_gives_the_order():
    both(lambda T: ints(T.utils.data.DataLoader(pairs(T), batch_size=4, sampler=[9, 0, 8, 1, 7])))


@pytest.mark.parametrize("lengths", [[3, 7], [0.3, 0.7], [0.25, 0.25, 0.5], [1, 0, 9]])
def test_random_split_is_torchs(lengths):
    def run(T):
        parts = T.utils.data.random_split(pairs(T), lengths, generator=T.Generator().manual_seed(3))
        return [list(p.indices) for p in parts], [ints(p[i] for i in range(len(p))) for p in parts]
    both(run)


def test_random_split_warns_for_an_empty_fraction_and_checks_the_sum():
    for T in (jitgrad, torch):
        with pytest.warns(UserWarning, match="Length of split at index 1 is 0"):
            T.utils.data.random_split(pairs(T, 3), [0.9, 0.1], generator=T.Generator())
    assert err_of(jitgrad.utils.data.random_split, pairs(jitgrad), [3, 3]) == \
        err_of(torch.utils.data.random_split, pairs(torch), [3, 3])
    assert err_of(jitgrad.utils.data.random_split, pairs(jitgrad), [1.5, -0.5]) == \
        err_of(torch.utils.data.random_split, pairs(torch), [1.5, -0.5])


def test_subset_concat_and_add():
    def run(T):
        a, b = pairs(T, 4), pairs(T, 3)
        cat = a + b
        sub = T.utils.data.Subset(cat, [6, 0, 4])
        return (len(cat), cat.cumulative_sizes, ints([cat[i] for i in (0, 3, 4, 6, -1, -7)]), len(sub),
                ints([sub[i] for i in range(3)]), ints(T.utils.data.DataLoader(cat, batch_size=3)))
    both(run)


@pytest.mark.parametrize("case", ["empty", "iterable", "neg_index", "tensor_sizes"])
def test_dataset_errors_are_torchs(case):
    def call(T):
        data = T.utils.data
        if case == "empty":
            return data.ConcatDataset([])
        if case == "iterable":
            return data.ConcatDataset([pairs(T), iterable_dataset(T, 2)])
        if case == "neg_index":
            return data.ConcatDataset([pairs(T, 2)])[-3]
        return data.TensorDataset(T.zeros(3), T.zeros(4))
    assert err_of(call, jitgrad) == err_of(call, torch)


def collate_cases(T):
    return {
        "tensors": [T.ones(2) * i for i in range(3)],
        "floats": [0.5, 1.5],
        "ints": [1, 2, 3],
        "strings": ["a", "b"],
        "numpy": [np.arange(3) * i for i in range(2)],
        "numpy_float32": [np.ones(2, np.float32), np.zeros(2, np.float32)],
        "numpy_scalars": [np.float64(1.5), np.float64(2.5)],
        "numpy_int_scalars": [np.int64(4), np.int64(5)],
        "bools": [np.bool_(True), np.bool_(False)],
        "tuples": [(T.ones(1), 1, "x"), (T.zeros(1), 2, "y")],
        "lists": [[1.0, 2], [3.0, 4]],
        "dicts": [{"a": 1, "b": {"c": 0.5}}, {"a": 2, "b": {"c": 1.5}}],
        "namedtuples": [Point(1, T.ones(2)), Point(2, T.zeros(2))],
        "ordered": [collections.OrderedDict(z=1, a=2), collections.OrderedDict(z=3, a=4)],
    }


@pytest.mark.parametrize("case", list(collate_cases(jitgrad)))
def test_default_collate_is_torchs(case):
    def run(T):
        out = T.utils.data.default_collate(collate_cases(T)[case])
        return type(out).__name__, ints([out])
    both(run)


@pytest.mark.parametrize("case", ["tensors", "tuples", "numpy", "numpy_scalars", "dicts", "namedtuples", "lists"])
def test_default_convert_is_torchs(case):
    both(lambda T: ints([T.utils.data.default_convert(collate_cases(T)[case])]))


@pytest.mark.parametrize("batch", [[object(), object()], [np.array(["a"]), np.array(["b"])], [[1, 2], [3]]])
def test_default_collate_errors_are_torchs(batch):
    assert err_of(jitgrad.utils.data.default_collate, batch) == err_of(torch.utils.data.default_collate, batch)


def test_custom_collate_fn_and_getitems():
    class Items:
        calls = []

        def __len__(self):
            return 5

        def __getitem__(self, i):
            return i * 10

        def __getitems__(self, idx):
            self.calls.append(list(idx))
            return [i * 10 for i in idx]

    def run(T):
        Items.calls = []
        dl = T.utils.data.DataLoader(Items(), batch_size=2, collate_fn=lambda b: ("batch", b))
        return list(dl), list(Items.calls)
    both(run)


def iterable_dataset(T, n):
    class Stream(T.utils.data.IterableDataset):
        def __iter__(self):
            return iter([T.tensor([float(i)]) for i in range(n)])

        def __len__(self):
            return n
    return Stream()


@pytest.mark.parametrize("kw", [dict(), dict(batch_size=3), dict(batch_size=3, drop_last=True),
                                dict(batch_size=None)])
def test_iterable_dataset_batches_are_torchs(kw):
    def run(T):
        dl = T.utils.data.DataLoader(iterable_dataset(T, 7), **kw)
        return len(dl), ints(dl)
    both(run)


def test_chained_iterable_datasets():
    both(lambda T: ints(T.utils.data.DataLoader(iterable_dataset(T, 2) + iterable_dataset(T, 3), batch_size=2)))


def test_iterable_dataset_that_yields_more_than_its_len_warns():
    for T in (jitgrad, torch):
        class Liar(T.utils.data.IterableDataset):
            def __iter__(self):
                return iter(range(3))

            def __len__(self):
                return 2
        dl = T.utils.data.DataLoader(Liar(), batch_size=None)
        len(dl)
        with pytest.warns(UserWarning, match="was reported to be 2"):
            list(dl)


LOADER_ERRORS = [
    dict(num_workers=-1), dict(timeout=-1), dict(prefetch_factor=2), dict(persistent_workers=True),
    dict(batch_size=None, drop_last=True), dict(sampler=[0, 1], shuffle=True), dict(batch_size=0),
    dict(batch_sampler=[[0]], batch_size=2), dict(batch_sampler=[[0]], drop_last=True), dict(batch_size=2.0),
    dict(drop_last=1),
]


@pytest.mark.parametrize("kw", LOADER_ERRORS, ids=[str(k) for k in LOADER_ERRORS])
def test_loader_argument_errors_are_torchs(kw):
    assert err_of(lambda T: T.utils.data.DataLoader(pairs(T), **kw), jitgrad) == \
        err_of(lambda T: T.utils.data.DataLoader(pairs(T), **kw), torch)


@pytest.mark.parametrize("kw", [dict(shuffle=True), dict(sampler=[0]), dict(batch_sampler=[[0]])])
def test_iterable_dataset_takes_no_sampler_or_shuffle(kw):
    def call(T):
        return T.utils.data.DataLoader(iterable_dataset(T, 3), **kw)
    j, t = err_of(call, jitgrad), err_of(call, torch)
    assert j[0] == t[0] == "ValueError" and j[1].split(",")[0] == t[1].split(",")[0]


def test_loader_attributes_are_fixed_after_init():
    for name in ("batch_size", "sampler", "drop_last", "dataset"):
        def call(T):
            setattr(T.utils.data.DataLoader(pairs(T)), name, 3)
        assert err_of(call, jitgrad) == err_of(call, torch)
    dl = jitgrad.utils.data.DataLoader(pairs(jitgrad))
    dl.collate_fn = list  # the others may change, as in torch
    assert dl.collate_fn is list


def test_pin_memory_without_a_gpu_warns_like_torch(monkeypatch):
    monkeypatch.setattr(jitgrad.cuda, "is_available", lambda: False)
    for T in (jitgrad, torch):
        with pytest.warns(UserWarning, match="'pin_memory' argument is set as true but no accelerator is found"):
            list(T.utils.data.DataLoader(pairs(T), pin_memory=True))
    monkeypatch.setattr(jitgrad.cuda, "is_available", lambda: True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        list(jitgrad.utils.data.DataLoader(pairs(jitgrad), pin_memory=True))


def test_what_needs_worker_processes_is_refused():
    with pytest.raises(NotImplementedError, match="worker_init_fn"):
        jitgrad.utils.data.DataLoader(pairs(jitgrad), num_workers=2, worker_init_fn=print)
    with pytest.raises(NotImplementedError, match="IterableDataset"):
        jitgrad.utils.data.DataLoader(iterable_dataset(jitgrad, 3), num_workers=1)
    assert jitgrad.utils.data.get_worker_info() is None


def test_a_dataset_subclass_and_the_base_class():
    class Squares(jitgrad.utils.data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return {"x": jitgrad.tensor(float(i)), "y": i * i}
    batches = list(jitgrad.utils.data.DataLoader(Squares(), batch_size=3))
    assert [b["y"].tolist() for b in batches] == [[0, 1, 4], [9]]
    with pytest.raises(NotImplementedError):
        jitgrad.utils.data.Dataset()[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(jitgrad.utils.data.DataLoader(Squares(), batch_size=3, num_workers=2)) == 2


@pytest.mark.parametrize("weights", [[0.1, 0.9, 0.4, 0.0, 2.0], [1.0] * 40, list(range(1, 8))])
@pytest.mark.parametrize("n", [2, 7, 50])
def test_weighted_random_sampler_with_replacement_is_torchs(weights, n):
    def run(T):
        s = T.utils.data.WeightedRandomSampler(weights, n, generator=T.Generator().manual_seed(n))
        return len(s), list(s), list(s), s.weights
    both(run)


@pytest.mark.parametrize("replacement", [True, False])
def test_weighted_random_sampler_single_draws_follow_the_weights(replacement):
    """One sample (torch's exponential race, with jitgrad's own numbers): by weight."""
    s = jitgrad.utils.data.WeightedRandomSampler([1.0, 0.0, 6.0], 1, replacement=replacement,
                                                 generator=jitgrad.Generator().manual_seed(0))
    counts = np.bincount([next(iter(s)) for _ in range(700)], minlength=3)
    assert counts[1] == 0 and 450 < counts[2] < 750 and 50 < counts[0] < 200


def test_weighted_random_sampler_takes_a_tensor_and_draws_without_replacement():
    s = jitgrad.utils.data.WeightedRandomSampler(jitgrad.tensor([1.0, 0.0, 3.0, 2.0]), 3, replacement=False,
                                                 generator=jitgrad.Generator().manual_seed(0))
    draws = [list(s) for _ in range(200)]
    assert all(len(set(d)) == 3 and 1 not in d for d in draws)  # distinct, never a zero weight
    firsts = np.bincount([d[0] for d in draws], minlength=4) / 200
    assert firsts[2] > firsts[3] > firsts[0]   # in order of weight
    dl = jitgrad.utils.data.DataLoader(pairs(jitgrad, 4), batch_size=2, sampler=s)
    assert sorted(len(b[1]) for b in dl) == [1, 2]


@pytest.mark.parametrize("case", ["negative", "zero_sum", "nan", "inf", "too_many", "two_d", "num_samples",
                                  "replacement"])
def test_weighted_random_sampler_errors_are_torchs(case):
    args = {"negative": ([-1.0, 1.0], 2), "zero_sum": ([0.0, 0.0], 2), "nan": ([float("nan"), 1.0], 2),
            "inf": ([float("inf"), 1.0], 2), "too_many": ([1.0, 2.0], 3, False), "two_d": ([[1.0, 2.0]], 2),
            "num_samples": ([1.0], 0), "replacement": ([1.0], 2, 1)}[case]
    assert err_of(lambda T: list(T.utils.data.WeightedRandomSampler(*args)), jitgrad) == \
        err_of(lambda T: list(T.utils.data.WeightedRandomSampler(*args)), torch)


def test_unseeded_shuffle_follows_the_global_seed():
    """Without a generator the order comes from the global generator: jitgrad.manual_seed
    repeats it (the numbers are jitgrad's, not torch's)."""
    def epochs():
        dl = jitgrad.utils.data.DataLoader(pairs(jitgrad, 12), batch_size=5, shuffle=True)
        return ints(dl), ints(dl)
    jitgrad.manual_seed(3)
    a = epochs()
    jitgrad.manual_seed(3)
    assert epochs() == a and a[0] != a[1]
    assert sorted(v for b in a[0] for v in b[1][1][2]) == list(range(12))


def test_collate_with_a_map_extends_default_collate():
    class Box:
        def __init__(self, v):
            self.v = v

    def run(T, mod):
        def boxes(batch, *, collate_fn_map=None):
            return ("boxes", [b.v for b in batch])
        fmap = dict(mod.default_collate_fn_map)
        fmap[Box] = boxes
        return mod.collate([(Box(1), T.ones(2)), (Box(2), T.zeros(2))], collate_fn_map=fmap)
    j, t = run(jitgrad, jcollate), run(torch, tcollate)
    assert j[0] == t[0] and ints([j[1]]) == ints([t[1]])
