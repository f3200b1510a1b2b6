"""scripts/chat.py: chatting with a checkpoint with the tools live, through transformers or an OpenAI-compatible
server (a small stand-in server here), and clear errors for bad input."""
import contextlib
import io
import json
import os
import re
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch
from conftest import ROOT

import chat
from agent_r1_tutorial import verl_bridge as vb
from agent_r1_tutorial import verl_data as vd
from agent_r1_tutorial.tinylm import build_tiny_lm

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    "A tiny checkpoint laid out as the reference trainer saves one: <ckpt>/policy holds model and tokenizer."
    tok, model = build_tiny_lm()
    root = tmp_path_factory.mktemp("ckpt") / "step_000001"
    with contextlib.redirect_stderr(io.StringIO()):
        tok.save_pretrained(root / "policy")
        model.save_pretrained(root / "policy")
    return root


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    from agent_r1_tutorial.search import BM25Retriever

    path = tmp_path_factory.mktemp("index") / "bm25"
    BM25Retriever(vd.hotpotqa_passages(vd.hotpotqa_toy_sample(8, seed=0))).save(path)
    return path


def run_main(argv, stdin=None):
    out, err = io.StringIO(), io.StringIO()
    old = sys.stdin
    sys.stdin = io.StringIO(stdin or "")
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = chat.main([str(a) for a in argv])
    finally:
        sys.stdin = old
    return code, out.getvalue(), err.getvalue()


def test_one_question_with_the_tiny_model(ckpt):
    code, out, err = run_main([ckpt, "--tools", "calculator", "--question", "What is 12 * 5 + 5?",
                               "--max-response-length", "48", "--max-turns", "2"])
    assert code == 0, err
    assert out.startswith("[turn 1] model:\n")
    assert "answer: " in out or "(no answer: the episode ended with " in out


def test_hf_backend_is_the_same_loop_as_training(ckpt):
    "Greedy chat through the script equals a greedy episode of the library's loop on the same row."
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agent_r1_tutorial.rollout import HFBackend

    args = chat.parser().parse_args([str(ckpt), "--tools", "calculator", "--max-response-length", "40"])
    tok, server, row = chat.build(args)
    buf = io.StringIO()
    chat.answer("What is 2 + 3?", tok, server, row, args, out=buf)
    mine = [c["token_ids"] for c in server.calls]
    model = AutoModelForCausalLM.from_pretrained(ckpt / "policy")
    ref = vb.LocalServerManager(HFBackend(model, tok.pad_token_id), AutoTokenizer.from_pretrained(ckpt / "policy"),
                                verl_types=False)
    env, task = vb.env_from_row(row("What is 2 + 3?"), tok)
    import asyncio
    asyncio.run(vb.run_agent_episode(ref, tok, env, task, {"temperature": 0}, 40, 5))
    assert mine == [c["token_ids"] for c in ref.calls]
    assert "Problem: What is 2 + 3?" in tok.decode(server.calls[0]["prompt_ids"])  # the GSM8K training prompt


def test_repl_answers_until_exit(ckpt):
    code, out, err = run_main([ckpt, "--tools", "calculator", "--max-response-length", "16", "--max-turns", "1"],
                              stdin="What is 1 + 1?\nWhat is 2 + 2?\nexit\nnever asked\n")
    assert code == 0, err
    assert out.count("[turn 1] model:") == 2 and out.count("you> ") == 3
    code, out, err = run_main([ckpt, "--tools", "calculator", "--max-response-length", "16"], stdin="")  # Ctrl-D
    assert code == 0 and "you> " in out


class _FakeVLLM(BaseHTTPRequestHandler):
    "An OpenAI-compatible completions endpoint answering with a scripted policy (what `vllm serve` would be)."
    tokenizer = policy = None
    requests = []

    def log_message(self, *a):
        pass

    def _send(self, obj, code=200):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/v1/models":
            return self._send({"object": "list", "data": [{"id": "tiny-merged", "object": "model"}]})
        self._send({"error": "not found"}, 404)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path != "/v1/completions" or body.get("model") != "tiny-merged":
            return self._send({"error": "bad request"}, 400)
        type(self).requests.append(body)
        context = self.tokenizer.decode(body["prompt"], skip_special_tokens=False)
        self._send({"choices": [{"index": 0, "text": self.policy(context), "finish_reason": "stop"}]})


@pytest.fixture
def fake_vllm(ckpt):
    from transformers import AutoTokenizer

    _FakeVLLM.tokenizer = AutoTokenizer.from_pretrained(ckpt / "policy")
    _FakeVLLM.requests = []
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _FakeVLLM)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    srv.shutdown()


