#!/usr/bin/env python3
"""The tiny speedrun's targets, measured (chapter 11). Prints the figures and writes them to <out>/bench.md.

    python scripts/bench_speedrun.py headline                 # random init -> EM per hop, total wall time
    python scripts/bench_speedrun.py rl-matters --seeds 0,1,2 # SFT on one-hop only (see --set), then RL on the mix
    python scripts/bench_speedrun.py algorithms               # GRPO, PPO, REINFORCE++, RLOO, StepPO from one SFT start
                                                              # (--algorithms rloo,steppo: only those)
    python scripts/bench_speedrun.py all

Targets (issue 6): headline >= 0.95 EM on held-out one-hop and two-hop questions each in <= 600 s on 2 CPU cores,
all stages included; RL lifts held-out two-hop EM by >= 0.30 over its SFT start within <= 900 s of RL, mean +- std
over 3 seeds, beside the no-tool and SFT-only baselines. Any SpeedrunConfig field can be changed with --set KEY=VALUE;
for instance `rl-matters --set sft_hops=1,2 --set sft_two_hop_share=0.02` demonstrates a few two-hop episodes instead
of none, and `--set sft_hops=1,2 --set sft_two_hop_stop=0.7` demonstrates every two-hop question but has the expert
answer 70% of them after one search (chapter 11, section 15, where RL then matters). Runs resume: a killed benchmark
started again with the same --out continues where it stopped.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))


def _cfg(preset: str, sets: list[str], **kw):
    from agent_r1_tutorial.speedrun import SpeedrunConfig
    from speedrun import _parse_value

    over = {k: _parse_value(v) for k, v in (s.split("=", 1) for s in sets)}
    for k in ("sft_hops", "rl_hops", "world_size"):
        if isinstance(over.get(k), int):
            over[k] = (over[k],)
    return SpeedrunConfig.preset(preset, **{**kw, **over})


def _total(run_dir: Path) -> dict:
    return json.loads((run_dir / "stages.json").read_text())


def _fmt(x: float) -> str:
    return f"{x:.3f}"


def headline(args, lines: list[str]):
    from agent_r1_tutorial.speedrun import run_speedrun

    cfg = _cfg(args.preset, args.set, seed=args.seeds[0], threads=args.threads)
    d = Path(args.out) / f"headline-s{cfg.seed}"
    ev = run_speedrun(cfg, d, progress=not args.quiet)
    t = _total(d)
    f = ev["final"]
    ok = f.get("em/1-hop", 0) >= 0.95 and f.get("em/2-hop", 0) >= 0.95 and sum(t.values()) <= 600
    lines += ["## Headline: random initialisation to held-out EM", "",
              "| model | EM 1-hop | EM 2-hop | tool calls | turns |", "|---|---|---|---|---|"]
    for k, name in (("no_tool", "no-tool baseline"), ("sft", "SFT only"), ("final", f"SFT + {cfg.algorithm}")):
        e = ev[k]
        lines.append(f"| {name} | {_fmt(e.get('em/1-hop', float('nan')))} | {_fmt(e.get('em/2-hop', float('nan')))} "
                     f"| {e['tool_calls']:.2f} | {e['turns']:.2f} |")
    lines += ["", "Wall time per stage (s): " + ", ".join(f"{k} {v:.0f}" for k, v in t.items())
              + f"; total **{sum(t.values()):.0f} s**.",
              f"Rollout throughput (greedy eval, batched loop): {f['agent_tokens_per_s']:.0f} agent tokens/s.",
              f"Target (>= 0.95 on each, <= 600 s): **{'met' if ok else 'not met'}**.", ""]


def _copy_sft(src: Path, dst: Path, cfg):
    "Start a run folder from the data and SFT stages of another (same SFT settings), to try other RL settings."
    if not (src / ".sft.done").exists():
        raise SystemExit(f"error: {src} holds no finished SFT stage (no .sft.done)")
    old = json.loads((src / "config.json").read_text())
    new = json.loads(json.dumps(dataclasses.asdict(cfg)))
    rl_keys = {"algorithm", "rl_steps", "prompts_per_step", "group_size", "rl_lr", "temperature", "kl_coef",
               "process_reward", "threads"}
    differ = sorted(k for k in new if new[k] != old.get(k) and k not in rl_keys)
    if differ:
        raise SystemExit(f"error: {src} was trained with other data or SFT settings (differs in {differ})")
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("rl", "final_model", ".rl.done", ".eval.done",
                                                            "episodes.jsonl", "plots", "report.md"))
    (dst / "config.json").write_text(json.dumps(new, indent=1))
    for name, drop in (("eval.json", "final"), ("stages.json", "rl"), ("stages.json", "eval")):
        data = json.loads((dst / name).read_text())
        data.pop(drop, None)
        (dst / name).write_text(json.dumps(data, indent=1))


def _two_search(run_dir: Path) -> float:
    "The share of held-out two-hop questions answered right after 2+ searches (one search and a right city is a guess)."
    two = [r for r in map(json.loads, (run_dir / "episodes.jsonl").read_text().splitlines()) if r["kind"] == "2-hop"]
    return sum(r["tool_calls"] >= 2 and r["reward"] == 1.0 for r in two) / max(1, len(two))


def rl_matters(args, lines: list[str]):
    from agent_r1_tutorial.speedrun import run_speedrun

    rows = []
    for seed in args.seeds:
        cfg = _cfg(args.preset, ["sft_hops=1", "rl_hops=1,2", *args.set], seed=seed, threads=args.threads)
        d = Path(args.out) / f"rl-matters-s{seed}"
        if args.sft_from and not d.exists():
            _copy_sft(Path(args.sft_from) / f"rl-matters-s{seed}", d, cfg)
        ev = run_speedrun(cfg, d, progress=not args.quiet)
        rows.append({"seed": seed, "no_tool": ev["no_tool"].get("em/2-hop", 0.0), "sft": ev["sft"].get("em/2-hop", 0.0),
                     "final": ev["final"].get("em/2-hop", 0.0), "final1": ev["final"].get("em/1-hop", 0.0),
                     "sft1": ev["sft"].get("em/1-hop", 0.0), "calls_sft": ev["sft"]["tool_calls"],
                     "calls_final": ev["final"]["tool_calls"], "rl_s": _total(d).get("rl", 0.0),
                     "two_search": _two_search(d)})
    lift = [r["final"] - r["sft"] for r in rows]
    ms = lambda xs: f"{statistics.mean(xs):.3f} ± {statistics.stdev(xs) if len(xs) > 1 else 0.0:.3f}"
    demos = ("one-hop demonstrations only" if cfg.sft_hops == (1,) else
             f"one-hop demonstrations and {cfg.sft_two_hop_share:.0%} of the two-hop ones")
    if cfg.sft_two_hop_stop and 2 in cfg.sft_hops:
        demos += (f", {cfg.sft_two_hop_stop:.0%} of which a flawed expert answers after one search "
                  "(with the bridge entity: wrong)")
    lines += [f"## RL matters: SFT on {demos}; RL ({cfg.algorithm}, {cfg.rl_steps} steps, lr {cfg.rl_lr:g}, "
              f"process reward {cfg.process_reward:g}, temperature {cfg.temperature:g}) on the one- and two-hop mix", "",
              "| seed | no-tool 2-hop | SFT 2-hop | SFT+RL 2-hop | SFT+RL 2-hop right after 2+ searches | SFT 1-hop "
              "| SFT+RL 1-hop | calls SFT | calls RL | RL s |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['seed']} | {_fmt(r['no_tool'])} | {_fmt(r['sft'])} | {_fmt(r['final'])} "
                     f"| {_fmt(r['two_search'])} | {_fmt(r['sft1'])} "
                     f"| {_fmt(r['final1'])} | {r['calls_sft']:.2f} | {r['calls_final']:.2f} | {r['rl_s']:.0f} |")
    ok = statistics.mean(lift) >= 0.30 and max(r["rl_s"] for r in rows) <= 900
    lines += ["", f"Two-hop EM lift from RL: **{ms(lift)}** over {len(rows)} seed(s) "
              f"(target >= 0.30 within 900 s of RL: **{'met' if ok else 'not met'}**).", ""]


def algorithms(args, lines: list[str]):
    from agent_r1_tutorial.speedrun import build_suite, run_speedrun
    from agent_r1_tutorial.trainer import ALGORITHMS

    chosen = args.algorithms.split(",") if args.algorithms else ["grpo", *[a for a in ALGORITHMS if a != "grpo"]]
    bad = [a for a in chosen if a not in ALGORITHMS]
    if bad:
        raise SystemExit(f"error: unknown algorithm(s) {bad}; choose from {list(ALGORITHMS)}")
    seed = args.seeds[0]
    base_cfg = _cfg(args.preset, args.set, seed=seed, threads=args.threads)
    suite = build_suite(base_cfg)  # the same worlds for every algorithm: embed them once
    base = Path(args.out) / f"algorithms-s{seed}-sft"
    start = run_speedrun(base_cfg, base, progress=not args.quiet, stages=["data", "sft"], suite=suite)["sft"]
    lines += ["## Algorithms at the same budget, from the same SFT checkpoint", "",
              f"{base_cfg.rl_steps} RL steps of {base_cfg.prompts_per_step} prompts × {base_cfg.group_size} episodes "
              f"at lr {base_cfg.rl_lr:g}, process reward {base_cfg.process_reward:g} (PPO and REINFORCE++ in verl use one "
              "response per prompt; here every algorithm gets the same episodes).", "",
              "| algorithm | EM 1-hop | EM 2-hop | 2-hop right after 2+ searches | tool calls | RL wall s |",
              "|---|---|---|---|---|---|",
              f"| (SFT start) | {_fmt(start.get('em/1-hop', float('nan')))} | {_fmt(start.get('em/2-hop', float('nan')))} "
              f"| | {start['tool_calls']:.2f} | |"]
    for alg in chosen:
        cfg = _cfg(args.preset, args.set, seed=seed, threads=args.threads, algorithm=alg)
        d = Path(args.out) / f"algorithms-s{seed}-{alg}"
        if not d.exists():  # start from a copy of the shared SFT stage
            _copy_sft(base, d, cfg)
        ev = run_speedrun(cfg, d, progress=not args.quiet, suite=suite)
        f = ev["final"]
        lines.append(f"| {alg} | {_fmt(f.get('em/1-hop', float('nan')))} | {_fmt(f.get('em/2-hop', float('nan')))} "
                     f"| {_fmt(_two_search(d))} | {f['tool_calls']:.2f} | {_total(d).get('rl', 0.0):.0f} |")
    lines.append("")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=["headline", "rl-matters", "algorithms", "all"])
    ap.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (rl-matters uses all; others the first)")
    ap.add_argument("--preset", choices=["tiny", "ci"], default="tiny")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--out", default=str(ROOT / "runs" / "bench"))
    ap.add_argument("--quiet", action="store_true", help="no progress bars")
    ap.add_argument("--sft-from", default=None, metavar="DIR",
                    help="rl-matters: start from the SFT stage of DIR/rl-matters-s<seed> (a run of the same data and "
                    "SFT settings), to compare RL settings without repeating SFT")
    ap.add_argument("--algorithms", default=None, metavar="A,B",
                    help="algorithms: run only these (comma-separated; default all), e.g. to split the work")
    args = ap.parse_args(argv)
    try:
        args.seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        ap.error(f"--seeds must be comma-separated integers, got {args.seeds!r}")
    for s in args.set:
        if "=" not in s:
            ap.error(f"--set needs KEY=VALUE, got {s!r}")
    from transformers.utils import logging as hf_logging

    from agent_r1_tutorial.core import env_report, env_report_md

    hf_logging.disable_progress_bar()
    t0 = time.time()
    lines = [f"# Tiny speedrun benchmark ({args.what}, preset {args.preset})", ""]
    try:
        for name, fn in (("headline", headline), ("rl-matters", rl_matters), ("algorithms", algorithms)):
            if args.what in (name, "all"):
                fn(args, lines)
    except ValueError as e:
        raise SystemExit(f"error: {e}")
    lines += [f"Benchmark wall time: {time.time() - t0:.0f} s.", "", "## Machine", "", env_report_md(env_report())]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"bench-{args.what}.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
