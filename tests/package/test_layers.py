"""The package's layering holds: each layer imports only the layers below it, the import
graph has no cycle but the documented Tensor <-> grad_fn pair inside graph/, and imports
inside functions exist only for heavy optional dependencies."""
import ast
import os

from conftest import ROOT

PKG = os.path.join(ROOT, "jitgrad")
# lowest first; a module may import modules of its own layer or of layers before it
LAYERS = ["_core", "gpu", "kernels", "graph", "cuda", "backends", "ops", "engine", "autograd", "distributed", "nn", "optim", "func", "compiler", "utils"]
# the one allowed cycle: a Tensor's grad_fn is a view of its row, and a node reads its
# saved values back as Tensors
PAIR = {"jitgrad.graph.tensor", "jitgrad.graph.node", "jitgrad.graph.rowinfo"}
# function-level imports allowed: heavy or optional dependencies, and the top package
# from entry points (python -m jitgrad.warmup / examples)
LAZY_OK = {"scipy.special", "graphviz", "matplotlib", "matplotlib.pyplot", "numba.core", "threadpoolctl",
           "scipy.linalg.cython_blas", "jitgrad", "sklearn.datasets", "tqdm", "torch", "numba_cuda", "numba.cuda",
           "mpi4py", "mpi4py.MPI"}


def _modules():
    out = {}
    for d, _, files in os.walk(PKG):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(d, f)
                name = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                is_pkg = name.endswith(".__init__")
                out[name[:-9] if is_pkg else name] = (path, is_pkg)
    return out


def _imports(mods):
    """{module: [(imported jitgrad module, at top level?)]} and the function-level imports."""
    graph, lazy = {}, []
    for m, (path, is_pkg) in mods.items():
        tree = ast.parse(open(path, encoding="utf-8").read())
        top = {id(n) for n in tree.body}
        for stmt in ast.walk(tree):
            if isinstance(stmt, ast.ImportFrom):
                if stmt.level:
                    parts = m.split(".") if is_pkg else m.split(".")[:-1]
                    base = ".".join(parts[:len(parts) - stmt.level + 1] + ([stmt.module] if stmt.module else []))
                else:
                    base = stmt.module or ""
                names = [base + "." + a.name if base + "." + a.name in mods else base for a in stmt.names]
            elif isinstance(stmt, ast.Import):
                names = [a.name for a in stmt.names]
            else:
                continue
            if id(stmt) not in top and not _inside_try_at_top(tree, stmt):
                lazy.extend((m, n) for n in names)
            for n in names:
                while n not in mods and "." in n:
                    n = n.rsplit(".", 1)[0]
                if n in mods and n != m:
                    graph.setdefault(m, set()).add(n)
    return graph, lazy


def _inside_try_at_top(tree, stmt):
    return any(isinstance(n, ast.Try) and any(stmt is s for s in ast.walk(n)) for n in tree.body)


def _layer(m):
    parts = m.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def test_each_layer_imports_only_layers_below_it():
    mods = _modules()
    graph, _ = _imports(mods)
    bad = []
    for m, deps in graph.items():
        lm = _layer(m)
        for d in deps:
            ld = _layer(d)
            if lm is not None and ld is not None and LAYERS.index(ld) > LAYERS.index(lm):
                bad.append(f"{m} -> {d}")
    assert not bad, "imports against the layering: " + ", ".join(sorted(bad))


def test_no_import_cycle_but_the_tensor_node_pair():
    mods = _modules()
    graph, _ = _imports(mods)
    graph = {m: {d for d in deps if not (m.endswith(".__init__") or d == m.rsplit(".", 1)[0])}
             for m, deps in graph.items()}
    index, low, stack, on, sccs = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            sccs.append(comp)

    for v in mods:
        if v not in index:
            visit(v)
    cycles = [c for c in sccs if len(c) > 1 and c != PAIR]
    assert not cycles, f"import cycles: {cycles}"


def test_function_level_imports_only_for_heavy_optional_dependencies():
    _, lazy = _imports(_modules())
    bad = [f"{m}: {n}" for m, n in lazy if n not in LAZY_OK and not n.startswith(("torch", "matplotlib"))]
    assert not bad, "imports inside functions: " + ", ".join(bad)
