"""jitgrad.viz: make_dot (graphviz Digraph, like torchviz.make_dot) and print_graph."""
import io
import re
import shutil
import sys

import pytest

import jitgrad
from jitgrad import nn


def _model_loss():
    jitgrad.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    loss = model(jitgrad.randn(5, 4)).sum()
    return model, loss


def _labels(src, name):
    """How many nodes of the DOT source carry the label `name` (first line of the label)."""
    return len(re.findall(r'\[label="?' + re.escape(name) + r'(?=["\n\]])', src))


def test_import_does_not_load_graphviz():
    # jitgrad.viz is importable without graphviz; only make_dot needs it
    assert hasattr(jitgrad, "viz")
    assert callable(jitgrad.viz.make_dot) and callable(jitgrad.viz.print_graph)


def test_print_graph_exact_text():
    x = jitgrad.randn(2, 3)
    w = jitgrad.randn(3, 4, requires_grad=True)
    loss = ((x @ w).relu()).sum()
    buf = io.StringIO()
    text = jitgrad.viz.print_graph(loss, file=buf, params={"w": w})
    expected = ("SumBackward0\n"
                "  ReluBackward0\n"
                "    MmBackward0\n"
                "      AccumulateGrad (w)\n")
    assert text == expected
    assert buf.getvalue() == expected


def test_print_graph_stdout_and_unnamed_leaf(capsys):
    w = jitgrad.randn(3, 4, requires_grad=True)
    text = jitgrad.viz.print_graph((w * 2).sum())
    assert text == "SumBackward0\n  MulBackward0\n    AccumulateGrad (3, 4)\n"
    assert capsys.readouterr().out == text


def test_print_graph_shared_subgraph_printed_once():
    x = jitgrad.randn(2, 3)
    w = jitgrad.randn(3, 4, requires_grad=True)
    y = (x @ w).relu()
    text = jitgrad.viz.print_graph((y * y).sum(), file=io.StringIO(), params={"w": w})
    assert text == ("SumBackward0\n"
                    "  MulBackward0\n"
                    "    ReluBackward0\n"
                    "      MmBackward0\n"
                    "        AccumulateGrad (w)\n"
                    "    ReluBackward0 (seen above)\n")


def test_print_graph_deep_sharing_stays_linear():
    x = jitgrad.ones(3, requires_grad=True)
    y = x
    for _ in range(60):  # 2**60 paths if shared nodes were expanded each time
        y = y * y
    text = jitgrad.viz.print_graph(y.sum(), file=io.StringIO())
    # Sum, 60 muls, 59 back-references, the first mul's two (repeated, childless) leaves
    assert text.count("(seen above)") == 59
    assert text.count("AccumulateGrad (3)") == 2
    assert text.count("\n") == 1 + 60 + 59 + 2


def test_make_dot_model_nodes_and_params():
    pytest.importorskip("graphviz")
    model, loss = _model_loss()
    dot = jitgrad.viz.make_dot(loss, params=dict(model.named_parameters()))
    src = dot.source
    for name in ("SumBackward0", "ReluBackward0", "AccumulateGrad"):
        assert name in src
    assert "MmBackward0" in src or "AddmmBackward0" in src
    # leaves: parameter name and shape, blue; the output: green
    assert '"0.weight\n (3, 4)" fillcolor=lightblue' in src
    assert '"0.bias\n (3)" fillcolor=lightblue' in src
    assert '"2.weight\n (2, 3)" fillcolor=lightblue' in src
    assert '"2.bias\n (2)" fillcolor=lightblue' in src
    assert "fillcolor=darkolivegreen1" in src
    assert src.count("fillcolor=lightblue") == 4
    assert _labels(src, "AccumulateGrad") == 4
    assert _labels(src, "SumBackward0") == 1
    assert "orange" not in src


