"""DistributedDataParallel, run for real: each test launches the ranks with mpiexec (2 and
3 ranks on this machine's cores: 3 also checks uneven shards and oversubscription) and
checks what they print. The rank scripts are ranks/ddp_train.py and ranks/ddp_checks.py."""
import pytest
from mpirun import mpirun, needs_mpi

pytestmark = needs_mpi


def assert_ok(n, script, *args, env=None):
    rc, out, err, _ = mpirun(script, n, *args, timeout=240, env=env)
    assert rc == 0 and out.count("OK") == n, (out + err)[-3000:]


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("opt", ["sgd", "adam"])
@pytest.mark.parametrize("accum", [1, 2])
def test_ddp_training_equals_one_process_on_the_whole_batch(n, opt, accum):
    assert_ok(n, "ddp_train.py", "--opt", opt, "--accum", accum)


@pytest.mark.parametrize("extra", [["--dtype", "float32", "--opt", "adam"], ["--as-view", "--accum", "3"],
                                   ["--bucket-mb", "25"], ["--hidden", "96", "--accum", "2"],
                                   ["--hidden", "96", "--as-view", "--opt", "adam"]])
def test_ddp_float32_bucket_views_one_bucket_and_gradients_reduced_in_place(extra):
    assert_ok(2, "ddp_train.py", *extra)


@pytest.mark.parametrize("case", ["param_count", "param_shape", "unused", "find_unused", "overlap"])
def test_ddp_checks_and_unused_parameters(case):
    assert_ok(2, "ddp_checks.py", case)


def test_ranks_share_the_cores_unless_a_thread_count_is_set():
    assert_ok(2, "ddp_checks.py", "threads", env={"OMP_NUM_THREADS": "", "JITGRAD_NUM_THREADS": ""})
