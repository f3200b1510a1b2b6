#!/usr/bin/env python3
"""The speedrun's command line: validate the request, pick the scale, run the stages that exist.

`bash speedrun.sh` calls this twice: first with the interpreter it will build the environment from, to reject bad
input before any set-up (this part uses the standard library only), then inside the environment to run.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# the first pass runs before the environment exists (standard library only), so it cannot import the library's
# names; tests/test_cli.py checks that these equal trainer.ALGORITHMS and verl_launch.ALGORITHMS
ALGORITHMS = ("grpo", "ppo", "reinforce_pp", "rloo", "steppo")
SCALES = ("auto", "tiny", "full")
TASKS = ("search", "arith", "textworld", "alfworld", "gsm8k")
TINY_TASKS, FULL_TASKS = ("search", "arith", "textworld"), ("search", "alfworld", "gsm8k")
RETRIEVERS = ("dense", "bm25")
PRESETS = ("tiny", "ci")
ENGINES = ("reference", "verl")

# The pipeline, stage by stage, with the chapter that builds each. `None` means not built yet.
STAGES = {
    "tiny": [
        ("data", "the generated worlds (train and held-out), their search index, the tokenizer", "11 · The tiny speedrun"),
        ("sft", "SFT warm start on scripted expert trajectories, loss masked to the agent's tokens", "11 · The tiny speedrun"),
        ("rl", "RL with the reference trainer (the chosen algorithm)", "11 · The tiny speedrun"),
        ("eval", "evaluation on held-out worlds, baselines beside it", "11 · The tiny speedrun"),
    ],
    "textworld": [  # the tiny scale's stages for --task textworld
        ("data", "TextWorld coin-collector games (cached), the dawdling teacher's episodes, the tokenizer, the "
         "scripted baselines", "11a · The text-game speedrun"),
        ("sft", "SFT of a fresh tiny model on the teacher's episodes", "11a · The text-game speedrun"),
        ("rl", "RL on the win alone with the reference trainer (the chosen algorithm)", "11a · The text-game speedrun"),
        ("eval", "greedy episodes on held-out games, the baselines beside them", "11a · The text-game speedrun"),
    ],
    "full": [
        ("preflight", "GPU count and memory, CUDA driver, disk, Python", "14 · verl launch and dry run"),
        ("env", "the pinned GPU stack (verl 0.9.1, vLLM, faiss-gpu)", "14 · verl launch and dry run"),
        ("data", "the task's data as verl parquet rows (HotpotQA, or ALFWorld's games)", "13 · verl data and index"),
        ("index", "bge-large-en-v1.5 embeddings and a FAISS index of the corpus (HotpotQA only)",
         "13 · verl data and index"),
        ("train", "verl training with this package's agent loop, estimators and losses", "14 · verl launch and dry run"),
        ("eval", "verl's last validation: EM on HotpotQA's dev sample, or ALFWorld's success rate on valid_seen",
         "14 · verl launch and dry run"),
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
                    "machine has NVIDIA GPUs or with --dry-run, tiny otherwise")
    ap.add_argument("--dry-run", action="store_true",
                    help="do everything that needs no GPU and print what would run")
    ap.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    ap.add_argument("--out", default=str(ROOT / "runs"), help="where run folders go (default runs/)")
    ap.add_argument("--print-scale", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--print-needs-verl", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--print-needs-games", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--preflight-only", action="store_true", help=argparse.SUPPRESS)
    tiny = ap.add_argument_group("tiny scale (the CPU speedrun); defaults as in agent_r1_tutorial.speedrun")
    ap.add_argument("--task", choices=TASKS, default="search",
                    help="search (default): questions about generated worlds on a CPU, HotpotQA on a GPU box; arith: "
                    "word problems with a calculator (CPU); textworld: TextWorld's coin-collector games (CPU); "
                    "alfworld: ALFWorld's household games (GPU box); gsm8k: GSM8K with the calculator (GPU box)")
    tiny.add_argument("--retriever", choices=RETRIEVERS, default="dense",
                      help="dense: FAISS over all-MiniLM-L6-v2 embeddings (default); bm25")
    tiny.add_argument("--preset", choices=PRESETS, default="tiny",
                      help="tiny: the full CPU run (default); ci: a seconds-long smoke run")
    tiny.add_argument("--engine", choices=ENGINES, default="reference",
                      help="the RL stage's trainer: reference (this package's, chapter 10; default) or verl (verl "
                      "0.9.1's own trainer, Ray and FSDP, with the GPU run's configuration, on this CPU; chapter 15)")
    ap.add_argument("--agent", default=None, metavar="AGENT",
                    help="train an agent you wrote: a function (base_url, task) -> final answer that calls an OpenAI "
                    "endpoint, named 'module:function' or 'path/to/file.py:function' ('openai' and 'httpx' are "
                    "chapter 16a's); verl plays every episode with it through a gateway in front of its rollout "
                    "servers. On a CPU it needs --engine verl")
    tiny.add_argument("--sft-from", default=None, metavar="RUN_DIR",
                      help="take the data and SFT stages from this finished run (same data and SFT settings) and run "
                      "only RL and the evaluation; by default a finished run in --out with the same settings is used "
                      "when there is one (e.g. the main job's, for --engine verl or another algorithm)")
    tiny.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    tiny.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="tiny_set",
                      help="any SpeedrunConfig field, e.g. --set rl_steps=50 --set sft_hops=1 (repeatable)")
    full = ap.add_argument_group("full scale (verl on NVIDIA GPUs); defaults as in agent_r1_tutorial.verl_launch")
    full.add_argument("--gpus", type=int, default=None, help="GPUs per node (default 4)")
    full.add_argument("--nnodes", type=int, default=None, help="nodes (default 1); more than one needs --head, except "
                      "with --engine verl, which starts that many Ray nodes on this machine (chapter 15)")
    full.add_argument("--head", default=None, metavar="ADDRESS", help="the Ray head node's IP address (multi-node)")
    full.add_argument("--model", default=None, help="Hugging Face model id or local folder "
                      "(default Qwen/Qwen2.5-1.5B-Instruct)")
    full.add_argument("--batch-size", type=int, default=None, help="prompts per training step (default 128)")
    full.add_argument("--mini-batch-size", type=int, default=None, help="prompts per optimizer step (default 64)")
    full.add_argument("--micro-batch-size", type=int, default=None, help="sequences per GPU per pass (default 2)")
    full.add_argument("--n-train", type=int, default=None, help="HotpotQA training questions (default 25600)")
    full.add_argument("--n-val", type=int, default=None, help="HotpotQA validation questions (default 128)")
    full.add_argument("--data-dir", default=str(ROOT / "data"),
                      help="downloads, prepared data and the index, shared by runs (default data/)")
    full.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                      help="any verl Hydra override, applied last (repeatable)")
    full.add_argument("--smoke", action="store_true",
                      help="what to run first on a new GPU box: one GPU, Qwen2.5-0.5B-Instruct, 64 questions, "
                      f"{SMOKE_STEPS} steps, an index over the sample's own passages (no corpus build); ends with PASS "
                      "or FAIL, the step time and the GPU memory (an estimated ten minutes)")
    return ap


SMOKE_STEPS = 3
# --smoke's sizes, where the command line does not set them: small enough for one GPU and minutes, big enough to run
# every part of the real pipeline (vLLM rollouts with searches, FSDP updates, a validation, a checkpoint)
SMOKE = {"gpus": 1, "model": "Qwen/Qwen2.5-0.5B-Instruct", "n_train": 64, "n_val": 16, "batch_size": 8,
         "mini_batch_size": 8, "micro_batch_size": 4}


def apply_smoke(args):
    "Fill in --smoke's sizes for what the command line left unset."
    for k, v in SMOKE.items():
        if getattr(args, k) is None:
            setattr(args, k, v)


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
    for opt in ("gpus", "nnodes", "batch_size", "mini_batch_size", "micro_batch_size", "n_train", "n_val"):
        v = getattr(args, opt)
        if v is not None and v < 1:
            ap.error(f"--{opt.replace('_', '-')} must be a positive integer, got {v}")
    if (args.nnodes or 1) > 1 and not args.head and not args.dry_run and args.engine != "verl":
        ap.error("--nnodes above 1 needs --head ADDRESS (the Ray head node's IP address); on a CPU, --engine verl "
                 "--nnodes N starts N Ray nodes on this machine")
    if args.engine == "verl" and args.head:
        ap.error("--head joins the GPU run's cluster; --engine verl --nnodes N starts its N Ray nodes on this machine")
    for o in args.override:
        if "=" not in o:
            ap.error(f"--override needs KEY=VALUE, got {o!r}")
    for o in args.tiny_set:
        if "=" not in o or not o.split("=", 1)[0]:
            ap.error(f"--set needs KEY=VALUE, got {o!r}")
    if args.threads is not None and args.threads < 1:
        ap.error(f"--threads must be a positive integer, got {args.threads}")
    if args.engine == "verl" and args.dry_run:
        ap.error("--dry-run checks the GPU pipeline without a GPU; --engine verl runs verl's trainer on this CPU for real "
                 "(drop one of them)")
    if args.agent is not None and args.task != "search":
        ap.error(f"--agent plays the search task (its rows carry the question and the search service); got --task "
                 f"{args.task}")
    if args.engine == "verl" and args.task != "search":
        ap.error(f"--engine verl runs the search task (its worlds become verl's data rows); got --task {args.task}")
    gpus = nvidia_gpus()
    # auto: the full pipeline where there are GPUs, and its dry run anywhere (the dry run exists for machines without)
    scale = args.scale if args.scale != "auto" else ("full" if (gpus or args.dry_run) and args.engine != "verl" else "tiny")
    if scale == "full" and args.task not in FULL_TASKS:
        ap.error(f"--task {args.task} is a CPU task; at full scale the tasks are {', '.join(FULL_TASKS)}")
    if scale == "tiny" and args.task not in TINY_TASKS:
        ap.error(f"--task {args.task} runs at full scale (verl on a GPU box; add --dry-run to check it without one); "
                 f"on a CPU the tasks are {', '.join(TINY_TASKS)}")
    if scale == "full" and args.engine == "verl":
        ap.error("--engine verl is the tiny scale's option (verl on this CPU); the full scale always runs verl")
    if args.agent is not None and scale == "tiny" and args.engine != "verl":
        ap.error("--agent trains through verl: add --engine verl on a CPU (the reference trainer trains an agent "
                 "through the gateway with `python scripts/train_agent.py --agent ...`)")
    if args.smoke:
        if scale != "full":
            ap.error("--smoke checks a GPU box (the full scale); add --dry-run to check it without GPUs")
        if args.task != "search" or (args.nnodes or 1) > 1:
            ap.error("--smoke runs the search task on one node")
        apply_smoke(args)
    if scale == "full" and not gpus and not args.dry_run:
        ap.error("--scale full needs NVIDIA GPUs and nvidia-smi found none; use --dry-run to check the full "
                 "pipeline without GPUs, or --scale tiny for the CPU speedrun")
    return scale


def _task_tag(args) -> str:
    "The full run folder's task part: none for HotpotQA (the folders it always had), 'alfworld-' for ALFWorld."
    return "" if args.task == "search" else f"{args.task}-"


def _smoke_tag(args) -> str:
    return "-smoke" if getattr(args, "smoke", False) else ""


def run(args, scale: str) -> int:
    "Run the built stages in order and write the run folder; say plainly what is not built yet."
    from agent_r1_tutorial.core import env_report, env_report_md, seed_everything

    seed_everything(args.seed)
    if args.agent is not None:  # a wrong name stops here, before any stage runs
        from agent_r1_tutorial.blackbox import load_agent

        try:
            load_agent(args.agent, caller_dir())
        except (ValueError, ImportError, FileNotFoundError) as e:
            raise SystemExit(f"error: --agent {args.agent}: {e}")
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    if scale == "tiny":
        cfg = tiny_config(args)  # a bad --set stops here, before any folder is made
        run_dir = tiny_run_dir(args)
        src = sft_source(args, cfg, run_dir)
        if src is not None:
            from agent_r1_tutorial.speedrun import fork_after_sft

            try:
                fork_after_sft(src, run_dir, cfg)
            except (ValueError, FileExistsError) as e:
                raise SystemExit(f"error: --sft-from: {e}")
            print(f"data and SFT stages from {src} (the same data and SFT settings): only RL and the evaluation run")
        run_dir.mkdir(parents=True, exist_ok=True)
    elif args.dry_run:  # a dry run keeps every attempt
        run_dir = Path(args.out) / f"{stamp}-{scale}-{_task_tag(args)}{args.algorithm}-s{args.seed}{_smoke_tag(args)}-dry"
        run_dir.mkdir(parents=True, exist_ok=False)
    else:  # one folder per algorithm and seed: started again, verl resumes from its last checkpoint there
        run_dir = Path(args.out) / f"{scale}-{_task_tag(args)}{args.algorithm}-s{args.seed}{_smoke_tag(args)}"
        if (run_dir / "checkpoints" / "latest_checkpointed_iteration.txt").exists():
            print(f"resuming the run in {run_dir} from its last checkpoint")
        run_dir.mkdir(parents=True, exist_ok=True)
    report = env_report()
    (run_dir / "env.json").write_text(json.dumps(report, indent=1))
    print(f"speedrun: scale={scale} task={args.task} algorithm={args.algorithm} seed={args.seed}"
          f"{' (dry run)' if args.dry_run else ''}\nrun folder: {run_dir}")
    rows, missing = [], []
    for name, what, chapter in STAGES["textworld" if scale == "tiny" and args.task == "textworld" else scale]:
        if scale == "tiny" and name == "rl" and args.engine == "verl":
            what, chapter = "RL with verl's own trainer (Ray, FSDP, our agent loop) on this CPU", "15 · verl on a CPU"
            if args.agent is not None:
                what, chapter = (f"RL with verl's own trainer on this CPU, every episode played by the agent {args.agent} "
                                 "through the gateway loop", "16a · Training an agent you did not write")
        if scale == "full" and name == "train" and args.agent is not None:
            what = f"verl training, every episode played by the agent {args.agent} through the gateway loop"
        fn = BUILT.get(f"{scale}/{name}")
        if fn is None:
            status = "NOT BUILT YET"
            missing.append(name)
        else:
            print(f"  -- {name}", flush=True)  # the stage's own lines (and progress bars) follow, then its status line
            t0 = time.time()
            status = fn(run_dir, args) or "done"  # a stage may say more than "done" (the full scale's dry run does)
            if status == "NOT BUILT YET":
                missing.append(name)
            elif scale == "full":
                status = f"{status} ({time.time() - t0:.1f} s)"
        rows.append((name, what, chapter, status))
        print(f"  {name:<10} {status:<14} {what}  [{chapter}]")
    lines = [f"# Speedrun report: {scale}, {args.algorithm}, seed {args.seed}", "",
             f"Run folder `{run_dir.name}`, started {stamp}.", "", "## Stages", "",
             "| stage | status | what | chapter |", "|---|---|---|---|"]
    lines += [f"| {n} | {s} | {w} | {c} |" for n, w, c, s in rows]
    if missing:
        lines += ["", f"**Not built yet: {', '.join(missing)}.** No model was trained and no metric was measured "
                  "by this run; the stages above land with the chapters named beside them."]
    if scale == "full" and args.dry_run:
        lines += ["", "**Dry run.** Nothing was trained. The stages ran as far as a machine without GPUs allows; "
                  "`verl_config.yaml` and `launch.sh` in this folder are what a GPU run would use."]
        if (run_dir / "agent_loop.json").exists():  # the train stage's agent-loop episodes on the tiny model
            lines += ["", "## Agent loop (dry run)", "", "| policy | layout | outputs | turns | tool calls | "
                      "response tokens | ended | reward score | ids and masks |", "|---|---|---|---|---|---|---|---|---|"]
            for who, r in json.loads((run_dir / "agent_loop.json").read_text()).items():
                lines.append(f"| {who} | {r['layout']} | {r['outputs']} | {r['turns']} | {r['tool_calls']} | "
                             f"{r['response_tokens']} | {r['end_reason']} | {r['reward_score']} | "
                             f"{'ok' if r['ids_and_masks_ok'] else 'WRONG'} |")
    lines += ["", "## Machine and versions", "", env_report_md(report), ""]
    if scale == "tiny" and not missing and (run_dir / "report.md").exists():
        pass  # the library wrote the report card (agent_r1_tutorial.speedrun.write_report)
    else:
        (run_dir / "report.md").write_text("\n".join(lines))
    print(f"report card: {run_dir / 'report.md'}")
    if missing:
        print(f"not built yet: {', '.join(missing)}. Nothing was trained; the stages above are listed with the "
              "chapters that build them.")
    return 0


# ---------------------------------------------------------------- the tiny scale (chapter 11 · the tiny speedrun)


def tiny_run_dir(args) -> Path:
    "runs/tiny-<task>-<algo>-s<seed>[-<preset>]: an unfinished run there is resumed, a finished one kept (-2, -3, ...)."
    rl_seed = tiny_config(args).rl_seed if args.task != "textworld" else None
    base = Path(args.out) / (f"tiny-{args.task}-{args.algorithm}-s{args.seed}"
                             + ("" if args.preset == "tiny" else f"-{args.preset}")
                             + ("" if args.engine == "reference" else f"-{args.engine}")
                             + ("" if args.engine != "verl" or (getattr(args, "nnodes", None) or 1) == 1
                                else f"-{args.nnodes}nodes")
                             + ("" if rl_seed is None else f"-rl{rl_seed}")
                             + _agent_tag(args))
    d, n = base, 1
    while (d / ".eval.done").exists():
        n += 1
        d = base.with_name(f"{base.name}-{n}")
    return d


def caller_dir() -> str:
    "The folder speedrun.sh was started from (it runs this script from the checkout): --agent's names start there."
    return os.environ.get("AR1_CALLER_DIR") or os.getcwd()


def _agent_tag(args) -> str:
    "The run folder's part for --agent: '-agent-<function>' (a run of our own loop has none)."
    agent = getattr(args, "agent", None)
    return "" if agent is None else "-agent-" + re.sub(r"[^A-Za-z0-9_]+", "_", agent.rsplit(":", 1)[-1])


def sft_source(args, cfg, run_dir: Path) -> Path | None:
    """The finished run whose data and SFT stages a new tiny run starts from: --sft-from, else one in --out with the same
    data and SFT settings (a different algorithm, engine, RL seed or other RL field), else None (the run trains its
    own). A run folder that exists already is resumed as it is."""
    if args.task == "textworld" or run_dir.exists():
        if args.sft_from and not (run_dir / ".sft.done").exists():
            raise SystemExit(f"error: --sft-from: {run_dir} exists already; resume it without --sft-from, or use "
                             "another --out")
        return None
    if args.sft_from:
        return Path(args.sft_from)
    from agent_r1_tutorial.speedrun import sft_differs

    preset = "" if args.preset == "tiny" else f"-{args.preset}"
    # this algorithm's reference run first (the main job's for grpo), then any other with the same settings
    for d in sorted(Path(args.out).glob(f"tiny-{args.task}-*-s{args.seed}{preset}*"),
                    key=lambda d: (d.name != f"tiny-{args.task}-{args.algorithm}-s{args.seed}{preset}", d.name)):
        if (d / ".sft.done").exists() and (d / "config.json").exists() and not sft_differs(d, cfg):
            return d
    return None


def tiny_config(args):
    "The tiny run's configuration: the preset, this command line's options, then every --set."
    from agent_r1_tutorial.speedrun import SpeedrunConfig

    try:
        if args.task == "textworld":
            from agent_r1_tutorial.gamerun import GameRunConfig

            return GameRunConfig.from_sets(args.tiny_set, args.preset, algorithm=args.algorithm, seed=args.seed,
                                           threads=args.threads)
        return SpeedrunConfig.from_sets(args.tiny_set, args.preset, task=args.task, algorithm=args.algorithm,
                                        seed=args.seed, retriever=args.retriever, threads=args.threads)
    except (ValueError, TypeError) as e:
        raise SystemExit(f"error: {e}")


_SUITES: dict = {}  # the worlds, environments and embeddings, built once for all four stages


def tiny_stage(name: str):
    def stage(run_dir, args) -> str:
        from transformers.utils import logging as hf_logging

        from agent_r1_tutorial.speedrun import build_suite, run_speedrun

        hf_logging.disable_progress_bar()  # the stages draw their own bars; no "Writing model shards" ones
        cfg = tiny_config(args)
        if args.task == "textworld":
            return game_stage(name, cfg, Path(run_dir))
        key = json.dumps(cfg.__dict__, sort_keys=True, default=list)
        if key not in _SUITES:
            _SUITES[key] = build_suite(cfg)
        if name == "data" and (Path(run_dir) / "config.json").exists():
            print(f"  resuming the unfinished run in {run_dir}")
        if name == "rl" and args.engine == "verl":
            return verl_rl(cfg, Path(run_dir), _SUITES[key], args.nnodes or 1, args.agent)
        try:
            evals = run_speedrun(cfg, run_dir, stages=[name], suite=_SUITES[key])
        except ValueError as e:
            raise SystemExit(f"error: {e}")
        if name == "eval" and args.engine == "verl":
            from agent_r1_tutorial.verl_cpu import verl_report

            report = Path(run_dir) / "report.md"  # the speedrun's report card, and what verl's run logged
            report.write_text(report.read_text() + "\n" + verl_report(Path(run_dir) / "verl"))
        times = json.loads((Path(run_dir) / "stages.json").read_text())
        took = f"({times.get(name, 0):.0f} s)"
        key = {"sft": "sft", "eval": "final"}.get(name)
        if key and key in evals:
            e = evals[key]
            ems = ", ".join(f"{k[3:]} {v:.2f}" for k, v in e.items() if k.startswith("em/") and k != "em/all")
            return f"done {took}: held-out EM {ems}"
        return f"done {took}"
    return stage


def game_stage(name: str, cfg, run_dir: Path) -> str:
    "One stage of the text-game speedrun (chapter 11a), with its time and, after SFT and eval, the held-out win."
    from agent_r1_tutorial.gamerun import run_gamerun

    if name == "data" and (run_dir / "config.json").exists():
        print(f"  resuming the unfinished run in {run_dir}")
    try:
        evals = run_gamerun(cfg, run_dir, stages=[name])
    except ValueError as e:
        raise SystemExit(f"error: {e}")
    took = f"({json.loads((run_dir / 'stages.json').read_text()).get(name, 0):.0f} s)"
    key = {"sft": "sft", "eval": "final"}.get(name)
    if key and key in evals:
        return f"done {took}: held-out win {evals[key]['win']:.2f}"
    return f"done {took}"


def verl_rl(cfg, run_dir: Path, suite, nnodes: int = 1, agent: str | None = None) -> str:
    """The RL stage on verl's own trainer (chapter 15), resumed from its last checkpoint when started again; with
    --agent, every episode is the user's agent's, through the gateway loop (chapter 16a)."""
    from agent_r1_tutorial.speedrun import _done
    from agent_r1_tutorial.verl_cpu import verl_rl_stage

    if _done(run_dir, "rl"):
        return "done before"
    t0 = time.time()
    try:
        if agent is None:
            res = verl_rl_stage(cfg, run_dir, suite, nnodes=nnodes)  # marks the stage done
        else:
            from agent_r1_tutorial.blackbox import verl_agent_stage

            res = verl_agent_stage(cfg, run_dir, suite, agent, search_dir=caller_dir(), nnodes=nnodes)
    except (ValueError, FileNotFoundError, RuntimeError, ImportError) as e:
        raise SystemExit(f"error: {e}")
    steps = [m for m in res["metrics"] if m["step"] >= 1]
    per_step = sum(m.get("timing_s/step", 0.0) for m in steps) / max(1, len(steps))
    return f"done ({time.time() - t0:.0f} s): {len(steps)} verl steps, {per_step:.1f} s per step"


BUILT.update({f"tiny/{n}": tiny_stage(n) for n in ("data", "sft", "rl", "eval")})


# ---------------------------------------------------------------- the full scale (chapters 12 to 14 · verl at scale)
# Each stage takes (run_dir, args) and returns its status. The library is imported inside the stages: the first call
# of this script (speedrun.sh's input check) runs before any environment exists, with the standard library only.


def _say(msg: str):
    for line in str(msg).splitlines():
        print(f"             {line}")


def gpu_venv() -> str:
    "The GPU environment, as speedrun.sh and setup_gpu.sh find it: $AR1_GPU_VENV, else .venv-gpu in the checkout."
    return os.environ.get("AR1_GPU_VENV") or ".venv-gpu"  # relative: launch.sh starts with cd into the checkout


def full_preflight(run_dir, args, gate: bool = False) -> str:
    "GPUs, driver, disk and Python; on a GPU run a failure stops everything, in the dry run it is reported."
    import preflight

    # the gate runs before speedrun.sh enters the GPU environment: check the one that exists (a resumed run), else the
    # interpreter it will be built from
    existing = ROOT / gpu_venv() / "bin" / "python"  # an absolute AR1_GPU_VENV replaces ROOT
    python_exe = (str(existing) if existing.exists() else os.environ.get("PYTHON") or "python3") if gate \
        else sys.executable
    # sized for the task and algorithm: the model's size and whether a critic is checkpointed too
    big = args.task == "alfworld" or "4B" in (getattr(args, "model", None) or "")
    smoke = getattr(args, "smoke", False)
    host = {"task": args.task, "critic": args.algorithm in ("ppo", "steppo"), "out_path": args.out,
            "params_b": 0.5 if smoke else 4.0 if big else 1.5, "ram_need_gib": 16 if smoke else None}
    report = preflight.run_checks(n_gpus=args.gpus or 4, disk_path=args.data_dir, allow_no_gpu=args.dry_run,
                                  min_disk_gib=10 if smoke else preflight.DEFAULT_MIN_DISK_GIB,
                                  python_exe=python_exe, host=host)
    _say(preflight.format_report(report))
    if run_dir is not None:
        from dataclasses import asdict

        (Path(run_dir) / "preflight.json").write_text(json.dumps(asdict(report), indent=1))
    if not report.ok:
        if args.dry_run:
            return f"{len(report.errors)} problem(s)"
        if gate:
            print("error: preflight checks failed (above); nothing was set up", file=sys.stderr)
            return "FAILED"
        raise SystemExit("error: preflight checks failed (above)")
    return "ok" if "gpus" in report.info else "no GPU (dry run)"


def full_env(run_dir, args) -> str:
    "The pinned GPU stack: speedrun.sh builds .venv-gpu before this script runs there; the dry run says what it would do."
    from importlib import metadata

    if args.dry_run:
        _say("would run: bash scripts/setup_gpu.sh  (pins: scripts/gpu/requirements-cu12.txt, or -cu13 for a "
             "driver >= 580; resolved set: scripts/gpu/constraints-*.txt)")
        return "not built (dry run)"
    versions = {}
    for pkg in ("verl", "vllm", "torch", "transformers", "faiss-gpu", "ray"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    _say(", ".join(f"{k} {v}" for k, v in versions.items()))
    if versions["verl"] is None or versions["vllm"] is None:
        raise SystemExit("error: verl and vLLM are not installed here: run through `bash speedrun.sh`, which builds "
                         ".venv-gpu with scripts/setup_gpu.sh")
    return "ok"


def _index_dir(run_dir, args) -> Path:
    small = args.dry_run or getattr(args, "smoke", False)  # an index of the sample's own passages, in the run folder
    return Path(run_dir) / "index" if small else Path(args.data_dir) / "index-bge-large-en-v1.5"


RETRIEVAL_PORT = 8765  # every node's retrieval service listens here, on 127.0.0.1 (chapter 04a)


def full_data(run_dir, args) -> str:
    "HotpotQA, downloaded once and sampled with the seed into verl parquet rows (a local sample in the dry run)."
    from agent_r1_tutorial import verl_data as vd

    out = Path(run_dir) / "data"
    if args.task == "alfworld":
        return alfworld_data(run_dir, args, out)
    if args.task == "gsm8k":
        return gsm8k_data(run_dir, args, out)
    if args.dry_run:
        train, dev = vd.hotpotqa_toy_sample(64, seed=0), vd.hotpotqa_toy_sample(16, seed=1)
        source = "local sample in HotpotQA's format (no download in a dry run)"
        n_train, n_val = args.n_train or 32, args.n_val or 8
    else:
        raw = vd.download_hotpotqa(Path(args.data_dir) / "raw")
        train, dev = vd.load_hotpotqa(raw["train"]), vd.load_hotpotqa(raw["dev"])
        source = "HotpotQA v1.1 (train, dev distractor)"
        n_train, n_val = args.n_train or 25_600, args.n_val or 128
    paths = vd.prepare_hotpotqa(out, train, dev, n_train=n_train, n_val=n_val, seed=args.seed, source=source,
                                search_url=f"http://127.0.0.1:{RETRIEVAL_PORT}")  # the node's retrieval service
    _say(f"{n_train} training and {n_val} validation rows from {source}: {paths['train'].parent}")
    if args.agent is not None:  # every row played by the user's agent, through the gateway loop (chapter 16a)
        from agent_r1_tutorial.blackbox import agent_rows

        for p in paths.values():
            vd.write_rows(agent_rows(vd.read_rows(p), args.agent, caller_dir()), p)
        _say(f"the rows are played by the agent {args.agent} through the gateway loop")
    if args.smoke and not args.dry_run:  # the smoke index's corpus: the sampled questions' own paragraphs, kept now
        ids = {r["extra_info"]["source_id"] for p in paths.values() for r in vd.read_rows(p)}
        passages = vd.hotpotqa_passages([r for r in (*train, *dev) if str(r.get("_id")) in ids])
        (Path(run_dir) / "smoke_passages.jsonl").write_text("".join(json.dumps(d) + "\n" for d in passages))
    return "done (sample)" if args.dry_run else "done"


def gsm8k_data(run_dir, args, out: Path) -> str:
    "GSM8K, downloaded once (two parquet files), as verl rows with the calculator (a local sample in the dry run)."
    import pandas as pd

    from agent_r1_tutorial import verl_data as vd

    if args.dry_run:
        train, test = vd.gsm8k_toy_sample(64, seed=0), vd.gsm8k_toy_sample(16, seed=1)
        source = "local sample in GSM8K's format (no download in a dry run)"
        n_train, n_val = args.n_train or 32, args.n_val or 8
    else:
        raw = vd.download_gsm8k(Path(args.data_dir) / "raw")
        train, test = (pd.read_parquet(raw[k]).to_dict("records") for k in ("train", "test"))
        source, n_train, n_val = "openai/gsm8k (train, test)", args.n_train, args.n_val or 256
    paths = vd.prepare_gsm8k(out, train, test, n_train=n_train, n_val=n_val, seed=args.seed, source=source)
    n = json.loads((paths["train"].parent / "manifest.json").read_text())
    _say(f"{n['n_train']} training and {n['n_validation']} validation problems from {source}: {paths['train'].parent}")
    return "done (sample)" if args.dry_run else "done"


def alfworld_data(run_dir, args, out: Path) -> str:
    "ALFWorld's game files, downloaded once, as verl rows (in the dry run: a game in their format, built locally)."
    from agent_r1_tutorial import verl_data as vd

    if args.dry_run:
        from agent_r1_tutorial.textgames import write_alfworld_fixture

        root = Path(run_dir) / "alfworld-sample" / "json_2.1.1"
        for split in ("train", "valid_seen"):
            write_alfworld_fixture(root / split)
        source = "one game in ALFWorld's format, built from its domain and grammar (no download in a dry run)"
    else:
        root = vd.download_alfworld(Path(args.data_dir) / "raw" / "alfworld")
        source = f"ALFWorld's game files ({root})"
    # unless given, every game of each split (None): valid_seen's 140 are the published table's validation set
    paths = vd.prepare_alfworld(out, root, n_train=args.n_train, n_val=args.n_val, seed=args.seed)
    n = json.loads((paths["train"].parent / "manifest.json").read_text())
    _say(f"{n['n_train']} training and {n['n_validation']} validation games from {source}: {paths['train'].parent}")
    return "done (sample)" if args.dry_run else "done"


def full_index(run_dir, args) -> str:
    "The retrieval index: BEIR's HotpotQA corpus with bge-large on the GPU (cached); MiniLM on a few passages when dry."
    from agent_r1_tutorial import verl_data as vd

    if args.task in ("alfworld", "gsm8k"):
        _say(f"{'ALFWorld' if args.task == 'alfworld' else 'GSM8K (the calculator)'} needs no retrieval index")
        return "not needed"

    out = _index_dir(run_dir, args)
    if args.smoke and not args.dry_run:  # the sample's own paragraphs (HotpotQA ships them; the data stage kept them)
        lines = (Path(run_dir) / "smoke_passages.jsonl").read_text().splitlines()
        vd.build_corpus_index([json.loads(l) for l in lines], out, encoder="all-MiniLM-L6-v2", device="cuda",
                              progress=False)
        _say(f"{len(lines)} passages of the sampled questions, all-MiniLM-L6-v2: {out}")
        return "done (smoke)"
    if args.dry_run:
        passages = vd.hotpotqa_passages(vd.hotpotqa_toy_sample(64, seed=0) + vd.hotpotqa_toy_sample(16, seed=1))
        vd.build_corpus_index(passages, out, encoder="all-MiniLM-L6-v2", device="cpu", progress=False)
        _say(f"{len(passages)} passages with all-MiniLM-L6-v2 in a flat FAISS index: {out}\n"
             "(full scale: ~5.2M BEIR passages with BAAI/bge-large-en-v1.5 on the GPU)")
        return "done (small)"
    corpus = vd.download(vd.BEIR_HOTPOTQA_URL, Path(args.data_dir) / "raw" / "beir-hotpotqa.zip")
    vd.build_corpus_index(vd.beir_corpus(corpus), out, encoder="BAAI/bge-large-en-v1.5", device="cuda",
                          batch_size=256)
    _say(f"index: {out}")
    return "done"


def _run_config(run_dir, args):
    from agent_r1_tutorial import verl_launch as vl

    data = Path(run_dir) / "data"
    knobs = dict(train_files=str(data / "train.parquet"), logger=("console", "file"),
                 rollout_data_dir=str(Path(run_dir) / "rollouts"),
                 val_files=str(data / "validation.parquet"), checkpoint_dir=str(Path(run_dir) / "checkpoints"),
                 seed=args.seed, experiment_name=Path(run_dir).name, extra_overrides=tuple(args.override))
    if args.agent is not None:  # verl's agent-loop file names the gateway loop's class for every worker
        from agent_r1_tutorial.blackbox import gateway_loop_config

        knobs["agent_loop_config_path"] = str(gateway_loop_config(Path(run_dir) / "agent_loop.yaml"))
    if args.smoke:  # one GPU: no tensor parallelism; a validation and a checkpoint at the last step
        knobs.update(rollout_tp=1, total_training_steps=SMOKE_STEPS, save_freq=SMOKE_STEPS, test_freq=SMOKE_STEPS)
    for opt, key in (("gpus", "n_gpus_per_node"), ("nnodes", "nnodes"), ("model", "model_path"),
                     ("batch_size", "train_batch_size"), ("mini_batch_size", "ppo_mini_batch_size"),
                     ("micro_batch_size", "micro_batch_size_per_gpu")):
        if getattr(args, opt) is not None:
            knobs[key] = getattr(args, opt)
    try:
        return vl.task_run_config({"search": "hotpotqa"}.get(args.task, args.task), args.algorithm, **knobs)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None


def full_train(run_dir, args) -> str:
    "Compose and validate verl's configuration, write it and the launch command; on GPUs, launch."
    from agent_r1_tutorial import verl_launch as vl

    run_dir = Path(run_dir)
    run = _run_config(run_dir, args)
    # each launch keeps its log and metrics (a resumed run loses none). The metrics path travels in Ray's runtime env:
    # verl's file logger runs in its TaskRunner actor, which does not inherit this process's environment when Ray is
    # already running or the job is submitted to a cluster
    n = 1 + len(list(run_dir.glob("train-*.log")))
    metrics = (run_dir / f"metrics-{n}.jsonl").resolve()
    run = dataclasses.replace(run, extra_overrides=(
        *run.extra_overrides, f"+ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH={metrics}"))
    cfg = vl.compose_verl_config(vl.verl_overrides(run))
    stand_in = tiny = None
    if args.dry_run:
        from agent_r1_tutorial.tinylm import build_tiny_lm, save_tokenizer

        tiny = build_tiny_lm()  # the policy of the dry run's agent-loop episode
    if args.dry_run and not Path(run.model_path).expanduser().is_dir():
        import contextlib
        import io

        stand_in = run_dir / "stand-in-model"  # the model sections load a config and a tokenizer from disk
        with contextlib.redirect_stderr(io.StringIO()):  # no progress bar for a 4 MB model
            save_tokenizer(tiny[0], stand_in)
            tiny[1].save_pretrained(stand_in)
    try:
        check = vl.validate_verl_config(cfg, model_path=str(stand_in) if stand_in else None)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    from omegaconf import OmegaConf

    (run_dir / "verl_config.yaml").write_text(OmegaConf.to_yaml(cfg))
    (run_dir / "validation.json").write_text(json.dumps(check, indent=1))
    # a search task: each node first starts a retrieval service over the index, which the rows' search tool asks
    service = {} if args.task != "search" else dict(
        retrieval_index=str(_index_dir(run_dir, args).resolve()), retrieval_port=RETRIEVAL_PORT,
        log_dir=str(run_dir.resolve()))
    venv = gpu_venv()  # the launch runs in the environment speedrun.sh built (AR1_GPU_VENV moves it)
    cmds = vl.launch_commands(run, head_address=args.head, venv=venv, **service)
    vl.write_launch_script(run, run_dir, ROOT, head_address=args.head, venv=venv, **service)
    _say(f"verl configuration: {run.algorithm} -> algorithm.adv_estimator={check['adv_estimator']}, "
         f"loss_mode={check['policy_loss']}, critic={check['use_critic']}, "
         f"reference={check['use_reference_policy']}, n={run.responses_per_prompt}")
    _say("validated with verl: validate_config + " + ", ".join(check["sections"]))
    if stand_in:
        _say(f"model sections checked with a local stand-in for {run.model_path} (verl loads the real one at launch)")
    _say("not converted: " + "; ".join(check["skipped"]))
    _say(f"agent loop: {check['agent_loop']}")
    if args.dry_run:
        _dry_run_agent_loop(run_dir, cfg, *tiny)
    print("  launch command" + ("s" if len(cmds) > 1 else "") + f" ({run_dir / 'launch.sh'}):")
    for step, cmd in cmds.items():
        print(("  # " + step + "\n" if len(cmds) > 1 else "") + "  " + cmd.replace("\n", "\n  "))
    if args.dry_run:
        return "validated; agent loop ran on CPU; not launched (needs GPUs)"
    if "submit" in cmds:
        _say("multi-node: start the head, join each worker node, then submit (launch.sh holds the three steps); "
             "each worker needs the head's ~/.ray/auth_token (Ray's token authentication)")
        if service:
            _say("each node's retrieval service keeps running after the run: stop it with "
                 f"kill $(cat {run_dir}/retrieval-$(hostname).log.pid)")
        return "commands written"
    log = run_dir / f"train-{n}.log"
    env = {**os.environ, "VERL_FILE_LOGGER_PATH": str(metrics)}  # the driver's own logger, if any, too
    _say(f"training; the log is {log}")
    with open(log, "w") as f:
        proc = subprocess.run(["bash", str(run_dir / "launch.sh")], stdout=f, stderr=subprocess.STDOUT, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"error: training failed (exit {proc.returncode}); the log is {log}")
    return "done"


def _scripted_searcher(row: dict):
    "A fixed policy for the dry run: search for the row's question, then answer with its gold answer."
    question, answer = row["extra_info"]["question"], row["reward_model"]["ground_truth"]

    def policy(context: str) -> str:
        if "<tool_response>" not in context:
            return ('<tool_call>\n{"name": "search", "arguments": {"query": ' + json.dumps(question)
                    + '}}\n</tool_call>')
        return f"<answer>{answer}</answer>"
    return policy


def _scripted_solver(row: dict):
    "A fixed policy for the dry run's GSM8K row: one calculator call that gives the answer, then the answer."
    answer = row["reward_model"]["ground_truth"]

    def policy(context: str) -> str:
        if "<tool_response>" not in context:
            return ('<tool_call>\n{"name": "calculator", "arguments": {"expression": ' + json.dumps(f"{answer} + 0")
                    + '}}\n</tool_call>')
        return f"<answer>{answer}</answer>"
    return policy


def _scripted_player(row: dict):
    "A fixed policy for the dry run's game: the game's own solution (from TextWorld's planner), one command a turn."
    from agent_r1_tutorial.textgames import TextGameEnv

    start = row["extra_info"]["env_kwargs"]["start"]  # the rows' "alfworld" skips the planner; the script needs it
    env = TextGameEnv(max_steps=50, start={"alfworld": "alfworld_plan"}.get(start, start))
    env.reset(**row["extra_info"]["reset_kwargs"])
    solution = env.walkthrough
    return lambda context: f"<action>{solution[min(context.count('<|im_start|>assistant'), len(solution)) - 1]}</action>"


def _dry_run_agent_loop(run_dir, cfg, tokenizer, model):
    "One episode of our agent loop, built as verl's worker builds it, on the tiny model; one scripted, with a search."
    from agent_r1_tutorial import verl_data as vd
    from agent_r1_tutorial import verl_launch as vl

    row = vd.read_rows(Path(run_dir) / "data" / "train.parquet")[0]
    name = row["agent_name"]
    if name != vl.AGENT_NAME:  # --agent: the gateway loop, registered here as the agent-loop file registers it there
        from agent_r1_tutorial.blackbox import register_gateway_loop

        register_gateway_loop()
    scripted = (("scripted player", _scripted_player(row)) if row["data_source"] == "alfworld"
                else ("scripted solver", _scripted_solver(row)) if row["data_source"] == "openai/gsm8k"
                else ("scripted searcher", _scripted_searcher(row)))
    service = None
    create = ((row["extra_info"].get("tools_kwargs") or {}).get("search_service") or {}).get("create_kwargs")
    if create:  # the search tool asks a retrieval service, as on the GPU box: one over the dry run's index
        from agent_r1_tutorial.retrieval_server import RetrievalServer

        service = RetrievalServer(index_dirs={"default": Path(run_dir) / "index"},
                                  log_file=Path(run_dir) / "retrieval.log")
        create["url"] = service.start()  # a free port here: the GPU run's is fixed, and may be taken on this machine
        _say(f"retrieval service over the dry run's index at {create['url']} (the GPU run's: each node's, port "
             f"{RETRIEVAL_PORT})")
    try:
        results = {"tiny model": vl.agent_loop_dry_run(cfg, row, tokenizer, model, response_length=128, agent_name=name),
                   scripted[0]: vl.agent_loop_dry_run(cfg, row, tokenizer, policy=scripted[1], response_length=1024,
                                                      agent_name=name)}
        if service is not None:
            from agent_r1_tutorial.retrieval_server import RemoteRetriever

            _say(f"the retrieval service answered {RemoteRetriever(service.url).health()['queries']} search(es)")
    finally:
        if service is not None:
            service.stop()
    (Path(run_dir) / "agent_loop.json").write_text(json.dumps(results, indent=1))
    for who, r in results.items():
        score = "scored by verl's reward loop" if r["reward_score"] is None else f"reward {r['reward_score']:g}"
        _say(f"episode ({who}): {r['turns']} turn(s), {r['tool_calls']} tool call(s), {r['outputs']} output(s) "
             f"({r['layout']} layout), {r['response_tokens']} response tokens ({r['sampled_tokens']} sampled), "
             f"ended: {r['end_reason']}, {score}, ids and masks {'ok' if r['ids_and_masks_ok'] else 'WRONG'}")
        if not r["ids_and_masks_ok"]:
            raise SystemExit(f"error: the agent loop's ids and masks are inconsistent ({who}); see agent_loop.json")


def full_eval(run_dir, args) -> str:
    "The held-out score of verl's validation after the last step (greedy, scored by our compute_score)."
    measure = "success rate" if args.task == "alfworld" else "EM"  # GSM8K's is exact match of the number
    if args.dry_run:
        held_out = {"alfworld": "games", "gsm8k": "problems"}.get(args.task, "questions")
        _say(f"reads verl's validation after the last step: {measure} on the validation {held_out}, "
             "scored by compute_score")
        return "needs GPUs"
    from agent_r1_tutorial.verl_launch import latest_verl_checkpoint, read_verl_metrics

    if args.smoke:
        return smoke_verdict(read_verl_metrics(run_dir), latest_verl_checkpoint(Path(run_dir) / "checkpoints"),
                             args.algorithm)
    val = [(m["step"], k, v) for m in read_verl_metrics(run_dir) for k, v in m.items() if k.startswith("val-core/")]
    if not val:
        raise SystemExit(f"error: verl logged no validation in {run_dir} (metrics-*.jsonl); see its train-*.log")
    last = max(s for s, _, _ in val)
    for s, k, v in val:
        if s in (0, last):
            _say(f"step {s}: {k} = {v:.4f}")
    ckpt = latest_verl_checkpoint(Path(run_dir) / "checkpoints")
    if ckpt is not None:
        hint = f" (python scripts/chat.py {ckpt} --tools search ...)" if args.task == "search" else ""
        _say(f"the trained model: {ckpt / 'actor' / 'huggingface'}{hint}")
    # verl's core validation metric is "acc" where episodes report one (our scorers, and every episode a game judged:
    # its win), else "reward" (a registered scorer that reports only a score)
    core = [v for name in ("acc", "reward") for s, k, v in val if s == last and k.endswith(f"/{name}/mean@1")]
    return f"{measure} {core[0]:.3f} at step {last}" if core else f"validated at step {last}"


def smoke_verdict(metrics: list[dict], checkpoint, algorithm: str = "grpo") -> str:
    "PASS when every step trained and was checkpointed, with the step time and peak GPU memory; else FAIL and why."
    steps = [m for m in metrics if m["step"] >= 1 and "timing_s/step" in m]
    mem = max((m.get("actor/perf/max_memory_allocated_gb", 0.0) for m in steps), default=0.0)
    if len(steps) < SMOKE_STEPS or checkpoint is None:
        why = (f"{len(steps)} of {SMOKE_STEPS} steps logged" if len(steps) < SMOKE_STEPS else "no checkpoint saved")
        _say(f"smoke: FAIL ({why}); see train-*.log in the run folder")
        return "FAIL"
    step_s = sum(m["timing_s/step"] for m in steps[1:] or steps) / len(steps[1:] or steps)  # the first compiles
    _say(f"smoke: PASS ({len(steps)} steps, {step_s:.1f} s per step after the first, peak GPU memory of the actor "
         f"{mem:.1f} GB, checkpoint {checkpoint.name}); the full run: bash speedrun.sh {algorithm}")
    return f"PASS, {step_s:.1f} s per step"


BUILT.update({"full/preflight": full_preflight, "full/env": full_env, "full/data": full_data,
              "full/index": full_index, "full/train": full_train, "full/eval": full_eval})


def main(argv=None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    scale = resolve(args, ap)
    if args.print_scale:
        print(scale)
        return 0
    if args.print_needs_verl:  # speedrun.sh: install verl's CPU build into .venv first?
        print("yes" if scale == "full" or args.engine == "verl" else "no")
        return 0
    if args.print_needs_games:  # speedrun.sh: install the text-game packages (TextWorld, ALFWorld) first?
        print("yes" if args.task in ("alfworld", "textworld") else "no")
        return 0
    if args.preflight_only:  # speedrun.sh, before the GPU environment exists (standard library only)
        return 0 if full_preflight(None, args, gate=True) != "FAILED" else 1
    return run(args, scale)


if __name__ == "__main__":
    sys.exit(main())
