"""How long the exported code is, cell by cell and function by function (what a reader meets in each chapter).

    python scripts/cell_lengths.py            # counts, and the offenders over the limit
    python scripts/cell_lengths.py --limit 40 # a stricter limit

An export cell is a code cell with `#| export` or `#| exports`; a function is any `def` (methods included) in one,
measured from its first decorator to its last line. Dataclasses whose body is only fields are not counted as
functions (they have none)."""
import argparse, ast, json, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def export_cells(nb: Path):
    for i, c in enumerate(json.loads(nb.read_text())["cells"]):
        if c["cell_type"] != "code":
            continue
        src = "".join(c["source"])
        if any(l.strip().replace(" ", "") in ("#|export", "#|exports") for l in src.splitlines()[:5]):
            yield i, src


def functions(src: str):
    try:
        tree = ast.parse(src)
    except SyntaxError:
        return
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            start = min([d.lineno for d in node.decorator_list] + [node.lineno])
            yield node.name, node.end_lineno - start + 1


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--limit", type=int, default=60, help="lines above which a cell or function is reported")
    p.add_argument("--nbs", default=str(ROOT / "nbs"), help="the notebooks' folder")
    a = p.parse_args(argv)
    if a.limit < 1:
        p.error(f"--limit must be a positive number of lines, got {a.limit}")
    nbs = sorted(Path(a.nbs).glob("*.ipynb"))
    if not nbs:
        p.error(f"no notebooks in {a.nbs}")
    cells, funcs, long_cells, long_funcs = 0, 0, [], []
    for nb in nbs:
        for i, src in export_cells(nb):
            cells += 1
            n = len(src.splitlines())
            if n > a.limit:
                long_cells.append((n, f"{nb.name} cell {i}"))
            for name, m in functions(src):
                funcs += 1
                if m > a.limit:
                    long_funcs.append((m, f"{nb.name}: {name}"))
    print(f"export cells: {cells}, over {a.limit} lines: {len(long_cells)}")
    print(f"functions and methods: {funcs}, over {a.limit} lines: {len(long_funcs)}")
    for title, rows in (("cells", long_cells), ("functions", long_funcs)):
        for n, where in sorted(rows, reverse=True):
            print(f"  {title[:-1]:8s} {n:4d}  {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
