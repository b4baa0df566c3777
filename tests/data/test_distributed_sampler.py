"""jitgrad.utils.data.DistributedSampler against torch's (torch 2.13): every rank's indices,
for shuffled and sequential passes, padded and dropped tails, several seeds and epochs,
equal torch's bit for bit, since a seeded jitgrad.Generator draws torch's permutation."""
import itertools

import pytest
from conftest import err_of
from hypothesis import given, settings
from hypothesis import strategies as st

import jitgrad
from jitgrad.utils.data import DistributedSampler

torch = pytest.importorskip("torch")
tdata = pytest.importorskip("torch.utils.data")


def shares(sampler_cls, n, replicas, shuffle, drop_last, seed, epochs):
    """Each rank's (len, indices) for each epoch, as lists."""
    out = []
    for rank in range(replicas):
        s = sampler_cls(range(n), num_replicas=replicas, rank=rank, shuffle=shuffle, seed=seed, drop_last=drop_last)
        for epoch in epochs:
            s.set_epoch(epoch)
            out.append((rank, epoch, len(s), list(s)))
    return out


@pytest.mark.parametrize("n,replicas", [(0, 2), (1, 1), (1, 3), (2, 5), (7, 2), (7, 3), (10, 4), (12, 3),
                                        (100, 7), (1437, 2), (1437, 3), (1437, 8)])
@pytest.mark.parametrize("shuffle,drop_last", list(itertools.product([True, False], repeat=2)))
def test_every_ranks_indices_are_torchs(n, replicas, shuffle, drop_last):
    for seed in (0, 1, 2**40 + 3):
        epochs = (0, 1, 5)
        j = shares(DistributedSampler, n, replicas, shuffle, drop_last, seed, epochs)
        t = shares(tdata.DistributedSampler, n, replicas, shuffle, drop_last, seed, epochs)
        assert j == t, (n, replicas, shuffle, drop_last, seed)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 300), replicas=st.integers(1, 9), shuffle=st.booleans(), drop_last=st.booleans(),
       seed=st.integers(-2**31, 2**62), epoch=st.integers(0, 1000), data=st.data())
def test_random_configurations_match_torch(n, replicas, shuffle, drop_last, seed, epoch, data):
    rank = data.draw(st.integers(0, replicas - 1))

    def run(mod):
        s = mod.DistributedSampler(list(range(n)), num_replicas=replicas, rank=rank, shuffle=shuffle, seed=seed,
                                   drop_last=drop_last)
        s.set_epoch(epoch)
        return len(s), s.num_samples, s.total_size, list(s)
    assert run(jitgrad.utils.data) == run(tdata)


def test_ranks_partition_the_data_and_epochs_reshuffle():
    """Without padding the ranks' shares are disjoint and cover the dataset; another epoch
    gives another order, the same epoch the same one."""
    s = [DistributedSampler(range(12), num_replicas=3, rank=r, seed=4) for r in range(3)]
    first = [list(x) for x in s]
    assert sorted(sum(first, [])) == list(range(12))
    for x in s:
        x.set_epoch(1)
    second = [list(x) for x in s]
    assert second != first and sorted(sum(second, [])) == list(range(12))
    assert [list(x) for x in s] == second


@pytest.mark.parametrize("rank", [-1, 3, 4])
def test_a_bad_rank_is_torchs_error(rank):
    def make(mod):
        return lambda: mod.DistributedSampler(range(5), num_replicas=3, rank=rank)
    assert err_of(make(jitgrad.utils.data)) == err_of(make(tdata))
    assert err_of(make(jitgrad.utils.data))[0] == "ValueError"


def test_defaults_without_a_process_group_are_torchs_error():
    """num_replicas/rank not given and no process group: torch's error (that of
    get_world_size on an uninitialized default group)."""
    assert not jitgrad.distributed.is_initialized() and not torch.distributed.is_initialized()
    j = err_of(lambda: DistributedSampler(range(5)))
    assert j == err_of(lambda: tdata.DistributedSampler(range(5))), j
    assert err_of(lambda: DistributedSampler(range(5), num_replicas=2)) == \
        err_of(lambda: tdata.DistributedSampler(range(5), num_replicas=2))


def test_a_dataloader_with_it_gives_torchs_batches():
    def batches(T, data_mod, rank):
        ds = data_mod.TensorDataset(T.arange(23, dtype=T.float64) * 0.5, T.arange(23))
        sampler = data_mod.DistributedSampler(ds, num_replicas=2, rank=rank, seed=3)
        loader = data_mod.DataLoader(ds, batch_size=4, sampler=sampler, drop_last=False)
        out = []
        for epoch in range(2):
            sampler.set_epoch(epoch)
            out.append([(x.tolist(), y.tolist()) for x, y in loader])
        return len(loader), out
    for rank in (0, 1):
        assert batches(jitgrad, jitgrad.utils.data, rank) == batches(torch, tdata, rank)


def test_exported_as_torch_exports_it():
    import jitgrad.utils.data.distributed as jd
    assert jd.DistributedSampler is DistributedSampler is jitgrad.utils.data.DistributedSampler
    assert isinstance(DistributedSampler(range(3), 1, 0), jitgrad.utils.data.Sampler)
