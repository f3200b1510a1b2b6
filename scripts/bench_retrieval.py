#!/usr/bin/env python3
"""Retrieval inside every rollout worker against one retrieval service per machine (chapter 04a), side by side.

    python scripts/bench_retrieval.py                      # 1M x 1024 flat index, 8 workers, 640 queries
    python scripts/bench_retrieval.py --n 250000 --out runs/bench-retrieval

A synthetic flat index (unit vectors, N x D float32) stands in for the Wikipedia one; a query is a seeded random unit
vector, made by a stand-in encoder whose cost is nil, so that the figures are the index's and the transport's.

- **per worker** (what verl's agent-loop workers did when each loaded the index): `--workers` processes each read their
  own copy of the index, with one thread each (Ray gives a worker one), and search their share of the queries one at a
  time, as each episode's tool call does.
- **service**: one process holds the index (chapter 04a's `RetrievalService` under uvicorn, all threads), and all the
  queries are sent at once through `RemoteRetriever.asearch`, the search tool's client.

Printed and written to <out>/retrieval.json: host memory (resident set of every process that holds the index), and the
p50 / p95 / max time from when all queries are sent to when each is answered. Memory is checked first: a run that would
not fit in this machine's available memory stops with the arithmetic.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


class SeededEncoder:
    "A stand-in query encoder: the query text 'q<seed>' becomes a seeded random unit vector (no model, no cost)."

    def __init__(self, dim: int):
        self.name, self.dim = f"seeded-{dim}", dim

    def encode_queries(self, queries):
        import numpy as np

        out = np.stack([np.random.default_rng(int(q[1:])).standard_normal(self.dim, dtype=np.float32) for q in queries])
        return out / np.linalg.norm(out, axis=1, keepdims=True)

    encode_docs = encode_queries


def build(path: Path, n: int, dim: int, seed: int = 0):
    "A flat inner-product index of n unit vectors, written in chunks (no second copy in memory)."
    import faiss
    import numpy as np

    index, rng = faiss.IndexFlatIP(dim), np.random.default_rng(seed)
    for start in range(0, n, 65536):
        x = rng.standard_normal((min(65536, n - start), dim), dtype=np.float32)
        index.add(x / np.linalg.norm(x, axis=1, keepdims=True))
    faiss.write_index(index, str(path))


def load(path: str, n: int, dim: int, threads: int | None):
    "The retriever as a process loads it: its own copy of the index and of the documents."
    import faiss

    from agent_r1_tutorial.search import DenseRetriever

    if threads:
        faiss.omp_set_num_threads(threads)
    return DenseRetriever([{"id": str(i), "text": f"passage {i}"} for i in range(n)], encoder=SeededEncoder(dim),
                          faiss_index=faiss.read_index(path))


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def worker(path, n, dim, k, inbox, outbox):
    "One rollout worker with its own index: report ready with its memory, then search each query it is given."
    ret = load(path, n, dim, threads=1)
    outbox.put(("ready", os.getpid(), rss_mb(os.getpid())))
    while (item := inbox.get()) is not None:
        qid, query, t0 = item
        ret.search([query], k)
        outbox.put(("done", qid, time.time() - t0))


def serve(path, n, dim, port):
    "The retrieval service: one copy, every thread, batching what arrives together."
    import uvicorn

    from agent_r1_tutorial.retrieval_server import RetrievalService, service_app

    service = RetrievalService({"synthetic": load(path, n, dim, threads=None)})
    uvicorn.run(service_app(service), host="127.0.0.1", port=port, log_level="warning")


def _get(outbox, procs):
    "The next message from the workers; a worker that died ends the benchmark with its exit code, not a hang."
    import queue

    while True:
        try:
            return outbox.get(timeout=1)
        except queue.Empty:
            dead = [p for p in procs if p.exitcode not in (None, 0)]
            if dead:
                for p in procs:
                    p.terminate()
                raise SystemExit(f"error: a worker exited with code {dead[0].exitcode} (its traceback is above)")


def per_worker(path, args) -> dict:
    ctx = mp.get_context("spawn")
    inboxes, outbox = [ctx.Queue() for _ in range(args.workers)], ctx.Queue()
    procs = [ctx.Process(target=worker, args=(str(path), args.n, args.dim, args.k, q, outbox)) for q in inboxes]
    t_load = time.time()
    for p in procs:
        p.start()
    ready = [_get(outbox, procs) for _ in procs]
    t_load = time.time() - t_load
    t0 = time.time()
    for i in range(args.queries):  # round robin: each worker gets its share, all sent at once
        inboxes[i % args.workers].put((i, f"q{i}", t0))
    lat = [_get(outbox, procs)[2] for _ in range(args.queries)]
    for q in inboxes:
        q.put(None)
    for p in procs:
        p.join()
    return {"processes": args.workers, "rss_mb": round(sum(r[2] for r in ready), 1), "load_s": round(t_load, 1),
            **_stats(lat)}


def service(path, args) -> dict:
    from agent_r1_tutorial.retrieval_server import RemoteRetriever, _free_port

    port = _free_port("127.0.0.1")
    proc = mp.get_context("spawn").Process(target=serve, args=(str(path), args.n, args.dim, port))
    t_load = time.time()
    proc.start()
    client = RemoteRetriever(f"http://127.0.0.1:{port}", timeout=600)
    while True:
        try:
            client.health()
            break
        except Exception:
            if not proc.is_alive():
                raise SystemExit("error: the retrieval service exited while loading")
            time.sleep(0.2)
    t_load = time.time() - t_load
    rss = rss_mb(proc.pid)

    async def ask_all():
        t0 = time.time()

        async def one(i):
            await client.asearch([f"q{i}"], args.k)
            return time.time() - t0
        return await asyncio.gather(*(one(i) for i in range(args.queries)))
    lat = asyncio.run(ask_all())
    batches = client.health()["batches"]
    proc.terminate()
    proc.join()
    return {"processes": 1, "rss_mb": round(rss, 1), "load_s": round(t_load, 1), "batches": batches, **_stats(lat)}


def _stats(lat) -> dict:
    lat = sorted(lat)
    q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))]
    return {"p50_s": round(statistics.median(lat), 3), "p95_s": round(q(0.95), 3), "max_s": round(lat[-1], 3)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000, help="vectors in the index (default 1,000,000)")
    ap.add_argument("--dim", type=int, default=1024, help="dimensions (default 1024, bge-large's)")
    ap.add_argument("--workers", type=int, default=8, help="rollout workers (default 8, verl's default)")
    ap.add_argument("--queries", type=int, default=640, help="queries sent at once (default 640)")
    ap.add_argument("--k", type=int, default=3, help="hits per query")
    ap.add_argument("--out", default=str(ROOT / "runs" / "bench-retrieval"))
    args = ap.parse_args(argv)
    for name in ("n", "dim", "workers", "queries", "k"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be a positive integer")
    copy_gb = args.n * args.dim * 4 / 1e9
    avail = next((int(l.split()[1]) / 1e6 for l in Path("/proc/meminfo").read_text().splitlines()
                  if l.startswith("MemAvailable:")), float("inf"))
    if copy_gb * (args.workers + 1) > 0.8 * avail:
        raise SystemExit(f"error: {args.workers} copies of a {args.n:,} x {args.dim} float32 index need "
                         f"{copy_gb * args.workers:.1f} GB, and this machine has {avail:.1f} GB available: "
                         f"use a smaller --n (the memory scales with it) or fewer --workers")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"flat-{args.n}x{args.dim}.faiss"
    if not path.exists():
        print(f"building a flat index of {args.n:,} x {args.dim} ({copy_gb:.2f} GB) ...", flush=True)
        build(path, args.n, args.dim)
    print(f"per worker: {args.workers} processes, each with its own copy ...", flush=True)
    a = per_worker(path, args)
    print("service: one process ...", flush=True)
    b = service(path, args)
    res = {"n": args.n, "dim": args.dim, "index_gb": round(copy_gb, 2), "queries": args.queries, "k": args.k,
           "cpus": os.cpu_count(), "per_worker": a, "service": b}
    (out / "retrieval.json").write_text(json.dumps(res, indent=1) + "\n")
    print(f"\n{args.queries} queries at once, flat index {args.n:,} x {args.dim} ({copy_gb:.2f} GB), "
          f"{os.cpu_count()} CPUs\n")
    print("| design | processes with the index | host memory (GB) | p50 (s) | p95 (s) | last (s) |")
    print("|---|---|---|---|---|---|")
    for name, r in (("index in every worker", a), ("one retrieval service", b)):
        print(f"| {name} | {r['processes']} | {r['rss_mb'] / 1024:.2f} | {r['p50_s']:.2f} | {r['p95_s']:.2f} | "
              f"{r['max_s']:.2f} |")
    print(f"\nmemory: {a['rss_mb'] / b['rss_mb']:.1f}x less with the service; p95: "
          f"{a['p95_s'] / b['p95_s']:.1f}x faster ({b['batches']} batches for {args.queries} queries)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
