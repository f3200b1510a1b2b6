#!/usr/bin/env python3
"""Train an agent you did not write: GRPO through the OpenAI-compatible gateway (chapter 16a), from a finished tiny
speedrun's SFT model, seed by seed, with held-out exact match as it goes, beside the same RL on the environment loop.

    bash speedrun.sh                                                   # first: the main job (its SFT model)
    python scripts/train_agent.py --run runs/tiny-search-grpo-s0 --out runs/agent
    python scripts/train_agent.py --run runs/tiny-search-grpo-s0 --agent mypackage.agents:my_agent

An agent is any function (base_url, task) -> final answer that talks to an OpenAI endpoint; the task carries
`question`, `search_url`, `collection`, `k` and `max_turns`. Rerun with the same --out to resume: finished runs
are kept, a run that stopped part-way starts again.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python scripts/train_agent.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", type=Path, default=ROOT / "runs" / "tiny-search-grpo-s0",
                    help="a finished tiny speedrun (task search) to start from (default runs/tiny-search-grpo-s0)")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "agent", help="where the curves go (default runs/agent)")
    ap.add_argument("--agent", default="openai",
                    help="openai (default), httpx, 'module:function' or 'path/to/file.py:function'")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="RL seeds (default 0 1 2)")
    ap.add_argument("--steps", type=int, help="RL steps per run (default: the speedrun's)")
    ap.add_argument("--eval-every", type=int, default=5, help="held-out EM every this many steps (default 5)")
    ap.add_argument("--no-loop", action="store_true", help="skip the comparison runs on the environment loop")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    if args.steps is not None and args.steps < 1:
        ap.error(f"--steps must be a positive integer, got {args.steps}")
    if args.eval_every < 1:
        ap.error(f"--eval-every must be a positive integer, got {args.eval_every}")
    from agent_r1_tutorial.blackbox import load_agent, summarize_runs, train_agent_runs

    try:
        agent = load_agent(args.agent, os.getcwd())
    except (ValueError, ImportError, FileNotFoundError) as e:
        ap.error(f"--agent {args.agent}: {e}")
    try:
        curve = train_agent_runs(args.run, args.out, agent, args.seeds, args.steps, args.eval_every,
                                 loop=not args.no_loop)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(summarize_runs(curve).to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
