"""The seed's training loop (nn.Linear + optim.SGD) run with a plain ``import jitgrad``, and the
same loop against torch 2.13 from identical weights.
"""
import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import ROOT, both, nn_, optim_, to_np

torch = pytest.importorskip("torch")



# ============================================================================= 8. the seed's training loop

SEED_LOOP = """
import jitgrad as torch
import jitgrad.nn as nn

# Setup
model = nn.Linear(10, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(32, 10)
y = torch.randn(32, 1)

losses = []
for epoch in range(100):
    pred = model(x)
    loss = ((pred - y) ** 2).mean()
    optimizer.zero_grad()  # Clear previous gradients
    loss.backward()        # Graph is consumed here
    optimizer.step()       # Uses no_grad internally
    losses.append(loss.item())

assert losses[-1] < losses[0], losses
print("DONE", losses[0], losses[-1])
"""


def test_seed003_training_loop_runs_with_plain_import():
    code = SEED_LOOP
    if os.environ.get("JITGRAD_TESTS_USE_TORCH") == "1":
        code = code.replace("jitgrad", "torch")
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert proc.returncode == 0, f"rc={proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    assert "DONE" in proc.stdout


def test_namespaces_reachable_after_plain_import():
    name = "torch" if os.environ.get("JITGRAD_TESTS_USE_TORCH") == "1" else "jitgrad"
    code = (f"import {name} as T\n"
            "assert callable(T.optim.SGD) and callable(T.optim.Adam) and callable(T.optim.AdamW)\n"
            "assert callable(T.nn.Linear) and callable(T.nn.init.zeros_) and callable(T.nn.functional.mse_loss)\n"
            "print('DONE')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0 and "DONE" in proc.stdout, proc.stderr[-3000:]


def test_seed003_training_loop_matches_torch():
    r = np.random.default_rng(33)
    w0 = (r.uniform(-1, 1, size=(1, 10)) / math.sqrt(10)).astype(np.float32)
    b0 = (r.uniform(-1, 1, size=(1,)) / math.sqrt(10)).astype(np.float32)
    xa = r.normal(size=(32, 10)).astype(np.float32)
    ya = r.normal(size=(32, 1)).astype(np.float32)

    def run(torch):            # the seed's code, verbatim apart from the fixed weights and data
        nn = nn_(torch)
        model = nn.Linear(10, 1)
        with torch.no_grad():
            model.weight.copy_(torch.tensor(w0))
            model.bias.copy_(torch.tensor(b0))
        optimizer = optim_(torch).SGD(model.parameters(), lr=0.01)
        x = torch.tensor(xa)
        y = torch.tensor(ya)
        losses = []
        for epoch in range(100):
            pred = model(x)
            loss = ((pred - y) ** 2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.detach().clone())
        return dict(weight=model.weight, bias=model.bias, losses=losses)

    j, t = both(run, dtype="float32")
    lj = [float(to_np(v)) for v in j["losses"]]
    assert lj[-1] < lj[0]
