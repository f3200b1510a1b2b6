#!/usr/bin/env python3
"""Check that a pinned GPU stack resolves on PyPI, and (with --write) regenerate its full constraints file.

    python3 scripts/gpu/resolve.py cu12 --python python3.12                    # resolves? how many packages, how long
    python3 scripts/gpu/resolve.py cu12 --python python3.11 --python python3.12 --write

For each interpreter it runs, without installing anything (only package metadata and wheels are fetched):

    pip install --dry-run --ignore-installed --prefer-binary --target <tmp> --report <json> -r requirements-<set>.txt

The target is the interpreter's own platform (Linux x86_64 here), which is what the GPU box runs. The resolution
runs pip under the given interpreter through `pip --python`, so a recent pip is used even when that interpreter's
own pip is old. `--only-binary=:all:` is not usable: antlr4-python3-runtime (needed by hydra-core and omegaconf) is
published as a source release only. --write merges the resolved sets into constraints-<set>.txt, adding
`python_version` markers where two interpreters resolved a package to different versions.

Standard library only.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def interpreter_version(python: str) -> str:
    out = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], capture_output=True,
                         text=True, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"{python} did not run: {out.stderr.strip()[-200:]}")
    return out.stdout.strip()


def resolve(pin_set: str, python: str, constraints: bool = False, timeout: float = 1800) -> dict:
    "Resolve requirements-<pin_set>.txt for `python`; returns rc, seconds, the resolved {name: version} and pip's tail."
    req = HERE / f"requirements-{pin_set}.txt"
    if not req.exists():
        raise FileNotFoundError(f"{req} does not exist: choose a pin set from "
                                f"{sorted(p.stem.split('-', 1)[1] for p in HERE.glob('requirements-*.txt'))}")
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "pip", "--python", python, "install", "--dry-run", "--ignore-installed",
               "--prefer-binary", "--disable-pip-version-check", "--target", str(Path(tmp) / "target"),
               "--report", str(report), "-r", str(req)]
        if constraints:
            cmd += ["-c", str(HERE / f"constraints-{pin_set}.txt")]
        env = dict(os.environ, PIP_CONFIG_FILE=os.devnull)  # no local mirror or index settings: PyPI as users see it
        t0 = time.time()
        res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
        seconds = time.time() - t0
        resolved = {}
        if res.returncode == 0 and report.exists():
            for item in json.loads(report.read_text())["install"]:
                resolved[item["metadata"]["name"]] = item["metadata"]["version"]
    return {"pin_set": pin_set, "python": python, "python_version": interpreter_version(python),
            "rc": res.returncode, "seconds": round(seconds, 1), "resolved": resolved,
            "tail": (res.stdout + res.stderr)[-3000:], "command": " ".join(cmd)}


def read_constraints(path: Path) -> dict[str, list[tuple[str, str | None]]]:
    "name (lower-case) -> [(version, marker or None)] from a constraints file."
    out: dict[str, list] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        spec, _, marker = line.partition(";")
        name, _, version = spec.strip().partition("==")
        out.setdefault(name.strip().lower(), []).append((version.strip(), marker.strip() or None))
    return out


def write_constraints(pin_set: str, results: list[dict]) -> Path:
    "Merge resolutions (one per Python) into constraints-<pin_set>.txt."
    names = sorted({n for r in results for n in r["resolved"]}, key=str.lower)
    pys = ", ".join(f"CPython {r['python_version']}" for r in results)
    lines = [f"# The full resolved set for requirements-{pin_set}.txt (Linux x86_64; {pys}), made by",
             f"# `python3 scripts/gpu/resolve.py {pin_set} " + " ".join(f"--python python{r['python_version']}" for r in results)
             + " --write` against PyPI.",
             "# Use as: pip install -r requirements-%s.txt -c constraints-%s.txt (scripts/setup_gpu.sh does)." % (pin_set, pin_set)]
    for n in names:
        versions = {r["python_version"]: r["resolved"].get(n) for r in results}
        distinct = set(versions.values())
        if len(distinct) == 1 and None not in distinct:
            lines.append(f"{n}=={distinct.pop()}")
        else:
            for pv, v in sorted(versions.items()):
                if v is not None:
                    lines.append(f'{n}=={v} ; python_version == "{pv}"')
    path = HERE / f"constraints-{pin_set}.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="scripts/gpu/resolve.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("pin_set", help="cu12 or cu13 (the requirements-<set>.txt next to this script)")
    ap.add_argument("--python", action="append", default=None, help="interpreter(s) to resolve for (repeatable)")
    ap.add_argument("--constraints", action="store_true", help="also apply constraints-<set>.txt")
    ap.add_argument("--write", action="store_true", help="write constraints-<set>.txt from the resolution")
    args = ap.parse_args(argv)
    results = []
    for py in args.python or [sys.executable]:
        r = resolve(args.pin_set, py, args.constraints)
        print(f"{args.pin_set} on Python {r['python_version']} ({py}): "
              + (f"resolved {len(r['resolved'])} packages in {r['seconds']} s" if r["rc"] == 0
                 else f"FAILED (exit {r['rc']}) after {r['seconds']} s\n{r['tail']}"))
        results.append(r)
    if any(r["rc"] != 0 for r in results):
        return 1
    if args.write:
        print(f"wrote {write_constraints(args.pin_set, results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
