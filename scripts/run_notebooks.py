#!/usr/bin/env python3
"""Run chapters as a reader's JupyterLab does (Run All, full size) and save their outputs: what the site shows.

The test suite runs the same notebooks shrunk (nbdev sets IN_TEST=1, and a hidden cell may then lower a step count);
the site must show what a reader's own run shows, so the outputs it renders come from here: every cell executed in
order in a fresh kernel, with IN_TEST unset and nbdev's directives ignored, exactly as Run All would. A notebook that
fails keeps its old outputs, and the cell and error are printed. Progress bars are switched off in the kernel so that
no saved output carries one. Afterwards `nbdev-clean` strips the execution metadata.

usage: python scripts/run_notebooks.py [NOTEBOOK ...] [--timeout S]
       (no notebook: every chapter in nbs/, in order; this takes a while)
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NBS = ROOT / "nbs"
# what a saved output must never hold: the machine that ran it
_LEAKS = re.compile(r"/work/|/root/|/home/\w+/|/tmp/tmp|site-packages")
# ... nor a library's log noise: timestamped log lines, torch's C++ notes, progress bars
_NOISE = re.compile(r"^(?:WARNING|INFO|DEBUG):\d{4}-\d\d-\d\d|^\[rank\d+\]:\[[WIE]|\d+/\d+ \[\d\d:\d\d|[\d.]+it/s\]", re.M)


def _chapters(args: list[str]) -> list[Path]:
    if not args:
        return sorted(p for p in NBS.glob("*.ipynb") if not p.name.startswith(("_", ".")))
    out = []
    for a in args:
        p = Path(a)
        p = p if p.exists() else NBS / a
        if not p.exists() or p.suffix != ".ipynb":
            raise SystemExit(f"no notebook {a!r} (give a path, or a name in nbs/ such as 08_advantages.ipynb)")
        out.append(p.resolve())
    return out


def _leaks(nb) -> list[str]:
    found = []
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            text = out.get("text") or "".join(str(v) for k, v in (out.get("data") or {}).items() if k.startswith("text"))
            for pattern in (_LEAKS, _NOISE):
                m = pattern.search(str(text))
                if m:
                    found.append(f"cell {i}: {m.group(0)!r}")
    return found


def _for_the_page(nb) -> int:
    """Drop what a static page cannot show: the outputs of `#| eval: false` cells (the page says they are not run
    there) and live widgets (whose only static form is a raw `VBox(children=...)` repr). Returns the outputs dropped."""
    dropped = 0
    for cell in (c for c in nb.cells if c.cell_type == "code"):
        not_run = re.search(r"^#\|\s*eval:\s*false\s*$", cell.source, re.M)
        keep = [] if not_run else [o for o in cell.outputs if "application/vnd.jupyter.widget-view+json" not in
                                   (o.get("data") or {})]
        dropped += len(cell.outputs) - len(keep)
        cell.outputs = keep
    return dropped


def run(path: Path, timeout: int) -> bool:
    "Execute one notebook in a fresh kernel and save it; False (and the notebook untouched) if it fails."
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(path, as_version=4)
    env_before = os.environ.get("IN_TEST")
    os.environ.pop("IN_TEST", None)  # a reader's kernel: full size
    os.environ.update(TQDM_DISABLE="1", HF_HUB_DISABLE_PROGRESS_BARS="1", TOKENIZERS_PARALLELISM="false")
    t0 = time.perf_counter()
    try:
        NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}},
                       record_timing=False).execute()
    except CellExecutionError as e:
        print(f"FAILED {path.name} after {time.perf_counter() - t0:.0f} s:\n{str(e)[-3000:]}", file=sys.stderr)
        return False
    finally:
        if env_before is not None:
            os.environ["IN_TEST"] = env_before
    _for_the_page(nb)
    leaks = _leaks(nb)
    if leaks:
        kept = ROOT / "_build" / "failed" / path.name  # the run is kept for a look, not saved over the chapter
        kept.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, kept)
        print(f"FAILED {path.name}: outputs show this machine or log noise ({'; '.join(leaks[:5])}); the run is in {kept}",
              file=sys.stderr)
        return False
    nbformat.write(nb, path)
    print(f"ran {path.name} in {time.perf_counter() - t0:.0f} s")
    return True


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python scripts/run_notebooks.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("notebooks", nargs="*", help="paths or names in nbs/ (default: every chapter)")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds one cell may take (default 1800)")
    args = ap.parse_args(argv)
    paths = _chapters(args.notebooks)
    failed = [p.name for p in paths if not run(p, args.timeout)]
    clean = Path(sys.executable).with_name("nbdev-clean")
    subprocess.run([str(clean) if clean.exists() else "nbdev-clean"], cwd=ROOT, check=True)
    if failed:
        print(f"{len(failed)} of {len(paths)} failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    print(f"all {len(paths)} ran; outputs saved")
    return 0


if __name__ == "__main__":
    sys.exit(main())
