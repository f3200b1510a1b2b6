#!/usr/bin/env python3
"""The text-game speedrun's targets, measured (chapter 11a). Prints the figures and writes them to <out>/bench.md.

    python scripts/bench_gamerun.py --seeds 0,1,2                 # GRPO per seed, then StepPO from the same SFT model
    python scripts/bench_gamerun.py --seeds 0 --algorithms grpo   # only the default run

For each seed the default run (`bash speedrun.sh --task textworld`: data, SFT, GRPO, eval) runs from random
initialisation. Every other algorithm then starts from that run's SFT model (`fork_game_run`) with the RL wall time
GRPO used as its budget (`rl_seconds`), so the algorithms are compared at equal compute. Targets: on the levels SFT alone
wins at most half of, held-out win after RL >= 0.8, for every seed, in <= 20 minutes for all stages on 2 CPU cores.
Any GameRunConfig field can be changed with --set KEY=VALUE. Runs resume: a killed benchmark started again with the
same --out continues where it stopped. --sft-from DIR takes each seed's data and SFT stages from an earlier benchmark's
first runs (their times included), for RL settings measured from the same starts.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _seeds(s: str) -> list[int]:
    try:
        seeds = [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seeds takes a comma list of non-negative ints, got {s!r}")
    if not seeds or min(seeds) < 0:
        raise argparse.ArgumentTypeError(f"--seeds takes a comma list of non-negative ints, got {s!r}")
    return seeds


def _mean_std(xs: list[float], digits: int = 3) -> str:
    m = statistics.mean(xs)
    return f"{m:.{digits}f} ± {statistics.stdev(xs):.{digits}f}" if len(xs) > 1 else f"{m:.{digits}f}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python scripts/bench_gamerun.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=_seeds, default=[0, 1, 2], help="comma list (default 0,1,2)")
    ap.add_argument("--algorithms", default="grpo,steppo",
                    help="comma list; the first is run in full, the others from its SFT model (default grpo,steppo)")
    ap.add_argument("--preset", default="tiny", help="tiny (default) or ci")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="any GameRunConfig field")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--out", default=str(ROOT / "runs" / "bench-gamerun"), help="run folders and bench.md go here")
    ap.add_argument("--quiet", action="store_true", help="no per-step lines")
    ap.add_argument("--sft-from", default=None, metavar="DIR",
                    help="an earlier --out: each seed's first run starts from its SFT model (RL settings may differ)")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from agent_r1_tutorial.gamerun import (GameRunConfig, fork_game_run, rl_step_costs, run_gamerun, weak_levels,
                                           win_on)
    from agent_r1_tutorial.trainer import ALGORITHMS

    algos = [a.strip() for a in args.algorithms.split(",") if a.strip()]
    bad = [a for a in algos if a not in ALGORITHMS]
    if not algos or bad:
        ap.error(f"--algorithms takes a comma list of {list(ALGORITHMS)}, got {args.algorithms!r}")
    out = Path(args.out)
    rows = []
    for seed in args.seeds:
        try:
            cfg = GameRunConfig.from_sets(args.set, args.preset, algorithm=algos[0], seed=seed, threads=args.threads)
        except (ValueError, TypeError) as e:
            raise SystemExit(f"error: {e}")
        first = out / f"{algos[0]}-s{seed}"
        if args.sft_from and not first.exists():
            src = Path(args.sft_from) / f"{algos[0]}-s{seed}"
            if not (src / "config.json").exists():
                raise SystemExit(f"error: --sft-from {args.sft_from}: no run {src.name} to start seed {seed} from")
            old, new = json.loads((src / "config.json").read_text()), json.loads(json.dumps(asdict(cfg)))
            try:  # fork_game_run refuses a change outside RL (the source's data and SFT must be the ones asked for)
                fork_game_run(src, first, **{k: v for k, v in new.items() if v != old.get(k)})
            except ValueError as e:
                raise SystemExit(f"error: --sft-from {args.sft_from}: {src.name}: {e}")
        ev = run_gamerun(cfg, first, progress=not args.quiet)
        times = json.loads((first / "stages.json").read_text())
        weak = weak_levels(ev["sft"]["win_by_level"])
        for algo in algos:
            d = out / f"{algo}-s{seed}"
            if algo != algos[0]:
                if not d.exists():
                    fork_game_run(first, d, algorithm=algo, rl_seconds=ev["rl_seconds"], rl_steps=10 * cfg.rl_steps)
                fork_cfg = GameRunConfig(**json.loads((d / "config.json").read_text()))
                e = run_gamerun(fork_cfg, d, progress=not args.quiet)
            else:
                e = ev
            rows.append(dict(seed=seed, algorithm=algo, sft_win=ev["sft"]["win"], win=e["final"]["win"],
                             sft_inadmissible=ev["sft"]["inadmissible"],
                             weak=weak, sft_weak=win_on(ev["sft"]["win_by_level"], weak),
                             final_weak=win_on(e["final"]["win_by_level"], weak), steps=e["final"]["steps"],
                             look=e["final"]["look_share"], inadmissible=e["final"]["inadmissible"],
                             rl_steps=e["rl_steps"], rl_seconds=e["rl_seconds"],
                             total_s=sum(times.values()) if algo == algos[0] else None,
                             teacher=ev["teacher"]["win"], random=ev["random"]["win"],
                             **{f"cost_{k}": v for k, v in rl_step_costs(d).items() if k.endswith(("_s", "rows"))}))
            r = rows[-1]
            print(f"seed {seed} {algo}: held-out win {r['sft_win']:.3f} -> {r['win']:.3f}; on SFT's weak levels "
                  f"{weak}: {r['sft_weak']:.3f} -> {r['final_weak']:.3f}; {r['rl_steps']} RL steps in "
                  f"{r['rl_seconds']:.0f} s", flush=True)
    lines = ["# Text-game speedrun: held-out games, per seed", "",
             f"Preset `{args.preset}`{', ' + ', '.join(args.set) if args.set else ''}. The first algorithm's run is "
             "the default pipeline from random initialisation; the others start from its SFT model with its RL wall "
             "time as their budget.", "",
             "| seed | algorithm | SFT win | win after RL | SFT's weak levels | their win: SFT | after RL | "
             "steps | look | inadmissible | RL steps | RL s | all stages s | targets |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        # rounded: a win rate of 24 games in 30 is 0.8, though its float average of level rates is 0.7999...
        met = round(r["final_weak"], 9) >= 0.8 and r["sft_weak"] <= 0.5 and (r["total_s"] or 0) <= 1200
        target = ("met" if met else "not met") if r["total_s"] is not None else "-"
        lines.append(f"| {r['seed']} | {r['algorithm']} | {r['sft_win']:.3f} | {r['win']:.3f} | "
                     f"{','.join(map(str, r['weak']))} | {r['sft_weak']:.3f} | {r['final_weak']:.3f} | "
                     f"{r['steps']:.2f} | {r['look']:.2f} | {r['inadmissible']:.3f} | {r['rl_steps']} | "
                     f"{r['rl_seconds']:.0f} | {'-' if r['total_s'] is None else round(r['total_s'])} | "
                     f"{target} |")
    lines += ["", "| algorithm | held-out win | win on SFT's weak levels | lift there | RL steps | RL s |",
              "|---|---|---|---|---|---|"]
    for algo in algos:
        rs = [r for r in rows if r["algorithm"] == algo]
        lines.append(f"| {algo} | {_mean_std([r['win'] for r in rs])} | {_mean_std([r['final_weak'] for r in rs])} | "
                     f"{_mean_std([r['final_weak'] - r['sft_weak'] for r in rs])} | "
                     f"{_mean_std([float(r['rl_steps']) for r in rs], 1)} | "
                     f"{_mean_std([r['rl_seconds'] for r in rs], 0)} |")
    lines += ["", "What an RL step cost (mean over steps and seeds):", "",
              "| algorithm | seconds per step | of which rollout | of which update | rows per update |",
              "|---|---|---|---|---|"]
    for algo in algos:
        rs = [r for r in rows if r["algorithm"] == algo]
        m = lambda k: statistics.mean(r[k] for r in rs)
        lines.append(f"| {algo} | {m('cost_step_s'):.1f} | {m('cost_rollout_s'):.1f} | {m('cost_update_s'):.1f} | "
                     f"{m('cost_rows'):.0f} |")
    base = [r for r in rows if r["algorithm"] == algos[0]]
    lines += ["", f"Baselines (held-out win, mean over seeds): random {_mean_std([r['random'] for r in base])}, "
              f"the dawdling teacher {_mean_std([r['teacher'] for r in base])}, SFT alone "
              f"{_mean_std([r['sft_win'] for r in base])}."]
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.md").write_text("\n".join(lines) + "\n")
    (out / "bench.json").write_text(json.dumps(rows, indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
