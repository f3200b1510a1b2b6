"""The retrieval service (chapter 04a) as its users meet it: a real server on 127.0.0.1, its command line, many
episodes at once across collections, and the failures a rollout must survive."""
import asyncio
import json
import os
import signal
import subprocess
import sys

import pytest
from conftest import ROOT

from agent_r1_tutorial.retrieval_server import RemoteRetriever, RetrievalServer, RetrievalServiceError
from agent_r1_tutorial.search import BM25Retriever, DenseRetriever, SentenceEncoder, toy_corpus
from agent_r1_tutorial.tools import ToolCall, get_tool, run_tool_calls_batch

SCRIPT = [sys.executable, str(ROOT / "scripts" / "retrieval_server.py")]


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    "Two collections of the toy corpus, as one passages file, and their questions."
    root = tmp_path_factory.mktemp("passages")
    (a, qa), (b, qb) = toy_corpus(80, seed=0), toy_corpus(40, seed=1)
    with open(root / "passages.jsonl", "w") as f:
        for name, store in (("a", a), ("b", b)):
            for d in store:
                f.write(json.dumps({"collection": name, "id": d.id, "title": d.title, "text": d.text}) + "\n")
    return {"path": root / "passages.jsonl", "docs": {"a": a, "b": b}, "questions": {"a": qa, "b": qb}}


@pytest.fixture(scope="module")
def dense(corpora):
    with RetrievalServer(passages=corpora["path"]) as server:
        yield server


def test_many_episodes_across_collections_get_their_own_passages(corpora, dense):
    "128 searches in flight over two collections: each gets exactly what the in-process retriever gives its query."
    enc = SentenceEncoder("all-MiniLM-L6-v2")
    local = {name: DenseRetriever(docs, encoder=enc) for name, docs in corpora["docs"].items()}
    asks = [(name, q["question"]) for name in ("a", "b") for q in corpora["questions"][name][:64]]
    clients = {name: RemoteRetriever(dense.url, name) for name in local}
    before = clients["a"].health()

    async def all_at_once():
        return await asyncio.gather(*(clients[name].asearch([q], 3) for name, q in asks))
    got = asyncio.run(all_at_once())
    for (name, q), hits in zip(asks, got):
        assert [d.id for d, _ in hits[0]] == [d.id for d, _ in local[name].search([q], 3)[0]], (name, q)
    after = clients["a"].health()
    assert after["queries"] - before["queries"] == 128 and after["batches"] - before["batches"] < 32


def test_the_search_tool_through_the_service_in_a_batch_of_episodes(corpora, dense):
    tool = get_tool("search_service", url=dense.url, collection="a", k=1)
    qs = corpora["questions"]["a"][:32]
    res = run_tool_calls_batch([[ToolCall("search", {"query": q["question"]})] for q in qs], [tool], timeout=30)
    assert all(r[0].ok for r in res)
    found = sum(r[0].info["doc_ids"][0] in q["doc_ids"] for r, q in zip(res, qs))
    assert found >= 24, found  # the gold passage first for most single-passage questions (chapter 04's recall)


def test_bad_requests_and_clients_are_named(corpora, dense):
    with pytest.raises(RetrievalServiceError, match="answered 404: unknown collection 'c'; this service has a, b"):
        RemoteRetriever(dense.url, "c").search(["x"], 1)
    with pytest.raises(RetrievalServiceError, match="answered 400: this service has 2 collections: name one"):
        RemoteRetriever(dense.url).search(["x"], 1)
    wrong = get_tool("search_service", url=dense.url, collection="c")  # a configuration error, not an outage
    (res,) = run_tool_calls_batch([[ToolCall("search", {"query": "x"})]], [wrong])[0]
    assert res.info["error"] == "service_error" and res.text == "Error: the search service could not run this search"
    with pytest.raises(TypeError, match="queries must be a list of strings"):
        RemoteRetriever(dense.url, "a").search("x", 1)
    with pytest.raises(ValueError, match="k must be a positive int"):
        RemoteRetriever(dense.url, "a").search(["x"], 0)
    with pytest.raises(ValueError, match="timeout must be a positive number"):
        RemoteRetriever(dense.url, timeout=0)
    with pytest.raises(ValueError, match="give passages or index_dirs"):
        from agent_r1_tutorial.retrieval_server import load_collections
        load_collections()


