"""The import contracts in pyproject.toml (``[tool.importlinter]``) hold: no module imports from a layer above its
own, families know no exporter / calibration / runtime / parity code, no target knows a model building block, and
no import cycle joins sibling modules or packages."""
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_are_kept():
    exe = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    r = subprocess.run([exe, "--config", str(ROOT / "pyproject.toml"), "--no-cache"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "Contracts: 4 kept, 0 broken." in r.stdout


def test_no_module_imports_itself_back_through_others():
    """No import cycle between modules. import-linter's ``acyclic_siblings`` contract (pyproject.toml) refuses
    cycles between siblings at every depth; this also refuses one between a package's ``__init__`` and its own
    modules (e.g. a registry package and the modules it lists: the shared types live in a ``base`` module both
    import), which are parent and child, not siblings."""
    import grimp

    g = grimp.build_graph("omni_export")
    adj = {m: g.find_modules_directly_imported_by(m) for m in g.modules}
    index, low, stack, on, cycles = {}, {}, [], set(), []

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in adj[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while not comp or comp[-1] != v:
                comp.append(stack.pop())
                on.discard(comp[-1])
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for m in sorted(adj):
        if m not in index:
            visit(m)
    assert cycles == []


def test_no_module_exceeds_400_lines():
    """No god files: every module of the package stays at or under 400 lines (split by concern past that)."""
    long = {str(p.relative_to(ROOT)): n for p in sorted((ROOT / "omni_export").rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > 400}
    assert long == {}
    assert len(list((ROOT / "omni_export").rglob("*.py"))) > 50  # the walk found the package
