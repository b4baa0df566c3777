"""torchdiffeq's own test suite, unmodified, on jitgrad through the import shim.

The package is PyPI's torchdiffeq==0.2.5 (installed with --no-deps: it would pull real torch); its tests are
the copy pinned in tests/third_party/torchdiffeq (see VENDORED.md). torchdiffeq_cases.py runs them in a
subprocess under `python -m jitgrad.as_torch` and counts cases (each solver of a per-solver loop its own).

The whole suite takes many minutes (real torch too: ~12 min on a busy 2-core machine; its odeint_tests alone
~9 min), so by default this runs CI_SUBSET, 25 cases from every module picked to fit the CI budget (about 35 s
compiled, 45 s under NUMBA_DISABLE_JIT=1; real torch runs the same 25 in 15 s); JITGRAD_TORCHDIFFEQ_FULL=1 runs
all of it and holds the counts to FULL_CASES and KNOWN_FAILURES. Last full run: jitgrad 128 of 129 (api 10/10,
event 13/13, gradient 28/28, norm 12/12, odeint 65/66), real torch 2.13 128 of 129 (the same one fails). Without torchdiffeq installed the test skips, unless
JITGRAD_REQUIRE_TORCHDIFFEQ=1 (CI sets it), where it fails.
"""
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT

HERE = os.path.dirname(os.path.abspath(__file__))
RUNNER = os.path.join(HERE, "torchdiffeq_cases.py")
VERSION = "0.2.5"

# every case of the vendored suite (129: the per-solver loops counted per solver), and the ones that may fail:
# TestMinMaxStep fails on real torch 2.13 as well (scipy's solvers take more steps than its bound of 50).
# (test_seminorm[dopri8] passes because manual_seed gives torch's weights: its bound holds for torch's
# weights after manual_seed(0), not for every seed; on real torch it fails for seeds 1 and 4.)
FULL_CASES = 129
KNOWN_FAILURES = {"odeint_tests": {"TestMinMaxStep.test_min_max_step": "fails on real torch 2.13 with scipy 1.17"}}

# the CI run: test methods picked to cover every module, the adjoint, events, norms, grids and callbacks,
# within the CI budget under NUMBA_DISABLE_JIT=1 as well
CI_SUBSET = {
    "TestCollectionState.test_forward": 5, "TestCollectionState.test_gradient": 5,
    "TestEventHandling.test_adjoint": 1,
    "TestCompareAdjointGradient.test_against_dopri5": 2,
    "TestNorms.test_norm": 1, "TestNorms.test_adjoint_norm": 1,
    "TestSolverError.test_adjoint": 1,
    "TestGridConstructor.test_grid_constructor": 1,
    "TestCallbacks.test_wrong_callback": 8,
}


def _require():
    if importlib.util.find_spec("torchdiffeq") is None:
        if os.environ.get("JITGRAD_REQUIRE_TORCHDIFFEQ") == "1":
            pytest.fail(f"JITGRAD_REQUIRE_TORCHDIFFEQ=1 but torchdiffeq is missing: "
                        f"pip install --no-deps torchdiffeq=={VERSION}")
        pytest.skip(f"torchdiffeq is not installed (pip install --no-deps torchdiffeq=={VERSION})")
    installed = importlib.metadata.version("torchdiffeq")
    assert installed == VERSION, f"the vendored tests are torchdiffeq {VERSION}'s, installed is {installed}"


def _run(tmp_path, tests):
    out = tmp_path / "cases.json"
    env = dict(os.environ, PYTHONPATH=ROOT)
    # torchdiffeq's tests add device 'cuda' when torch.cuda.is_available(): CI's CUDA simulator would say so
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    proc = subprocess.run([sys.executable, "-m", "jitgrad.as_torch", RUNNER, "--json", str(out), *tests],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=3000)
    assert out.exists(), f"the runner did not finish:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return json.loads(out.read_text()), proc


def _failures(result):
    return {mod: {case: why for case, (ok, why) in cases.items() if ok is not True}
            for mod, cases in result["cases"].items() if any(ok is not True for ok, _ in cases.values())}


@pytest.mark.skipif(os.environ.get("JITGRAD_TORCHDIFFEQ_FULL") == "1", reason="the full suite runs instead")
def test_torchdiffeq_ci_subset(tmp_path):
    _require()
    result, proc = _run(tmp_path, list(CI_SUBSET))
    counted = {}
    for cases in result["cases"].values():
        for case in cases:
            key = case.split("[")[0]
            counted[key] = counted.get(key, 0) + 1
    assert counted == CI_SUBSET, proc.stdout[-3000:]
    assert not _failures(result), proc.stdout[-6000:]
    assert result["torch_version"] == "2.13.0+jitgrad"


@pytest.mark.skipif(os.environ.get("JITGRAD_TORCHDIFFEQ_FULL") != "1", reason="JITGRAD_TORCHDIFFEQ_FULL=1 runs it")
def test_torchdiffeq_full_suite(tmp_path):
    _require()
    result, proc = _run(tmp_path, [])
    total = sum(len(c) for c in result["cases"].values())
    assert total == FULL_CASES, proc.stdout[-3000:]
    failures = _failures(result)
    unexpected = {m: {c: w for c, w in f.items() if c not in KNOWN_FAILURES.get(m, {})} for m, f in failures.items()}
    assert not any(unexpected.values()), json.dumps(unexpected, indent=1)
