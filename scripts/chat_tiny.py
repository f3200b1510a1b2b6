#!/usr/bin/env python3
"""Question the tiny speedrun's agent about a world it has never seen, and watch its tool calls.

    python scripts/chat_tiny.py runs/tiny-search-grpo-s0                  # a fresh world, a REPL
    python scripts/chat_tiny.py runs/tiny-search-grpo-s0 --examples 4     # four generated questions, scored
    python scripts/chat_tiny.py runs/tiny-search-grpo-s0 --question "Who leads Bamro Labs?" --world 7

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

    # the tokenizer as saved (tokenizer.json): AutoTokenizer would read the model folder's config.json and build Qwen2's
    # tokenizer class around it, whose own pre-tokenizer splits words differently ('g', 'o', ' ' for the token 'go ')
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
    args = ap.parse_args(argv)
    run = Path(args.run)
    model_dir = next((d for d in (run / "final_model", run / "sft_model", run) if (d / "config.json").exists()), None)
    if model_dir is None:
        ap.error(f"{run} holds no model: expected final_model/ or sft_model/ of a tiny speedrun, or a model folder")
    if args.examples < 0:
        ap.error(f"--examples must be a non-negative integer, got {args.examples}")
    from transformers.utils import logging as hf_logging

    from agent_r1_tutorial.speedrun import ask, fresh_world
    from agent_r1_tutorial.worlds import make_questions

    hf_logging.disable_progress_bar()
    model, tok = load_model(model_dir)
    world = fresh_world(args.world)
    print(f"model: {model_dir}\nworld {args.world} (never seen in training):")
    for d in world.passages():
        print("  " + d["text"])

    cfg_file = run / "config.json"  # search as the run was trained: the same number of passages per search
    run_cfg = json.loads(cfg_file.read_text()) if cfg_file.exists() else {}  # a model's own config.json has neither
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


if __name__ == "__main__":
    sys.exit(main())
