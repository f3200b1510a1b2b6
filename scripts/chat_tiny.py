#!/usr/bin/env python3
"""Question the tiny speedrun's agent about a world it has never seen, or watch a text-game agent play a new game.

    python scripts/chat_tiny.py runs/tiny-search-grpo-s0                  # a fresh world, a REPL
    python scripts/chat_tiny.py runs/tiny-search-grpo-s0 --examples 4     # four generated questions, scored
    python scripts/chat_tiny.py runs/tiny-search-grpo-s0 --question "Who leads Bamro Labs?" --world 7
    python scripts/chat_tiny.py runs/tiny-textworld-grpo-s0 --level 7     # a new game, played turn by turn

The run folder's final_model/ is used (sft_model/ if RL has not finished). Questions must be about the printed world,
phrased as in training ("Where was X born?", "Who leads the employer of X?", ...): a tiny model knows nothing else.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path


def load_model(model_dir):
    "The tiny model of a run and its tokenizer, exactly as trained."
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    # the tokenizer as saved (tokenizer.json), also from a folder written before save_tokenizer (chapter 00a),
    # where AutoTokenizer would build Qwen2's tokenizer class around it, which splits 'go ' as 'g' 'o' ' '
    return AutoModelForCausalLM.from_pretrained(model_dir).eval(), PreTrainedTokenizerFast.from_pretrained(model_dir)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python scripts/chat_tiny.py", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    ap.add_argument("run", help="a tiny speedrun folder (or a model folder with a tokenizer)")
    ap.add_argument("--world", type=int, default=0, help="which fresh world (a seed; default 0)")
    ap.add_argument("--question", default=None, help="ask this and exit")
    ap.add_argument("--examples", type=int, default=0, help="ask this many generated questions (with gold answers)")
    ap.add_argument("--retriever", choices=("dense", "bm25"), default="bm25")
    ap.add_argument("--level", type=int, default=None, help="text games: the new game's level (default: the run's "
                    "highest)")
    ap.add_argument("--games", type=int, default=1, help="text games: how many new games to play (default 1)")
    args = ap.parse_args(argv)
    run = Path(args.run)
    model_dir = next((d for d in (run / "final_model", run / "sft_model", run) if (d / "config.json").exists()), None)
    if model_dir is None:
        ap.error(f"{run} holds no model: expected final_model/ or sft_model/ of a tiny speedrun, or a model folder")
    if args.examples < 0:
        ap.error(f"--examples must be a non-negative integer, got {args.examples}")
    if args.games < 1:
        ap.error(f"--games must be a positive integer, got {args.games}")
    if args.world < 0:
        ap.error(f"--world must be a non-negative integer, got {args.world}")
    cfg_file = run / "config.json"  # the run's settings (a model's own config.json has none of them)
    run_cfg = json.loads(cfg_file.read_text()) if cfg_file.exists() else {}
    if "challenge" in run_cfg:  # a text-game run (chapter 11a)
        return play_games(run_cfg, model_dir, args, ap)
    from transformers.utils import logging as hf_logging

    from agent_r1_tutorial.speedrun import ask, fresh_world
    from agent_r1_tutorial.worlds import make_questions

    hf_logging.disable_progress_bar()
    model, tok = load_model(model_dir)
    world = fresh_world(args.world)
    print(f"model: {model_dir}\nworld {args.world} (never seen in training):")
    for d in world.passages():
        print("  " + d["text"])

    # search as the run was trained: the same number of passages per search
    k, quote = run_cfg.get("search_k", 1), run_cfg.get("quote_names", False)
    print(f"search: {args.retriever}, {k} passage(s) per query, as in training")

    def show(question, gold=None):
        rec = ask(model, tok, world, question, args.retriever, answer=gold, k=k, quote=quote)
        print(f"\n> {question}")
        for i, t in enumerate(rec["turns"], 1):
            print(f"  [agent, turn {i}] " + t["response"].replace("\n", "\n                   "))
            if t["feedback"]:
                print("  [tool]          " + t["feedback"].replace("\n", "\n                  "))
        if gold is not None:
            print(f"  gold: {gold}  ->  reward {rec['reward']:.0f}")

    if args.question:
        show(args.question)
    elif args.examples:
        rng = random.Random(args.world)
        for q in make_questions(world, rng, args.examples, hops=1) + make_questions(world, rng, args.examples, hops=2):
            show(q["question"], q["answer"])
    else:
        print("\nAsk about this world (an empty line or Ctrl-D ends).")
        while True:
            try:
                q = input("? ").strip()
            except EOFError:
                break
            if not q:
                break
            show(q)
    return 0


def play_games(run_cfg: dict, model_dir: Path, args, ap) -> int:
    "Text games: the run's agent plays new games of its challenge, printed turn by turn."
    from transformers.utils import logging as hf_logging

    from agent_r1_tutorial.gamerun import GameRunConfig, evaluate_games, fresh_game, play_turns

    cfg = GameRunConfig(**run_cfg)
    if args.level is not None and not 1 <= args.level <= 300:
        ap.error(f"--level must be an integer from 1 to 300, got {args.level}")
    hf_logging.disable_progress_bar()
    model, tok = load_model(model_dir)
    print(f"model: {model_dir}\n{cfg.challenge}, at most {cfg.max_steps} commands per game")
    for g in range(args.games):
        task = fresh_game(cfg, seed=args.world + g, level=args.level)
        m, (traj,) = evaluate_games(model, tok, [task], cfg)
        print(f"\n=== game {args.world + g} (level {task['level']}, never seen in training)")
        opening = tok.decode(traj.steps[0].obs_ids).split("<|im_start|>user\n")[-1].split("<|im_end|>")[0]
        print("[game]   " + opening.replace("\n", "\n         "))
        for i, (response, answer) in enumerate(play_turns(traj), 1):
            print(f"[agent, turn {i}] {response}")
            print("[game]   " + answer.replace("\n", "\n         "))
        print(f"--> {'won' if m['win'] else 'lost'} in {len(traj.steps)} turn(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
