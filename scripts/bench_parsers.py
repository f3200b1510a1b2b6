#!/usr/bin/env python3
"""How long the response parsers take on degenerate text (chapters 03 and 07), in one run, on this machine.

A policy under RL sometimes repeats a tag until its token budget runs out. Every parser that reads a response (the
call formats' `parse`, the reward's `split_turns` and `format_reward`, the Python tool's `strip_fence`) must stay linear on such text. For each shape
of degenerate response this prints the seconds each parser takes at 0.1 MB and 1 MB and their ratio (a linear parser
takes about 10 times as long on 10 times the text; a quadratic one about 100 times). For reference it also times, at
the smaller sizes only, the lazy regular expression `<tool_call>(.*?)</tool_call>` that a first version used.

usage: python scripts/bench_parsers.py [--mb 1.0] [--repeats 3] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time


def shapes(n_chars: int) -> dict[str, str]:
    "Degenerate responses of about `n_chars` characters."
    def rep(s):
        return s * max(1, n_chars // len(s))
    return {"<tool_call> repeated, never closed": rep("<tool_call>"),
            "<answer> repeated, never closed": rep("<answer>"),
            "</tool_call> repeated (stray closes)": rep("</tool_call>"),
            "<search> repeated, never closed": rep("<search>"),
            "<tool_response> repeated, never closed": rep("<tool_response>"),
            "a call's JSON opened 10^5 deep": "<tool_call>" + "[" * (n_chars - 23) + "</tool_call>"}


def best(fn, text: str, repeats: int) -> float:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(text)
        out.append(time.perf_counter() - t0)
    return min(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=float, default=1.0, help="the large size, in millions of characters")
    ap.add_argument("--repeats", type=int, default=3, help="timings per cell; the fastest is reported")
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args(argv)
    if not 0 < args.mb <= 64:
        ap.error(f"--mb must be in (0, 64], got {args.mb}")
    if args.repeats < 1:
        ap.error(f"--repeats must be at least 1, got {args.repeats}")

    from agent_r1_tutorial.rewards import format_reward, split_turns
    from agent_r1_tutorial.sandbox import strip_fence
    from agent_r1_tutorial.tools import get_format

    lazy = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
    parsers = {"hermes.parse": get_format("hermes").parse, "search_r1.parse": get_format("search_r1").parse,
               "split_turns": split_turns, "format_reward": format_reward}
    big = int(args.mb * 1_000_000)
    small = big // 10
    rows = []
    print(f"{'shape':42} {'parser':16} {small / 1e6:>8.2f} MB {big / 1e6:>8.2f} MB  ratio")
    for shape in shapes(small):
        t_small, t_big = shapes(small)[shape], shapes(big)[shape]
        for name, fn in parsers.items():
            a, b = best(fn, t_small, args.repeats), best(fn, t_big, args.repeats)
            rows.append({"shape": shape, "parser": name, "small_s": a, "big_s": b, "ratio": b / max(a, 1e-9)})
            print(f"{shape:42} {name:16} {a:10.4f} s {b:10.4f} s {b / max(a, 1e-9):6.1f}")
    # the lazy regex, on the first shape only and at 1/100 and 1/10 of the small size: it is quadratic
    t1, t2 = shapes(small // 100)["<tool_call> repeated, never closed"], shapes(small // 10)["<tool_call> repeated, never closed"]
    a, b = best(lambda t: list(lazy.finditer(t)), t1, 1), best(lambda t: list(lazy.finditer(t)), t2, 1)
    rows.append({"shape": "<tool_call> repeated, never closed", "parser": "lazy regex (reference)",
                 "small_s": a, "big_s": b, "ratio": b / max(a, 1e-9), "sizes_mb": [len(t1) / 1e6, len(t2) / 1e6]})
    print(f"\nlazy regex <tool_call>(.*?)</tool_call> on repeated <tool_call>: {len(t1) / 1e6:.3f} MB {a:.4f} s, "
          f"{len(t2) / 1e6:.3f} MB {b:.4f} s, ratio {b / max(a, 1e-9):.0f} for 10x the text")
    # the Python tool unwraps a Markdown fence around the code it is given: a run of spaces inside one
    fenced = {n: "```\n" + " " * n + "x\n```" for n in (small, big)}
    a, b = best(strip_fence, fenced[small], args.repeats), best(strip_fence, fenced[big], args.repeats)
    rows.append({"shape": "a fence around a run of spaces", "parser": "strip_fence", "small_s": a, "big_s": b,
                 "ratio": b / max(a, 1e-9)})
    print(f"strip_fence on a fenced run of spaces: {small / 1e6:.2f} MB {a:.4f} s, {big / 1e6:.2f} MB {b:.4f} s")
    worst = max(r["big_s"] for r in rows if r["parser"] in parsers)
    print(f"slowest parser at {big / 1e6:.2f} MB: {worst:.3f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"mb": args.mb, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