def test_a_killed_service_is_an_error_observation_not_a_hang(corpora, tmp_path):
    server = RetrievalServer(passages=corpora["path"], retriever="bm25", log_file=tmp_path / "server.log")
    url = server.start()
    tool = get_tool("search_service", url=url, collection="a", k=1, timeout=2)
    call = [[ToolCall("search", {"query": "Who founded it?"})]]
    assert run_tool_calls_batch(call, [tool])[0][0].ok
    os.killpg(server.proc.pid, signal.SIGKILL)  # killed, as the memory monitor or an OOM would
    server.proc.wait()
    res = run_tool_calls_batch(call * 8, [tool], timeout=30)
    assert all(r[0].info["error"] == "service_unavailable" for r in res)
    assert all(r[0].text == "Error: the search service is not answering; try again later" for r in res)
    with pytest.raises(RetrievalServiceError, match=f"the retrieval service at {url} is not reachable"):
        RemoteRetriever(url, "a").health()


def test_command_line_serves_in_the_background_and_refuses_a_taken_port(tmp_path):
    docs, qs = toy_corpus(30, seed=2)
    BM25Retriever(docs).save(tmp_path / "idx")
    port = str(__import__("agent_r1_tutorial.retrieval_server", fromlist=["_free_port"])._free_port("127.0.0.1"))
    cmd = SCRIPT + ["--index-dir", f"default={tmp_path / 'idx'}", "--port", port]
    first = subprocess.run(cmd + ["--background", str(tmp_path / "one.log")], capture_output=True, text=True,
                           timeout=300)
    assert first.returncode == 0, first.stderr
    pid = int((tmp_path / "one.log.pid").read_text())
    try:
        assert f"retrieval service at http://127.0.0.1:{port} (pid {pid}" in first.stdout
        hits = RemoteRetriever(f"http://127.0.0.1:{port}").search([qs[0]["question"]], 1)
        assert hits[0][0][0].id in qs[0]["doc_ids"]
        second = subprocess.run(cmd + ["--background", str(tmp_path / "two.log")], capture_output=True, text=True,
                                timeout=300)
        assert second.returncode == 1 and f"port {port} of 127.0.0.1 is taken" in second.stderr
        assert "Traceback" not in second.stderr
    finally:
        os.kill(pid, signal.SIGTERM)


@pytest.mark.parametrize("argv, msg", [
    ([], "give --passages or --index-dir"),
    (["--passages", "/nonexistent/passages.jsonl"], "passages file '/nonexistent/passages.jsonl' does not exist"),
    (["--index-dir", "default=/nonexistent"], "/nonexistent has no config.json: it is not a saved retriever"),
    (["--passages", "x", "--retriever", "grep"], "invalid choice: 'grep'"),
])
def test_command_line_bad_input(argv, msg):
    res = subprocess.run(SCRIPT + argv, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and msg in res.stderr and "Traceback" not in res.stderr, res.stderr


def test_a_server_dies_with_the_process_that_started_it(corpora, tmp_path):
    "A run killed outright (SIGKILL: no `finally`, no `with`) leaves no retrieval server behind, holding memory and a port."
    import time

    owner = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\n"
        "from agent_r1_tutorial.retrieval_server import RetrievalServer\n"
        f"s = RetrievalServer(passages={str(corpora['path'])!r}, retriever='bm25', log_file={str(tmp_path / 'log')!r})\n"
        "print(s.start(), s.proc.pid, flush=True)\n"
        "time.sleep(600)\n")], stdout=subprocess.PIPE, text=True)
    url, pid = owner.stdout.readline().split()
    assert RemoteRetriever(url).health()["pid"] == int(pid)
    owner.kill()
    owner.wait()

    def alive() -> bool:  # a zombie (exited, not yet reaped by whoever adopted it) counts as gone
        try:
            return "\nState:\tZ" not in open(f"/proc/{pid}/status").read()
        except FileNotFoundError:
            return False

    for _ in range(50):  # the server checks for its parent every second
        if not alive():
            break
        time.sleep(0.2)
    else:
        os.kill(int(pid), signal.SIGKILL)
        pytest.fail("the retrieval server outlived the process that started it")
    with pytest.raises(RetrievalServiceError):
        RemoteRetriever(url, timeout=2).health()
