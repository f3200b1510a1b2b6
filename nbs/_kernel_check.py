"""Imported by the first cell of every chapter: stop with one clear message when the kernel cannot run the chapter.

A chapter needs the package `agent_r1_tutorial` (and what it depends on) in the kernel's Python. A kernel started
from another environment fails a few cells later with a long traceback through whatever imports first (nbdev's
show_doc, say); this says what is wrong and what to run instead, and nothing else.
"""
import importlib
import sys
from pathlib import Path

_LAB = "bash scripts/lab.sh"


class KernelNotReady(Exception):
    "Raised at import when this kernel cannot run the chapters; IPython shows only the message."

    def _render_traceback_(self):  # IPython calls this instead of printing a traceback
        return ["", *str(self).splitlines(), ""]


def _check():
    root = Path(__file__).resolve().parent.parent
    try:
        pkg = importlib.import_module("agent_r1_tutorial.core")
    except ImportError as e:
        missing = getattr(e, "name", None) or str(e)
        raise KernelNotReady(
            f"This kernel cannot import agent_r1_tutorial (missing: {missing}).\n"
            f"The kernel runs {sys.executable}, which is not the project's environment.\n"
            f"From the repository ({root}), run\n\n    {_LAB}\n\n"
            "which sets up .venv (the first time takes a few minutes) and opens JupyterLab on these notebooks "
            "with the right kernel."
        ) from None
    where = Path(pkg.__file__).resolve().parent.parent
    if where != root:
        print(f"Note: this kernel imports agent_r1_tutorial from {where}, not from this checkout ({root}); "
              f"edits made here will not be what runs. `{_LAB}` opens JupyterLab with this checkout's package.")


_check()
