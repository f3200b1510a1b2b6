"""Every notebook executes top to bottom, as `nbdev-test` runs it: cells tagged with a flag in tst_flags
(notest, slow, gpu) are skipped unless the flag is given (AR1_FLAGS, from scripts/test.sh --flags)."""
import os
import subprocess

import pytest
from conftest import ROOT, venv_bin

NOTEBOOKS = sorted(p for p in (ROOT / "nbs").rglob("*.ipynb")
                   if not any(part.startswith(("_", ".")) for part in p.relative_to(ROOT / "nbs").parts))


def test_there_are_notebooks():
    assert any(p.name == "index.ipynb" for p in NOTEBOOKS) and len(NOTEBOOKS) >= 2


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=[str(p.relative_to(ROOT / "nbs")) for p in NOTEBOOKS])
def test_notebook_runs(nb):
    flags = os.environ.get("AR1_FLAGS", "")
    res = subprocess.run([venv_bin("nbdev-test"), str(nb), "--flags", flags], cwd=ROOT,
                         capture_output=True, text=True, timeout=3600)
    assert res.returncode == 0, f"{nb.name} failed under nbdev-test:\n{(res.stdout + res.stderr)[-6000:]}"


def _toy_project(tmp_path, cells):
    "A one-notebook nbdev project with the real pyproject.toml (so the real tst_flags apply)."
    import json

    (tmp_path / "nbs").mkdir()
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    nb = {"cells": [{"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": c}
                    for c in cells],
          "metadata": {"kernelspec": {"display_name": "python3", "language": "python", "name": "python3"}},
          "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "nbs" / "toy.ipynb"
    path.write_text(json.dumps(nb))
    return path


def _nbdev_test(path, flags=""):
    res = subprocess.run([venv_bin("nbdev-test"), str(path), "--flags", flags], cwd=path.parent.parent,
                         capture_output=True, text=True, timeout=300)
    return res.returncode, res.stdout + res.stderr


def test_skip_flags_are_honoured(tmp_path):
    nb = _toy_project(tmp_path, ["x = 1", "#| slow\nraise RuntimeError('the slow cell ran')",
                                 "#| gpu\nraise RuntimeError('the gpu cell ran')"])
    assert _nbdev_test(nb)[0] == 0
    rc, out = _nbdev_test(nb, "slow")
    assert rc != 0 and "the slow cell ran" in out
    rc, out = _nbdev_test(nb, "gpu")
    assert rc != 0 and "the gpu cell ran" in out


def test_a_failing_cell_fails_the_notebook(tmp_path):
    nb = _toy_project(tmp_path, ["x = 1", "assert x == 2, 'x is not 2'"])
    rc, out = _nbdev_test(nb)
    assert rc != 0 and "x is not 2" in out


def test_every_chapter_checks_its_kernel_first():
    "The first cell a reader runs in each chapter imports `_kernel_check` (after the `default_exp` line nbdev reads)."
    import json

    for nb in NOTEBOOKS:
        if nb.name == "index.ipynb":
            continue
        code = ["".join(c["source"]) for c in json.loads(nb.read_text())["cells"] if c["cell_type"] == "code"]
        first = next(s for s in code if not s.startswith("#| default_exp"))
        assert "import _kernel_check" in first, f"{nb.name}: the first cell does not check the kernel"


def test_a_kernel_without_the_package_gets_one_message_not_a_traceback():
    "In IPython (what JupyterLab runs), a kernel that cannot import the package is told what to run, and nothing else."
    code = "import sys; sys.modules['agent_r1_tutorial.core'] = None; import _kernel_check"
    res = subprocess.run([venv_bin("python"), "-m", "IPython", "--quick", "--no-banner", "-c", code],
                         cwd=ROOT / "nbs", capture_output=True, text=True, timeout=120)
    out = res.stdout + res.stderr
    assert "cannot import agent_r1_tutorial" in out and "bash scripts/lab.sh" in out, out
    assert "Traceback" not in out and "File " not in out, out
    ok = subprocess.run([venv_bin("python"), "-c", "import _kernel_check"], cwd=ROOT / "nbs", capture_output=True,
                        text=True, timeout=120)
    assert ok.returncode == 0 and not ok.stdout.strip(), ok.stdout + ok.stderr  # the package here: silent


def _run_notebooks_script():
    "scripts/run_notebooks.py as a module (scripts/ is not a package)."
    import importlib.util

    spec = importlib.util.spec_from_file_location("run_notebooks", ROOT / "scripts" / "run_notebooks.py")
    rn = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rn)
    return rn


def test_saved_outputs_keep_only_what_a_static_page_can_show():
    "scripts/run_notebooks.py drops the outputs of `#| eval: false` cells and live widgets, and keeps the rest."
    import nbformat

    rn = _run_notebooks_script()
    widget = nbformat.v4.new_output("display_data", data={"application/vnd.jupyter.widget-view+json": {"model_id": "x"},
                                                          "text/plain": "VBox(children=(...))"})
    text = nbformat.v4.new_output("stream", text="kept\n")
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("#| eval: false\nlaunch()", outputs=[text]),
        nbformat.v4.new_code_cell("browser", outputs=[widget, text]),
        nbformat.v4.new_code_cell("print('kept')", outputs=[text]),
    ])
    assert rn._for_the_page(nb) == 2
    assert [len(c.outputs) for c in nb.cells] == [0, 1, 1]
    assert nb.cells[1].outputs[0]["text"] == "kept\n"
    # a leak of the machine in what is left is found
    nb.cells[2].outputs = [nbformat.v4.new_output("stream", text="saved in /work/main/runs\n")]
    assert rn._leaks(nb) and "cell 2" in rn._leaks(nb)[0]
    # and so is a library's log line or a progress bar
    for noise in ("WARNING:2026-11-27 06:21:24,578:No supported accelerator detected.\n",
                  "[rank0]:[W1127 06:21:47.490540243 ProcessGroup.hpp:1006] Warning: No backend\n",
                  "Loading weights: 100%|##########| 26/26 [00:00<00:00, 2196.15it/s]\n"):
        nb.cells[2].outputs = [nbformat.v4.new_output("stream", name="stderr", text=noise)]
        assert rn._leaks(nb), noise
    nb.cells[2].outputs = [nbformat.v4.new_output("stream", text="warning: RL has no signal in 3 steps\n")]
    assert not rn._leaks(nb)  # a message of ours is not noise


def test_no_saved_output_shows_the_machine_or_log_noise():
    "What the site renders: every saved output of every chapter, checked as scripts/run_notebooks.py checks a run."
    import nbformat

    rn = _run_notebooks_script()
    found = {p.name: rn._leaks(nbformat.read(p, as_version=4)) for p in NOTEBOOKS}
    assert not {k: v for k, v in found.items() if v}
