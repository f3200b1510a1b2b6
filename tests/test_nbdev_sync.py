"""Notebooks are the source: the library must be exactly what nbdev-export makes of them, the notebooks must be
clean, and the book must keep its shape (one module per notebook, imports flowing one way)."""
import ast
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT, default_exp, venv_bin

LIB = ROOT / "agent_r1_tutorial"


def _files(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts}


def _copy_project(dst: Path):
    shutil.copy2(ROOT / "pyproject.toml", dst / "pyproject.toml")
    shutil.copytree(ROOT / "nbs", dst / "nbs", ignore=shutil.ignore_patterns(".ipynb_checkpoints", "nbdev.yml"))


def test_library_is_what_nbdev_export_makes(tmp_path):
    _copy_project(tmp_path)
    (tmp_path / LIB.name).mkdir()
    shutil.copy2(LIB / "__init__.py", tmp_path / LIB.name / "__init__.py")  # holds the version nbdev keeps
    res = subprocess.run([venv_bin("nbdev-export")], cwd=tmp_path, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    made, committed = _files(tmp_path / LIB.name), _files(LIB)
    assert sorted(made) == sorted(committed), "modules differ from the notebooks' exports: run nbdev-export"
    stale = [f for f in made if made[f] != committed[f]]
    assert not stale, f"{stale} differ from what nbdev-export makes of the notebooks: run nbdev-export"


def test_notebooks_are_clean(tmp_path):
    _copy_project(tmp_path)
    before = _files(tmp_path / "nbs")
    res = subprocess.run([venv_bin("nbdev-clean")], cwd=tmp_path, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    after = _files(tmp_path / "nbs")
    dirty = [f for f in before if f.endswith(".ipynb") and before[f] != after[f]]
    assert not dirty, f"nbdev-clean changes {dirty}: run nbdev-clean and commit"


def _notebooks():
    return sorted(p for p in (ROOT / "nbs").glob("*.ipynb") if not p.name.startswith(("_", ".")))


def test_each_chapter_exports_one_module():
    mods = {}
    for nb in _notebooks():
        exps = default_exp(nb)
        if nb.name == "index.ipynb":
            assert not exps, "index.ipynb is the landing page and exports nothing"
            continue
        assert re.match(r"^\d\d[a-z]?_", nb.name), f"{nb.name}: chapters are numbered in curriculum order (NN_name)"
        assert len(exps) == 1, f"{nb.name} must export exactly one module (#| default_exp), found {exps}"
        assert exps[0] not in mods, f"{nb.name} and {mods.get(exps[0])} both export {exps[0]}"
        mods[exps[0]] = nb.name


def test_imports_flow_one_way():
    "A module may import from earlier chapters only, never from a later one (or itself through the package)."
    order = {}  # module -> its chapter's prefix ("00", "00a", "01", ...), which sorts in curriculum order
    for nb in _notebooks():
        for mod in default_exp(nb):
            order[mod] = nb.name.split("_", 1)[0]
    for mod, n in order.items():
        tree = ast.parse((LIB / f"{mod.replace('.', '/')}.py").read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] if node.level == 0 else [f"agent_r1_tutorial.{node.module}"]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for name in names:
                if name.startswith("agent_r1_tutorial."):
                    dep = name.split(".", 1)[1]
                    if dep in order:
                        assert order[dep] < n, f"{mod} (chapter {n}) imports {dep} (chapter {order[dep]})"


def test_sync_check_catches_a_hand_edit(tmp_path):
    "The sync check above must fail when a generated module is edited by hand."
    _copy_project(tmp_path)
    shutil.copytree(LIB, tmp_path / LIB.name, ignore=shutil.ignore_patterns("__pycache__"))
    core = tmp_path / LIB.name / "core.py"
    core.write_text(core.read_text() + "\n# a hand edit\n")
    before = core.read_bytes()
    subprocess.run([venv_bin("nbdev-export")], cwd=tmp_path, capture_output=True, check=True)
    assert core.read_bytes() != before, "nbdev-export did not regenerate a hand-edited module"


def test_title_cells_hold_only_title_and_description():
    "nbdev turns a chapter's first Markdown cell into the page's title and description and drops the rest of that cell."
    for nb in _notebooks():
        cells = json.loads(nb.read_text())["cells"]
        first = next(c for c in cells if c["cell_type"] == "markdown")
        lines = [l for l in "".join(first["source"]).splitlines()[1:] if l.strip()]
        extra = [l for l in lines if not l.startswith(">")]
        assert not extra, f"{nb.name}: the title cell also holds {extra[0][:60]!r}..., which the site would not show"