def test_vllm_backend_runs_the_calculator_live(ckpt, fake_vllm):
    def policy(ctx):
        if "<tool_response>" not in ctx:
            return '<tool_call>\n{"name": "calculator", "arguments": {"expression": "17 * 23"}}\n</tool_call>'
        return "<answer>" + re.findall(r"<tool_response>\n(.*?)\n</tool_response>", ctx, re.S)[-1] + "</answer>"
    _FakeVLLM.policy = staticmethod(policy)
    code, out, err = run_main([ckpt, "--tools", "calculator", "--backend", "vllm", "--url", fake_vllm,
                               "--question", "What is 17 * 23?"])
    assert code == 0, err
    assert "[turn 1] model:\n<tool_call>" in out and "[turn 1] tools:\n391" in out and out.rstrip().endswith("answer: 391")
    first, second = _FakeVLLM.requests
    assert isinstance(first["prompt"], list) and second["prompt"][:len(first["prompt"])] == first["prompt"]


def test_vllm_backend_searches_the_index_live(ckpt, fake_vllm, index):
    rec = vd.hotpotqa_toy_sample(8, seed=0)[0]

    def policy(ctx):
        if "<tool_response>" not in ctx:
            return '<tool_call>\n{"name": "search", "arguments": {"query": ' + json.dumps(rec["question"]) + '}}\n</tool_call>'
        return f"<answer>{rec['answer']}</answer>"
    _FakeVLLM.policy = staticmethod(policy)
    code, out, err = run_main([ckpt, "--tools", "search", "--index-dir", index, "--backend", "vllm", "--url",
                               fake_vllm, "--question", rec["question"]])
    assert code == 0, err
    tools = out.split("[turn 1] tools:\n")[1]
    assert any(t in tools.split("[turn 2]")[0] for t, _ in rec["supporting_facts"])  # passages from the index
    assert out.rstrip().endswith(f"answer: {rec['answer']}")
    assert "Question: " + rec["question"] in _FakeVLLM.tokenizer.decode(_FakeVLLM.requests[0]["prompt"])


@pytest.mark.parametrize("argv, code, msg", [
    (["{tmp}/nope", "--question", "q"], 2, "does not exist"),
    (["{tmp}", "--question", "q"], 2, "holds no model"),
    (["{ckpt}", "--tools", "abacus", "--question", "q"], 2, "unknown tool 'abacus'; available: "),
    (["{ckpt}", "--tools", "search", "--question", "q"], 2, "the search tool needs --index-dir"),
    (["{ckpt}", "--tools", "search", "--search-url", "127.0.0.1:8765", "--question", "q"], 2,
     "--search-url must look like http://127.0.0.1:8765"),
    (["{ckpt}", "--tools", "search", "--index-dir", "{tmp}", "--question", "q"], 2, "is not a saved retriever"),
    (["{ckpt}", "--tools", "calculator", "--backend", "vllm", "--question", "q"], 2, "--backend vllm needs --url"),
    (["{ckpt}", "--tools", "calculator", "--backend", "vllm", "--url", "localhost:8000", "--question", "q"], 2,
     "--url must look like http://host:port/v1"),
    (["{ckpt}", "--tools", "calculator", "--backend", "vllm", "--url", "http://127.0.0.1:9/v1", "--question", "q"], 1,
     "cannot reach an OpenAI-compatible server at http://127.0.0.1:9/v1"),
    (["{ckpt}", "--tools", "calculator", "--question", " "], 2, "--question is empty"),
    (["{ckpt}", "--tools", "calculator", "--max-turns", "0", "--question", "q"], 2, "must be positive"),
])
def test_bad_input_is_named(ckpt, tmp_path, argv, code, msg):
    argv = [a.format(tmp=tmp_path, ckpt=ckpt) for a in argv]
    got, out, err = run_main(argv)
    assert got == code and msg in err, (got, err)
    assert "Traceback" not in out + err


def test_command_line_has_no_traceback(ckpt, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    res = subprocess.run([sys.executable, "scripts/chat.py", str(tmp_path / "missing"), "--question", "q"],
                         cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 2 and "does not exist" in res.stderr and "Traceback" not in res.stderr
    res = subprocess.run([sys.executable, "scripts/chat.py", "--backend", "tpu", str(ckpt)],
                         cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 2 and "invalid choice: 'tpu'" in res.stderr


def test_a_verl_checkpoint_without_weights_says_how_to_merge(ckpt, tmp_path):
    "verl keeps config and tokenizer in actor/huggingface; without hf_model in save_contents the weights are shards."
    import shutil

    hf = tmp_path / "global_step_3" / "actor" / "huggingface"
    shutil.copytree(ckpt / "policy", hf)
    assert chat.model_folder(str(tmp_path / "global_step_3")) == hf  # with weights (hf_model saved): loads
    for w in hf.glob("*.safetensors"):
        w.unlink()
    with pytest.raises(chat.UsageError, match="no weights.*verl.model_merger merge --backend fsdp"):
        chat.model_folder(str(tmp_path / "global_step_3"))
