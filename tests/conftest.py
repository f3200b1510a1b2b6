"""Shared set-up for the test suite.

Test flags mirror nbdev's: tests marked `slow` or `gpu` are skipped unless the flag is given
(`bash scripts/test.sh --flags "slow gpu"`, which exports AR1_FLAGS).
"""
import json
import os
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FLAGS = set(os.environ.get("AR1_FLAGS", "").split())
# scripts/ holds command-line tools, not a package (verl's wheel installs a top-level `scripts` package),
# so its modules are imported by putting the folder itself on the path
sys.path.insert(0, str(ROOT / "scripts"))


def pytest_collection_modifyitems(config, items):
    for item in items:
        for flag in ("slow", "gpu"):
            if flag in item.keywords and flag not in FLAGS:
                item.add_marker(pytest.mark.skip(reason=f"marked {flag}: run with --flags {flag}"))


def venv_bin(name: str) -> str:
    "A console script of the environment the tests run in (nbdev-export, smalldocs, ...)."
    return str(Path(sys.executable).with_name(name))


def default_exp(nb: Path) -> list[str]:
    "The modules a notebook exports (its `#| default_exp` directives)."
    cells = json.loads(nb.read_text())["cells"]
    return [m.group(1) for c in cells if c["cell_type"] == "code"
            for m in re.finditer(r"^#\|\s*default_exp\s+(\S+)", "".join(c["source"]), re.M)]
