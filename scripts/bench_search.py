#!/usr/bin/env python3
"""Benchmark the retrieval behind the search tool (chapter 04), in one run, on this machine.

1. Throughput of exact top-k search: FAISS (`IndexFlatIP`, one batched call) against NumPy brute force (a matrix
   product and a partial sort, in chunks of queries) on the *same* L2-normalised vectors, in queries per second,
   with their ratio and a check that both return the same top-k. One-query-at-a-time rates are measured too.
2. The approximate indexes of `build_index` (IVF, HNSW) on the same vectors: build time, queries per second and
   recall@k against the exact answer.
3. Retrieval quality: recall@k of dense retrieval (all-MiniLM-L6-v2 + FAISS) and of BM25 (bm25s) on the generated
   town corpus of `toy_corpus`, per question kind.

The vectors are synthetic but shaped like sentence embeddings: clusters in a 32-dimensional latent space, lifted
linearly into `--dim` dimensions with a little noise. (Uniformly random vectors in 384 dimensions have nearly equal
pairwise similarities, which makes every approximate index look far worse than on real data.) The exact-search
comparison does not depend on the distribution. Other processes on the machine change the absolute numbers: the load average is
printed with the results.

usage: python scripts/bench_search.py [--n 100000] [--dim 384] [--queries 1000] [--k 10] [--repeats 3]
                                      [--towns 300] [--skip-approx] [--skip-quality] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description="FAISS versus NumPy top-k search, approximate indexes, and dense "
                                 "versus BM25 recall@k on a generated corpus.")
    ap.add_argument("--n", type=int, default=100_000, help="vectors in the index (default 100000)")
    ap.add_argument("--dim", type=int, default=384, help="vector dimension (default 384, MiniLM's)")
    ap.add_argument("--queries", type=int, default=1000, help="queries per batch (default 1000)")
    ap.add_argument("--k", type=int, default=10, help="hits per query (default 10)")
    ap.add_argument("--repeats", type=int, default=3, help="timed repeats; the median is reported (default 3)")
    ap.add_argument("--towns", type=int, default=300, help="passages in the generated corpus (default 300)")
    ap.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    ap.add_argument("--skip-approx", action="store_true", help="skip the IVF and HNSW measurements")
    ap.add_argument("--skip-quality", action="store_true", help="skip the dense-versus-BM25 recall measurement")
    ap.add_argument("--json", default=None, help="also write the results to this JSON file")
    return ap


class EmbeddingLike:
    "Vectors shaped like sentence embeddings: clusters in a low-dimensional latent space, lifted linearly to `d`."

    def __init__(self, d: int, seed: int, latent: int = 32, n_clusters: int = 64):
        world = np.random.default_rng(seed)
        self.centers = world.standard_normal((n_clusters, latent)).astype(np.float32)
        self.lift = world.standard_normal((latent, d)).astype(np.float32)
        self.latent, self.d = latent, d

    def sample(self, n: int, rng: np.random.Generator, chunk: int = 20_000) -> np.ndarray:
        out = np.empty((n, self.d), np.float32)
        for s in range(0, n, chunk):
            m = min(chunk, n - s)
            z = self.centers[rng.integers(0, len(self.centers), m)]
            z = z + rng.standard_normal((m, self.latent)).astype(np.float32)
            x = z @ self.lift + 0.1 * np.sqrt(self.latent) * rng.standard_normal((m, self.d)).astype(np.float32)
            out[s:s + m] = x / np.linalg.norm(x, axis=1, keepdims=True)
        return out


def numpy_topk(x: np.ndarray, q: np.ndarray, k: int, chunk: int = 256) -> tuple[np.ndarray, np.ndarray]:
    "Exact top-k by inner product: a matrix product per chunk of queries, then a partial sort of each row."
    scores = np.empty((len(q), k), np.float32)
    ids = np.empty((len(q), k), np.int64)
    for s in range(0, len(q), chunk):
        sims = q[s:s + chunk] @ x.T
        part = np.argpartition(-sims, k - 1, axis=1)[:, :k]
        top = np.take_along_axis(sims, part, 1)
        order = np.argsort(-top, axis=1)
        ids[s:s + chunk] = np.take_along_axis(part, order, 1)
        scores[s:s + chunk] = np.take_along_axis(top, order, 1)
    return scores, ids


def timed(fn, repeats: int) -> tuple[float, object]:
    "Median wall-clock seconds of `repeats` calls after one warm-up call, and the last result."
    out = fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def timed_side_by_side(fns: dict, repeats: int) -> tuple[dict, dict]:
    "Median seconds per function, the functions timed in turn within each repeat, so that load changes hit all alike."
    out = {name: fn() for name, fn in fns.items()}  # warm-up
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            out[name] = fn()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(t) for name, t in times.items()}, out


def overlap(a: np.ndarray, b: np.ndarray) -> float:
    "Mean share of b's top-k ids that a also returned (1.0 = the same sets)."
    k = b.shape[1]
    return float(np.mean([len(set(r) & set(s)) / k for r, s in zip(a, b)]))


def machine() -> dict:
    import faiss
    info = {"python": platform.python_version(), "cpu_count": os.cpu_count(), "faiss_threads": faiss.omp_get_max_threads(),
            "faiss": faiss.__version__, "numpy": np.__version__, "platform": platform.platform()}
    try:
        from threadpoolctl import threadpool_info
        info["blas"] = [f"{p.get('internal_api')} ({p.get('num_threads')} threads)" for p in threadpool_info()
                        if p.get("user_api") == "blas"]
    except ImportError:
        pass
    if hasattr(os, "getloadavg"):
        info["load_average_before"] = [round(v, 2) for v in os.getloadavg()]
    return info


def bench_exact(args, x, q) -> dict:
    import faiss
    from agent_r1_tutorial.search import build_index

    t0 = time.perf_counter()
    index = build_index(x, "flat")
    build_s = time.perf_counter() - t0
    t, out = timed_side_by_side({"faiss": lambda: index.search(q, args.k),
                                 "numpy": lambda: numpy_topk(x, q, args.k)}, args.repeats)
    t_faiss, t_numpy = t["faiss"], t["numpy"]
    (f_scores, f_ids), (n_scores, n_ids) = out["faiss"], out["numpy"]
    n_single = min(100, len(q))
    threads = faiss.omp_get_max_threads()

    def faiss_one_thread():  # below 20 queries FAISS scans without BLAS; OpenMP barriers cost more than they save
        faiss.omp_set_num_threads(1)
        try:
            return [index.search(q[i:i + 1], args.k) for i in range(n_single)]
        finally:
            faiss.omp_set_num_threads(threads)
    t1, _ = timed_side_by_side({"faiss": lambda: [index.search(q[i:i + 1], args.k) for i in range(n_single)],
                                "faiss_1_thread": faiss_one_thread,
                                "numpy": lambda: [numpy_topk(x, q[i:i + 1], args.k) for i in range(n_single)]},
                               max(1, args.repeats // 2))
    t_faiss1, t_numpy1 = t1["faiss"], t1["numpy"]
    return {
        "n": len(x), "dim": x.shape[1], "queries": len(q), "k": args.k, "flat_build_s": round(build_s, 4),
        "faiss_batched_qps": len(q) / t_faiss, "numpy_batched_qps": len(q) / t_numpy,
        "batched_ratio_faiss_over_numpy": t_numpy / t_faiss,
        "faiss_single_qps": n_single / t_faiss1, "numpy_single_qps": n_single / t_numpy1,
        "single_ratio_faiss_over_numpy": t_numpy1 / t_faiss1,
        "faiss_single_1_thread_qps": n_single / t1["faiss_1_thread"], "faiss_threads": threads,
        "same_topk_ids": overlap(n_ids, f_ids), "max_score_difference": float(np.abs(f_scores - n_scores).max()),
    }


def bench_approx(args, x, q, exact_ids) -> list[dict]:
    import faiss
    from agent_r1_tutorial.search import build_index

    rows = []
    nlist = int(np.sqrt(len(x)))  # fewer cells than the library's default keeps k-means training short on a CPU
    t0 = time.perf_counter()
    ivf = build_index(x, "ivf", nlist=nlist)
    build = time.perf_counter() - t0
    for nprobe in (1, 4, 16, 64):
        faiss.extract_index_ivf(ivf).nprobe = nprobe
        t, (_, ids) = timed(lambda: ivf.search(q, args.k), args.repeats)  # noqa: B023 (called at once)
        rows.append({"index": f"IVF{nlist},Flat", "param": f"nprobe={nprobe}", "build_s": build,
                     "qps": len(q) / t, "recall_vs_exact": overlap(ids, exact_ids)})
    t0 = time.perf_counter()
    hnsw = build_index(x, "hnsw")
    build = time.perf_counter() - t0
    for ef in (16, 64, 256):
        hnsw.hnsw.efSearch = ef
        t, (_, ids) = timed(lambda: hnsw.search(q, args.k), args.repeats)
        rows.append({"index": "HNSW32,Flat", "param": f"ef_search={ef}", "build_s": build,
                     "qps": len(q) / t, "recall_vs_exact": overlap(ids, exact_ids)})
    return rows


def bench_quality(args) -> dict:
    from agent_r1_tutorial.search import BM25Retriever, DenseRetriever, SentenceEncoder, recall_at_k, toy_corpus

    docs, questions = toy_corpus(args.towns, seed=args.seed)
    t0 = time.perf_counter()
    dense = DenseRetriever(docs, SentenceEncoder("all-MiniLM-L6-v2"))
    dense_build = time.perf_counter() - t0
    t0 = time.perf_counter()
    bm25 = BM25Retriever(docs)
    bm25_build = time.perf_counter() - t0
    kinds = sorted({q["kind"] for q in questions})
    single = [q for q in questions if len(q["doc_ids"]) == 1]
    out = {"docs": len(docs), "questions": len(questions), "dense_build_s": dense_build, "bm25_build_s": bm25_build,
           "recall": {}}
    for name, r in (("dense (MiniLM + FAISS flat)", dense), ("BM25 (bm25s)", bm25)):
        t0 = time.perf_counter()
        out["recall"][name] = {"all single-passage": recall_at_k(r, single, (1, 3, 5, 10))}
        out["recall"][name]["single_passage_qps"] = len(single) / (time.perf_counter() - t0)
        for kind in kinds:
            out["recall"][name][kind] = recall_at_k(r, [q for q in questions if q["kind"] == kind], (1, 3, 5, 10))
    return out


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    if args.n < args.k or args.queries < 1 or args.k < 1:
        parser().error("need --n >= --k >= 1 and --queries >= 1")
    rng = np.random.default_rng(args.seed)
    results = {"machine": machine(), "args": vars(args)}
    print(f"# Search benchmark\n\nmachine: {results['machine']}\n")

    world = EmbeddingLike(args.dim, args.seed)
    x, q = world.sample(args.n, rng), world.sample(args.queries, rng)
    ex = bench_exact(args, x, q)
    results["exact"] = ex
    print(f"## Exact top-{args.k}: {args.n:,} vectors x {args.dim} dims, {args.queries:,} queries\n")
    print("| method | batched queries/s | one query at a time, queries/s |\n|---|---|---|")
    print(f"| FAISS IndexFlatIP ({ex['faiss_threads']} OpenMP threads) | {ex['faiss_batched_qps']:,.0f} | {ex['faiss_single_qps']:,.0f} |")
    print(f"| NumPy matmul + argpartition | {ex['numpy_batched_qps']:,.0f} | {ex['numpy_single_qps']:,.0f} |")
    print(f"| ratio FAISS / NumPy | {ex['batched_ratio_faiss_over_numpy']:.2f}x | {ex['single_ratio_faiss_over_numpy']:.2f}x |")
    print(f"| FAISS, one OpenMP thread | | {ex['faiss_single_1_thread_qps']:,.0f} |")
    print(f"\nsame top-{args.k} ids: {ex['same_topk_ids']:.4f}; largest score difference {ex['max_score_difference']:.2e}\n")

    if not args.skip_approx:
        from agent_r1_tutorial.search import build_index
        _, exact_ids = build_index(x, "flat").search(q, args.k)
        rows = bench_approx(args, x, q, exact_ids)
        results["approx"] = rows
        print(f"## Approximate indexes (same vectors)\n\n| index | search setting | build s | queries/s | recall@{args.k} vs exact |\n|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['index']} | {r['param']} | {r['build_s']:.1f} | {r['qps']:,.0f} | {r['recall_vs_exact']:.3f} |")
        print()

    if not args.skip_quality:
        qual = bench_quality(args)
        results["quality"] = qual
        print(f"## Recall@k on the generated corpus ({qual['docs']} passages, {qual['questions']} questions)\n")
        print(f"index build: dense {qual['dense_build_s']:.1f} s (embedding included), BM25 {qual['bm25_build_s']:.2f} s\n")
        print("| retriever | questions | recall@1 | recall@3 | recall@5 | recall@10 |\n|---|---|---|---|---|---|")
        for name, rec in qual["recall"].items():
            for kind, r in rec.items():
                if isinstance(r, dict):
                    print(f"| {name} | {kind} | " + " | ".join(f"{r[k]:.3f}" for k in (1, 3, 5, 10)) + " |")
        for name, rec in qual["recall"].items():
            print(f"\n{name}: {rec['single_passage_qps']:,.0f} questions/s end to end (encoding included)")
    if hasattr(os, "getloadavg"):
        results["machine"]["load_average_after"] = [round(v, 2) for v in os.getloadavg()]
        print(f"\nload average after: {results['machine']['load_average_after']}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
