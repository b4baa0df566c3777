"""set_num_threads / get_num_threads: both BLAS pools (numpy's for the forward, scipy's
for the Numba backward) move together; jitgrad starts them at one thread."""
import os

import pytest

import jitgrad


def _pool_threads():
    import threadpoolctl
    return sorted({i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"})


def test_default_is_one_thread_in_every_blas_pool():
    if os.environ.get("JITGRAD_NUM_THREADS"):
        pytest.skip("JITGRAD_NUM_THREADS overrides the default")
    assert jitgrad.get_num_threads() == 1
    assert _pool_threads() == [1]


def test_set_num_threads_moves_all_pools_together():
    before = jitgrad.get_num_threads()
    try:
        jitgrad.set_num_threads(2)
        assert jitgrad.get_num_threads() == 2 and _pool_threads() == [2]
    finally:
        jitgrad.set_num_threads(before)
    assert jitgrad.get_num_threads() == before


@pytest.mark.parametrize("bad, msg", [(0, "expects a positive integer"), (-1, "expects a positive integer"),
                                      (1.5, "expects an int, but got float"), (True, "expects an int, but got bool")])
def test_set_num_threads_rejects_bad_counts_like_torch(bad, msg):
    import torch
    with pytest.raises(RuntimeError, match=msg):
        torch.set_num_threads(bad)
    before = jitgrad.get_num_threads()
    with pytest.raises(RuntimeError, match="set_num_threads " + msg):
        jitgrad.set_num_threads(bad)
    assert jitgrad.get_num_threads() == before
