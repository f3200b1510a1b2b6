#!/usr/bin/env python3
"""verl's trainer against the reference trainer, from one SFT checkpoint (chapter 15). Prints the figures and writes
them to <out>/engines.md and <out>/engines.json.

    python scripts/bench_engines.py --sft-from runs/tiny-search-grpo-s0 --seeds 0,1,2
    python scripts/bench_engines.py --sft-from runs/tiny-search-grpo-s0 --seeds 0 --engines verl --steps 4

For each seed and engine the data and SFT stages are copied from --sft-from (fork_after_sft), RL runs with that seed as
its own (rl_seed) on the reference trainer (chapter 10) or on verl 0.9.1's trainer on this CPU (chapter 15), and
held-out EM is measured every --eval-every steps by the same code for both engines (evaluate_agent: greedy, the
held-out worlds): the reference trainer evaluates its policy as it trains, verl's checkpoints are evaluated after its
run. Target: from an SFT model that answers <= 0.50 of the two-hop questions, every seed lifts two-hop EM by >= 0.30
on verl. Runs resume: started again with the same --out, finished runs are read back and unfinished ones go on from
their last checkpoint. `--overheads` instead times verl's step before and after chapter 15's cuts, and `--set` changes
an RL field for every run (e.g. --set filter_groups=false).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENGINES = ("reference", "verl")


def _seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seeds takes comma-separated integers, got {text!r}") from None
    if not seeds or any(s < 0 for s in seeds):
        raise argparse.ArgumentTypeError(f"--seeds takes non-negative integers, got {text!r}")
    return seeds


def _engines(text: str) -> list[str]:
    names = [e for e in text.split(",") if e]
    bad = [e for e in names if e not in ENGINES]
    if not names or bad:
        raise argparse.ArgumentTypeError(f"--engines takes a comma list of {', '.join(ENGINES)}, got {text!r}")
    return names


def source_config(src: Path, args):
    "The source run's configuration, with this benchmark's RL fields (steps, evaluation, RL seed set per run)."
    from agent_r1_tutorial.speedrun import SpeedrunConfig

    if not (src / ".sft.done").exists() or not (src / "config.json").exists():
        raise SystemExit(f"error: --sft-from {src}: no finished SFT stage there (run `bash speedrun.sh` first)")
    cfg = SpeedrunConfig(**json.loads((src / "config.json").read_text()))
    if cfg.task != "search":
        raise SystemExit(f"error: --sft-from {src}: a {cfg.task!r} run; verl's engine runs the search task")
    from agent_r1_tutorial.speedrun import RL_FIELDS, parse_sets

    try:
        sets = parse_sets(args.set)
    except ValueError as e:
        raise SystemExit(f"error: {e}")
    bad = sorted(set(sets) - RL_FIELDS)
    if bad:
        raise SystemExit(f"error: --set {bad}: only RL fields can differ from the SFT run ({sorted(RL_FIELDS)})")
    try:
        return dataclasses.replace(cfg, rl_steps=args.steps or cfg.rl_steps,
                                   rl_eval_every=args.eval_every or cfg.rl_eval_every, threads=args.threads, **sets)
    except (ValueError, TypeError) as e:
        raise SystemExit(f"error: {e}")


def run_one(cfg, src: Path, run_dir: Path, engine: str, suite) -> dict:
    "One RL run from the source's SFT model; its held-out curve (SFT at step 0, then every rl_eval_every steps)."
    from agent_r1_tutorial.speedrun import _done, fork_after_sft, read_jsonl, run_speedrun

    if not run_dir.exists():
        fork_after_sft(src, run_dir, cfg)
    if engine == "verl" and not _done(run_dir, "rl"):
        from agent_r1_tutorial.verl_cpu import verl_rl_stage

        verl_rl_stage(cfg, run_dir, suite, verbose=False)  # marks the RL stage done, as run_speedrun's stages are
    ev = run_speedrun(cfg, run_dir, progress=False, stages=["rl", "eval"], suite=suite)
    keep = lambda r: {k: r[k] for k in ("em/1-hop", "em/2-hop", "after_2_searches/2-hop") if k in r}
    curve = [{"step": 0, **keep(ev["sft"])}]
    curve += [{"step": r["step"], **keep(r)} for r in read_jsonl(run_dir / "rl" / "eval.jsonl")]
    curve += [{"step": cfg.rl_steps, **keep(ev["final"])}]
    times = json.loads((run_dir / "stages.json").read_text())
    out = {"engine": engine, "seed": cfg.seed if cfg.rl_seed is None else cfg.rl_seed, "curve": curve, "rl_seconds": round(times.get("rl", 0.0), 1)}
    if engine == "verl":  # where a step's time went: verl's own timing metrics
        from agent_r1_tutorial.verl_cpu import read_verl_metrics, step_time_breakdown

        out["phases"] = {k: round(v, 3) for k, v in step_time_breakdown(read_verl_metrics(run_dir / "verl")).items()}
        out["step_seconds"] = out["phases"]["step"]
    else:  # the reference trainer's (chapter 10): rollout, update, and the step
        m = [r for r in read_jsonl(run_dir / "rl" / "metrics.jsonl") if "time/step_s" in r]
        mean = lambda k: round(statistics.mean(r.get(k, 0.0) for r in m), 3) if m else None
        out["phases"] = {"rollout": mean("time/rollout_s"), "update": mean("time/update_s"), "step": mean("time/step_s")}
        out["step_seconds"] = out["phases"]["step"]
    return out


# the configuration before chapter 15's cuts: the reference model built (and its log-probs computed every step) although
# the KL coefficient is 0, and the old log-probs recomputed although the rollout's are the policy's own
BEFORE_CUTS = ("actor_rollout_ref.actor.use_kl_loss=True", "algorithm.rollout_correction.bypass_mode=False")


def overheads(args, src: Path, base, suite, out: Path) -> dict:
    "verl's step before and after the cuts, one run each from the same SFT model, one after the other."
    from agent_r1_tutorial.speedrun import fork_after_sft
    from agent_r1_tutorial.verl_cpu import read_verl_metrics, step_time_breakdown, verl_rl_stage

    cfg = dataclasses.replace(base, rl_steps=args.steps or 3)
    phases = {}
    for name, extra in (("before", BEFORE_CUTS), ("after", ())):
        d = out / f"overheads-{name}"
        if not d.exists():
            fork_after_sft(src, d, cfg)
        if not (d / "verl" / "checkpoints" / f"global_step_{cfg.rl_steps}").exists():
            print(f"verl, {cfg.rl_steps} steps, {name} the cuts ...", flush=True)
            verl_rl_stage(cfg, d, suite, verbose=False, overrides=extra)
        phases[name] = {k: round(v, 3) for k, v in step_time_breakdown(read_verl_metrics(d / "verl")).items()}
    # what bypass_mode relies on, measured where verl still recomputed: the rollout's log-probs against the actor's
    diff = [m["training/rollout_probs_diff_max"] for m in read_verl_metrics(out / "overheads-before" / "verl")
            if "training/rollout_probs_diff_max" in m]
    return {"source": src.name, "steps": cfg.rl_steps, "before_overrides": list(BEFORE_CUTS), "phases": phases,
            "rollout_probs_diff_max": max(diff) if diff else None}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sft-from", required=True, metavar="RUN_DIR",
                    help="a finished tiny run (e.g. runs/tiny-search-grpo-s0, the main job's) whose SFT model both "
                    "engines start from")
    ap.add_argument("--seeds", type=_seeds, default=[0, 1, 2], help="RL seeds, comma-separated (default 0,1,2)")
    ap.add_argument("--engines", type=_engines, default=list(ENGINES), help="reference,verl (default both)")
    ap.add_argument("--steps", type=int, default=None, help="RL steps (default: the source run's rl_steps)")
    ap.add_argument("--eval-every", type=int, default=None,
                    help="RL steps between held-out evaluations (default: the source run's rl_eval_every)")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads in this process")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="an RL field of SpeedrunConfig for every run, e.g. --set filter_groups=false (repeatable)")
    ap.add_argument("--out", default=str(ROOT / "runs" / "bench-engines"), help="where the run folders go")
    ap.add_argument("--overheads", action="store_true",
                    help="instead of the curves: verl's step before and after chapter 15's cuts (no reference model "
                    "when the KL coefficient is 0; the rollout's log-probs as the old ones), --steps steps each "
                    "(default 3), side by side")
    ap.add_argument("--export", default=None, metavar="JSON", help="also write the figures to this file "
                    "(docs/verl_cpu/engines.json is what chapter 15 plots)")
    args = ap.parse_args(argv)
    for name in ("steps", "eval_every", "threads"):
        v = getattr(args, name)
        if v is not None and v < 1:
            ap.error(f"--{name.replace('_', '-')} must be a positive integer, got {v}")
    src, out = Path(args.sft_from), Path(args.out)
    base = source_config(src, args)
    from agent_r1_tutorial.speedrun import build_suite

    if "verl" in args.engines:
        import importlib.util

        if importlib.util.find_spec("verl") is None:
            raise SystemExit("error: verl is not installed here (bash scripts/setup.sh dev, or pip install -e '.[verl]')")
    suite = build_suite(base)  # the worlds and their index: the same for every RL seed
    if args.overheads:
        try:
            res = overheads(args, src, base, suite, out)
        except (ValueError, FileNotFoundError, RuntimeError) as e:
            raise SystemExit(f"error: {e}")
        b, a = res["phases"]["before"], res["phases"]["after"]
        from agent_r1_tutorial.verl_cpu import STEP_PHASES

        lines = [f"# verl's step before and after the cuts ({res['steps']} steps each, from {src.name})", "",
                 "| phase | before (s) | after (s) |", "|---|---|---|"]
        lines += [f"| {STEP_PHASES.get(k, k)} | {b.get(k, 0.0):.2f} | {a.get(k, 0.0):.2f} |"
                  for k in dict.fromkeys([*b, *a]) if k != "step"]
        lines += [f"| **step** | **{b['step']:.2f}** | **{a['step']:.2f}** |", "",
                  f"A step after the cuts takes {a['step'] / b['step']:.2f} of the time it took before. Before them, the "
                  f"rollout's token probabilities and the actor's differed by at most {res['rollout_probs_diff_max']:.1e} (verl's "
                  "training/rollout_probs_diff_max): the rollout's are exact enough to be the old ones."]
        out.mkdir(parents=True, exist_ok=True)
        (out / "overheads.json").write_text(json.dumps(res, indent=1))
        if args.export:
            Path(args.export).write_text(json.dumps(res, indent=1) + "\n")
        print("\n".join(lines))
        return 0
    runs = []
    for seed in args.seeds:
        # the source's own seed needs no rl_seed: such a run is the one `bash speedrun.sh` makes with that seed
        cfg = dataclasses.replace(base, rl_seed=None if seed == base.seed else seed)
        for engine in args.engines:
            print(f"seed {seed}, {engine} trainer ...", flush=True)
            try:
                runs.append(run_one(cfg, src, out / f"{engine}-s{seed}", engine, suite))
            except (ValueError, FileNotFoundError, RuntimeError) as e:
                raise SystemExit(f"error: seed {seed}, {engine}: {e}")
            c = runs[-1]["curve"]
            print(f"  two-hop EM {c[0]['em/2-hop']:.3f} -> {c[-1]['em/2-hop']:.3f}, one-hop {c[-1]['em/1-hop']:.3f}, "
                  f"RL {runs[-1]['rl_seconds']:.0f} s", flush=True)
    evals = json.loads((src / "eval.json").read_text())
    result = {"source": src.name, "rl_steps": base.rl_steps, "eval_every": base.rl_eval_every,
              "episodes_per_step": base.prompts_per_step * base.group_size,
              "baselines": {k: {m: evals[k][m] for m in ("em/1-hop", "em/2-hop")} for k in ("no_tool", "sft")},
              "runs": runs}
    lines = [f"# Two trainers from one SFT model ({src.name})", "",
             f"GRPO, {base.rl_steps} steps of {base.prompts_per_step} questions x {base.group_size} episodes; held-out "
             f"EM (greedy) every {base.rl_eval_every} steps by the same code for both engines.", "",
             "| seed | engine | 2-hop SFT | 2-hop after RL | lift | 1-hop after RL | RL s | s per step |",
             "|---|---|---|---|---|---|---|---|"]
    for r in runs:
        c = r["curve"]
        lines.append(f"| {r['seed']} | {r['engine']} | {c[0]['em/2-hop']:.3f} | {c[-1]['em/2-hop']:.3f} | "
                     f"{c[-1]['em/2-hop'] - c[0]['em/2-hop']:+.3f} | {c[-1]['em/1-hop']:.3f} | {r['rl_seconds']:.0f} | "
                     f"{r['step_seconds'] if r['step_seconds'] is not None else ''} |")
    if {r["engine"] for r in runs} == set(ENGINES):  # where a step's time went, both trainers, the same steps
        mean = lambda e, k: statistics.mean(r["phases"].get(k, 0.0) for r in runs if r["engine"] == e)
        lines += ["", "Seconds per step, mean over the seeds (same batch: "
                  f"{base.prompts_per_step * base.group_size} episodes):", "",
                  "| trainer | step | rollout | update | the rest |", "|---|---|---|---|---|"]
        for e, roll, upd in (("reference", "rollout", "update"), ("verl", "timing_s/gen", "timing_s/update_actor")):
            st, ro, up = mean(e, "step"), mean(e, roll), mean(e, upd)
            lines.append(f"| {e} | {st:.2f} | {ro:.2f} | {up:.2f} | {st - ro - up:.2f} |")
    verl = [r for r in runs if r["engine"] == "verl"]
    if verl:
        lifts = [r["curve"][-1]["em/2-hop"] - r["curve"][0]["em/2-hop"] for r in verl]
        ok = all(x >= 0.30 for x in lifts) and verl[0]["curve"][0]["em/2-hop"] <= 0.50
        lines += ["", f"verl's two-hop lift per seed: {', '.join(f'{x:+.3f}' for x in lifts)} "
                  f"(target: SFT <= 0.50 and every seed >= +0.30: **{'met' if ok else 'not met'}**)."]
    out.mkdir(parents=True, exist_ok=True)
    (out / "engines.md").write_text("\n".join(lines) + "\n")
    (out / "engines.json").write_text(json.dumps(result, indent=1))
    if args.export:
        Path(args.export).parent.mkdir(parents=True, exist_ok=True)
        Path(args.export).write_text(json.dumps(result, indent=1) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
