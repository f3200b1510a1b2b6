#!/usr/bin/env python3
"""Serve retrieval collections over HTTP (chapter 04a): POST /search, GET /health, on 127.0.0.1 unless told otherwise.

    python scripts/retrieval_server.py --index-dir wiki=data/index-bge-large-en-v1.5 --device cuda --port 8765
    python scripts/retrieval_server.py --passages passages.jsonl --retriever bm25

One per machine: every rollout worker on the machine asks it (the search tool's url), and it loads the index once.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent_r1_tutorial.retrieval_server import main  # noqa: E402

if __name__ == "__main__":
    main()
