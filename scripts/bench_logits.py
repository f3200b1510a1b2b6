#!/usr/bin/env python3
"""Log-probabilities and entropy over a large vocabulary: verl 0.9.1's fallback against the chunked functions of
chapter 12 (`patch_verl_logits`), side by side.

    python scripts/bench_logits.py                                  # CPU: 2,048 rows x 151,936, bf16
    python scripts/bench_logits.py --device cuda --rows 40960 --batch 8           # a GPU: a micro-batch of 8 x 5,120
    python scripts/bench_logits.py --device cuda --rows 40960 --batch 8 --model qwen2.5-1.5b   # with the forward pass

verl uses its fallbacks where flash-attn is not installed (the pinned GPU stack): `logprobs_from_logits_v2`, a Python
loop with one `log_softmax` per row, and `entropy_from_logits`, which builds the whole softmax at once. Each variant
runs in a fresh process (so that one's peak memory does not hide another's), forward only as in verl's old-log-prob
pass, or forward and backward with --backward. With --batch B the logits are (B, rows / B, vocab), the layout verl's
actor hands them over in when padding is kept (`use_remove_padding=False`, which the sdpa GPU stack sets), so verl's
loop goes over B sequences; without it they are (rows, vocab), a packed batch, and the loop goes over single tokens.
With --model the logits come from a random-weight model of that size run on random token ids (no download: the
architecture is built from its published sizes), and the time and memory include its forward pass (and, with
--backward, its backward pass, with gradient checkpointing as verl's actor runs it); the log-probs and the entropy
are then computed together, as verl's actor does. Printed, and written to --out as JSON: seconds, the peak memory above
the inputs (CUDA's allocator on a GPU, the resident set on a CPU), and the largest error against float64.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = ("verl_logprobs", "chunked_logprobs", "verl_entropy", "chunked_entropy")
MODEL_VARIANTS = ("verl", "chunked")
# published architecture sizes (config.json on the Hub), so that a random-weight copy needs no download
MODELS = {"qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                               num_key_value_heads=2, tie_word_embeddings=True),
          "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                               num_key_value_heads=2, tie_word_embeddings=True),
          "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                       num_key_value_heads=1, tie_word_embeddings=True)}  # a quick check of the script on a CPU


def _rss_mb() -> float:
    import os
    with open("/proc/self/statm") as f:  # Linux: resident pages are the second field
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class _RssPeak:
    "The largest resident set seen while the block runs (sampled every millisecond by a thread)."

    def __enter__(self):
        import threading
        self.base = self.peak = _rss_mb()
        self._stop = threading.Event()
        def watch():
            while not self._stop.wait(0.001):
                self.peak = max(self.peak, _rss_mb())
        self._thread = threading.Thread(target=watch, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss_mb())


def _card(device: str) -> str:
    import platform

    import torch
    return torch.cuda.get_device_name(device) if device.startswith("cuda") else platform.processor() or "cpu"


def one(variant: str, rows: int, vocab: int, device: str, backward: bool, chunk: int, batch: int = 1) -> dict:
    "Run one variant on seeded bf16 logits in this process; its figures."
    import torch
    sys.path.insert(0, str(ROOT))
    from verl.utils import torch_functional as verl_F
    from agent_r1_tutorial.verl_bridge import chunked_entropy, chunked_log_probs

    g = torch.Generator(device=device).manual_seed(0)
    # made 64 rows at a time, so that no float32 copy of the whole batch sets the process's peak before the run
    logits = torch.cat([(torch.randn(min(64, rows - i), vocab, generator=g, device=device) * 3).to(torch.bfloat16)
                        for i in range(0, rows, 64)])
    labels = torch.randint(0, vocab, (rows,), generator=g, device=device)
    if batch > 1:  # (B, rows / B, vocab): verl's unpacked layout
        logits, labels = logits.view(batch, rows // batch, vocab), labels.view(batch, rows // batch)
    fn = {"verl_logprobs": lambda z: verl_F.logprobs_from_logits_v2(z, labels),
          "chunked_logprobs": lambda z: chunked_log_probs(z, labels, chunk),
          "verl_entropy": verl_F.entropy_from_logits,
          "chunked_entropy": lambda z: chunked_entropy(z, chunk)}[variant]
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    z = logits.requires_grad_(backward)
    with _RssPeak() as rss:
        t0 = time.perf_counter()
        with torch.set_grad_enabled(backward):
            out = fn(z)
            if backward:
                out.float().sum().backward()
        if cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20 if cuda else rss.peak - rss.base
    with torch.no_grad():  # float64 answers, after the measurement and a slice at a time
        ref = torch.cat([(torch.log_softmax(z.double(), -1).gather(-1, y[:, None]).squeeze(-1) if "logprobs" in variant
                          else -(torch.softmax(z.double(), -1) * torch.log_softmax(z.double(), -1)).sum(-1))
                         for z, y in zip(logits.detach().reshape(-1, vocab).split(64), labels.reshape(-1).split(64))])
    return {"variant": variant, "card": _card(device), "seconds": round(seconds, 3), "peak_mb": round(peak, 1),
            "max_error": float((out.detach().double().reshape(-1) - ref).abs().max()), "dtype": str(out.dtype)}


def one_model(variant: str, model: str, rows: int, batch: int, device: str, backward: bool, chunk: int) -> dict:
    "A random-weight model's forward (and backward), then log-probs and entropy of its logits, as verl's actor does."
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    sys.path.insert(0, str(ROOT))
    from verl.utils import torch_functional as verl_F
    from agent_r1_tutorial.verl_bridge import chunked_entropy, chunked_log_probs

    cfg = Qwen2Config(vocab_size=151_936, max_position_embeddings=32_768, rope_theta=1e6, **MODELS[model])
    cfg._attn_implementation = "sdpa"  # the GPU stack's attention (no flash-attn wheel)
    torch.manual_seed(0)
    with torch.device(device):
        m = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    if backward:
        m.gradient_checkpointing_enable()  # verl's actor default (enable_gradient_checkpointing=True)
        m.config.use_cache = False
    else:
        m.eval()
    ids = torch.randint(0, cfg.vocab_size, (batch, rows // batch), device=device)
    labels = torch.roll(ids, -1, dims=1)
    logp, ent = ((verl_F.logprobs_from_logits_v2, verl_F.entropy_from_logits) if variant == "verl" else
                 (lambda z, y: chunked_log_probs(z, y, chunk), lambda z: chunked_entropy(z, chunk)))
    n_params = sum(p.numel() for p in m.parameters())
    cuda = device.startswith("cuda")

    def step():
        with torch.set_grad_enabled(backward):
            logits = m(input_ids=ids, use_cache=False).logits
            log_probs, entropy = logp(logits, labels), ent(logits)
            if backward:  # a policy-gradient-shaped loss: both outputs reach the weights
                (log_probs.float().mean() + 0.01 * entropy.float().mean()).backward()
        return log_probs, entropy

    step()  # warm-up: kernels compiled and the allocator's pools made before the measurement
    m.zero_grad(set_to_none=True)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    with _RssPeak() as rss:
        t0 = time.perf_counter()
        step()
        if cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20 if cuda else rss.peak - rss.base
    return {"variant": variant, "card": _card(device), "model": model, "params": n_params, "seconds": round(seconds, 3),
            "peak_mb": round(peak, 1), "weights_mb": round(base / 2**20, 1) if cuda else None}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python scripts/bench_logits.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=2048, help="token rows (default 2048)")
    ap.add_argument("--vocab", type=int, default=151_936, help="vocabulary size (default Qwen2.5's 151,936)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    ap.add_argument("--chunk", type=int, default=256, help="rows per step of the chunked functions (default 256)")
    ap.add_argument("--backward", action="store_true", help="time forward and backward (default forward only)")
    ap.add_argument("--batch", type=int, default=1, help="sequences the rows are split into (default 1: packed rows)")
    ap.add_argument("--model", choices=sorted(MODELS), help="include a random-weight model's forward pass")
    ap.add_argument("--out", type=Path, help="write the figures here as JSON")
    ap.add_argument("--one", choices=VARIANTS + MODEL_VARIANTS, help=argparse.SUPPRESS)  # internal: one variant, in this process
    args = ap.parse_args(argv)
    for name in ("rows", "vocab", "chunk", "batch"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be a positive integer, got {getattr(args, name)}")
    if args.device not in ("cpu", "cuda") and not args.device.startswith("cuda:"):
        ap.error(f"--device must be cpu or cuda, got {args.device!r}")
    if args.rows % args.batch:
        ap.error(f"--rows ({args.rows}) must be a multiple of --batch ({args.batch})")
    if args.model and args.vocab != 151_936:
        ap.error("--model uses its own vocabulary (151,936): leave --vocab out")
    if args.one:
        res = (one_model(args.one, args.model, args.rows, args.batch, args.device, args.backward, args.chunk)
               if args.model else one(args.one, args.rows, args.vocab, args.device, args.backward, args.chunk,
                                      args.batch))
        print(json.dumps(res))
        return 0
    gb = args.rows * args.vocab * 2 / 1e9
    layout = f"{args.batch} x {args.rows // args.batch:,}" if args.batch > 1 else "packed"
    print(f"{args.rows:,} rows ({layout}) x {args.vocab:,} vocabulary in bf16 ({gb:.2f} GB of logits) on {args.device}, "
          f"{'forward and backward' if args.backward else 'forward only'}, chunks of {args.chunk:,} rows"
          + (f", after a random-weight {args.model}'s forward pass" if args.model else ""))
    results = []
    for v in (MODEL_VARIANTS if args.model else VARIANTS):
        cmd = [sys.executable, __file__, "--one", v, "--rows", str(args.rows), "--vocab", str(args.vocab),
               "--device", args.device, "--chunk", str(args.chunk), "--batch", str(args.batch)] + (
               ["--backward"] if args.backward else []) + (["--model", args.model] if args.model else [])
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            print(f"{v} failed:\n{res.stderr[-2000:]}", file=sys.stderr)
            return 1
        r = json.loads(res.stdout.strip().splitlines()[-1])
        results.append(r)
        if args.model:
            print(f"  {v:17} {r['seconds']:8.3f} s   peak {r['peak_mb']:9.1f} MB above the weights")
            continue
        print(f"  {v:17} {r['seconds']:8.3f} s   peak {r['peak_mb']:9.1f} MB above the inputs   "
              f"largest error {r['max_error']:.2e} ({r['dtype']})")
    by = {r["variant"]: r for r in results}
    for what in (("",) if args.model else ("logprobs", "entropy")):
        a, b = by[f"verl{what and '_' + what}"], by[f"chunked{what and '_' + what}"]
        print(f"{what or 'log-probs and entropy'}: chunked / verl's fallback: time {b['seconds'] / max(a['seconds'], 1e-9):.2f}x, "
              f"peak memory {b['peak_mb'] / max(a['peak_mb'], 1e-9):.2f}x")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"rows": args.rows, "vocab": args.vocab, "device": args.device,
                                        "chunk": args.chunk, "backward": args.backward, "batch": args.batch,
                                        "model": args.model, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
