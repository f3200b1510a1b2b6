#!/usr/bin/env python3
"""Benchmark the multi-turn rollout: the KV cache kept across turns versus re-encoding every turn's history.

Both modes roll out the same batch with the same seed on the same model, side by side in one run (alternating, after a
warm-up), and the script prints generated tokens/s for each and their ratio. The sampled tokens must be identical.

usage: python scripts/bench_rollout.py [--episodes 16] [--turns 6] [--max-new-tokens 32] [--hidden 128] [--layers 4]
                                       [--threads N] [--device cpu|cuda] [--json]
"""
import argparse
import json
import platform
import sys

import torch

from agent_r1_tutorial.core import get_device
from agent_r1_tutorial.rollout import benchmark_rollout
from agent_r1_tutorial.tinylm import build_tiny_lm


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--episodes", type=int, default=16)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--reply-words", type=int, default=24, help="length of the environment's reply each turn")
    ap.add_argument("--hidden", type=int, default=128, help="model width (the speedrun's default is 128)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    a = ap.parse_args(argv)
    for name in ("episodes", "turns", "max_new_tokens", "hidden", "layers"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if a.threads:
        torch.set_num_threads(a.threads)
    device = get_device(a.device)
    tok, model = build_tiny_lm(seed=0, hidden_size=a.hidden, num_hidden_layers=a.layers)
    model = model.to(device)
    res = benchmark_rollout(model, tok, n_episodes=a.episodes, turns=a.turns, max_new_tokens=a.max_new_tokens,
                            reply_words=a.reply_words)
    res.update(device=str(device), torch_threads=torch.get_num_threads(), machine=platform.processor() or platform.machine(),
               episodes=a.episodes, turns=a.turns, max_new_tokens=a.max_new_tokens, hidden=a.hidden, layers=a.layers)
    if a.json:
        print(json.dumps(res))
    else:
        print(f"model h{a.hidden} L{a.layers} on {device} ({res['torch_threads']} threads); {a.episodes} episodes x "
              f"{a.turns} turns x {a.max_new_tokens} tokens; final context {res['final_context']} tokens")
        print(f"  KV cache kept across turns : {res['tokens_per_s_reuse']:8.0f} generated tokens/s "
              f"({res['fed_tokens_reuse']} tokens fed)")
        print(f"  history re-encoded         : {res['tokens_per_s_reencode']:8.0f} generated tokens/s "
              f"({res['fed_tokens_reencode']} tokens fed)")
        print(f"  ratio                      : {res['speedup']:.2f}x   identical tokens: {res['same_tokens']}")
    return 0 if res["same_tokens"] else 1


if __name__ == "__main__":
    sys.exit(main())
