#!/usr/bin/env python3
"""The speedrun's command line: validate the request, pick the scale, run the stages that exist.

`bash speedrun.sh` calls this twice: first with the interpreter it will build the environment from, to reject bad
input before any set-up (this part uses the standard library only), then inside the environment to run.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ALGORITHMS = ("grpo", "ppo", "reinforce_pp", "rloo", "steppo")
SCALES = ("auto", "tiny", "full")

# The pipeline, stage by stage, with the chapter that builds each. `None` means not built yet.
STAGES = {
    "tiny": [
        ("data", "build the tokenizer and the generated worlds (train and held-out)", "11 · The tiny speedrun"),
        ("sft", "SFT warm start on scripted expert trajectories, loss masked to the agent's tokens", "11 · The tiny speedrun"),
        ("rl", "RL with the reference trainer (the chosen algorithm)", "10 · The trainer"),
        ("eval", "evaluation on held-out worlds, baselines beside it", "11 · The tiny speedrun"),
    ],
    "full": [
        ("preflight", "GPU count and memory, CUDA driver, disk, Python", "12 · verl at scale"),
        ("env", "the pinned GPU stack (verl 0.9.1, vLLM, faiss-gpu)", "12 · verl at scale"),
        ("data", "HotpotQA download and verl parquet rows", "12 · verl at scale"),
        ("index", "bge-large-en-v1.5 embeddings and a FAISS index of the corpus", "12 · verl at scale"),
        ("train", "verl training with this package's agent loop, estimators and losses", "12 · verl at scale"),
        ("eval", "EM and F1 on the HotpotQA dev sample", "12 · verl at scale"),
    ],
}
BUILT: dict[str, object] = {}  # stage key "scale/name" -> callable(run_dir, args); filled in as chapters land


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="bash speedrun.sh",
        description="Train a tool-using search agent end to end: a tiny one on a CPU, or the full HotpotQA "
        "pipeline on verl on a GPU box.",
        epilog="Examples: `bash speedrun.sh` (tiny, GRPO, on a machine without GPUs); `bash speedrun.sh grpo` on a "
        "GPU box; `bash speedrun.sh ppo --scale tiny`; `bash speedrun.sh grpo --dry-run`.",
    )
    ap.add_argument("algorithm", nargs="?", default="grpo", choices=ALGORITHMS,
                    help="the RL algorithm (default: grpo)")
    ap.add_argument("--scale", choices=SCALES, default="auto",
                    help="tiny: the CPU speedrun; full: verl on NVIDIA GPUs; auto (default): full when this "
                    "machine has NVIDIA GPUs, tiny otherwise")
    ap.add_argument("--dry-run", action="store_true",
                    help="do everything that needs no GPU and print what would run")
    ap.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    ap.add_argument("--out", default=str(ROOT / "runs"), help="where run folders go (default runs/)")
    ap.add_argument("--print-scale", action="store_true", help=argparse.SUPPRESS)
    return ap


def nvidia_gpus() -> list[str]:
    "The NVIDIA GPUs `nvidia-smi -L` lists (none when there is no driver)."
    if not shutil.which("nvidia-smi"):
        return []
    try:
        res = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [l for l in res.stdout.splitlines() if l.startswith("GPU ")] if res.returncode == 0 else []


def resolve(args, ap) -> str:
    "The scale to run at, or a usage error that says why not."
    if args.seed < 0:
        ap.error(f"--seed must be a non-negative integer, got {args.seed}")
    gpus = nvidia_gpus()
    scale = args.scale if args.scale != "auto" else ("full" if gpus else "tiny")
    if scale == "full" and not gpus and not args.dry_run:
        ap.error("--scale full needs NVIDIA GPUs and nvidia-smi found none; use --dry-run to check the full "
                 "pipeline without GPUs, or --scale tiny for the CPU speedrun")
    return scale


def run(args, scale: str) -> int:
    "Run the built stages in order and write the run folder; say plainly what is not built yet."
    from agent_r1_tutorial.core import env_report, env_report_md, seed_everything

    seed_everything(args.seed)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = Path(args.out) / f"{stamp}-{scale}-{args.algorithm}-s{args.seed}{'-dry' if args.dry_run else ''}"
    run_dir.mkdir(parents=True, exist_ok=False)
    report = env_report()
    (run_dir / "env.json").write_text(json.dumps(report, indent=1))
    print(f"speedrun: scale={scale} algorithm={args.algorithm} seed={args.seed}"
          f"{' (dry run)' if args.dry_run else ''}\nrun folder: {run_dir}")
    rows, missing = [], []
    for name, what, chapter in STAGES[scale]:
        fn = BUILT.get(f"{scale}/{name}")
        if fn is None:
            status = "NOT BUILT YET"
            missing.append(name)
        else:
            fn(run_dir, args)
            status = "done"
        rows.append((name, what, chapter, status))
        print(f"  {name:<10} {status:<14} {what}  [{chapter}]")
    lines = [f"# Speedrun report: {scale}, {args.algorithm}, seed {args.seed}", "",
             f"Run folder `{run_dir.name}`, started {stamp}.", "", "## Stages", "",
             "| stage | status | what | chapter |", "|---|---|---|---|"]
    lines += [f"| {n} | {s} | {w} | {c} |" for n, w, c, s in rows]
    if missing:
        lines += ["", f"**Not built yet: {', '.join(missing)}.** No model was trained and no metric was measured "
                  "by this run; the stages above land with the chapters named beside them."]
    lines += ["", "## Machine and versions", "", env_report_md(report), ""]
    (run_dir / "report.md").write_text("\n".join(lines))
    print(f"report card: {run_dir / 'report.md'}")
    if missing:
        print(f"not built yet: {', '.join(missing)}. Nothing was trained; the stages above are listed with the "
              "chapters that build them.")
    return 0


def main(argv=None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    scale = resolve(args, ap)
    if args.print_scale:
        print(scale)
        return 0
    return run(args, scale)


if __name__ == "__main__":
    sys.exit(main())
