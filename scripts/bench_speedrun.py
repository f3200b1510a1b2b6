#!/usr/bin/env python3
"""The tiny speedrun's targets, measured (chapter 11). Prints the figures and writes them to <out>/bench.md.

    python scripts/bench_speedrun.py headline --seeds 0,1,2   # the default run per seed: EM per hop, lift, wall time
    python scripts/bench_speedrun.py rl-matters --seeds 0,1,2 # SFT on one-hop only (see --set), then RL on the mix
    python scripts/bench_speedrun.py algorithms               # GRPO, PPO, REINFORCE++, RLOO, StepPO from one SFT start
                                                              # (--algorithms rloo,steppo: only those)
    python scripts/bench_speedrun.py rl-speed                 # RL episodes/s, rollout and update switches off and on, side by side
    python scripts/bench_speedrun.py sft-speed                # SFT and drill steps, logits everywhere or where the loss is
    python scripts/bench_speedrun.py arith --seeds 0,1,2      # the calculator task per seed, beside its no-calculator baseline
    python scripts/bench_speedrun.py all

Targets: headline, for every seed on its own: SFT alone answers <= 0.50 of the held-out two-hop questions, RL lifts that
to >= 0.90 with one-hop >= 0.95, all stages in <= 900 s on 2 CPU cores. rl-matters: RL lifts held-out two-hop EM by
>= 0.30 over its SFT start, beside the no-tool and SFT-only baselines. Any SpeedrunConfig field can be changed with --set KEY=VALUE;
for instance `rl-matters --set sft_hops=1,2 --set sft_two_hop_share=0.02` demonstrates a few two-hop episodes instead
of none, and `--set sft_hops=1,2 --set sft_two_hop_stop=0.7` demonstrates every two-hop question but has the expert
answer 70% of them after one search (chapter 11, section 10, where RL then matters). Runs resume: a killed benchmark
started again with the same --out continues where it stopped.
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _cfg(preset: str, sets: list[str], **kw):
    from agent_r1_tutorial.speedrun import SpeedrunConfig

    try:
        return SpeedrunConfig.from_sets(sets, preset, **kw)
    except (ValueError, TypeError) as e:
        raise SystemExit(f"error: {e}")


def _total(run_dir: Path) -> dict:
    return json.loads((run_dir / "stages.json").read_text())


def _fmt(x: float) -> str:
    return f"{x:.3f}"


def headline(args, lines: list[str]):
    "The default run from random initialisation, once per seed: each seed is held to the targets on its own."
    from agent_r1_tutorial.speedrun import run_speedrun

    rows = []
    for seed in args.seeds:
        cfg = _cfg(args.preset, args.set, seed=seed, threads=args.threads)
        d = Path(args.out) / f"headline-s{cfg.seed}"
        ev = run_speedrun(cfg, d, progress=not args.quiet)
        t = sum(_total(d).values())
        g = lambda k, m: ev[k].get(m, float("nan"))
        r = {"seed": seed, "no_tool": g("no_tool", "em/2-hop"), "sft1": g("sft", "em/1-hop"), "sft2": g("sft", "em/2-hop"),
             "rl1": g("final", "em/1-hop"), "rl2": g("final", "em/2-hop"), "two": g("final", "after_2_searches/2-hop"),
             "total": t}
        r["lift"] = r["rl2"] - r["sft2"]
        r["met"] = (r["sft2"] <= 0.50 and r["rl2"] >= 0.90 and r["rl1"] >= 0.95 and r["lift"] >= 0.30 and t <= 900)
        rows.append(r)
    lines += ["## Headline: random initialisation to held-out EM, one run per seed", "",
              "Targets for every seed: SFT alone two-hop <= 0.50; after RL two-hop >= 0.90 and one-hop >= 0.95 "
              "(a two-hop lift >= 0.30); all stages <= 900 s.", "",
              "| seed | no-tool 2-hop | SFT 1-hop | SFT 2-hop | RL 1-hop | RL 2-hop | lift | 2-hop answered after 2 "
              "searches | total s | targets |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['seed']} | {_fmt(r['no_tool'])} | {_fmt(r['sft1'])} | {_fmt(r['sft2'])} | {_fmt(r['rl1'])} "
                     f"| {_fmt(r['rl2'])} | {r['lift']:+.3f} | {_fmt(r['two'])} | {r['total']:.0f} "
                     f"| {'met' if r['met'] else 'not met'} |")
    lines += ["", f"Seeds meeting every target: **{sum(r['met'] for r in rows)} of {len(rows)}**.", ""]


def arith(args, lines: list[str]):
    "The arithmetic task from random initialisation, once per seed, beside the no-calculator baseline."
    from agent_r1_tutorial.core import read_jsonl
    from agent_r1_tutorial.speedrun import run_speedrun

    lines += ["## Arithmetic with a calculator: random initialisation to held-out EM, one run per seed", "",
              "Target for every seed: held-out EM >= 0.90 with the calculator, all stages <= 900 s.", "",
              "| seed | no-calculator | SFT | SFT + RL | copying after the drills | total s | target |",
              "|---|---|---|---|---|---|---|"]
    met = 0
    for seed in args.seeds:
        cfg = _cfg(args.preset, [*args.set, "task=arith"], seed=seed, threads=args.threads)
        d = Path(args.out) / f"arith-s{cfg.seed}"
        ev = run_speedrun(cfg, d, progress=not args.quiet)
        t = sum(_total(d).values())
        drill = read_jsonl(d / "drill.jsonl") if (d / "drill.jsonl").exists() else []
        copied = f"{drill[-1]['copy']:.2f}" if drill and "copy" in drill[-1] else ""
        ok = ev["final"]["em/arith"] >= 0.90 and t <= 900
        met += ok
        lines.append(f"| {seed} | {_fmt(ev['no_tool']['em/arith'])} | {_fmt(ev['sft']['em/arith'])} "
                     f"| {_fmt(ev['final']['em/arith'])} | {copied} | {t:.0f} | {'met' if ok else 'not met'} |")
    lines += ["", f"Seeds meeting the target: **{met} of {len(args.seeds)}**.", ""]


def _copy_sft(src: Path, dst: Path, cfg):
    "Start a run folder from the data and SFT stages of another (same SFT settings), to try other RL settings."
    from agent_r1_tutorial.speedrun import fork_after_sft

    try:
        fork_after_sft(src, dst, cfg)
    except (ValueError, FileExistsError) as e:
        raise SystemExit(f"error: {e}")


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


def rl_speed(args, lines: list[str]):
    "RL steps with the update's switches off and on, alternated from one SFT checkpoint: episodes per second."
    from transformers import AutoTokenizer
    import torch

    from agent_r1_tutorial.speedrun import _load_model, build_suite, rl_trainer_config, run_speedrun
    from agent_r1_tutorial.worlds import WorldSearchTool
    from agent_r1_tutorial.tools import BaseTool
    from agent_r1_tutorial.trainer import Trainer

    seed, steps = args.seeds[0], args.steps or 5
    cfg = _cfg(args.preset, args.set, seed=seed, threads=args.threads)
    suite = build_suite(cfg)
    base = Path(args.out) / f"rl-speed-s{seed}-sft"
    run_speedrun(cfg, base, progress=not args.quiet, stages=["data", "sft"], suite=suite)
    tok = AutoTokenizer.from_pretrained(base / "tokenizer")

    class ThreadedSearch(WorldSearchTool):
        aexecute = BaseTool.aexecute  # each search in a worker thread, its new query embedded alone (the old path)

    threaded = copy.copy(suite.train_env)
    threaded.tools = {}
    for wid in range(len(threaded.worlds)):
        t = suite.train_env.tool(wid)
        threaded.tools[wid] = ThreadedSearch(t.retriever, k=t.k, max_chars=t.max_chars)
    multinomial = lambda logp, gen: torch.multinomial(logp.exp(), 1, generator=gen).squeeze(1)
    old, new = (multinomial, threaded), (None, suite.train_env)  # (sampler, environments); None: `sample_tokens`
    variants = {"transformers' decoding, torch.multinomial, searches in threads, every row, old log-probs recomputed":
                    (dict(fast_decode=False, filter_groups=False, bypass_mode=False), old),
                "+ filter_groups, bypass_mode": (dict(fast_decode=False, filter_groups=True, bypass_mode=True), old),
                "+ fast_decode (growing KV cache, GQA kernel, one prefill per prompt)":
                    (dict(fast_decode=True, filter_groups=True, bypass_mode=True), old),
                "+ sample_tokens, searches batched on the event loop":
                    (dict(fast_decode=True, filter_groups=True, bypass_mode=True), new)}
    trainers = {}
    for name, (kw, (sampler, make_env)) in variants.items():
        tr = trainers[name] = Trainer(_load_model(base / "sft_model"), tok, make_env, suite.train_tasks,
                                      dataclasses.replace(rl_trainer_config(cfg, base), out_dir=None, save_every=0, **kw))
        tr.sampler = sampler
    logs = {name: [] for name in trainers}
    for _ in range(steps):  # alternate, so that both see the same machine load
        for name, tr in trainers.items():
            logs[name].append(tr.step())
    n_ep = cfg.prompts_per_step * cfg.group_size
    mean = lambda name, k, d=float("nan"): statistics.mean(m.get(k, d) for m in logs[name])
    lines += [f"## RL throughput: {steps} steps of {cfg.prompts_per_step} prompts × {cfg.group_size} episodes "
              "each, the settings alternated from the same SFT checkpoint", "",
              "| settings | episodes/s | step s | rollout s (prefill / decode / tools) | rows, scores, log-probs s "
              "| update s | rows updated | groups with signal |", "|---|---|---|---|---|---|---|---|"]
    eps = {}
    for name in trainers:
        eps[name] = n_ep * len(logs[name]) / sum(m["time/step_s"] for m in logs[name])
        split = " / ".join(f"{mean(name, f'time/rollout_{k}_s'):.2f}" for k in ("prefill", "decode", "env"))
        lines.append(f"| {name} | {eps[name]:.1f} | {mean(name, 'time/step_s'):.2f} | {mean(name, 'time/rollout_s'):.2f} "
                     f"({split}) "
                     f"| {mean(name, 'time/prepare_s'):.2f} | {mean(name, 'time/update_s'):.2f} "
                     f"| {mean(name, 'update/rows_kept', 1.0):.0%} | {mean(name, 'groups/with_variance'):.0%} |")
    a, *_, b = eps.values()
    lines += ["", f"Episodes per second: **{b / a:.2f}×** with every switch on.", ""]


def sft_speed(args, lines: list[str]):
    "SFT and drill steps with logits at every position, and at the loss's positions only, alternated: seconds a step."
    import itertools
    import random

    import torch

    from agent_r1_tutorial.masks import growing_layout
    from agent_r1_tutorial.speedrun import (build_suite, build_tokenizer, drill_batches, expert_trajectories, lm_loss,
                                            sft_batches, sft_loss)
    from agent_r1_tutorial.tinylm import tiny_qwen2

    cfg = _cfg(args.preset, args.set, seed=args.seeds[0], threads=args.threads)
    if cfg.task != "search":
        raise SystemExit("error: sft-speed measures the search task's batches (drop --set task=...)")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    n = args.steps or 50
    suite = build_suite(cfg)
    tok = build_tokenizer(suite, cfg.vocab_size, trailing_spaces=cfg.tokenizer_spaces == "trailing")
    rows = [growing_layout(t) for t in expert_trajectories(suite, tok, suite.sft_tasks[:20 * cfg.sft_batch])]
    batches = {"SFT": (list(itertools.islice(sft_batches(rows, tok.pad_token_id, cfg.sft_batch, random.Random(0)), n)),
                       "response_mask"),
               "drill": (list(itertools.islice(drill_batches(tok, suite.drill, cfg.drill_batch, random.Random(0)), n)),
                         "labels")}

    def every_position_sft(model, b):  # the definition: logits at every position, the mask applied in the mean
        R = b["responses"].shape[1]
        logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                       position_ids=b["position_ids"]).logits[:, -R - 1:-1].float()
        ce = torch.nn.functional.cross_entropy(logits.flatten(0, 1), b["responses"].flatten(), reduction="none")
        m = b["response_mask"].flatten().float()
        return (ce * m).sum() / m.sum()

    losses = {"SFT": (every_position_sft, sft_loss), "drill": (lambda m, b: m(**b).loss, lm_loss)}
    lines += [f"## SFT and drill steps: logits at every position or at the loss's positions only ({n} timed steps "
              "each after one untimed, alternated, the same batches and initialisation)", "",
              "| batches | tokens a batch (padded) | share of positions in the loss | every position, s a step "
              "| loss positions only, s a step | speed-up |", "|---|---|---|---|---|---|"]
    for name, (bs, key) in batches.items():
        models = [tiny_qwen2(tok, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers, seed=cfg.seed,
                             num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads) for _ in range(2)]
        opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in models]
        spent = [0.0, 0.0]

        def step(k, b):
            loss = losses[name][k](models[k], b)
            opts[k].zero_grad()
            loss.backward()
            opts[k].step()

        for k in (0, 1):  # one untimed step each: first-call costs (allocations, kernels chosen) are nobody's
            step(k, bs[0])
        for i, b in enumerate(bs):
            for k in ((0, 1) if i % 2 else (1, 0)):  # alternated, and each goes first every other batch
                t = time.perf_counter()
                step(k, b)
                spent[k] += time.perf_counter() - t
        tokens = sum(b["input_ids"].numel() for b in bs) / n
        share = sum(int((b[key][:, 1:] != -100).sum()) if key == "labels" else int(b[key].sum()) for b in bs) / n
        lines.append(f"| {name} | {tokens:.0f} | {share / tokens:.0%} | {spent[0] / n:.3f} | {spent[1] / n:.3f} "
                     f"| {spent[0] / spent[1]:.2f}× |")
    lines += ["", "The same loss either way (chapter 11's test under `sft_loss` checks the loss and its gradients); the "
              "second also runs its forward without the KV cache `model(...)` builds, which training never reads.", ""]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=["headline", "rl-matters", "algorithms", "rl-speed", "sft-speed", "arith", "all"])
    ap.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (headline and rl-matters use all; others "
                    "the first)")
    ap.add_argument("--preset", choices=["tiny", "ci"], default="tiny")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--out", default=str(ROOT / "runs" / "bench"))
    ap.add_argument("--quiet", action="store_true", help="no progress bars")
    ap.add_argument("--sft-from", default=None, metavar="DIR",
                    help="rl-matters: start from the SFT stage of DIR/rl-matters-s<seed> (a run of the same data and "
                    "SFT settings), to compare RL settings without repeating SFT")
    ap.add_argument("--steps", type=int, default=None,
                    help="rl-speed: RL steps per setting (default 5); sft-speed: steps per loss (default 50)")
    ap.add_argument("--algorithms", default=None, metavar="A,B",
                    help="algorithms: run only these (comma-separated; default all), e.g. to split the work")
    args = ap.parse_args(argv)
    try:
        args.seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        ap.error(f"--seeds must be comma-separated integers, got {args.seeds!r}")
    if args.steps is not None and args.steps < 1:
        ap.error(f"--steps must be >= 1, got {args.steps}")
    for s in args.set:
        if "=" not in s:
            ap.error(f"--set needs KEY=VALUE, got {s!r}")
    from transformers.utils import logging as hf_logging

    from agent_r1_tutorial.core import env_report, env_report_md

    hf_logging.disable_progress_bar()
    t0 = time.time()
    lines = [f"# Tiny speedrun benchmark ({args.what}, preset {args.preset})", ""]
    try:
        for name, fn in (("headline", headline), ("rl-matters", rl_matters), ("algorithms", algorithms),
                         ("rl-speed", rl_speed), ("sft-speed", sft_speed), ("arith", arith)):
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