def test_make_dot_shared_node_appears_once():
    pytest.importorskip("graphviz")
    x = jitgrad.randn(2, 3)
    w = jitgrad.randn(3, 4, requires_grad=True)
    y = (x @ w).relu()
    src = jitgrad.viz.make_dot((y * y + y).sum(), params={"w": w}).source
    assert _labels(src, "ReluBackward0") == 1
    assert _labels(src, "MmBackward0") == 1
    assert _labels(src, "AccumulateGrad") == 1
    assert src.count('"w\n (3, 4)"') == 1
    # but every use is an edge into a node: relu feeds mul twice and add once
    relu_id = re.search(r"\t(\d+) \[label=ReluBackward0", src).group(1)
    assert len(re.findall(r"\t" + relu_id + r" -> ", src)) == 3


def test_make_dot_deep_sharing_is_linear():
    pytest.importorskip("graphviz")
    x = jitgrad.ones(3, requires_grad=True)
    y = x
    for _ in range(60):
        y = y * y
    src = jitgrad.viz.make_dot(y.sum()).source
    assert _labels(src, "MulBackward0") == 60


def test_make_dot_show_saved_adds_orange_nodes():
    pytest.importorskip("graphviz")
    model, loss = _model_loss()
    params = dict(model.named_parameters())
    plain = jitgrad.viz.make_dot(loss, params=params).source
    saved = jitgrad.viz.make_dot(loss, params=params, show_saved=True).source
    n_plain = len(re.findall(r"\[label=", plain))
    n_saved = len(re.findall(r"\[label=", saved))
    assert n_saved > n_plain
    assert "fillcolor=orange" in saved
    assert "style=dotted" in saved
    assert '"result\n (5, 3)" fillcolor=orange' in saved  # ReluBackward0's saved output
    # the leaves are still drawn once each, blue, with their names
    assert saved.count("fillcolor=lightblue") == 4 and _labels(saved, "AccumulateGrad") == 4


def test_make_dot_show_attrs_and_custom_function():
    pytest.importorskip("graphviz")

    class Sq(jitgrad.autograd.Function):
        @staticmethod
        def forward(ctx, a):
            ctx.save_for_backward(a)
            return a * a

        @staticmethod
        def backward(ctx, g):
            a, = ctx.saved_tensors
            return 2 * a * g

    x = jitgrad.randn(3, requires_grad=True)
    out = Sq.apply(x * 2).sum()
    src = jitgrad.viz.make_dot(out, params={"x": x}, show_attrs=True, show_saved=True).source
    assert "SqBackward" in src
    assert "saved_tensors[0]" in src
    # MulBackward0's attribute table: x * 2 saves no self (only other's gradient would read it), as in torch
    assert "other: [saved tensor]" in src and "self :           None" in src
    # x is a param: it stays one blue node named x
    assert src.count('"x\n (3)" fillcolor=lightblue') == 1


def test_make_dot_tuple_and_after_backward():
    pytest.importorskip("graphviz")
    w = jitgrad.randn(3, requires_grad=True)
    a, b = (w * 2).sum(), (w * 3).sum()
    src = jitgrad.viz.make_dot((a, b), params={"w": w}).source
    assert src.count("fillcolor=darkolivegreen1") == 2
    assert _labels(src, "AccumulateGrad") == 1
    a.backward()
    # saved values are freed by backward: show_saved must still work (nothing to show)
    src = jitgrad.viz.make_dot(a, params={"w": w}, show_saved=True, show_attrs=True).source
    assert "SumBackward0" in src and "orange" not in src


def test_graphviz_not_imported_by_jitgrad():
    import subprocess
    code = "import sys, jitgrad; print('graphviz' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "False"


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot binary is not installed")
def test_render_svg(tmp_path):
    pytest.importorskip("graphviz")
    model, loss = _model_loss()
    dot = jitgrad.viz.make_dot(loss, params=dict(model.named_parameters()), show_saved=True)
    svg = dot.pipe(format="svg").decode()
    assert svg.lstrip().startswith("<?xml") or "<svg" in svg
    for name in ("SumBackward0", "ReluBackward0", "AccumulateGrad", "0.weight", "2.bias", "(3, 4)"):
        assert name in svg
    path = dot.render(str(tmp_path / "graph"), format="svg")
    with open(path) as f:
        assert "SumBackward0" in f.read()
