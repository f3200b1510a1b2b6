"""Tests for agent_r1_tutorial.search beyond nbs/04_search.ipynb: the document store, FAISS against NumPy, save/load,
the passage budget, and retrieval quality on generated questions (real MiniLM embeddings, no download)."""
import json
import zlib

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from agent_r1_tutorial.search import (
    ENCODERS, BM25Retriever, DenseRetriever, Doc, DocStore, SearchTool, SentenceEncoder, build_index,
    format_passages, load_retriever, recall_at_k, toy_corpus,
)
from agent_r1_tutorial.tools import ToolCall, get_tool, run_tool_calls


class HashModel:
    "A stand-in for a SentenceTransformer: hashed bag of words, normalised. Fast and deterministic."

    def __init__(self, dim=64):
        self.dim, self.seen = dim, []

    def get_embedding_dimension(self):
        return self.dim

    def encode(self, texts, batch_size=64, convert_to_numpy=True, normalize_embeddings=True, show_progress_bar=False):
        self.seen.extend(texts)
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, t in enumerate(texts):
            for w in t.lower().replace("?", " ").replace(".", " ").split():
                out[i, zlib.crc32(w.encode()) % self.dim] += 1.0
        out += 1e-6
        return out / np.linalg.norm(out, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def corpus():
    return toy_corpus(40, seed=3)


@pytest.fixture(scope="module")
def minilm():
    return SentenceEncoder("all-MiniLM-L6-v2")


# ---------------------------------------------------------------- documents and corpus

docs_st = st.lists(st.builds(Doc, st.text(min_size=1, max_size=8), st.text(max_size=10),
                             st.text(min_size=1, max_size=40).filter(str.strip)),
                   max_size=10, unique_by=lambda d: d.id)


@given(docs=docs_st)
@settings(max_examples=50, deadline=None)
def test_docstore_round_trip(tmp_path_factory, docs):
    store = DocStore(docs)
    path = tmp_path_factory.mktemp("store") / "docs.jsonl"
    store.save(path)
    back = DocStore.load(path)
    assert back.docs == store.docs
    for i, d in enumerate(docs):
        assert back.get(d.id) == d and back.position(d.id) == i


def test_docstore_rejects_bad_documents():
    with pytest.raises(ValueError, match="duplicate document id 'x'"):
        DocStore([Doc("x", "", "a"), Doc("x", "", "b")])
    with pytest.raises(ValueError, match="empty text"):
        DocStore([Doc("x", "", "")])
    with pytest.raises(ValueError, match="empty id"):
        DocStore([Doc("", "", "a")])
    with pytest.raises(TypeError, match="must be a Doc or a dict"):
        DocStore(["just text"])
    with pytest.raises(KeyError, match="no document with id 'q'"):
        DocStore([Doc("x", "", "a")]).get("q")


def test_toy_corpus_is_seeded_and_consistent(corpus):
    docs, qs = corpus
    assert toy_corpus(40, seed=3)[1] == qs and toy_corpus(40, seed=4)[1] != qs
    years = [q["answer"] for q in qs if q["kind"] == "year"]
    assert len(set(years)) == len(years) == 40
    for q in qs:
        gold = [docs.get(i).text for i in q["doc_ids"]]
        if q["kind"] == "years_between":
            ys = [int(next(w.strip(".,") for w in t.split() if w.strip(".,").isdigit() and 1100 <= int(w.strip(".,")) < 1850))
                  for t in gold]
            assert int(q["answer"]) == abs(ys[1] - ys[0])
        elif len(gold) == 1:
            assert q["answer"] in gold[0]
    with pytest.raises(ValueError, match="n_towns"):
        toy_corpus(10_000)


# ---------------------------------------------------------------- indexes


@given(n=st.integers(1, 300), d=st.sampled_from([4, 16, 64]), k=st.integers(1, 12), seed=st.integers(0, 10**6))
@settings(max_examples=40, deadline=None)
def test_flat_index_equals_numpy_brute_force(n, d, k, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    q = x[rng.integers(0, n, 5)] + 0.1 * rng.standard_normal((5, d)).astype(np.float32)
    scores, ids = build_index(x, "flat").search(q, min(k, n))
    ref = q @ x.T
    np.testing.assert_allclose(scores, -np.sort(-ref, axis=1)[:, :min(k, n)], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.take_along_axis(ref, ids, 1), scores, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", ["ivf", "hnsw", "IVF8,Flat", "HNSW16"])
def test_approximate_indexes_find_exact_duplicates(kind):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2000, 32)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    index = build_index(x, kind, nprobe=8, ef_search=64)
    _, ids = index.search(x[:100], 1)
    assert (ids[:, 0] == np.arange(100)).mean() > 0.9


def test_build_index_rejects_bad_input():
    with pytest.raises(ValueError, match="unknown index kind"):
        build_index(np.ones((3, 4), np.float32), "nonsense")
    with pytest.raises(ValueError, match="non-empty"):
        build_index(np.ones((4,), np.float32))


# ---------------------------------------------------------------- retrievers with a stand-in encoder


def hash_retriever(docs, index="flat"):
    return DenseRetriever(docs, SentenceEncoder("hash-test", model=HashModel()), index=index)


def test_dense_search_is_batched_and_consistent(corpus, tmp_path):
    docs, qs = corpus
    r = hash_retriever(docs)
    queries = [q["question"] for q in qs[:20]]
    batch = r.search(queries, k=4)
    assert [len(h) for h in batch] == [4] * 20
    for q, hits in zip(queries, batch):
        assert [d.id for d, _ in r.search([q], k=4)[0]] == [d.id for d, _ in hits]
        assert all(a >= b for (_, a), (_, b) in zip(hits, hits[1:]))  # best first
    assert len(r.search(["x"], k=999)[0]) == len(docs)
    r.save(tmp_path / "idx")
    cfg = json.loads((tmp_path / "idx" / "config.json").read_text())
    assert cfg["type"] == "dense" and cfg["n_docs"] == len(docs) and cfg["encoder"] == "hash-test"
    again = DenseRetriever.load(tmp_path / "idx", encoder=SentenceEncoder("hash-test", model=HashModel()))
    assert [[d.id for d, _ in h] for h in again.search(queries, 4)] == [[d.id for d, _ in h] for h in batch]


def test_dense_load_catches_mismatches(corpus, tmp_path):
    docs, _ = corpus
    hash_retriever(docs).save(tmp_path / "idx")
    with pytest.raises(ValueError, match="dimension 64 but the encoder"):
        DenseRetriever.load(tmp_path / "idx", encoder=SentenceEncoder("other", model=HashModel(dim=32)))
    DocStore(docs.docs[:5]).save(tmp_path / "idx" / "docs.jsonl")
    with pytest.raises(ValueError, match="do not belong together"):
        DenseRetriever.load(tmp_path / "idx", encoder=SentenceEncoder("hash-test", model=HashModel()))
    with pytest.raises(ValueError, match="expected"):
        DenseRetriever(docs, SentenceEncoder("hash-test", model=HashModel()), embeddings=np.zeros((3, 64), np.float32))


@pytest.mark.parametrize("bad", ["one string", [1, 2], None])
def test_search_rejects_bad_queries(corpus, bad):
    docs, _ = corpus
    for r in (hash_retriever(docs), BM25Retriever(docs)):
        with pytest.raises(TypeError, match="list of strings"):
            r.search(bad)
        with pytest.raises(ValueError, match="positive int"):
            r.search(["q"], k=0)


def test_bge_path_is_wired_without_downloading(monkeypatch):
    "At scale the encoder comes from sentence-transformers by name; the test replaces the class, so nothing downloads."
    import sentence_transformers
    made = []

    class FakeST(HashModel):
        def __init__(self, name, device=None):
            super().__init__(dim=1024)
            made.append((name, device))
    monkeypatch.setattr(sentence_transformers, "SentenceTransformer", FakeST)
    enc = SentenceEncoder("BAAI/bge-large-en-v1.5", device="fake-device-for-test")
    assert made == [("BAAI/bge-large-en-v1.5", "fake-device-for-test")] and enc.dim == 1024
    enc.encode_queries(["who founded it"])
    enc.encode_docs(["a passage"])
    assert enc.model.seen == [ENCODERS["BAAI/bge-large-en-v1.5"]["query_prefix"] + "who founded it", "a passage"]


# ---------------------------------------------------------------- real retrieval quality


SINGLE = ("year", "founder", "river", "population", "export", "describe")


def test_bm25_finds_the_passage_that_holds_the_answer(corpus):
    docs, qs = corpus
    bm25 = BM25Retriever(docs)
    single = [q for q in qs if q["kind"] in SINGLE]
    hits = bm25.search([q["question"] for q in single], k=1)
    assert np.mean([h[0][0].id == q["doc_ids"][0] for h, q in zip(hits, single)]) > 0.97
    assert bm25.search(["qqqzzz", "the and of"], k=5) == [[], []]


def test_dense_minilm_finds_the_passage_that_holds_the_answer(corpus, minilm):
    docs, qs = corpus
    dense = DenseRetriever(docs, minilm)
    named = [q for q in qs if q["kind"] in SINGLE[:-1]]  # questions that name their town
    rec = recall_at_k(dense, named, ks=(1, 5))
    assert rec[1] > 0.9 and rec[5] > 0.97, rec
    assert recall_at_k(dense, [q for q in qs if q["kind"] == "describe"], ks=(10,))[10] > 0.5


def test_recall_at_k_counts_every_gold_passage(corpus):
    docs, qs = corpus

    class Oracle:
        def search(self, queries, k):
            return [[(docs.get(i), 1.0) for i in qs[n]["doc_ids"]][:k] for n in range(len(queries))]
    two = [q for q in qs if len(q["doc_ids"]) == 2]
    assert recall_at_k(Oracle(), qs[:len(qs)]) == {1: pytest.approx(1 - len(two) / len(qs)), 3: 1.0, 5: 1.0, 10: 1.0}
    with pytest.raises(ValueError, match="questions is empty"):
        recall_at_k(Oracle(), [])


# ---------------------------------------------------------------- the search tool

long_docs = st.lists(st.builds(Doc, st.uuids().map(str), st.text(max_size=30), st.text(min_size=1, max_size=800)),
                     max_size=8)


@given(docs=long_docs, budget=st.integers(1, 2000))
@settings(max_examples=200, deadline=None)
def test_passages_never_exceed_their_budget(docs, budget):
    hits = [(d, 1.0) for d in docs]
    text = format_passages(hits, budget)
    assert len(text) <= budget
    if docs:
        assert text.startswith("[1]") or len(text) == budget
    ranks = [int(line[1:line.index("]")]) for line in text.split("\n") if line.startswith("[") and "]" in line[:4]]
    assert ranks == sorted(ranks)


def test_short_passages_pass_their_room_on():
    short, long = Doc("s", "S", "tiny"), Doc("l", "L", "word " * 300)
    text = format_passages([(short, 1), (long, 1)], 300)
    assert len(text) <= 300 and text.count("word") > 45  # the long passage got nearly all of the 300


def test_search_tool_rewards_and_errors(corpus, tmp_path):
    docs, qs = corpus
    bm25 = BM25Retriever(docs)
    tool = SearchTool(bm25, k=2, max_chars=300, found_reward=0.1, empty_reward=-0.05)
    ok, empty, invalid, blank = run_tool_calls(
        [ToolCall("search", {"query": qs[0]["question"]}), ToolCall("search", {"query": "zzqq"}),
         ToolCall("search", {"query": 5}), ToolCall("search", {"query": "   "})], [tool])
    assert ok.ok and ok.reward == 0.1 and ok.info["doc_ids"][0] == qs[0]["doc_ids"][0] and len(ok.text) <= 300
    assert empty.ok and empty.reward == -0.05 and empty.info["doc_ids"] == [] and "No results" in empty.text
    assert not invalid.ok and invalid.info["error"] == "invalid_arguments"
    assert not blank.ok and "empty" in blank.text
    strict = SearchTool(bm25, min_score=1e9, empty_reward=-0.05)
    assert strict(query=qs[0]["question"]).reward == -0.05  # nothing scores that high: found nothing
    bm25.save(tmp_path / "bm25")
    a, b = SearchTool(index_dir=tmp_path / "bm25"), get_tool("search", index_dir=str(tmp_path / "bm25"))
    assert a.retriever is b.retriever  # one copy per process
    assert load_retriever(tmp_path / "bm25", cache=False) is not a.retriever
    with pytest.raises(FileNotFoundError, match="not a saved retriever"):
        load_retriever(tmp_path)
    with pytest.raises(ValueError, match="either a retriever or an index_dir"):
        SearchTool(bm25, index_dir=tmp_path / "bm25")


def test_search_tool_schema_fits_verl(corpus):
    schemas = pytest.importorskip("verl.tools.schemas")
    s = SearchTool(BM25Retriever(corpus[0])).openai_schema()
    assert schemas.OpenAIFunctionToolSchema.model_validate(s).function.parameters.required == ["query"]
