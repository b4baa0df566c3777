"""Runs torchdiffeq's own unittest suite (the pinned copy in tests/third_party/torchdiffeq/tests) and counts
its cases; run under the shim by test_torchdiffeq.py, or directly for the real-torch baseline:

    python -m jitgrad.as_torch tests/libraries/torchdiffeq_cases.py [--json OUT] [TestClass.test_name ...]
    python tests/libraries/torchdiffeq_cases.py                           # the same suite on real torch

A case is one test method, except that a method looping over solvers counts each solver as its own case
(the subTest parameter `method`, or `solver` for TestScipySolvers): a case passes when every subTest and
the method itself passed. Prints one line per failed case and a closing "N passed, N failed" line.
"""
import argparse
import collections
import json
import os
import sys
import time
import traceback
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SUITE_DIR = os.path.join(HERE, os.pardir, "third_party", "torchdiffeq", "tests")
MODULES = ("api_tests", "event_tests", "gradient_tests", "norm_tests", "odeint_tests")


class CaseResult(unittest.TestResult):
    """Collects (module, case) -> [passed?, first failure] from tests and subTests."""

    def __init__(self):
        super().__init__()
        self.cases = collections.OrderedDict()
        self.seconds = collections.Counter()
        self.test_seconds = {}
        self._t0 = None

    @staticmethod
    def _case(test, params=None):
        key = test.id().split(".", 1)[1]
        solver = (params or {}).get("method", (params or {}).get("solver"))
        return test.__class__.__module__, key + (f"[{solver}]" if solver is not None else "")

    def _record(self, test, params, err):
        mod, case = self._case(test, params)
        entry = self.cases.setdefault((mod, case), [True, None])
        if err is not None and entry[0]:
            entry[0] = False
            lines = traceback.format_exception(*err)
            entry[1] = (f"{dict(params or {})} " if params else "") + lines[-1].strip()[:300]

    def startTest(self, test):
        super().startTest(test)
        self._t0 = time.perf_counter()

    def stopTest(self, test):
        super().stopTest(test)
        dt = time.perf_counter() - self._t0
        self.seconds[test.__class__.__module__] += dt
        self.test_seconds[test.id().split(".", 1)[1]] = dt

    def addSubTest(self, test, subtest, err):
        super().addSubTest(test, subtest, err)
        self._record(test, dict(subtest.params), err)

    def addSuccess(self, test):
        super().addSuccess(test)
        if not any(k[1].split("[")[0] == self._case(test)[1] for k in self.cases):
            self._record(test, None, None)

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._record(test, None, err)

    addError = addFailure

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self.cases.setdefault(self._case(test), [None, f"skipped: {reason}"])


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", help="write {module: {case: [passed, reason]}} and seconds per module here")
    ap.add_argument("tests", nargs="*", help="TestClass or TestClass.test_name to run (default: all)")
    args = ap.parse_args(argv)
    sys.path.insert(0, os.path.abspath(SUITE_DIR))
    import torch

    suite = unittest.TestSuite()
    for name in MODULES:
        mod = __import__(name)
        for test in unittest.defaultTestLoader.loadTestsFromModule(mod):
            for t in test if isinstance(test, unittest.TestSuite) else [test]:
                tid = t.id().split(".", 1)[1]
                if not args.tests or any(tid == s or tid.startswith(s + ".") for s in args.tests):
                    suite.addTest(t)
    result = CaseResult()
    t0 = time.perf_counter()
    suite.run(result)
    wall = time.perf_counter() - t0
    per_module = collections.defaultdict(dict)
    for (mod, case), (ok, why) in result.cases.items():
        per_module[mod][case] = [ok, why]
        if ok is False:
            print(f"FAILED {mod}.{case}: {why}")
    passed = sum(ok is True for ok, _ in result.cases.values())
    failed = sum(ok is False for ok, _ in result.cases.values())
    for mod in MODULES:
        cases = per_module.get(mod, {})
        print(f"{mod}: {sum(v[0] is True for v in cases.values())}/{len(cases)} cases passed, "
              f"{result.seconds[mod]:.1f} s")
    print(f"torch {torch.__version__}: {wall:.1f} s")
    print(f"{passed} passed, {failed} failed")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cases": per_module, "seconds": dict(result.seconds), "test_seconds": result.test_seconds,
                       "wall": wall,
                       "torch_version": str(torch.__version__)}, f, indent=1)
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
