#!/usr/bin/env python3
"""Chat with a trained checkpoint, with the same tools live.

The agent answers each question the way it was trained to: the same chat template, the same prompt template, the same
tools (search over an index, the calculator) and the same agent loop (`verl_bridge.run_agent_episode`), with every
turn printed as it happens: the model's reply, the tools' results, the answer.

    python scripts/chat.py runs/<run>/checkpoints/global_step_200 --tools calculator --question "What is 17 * 23?"
    python scripts/chat.py merged/ --tools search --index-dir data/index-bge-large-en-v1.5     # a REPL
    python scripts/chat.py merged/ --tools search --search-url http://127.0.0.1:8765          # a running service
    python scripts/chat.py merged/ --tools search --index-dir ... --backend vllm --url http://localhost:8000/v1

Backends: `hf` loads the checkpoint with transformers (CPU or GPU) and samples token ids exactly, as the trainer's
rollouts do; `vllm` sends the same prompt ids to an OpenAI-compatible server (`vllm serve <merged checkpoint>`), which
answers with text that is encoded again (fine for chatting; training keeps sampled ids instead).

The search tool asks a retrieval service (chapter 04a), as training does: --index-dir starts one over that index for the
session, on 127.0.0.1, and stops it at the end; --search-url uses one that is already running.
"""
from __future__ import annotations

import argparse
import asyncio
import atexit
import json
import re
import sys
import urllib.error
import urllib.request
from pathlib import Path

TEMPLATES = {"auto": None, "hotpotqa": "HOTPOTQA_PROMPT", "gsm8k": "GSM8K_PROMPT", "plain": "{question}"}
TOOL_DEFAULTS = {"search": {"k": 3, "max_chars": 1000}, "calculator": {"max_exponent": 1000}}


class UsageError(ValueError):
    "Bad input on the command line: reported with the usage line, exit status 2."


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python scripts/chat.py", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[2:]))
    ap.add_argument("checkpoint", help="a Hugging Face model folder (config.json and weights, e.g. verl's merged "
                    "checkpoint), or a trainer checkpoint holding one in policy/")
    ap.add_argument("--tools", default="search", help="comma-separated tools: search, calculator (default: search)")
    ap.add_argument("--index-dir", default=None, help="the retriever folder the search tool loads "
                    "(build_corpus_index or a saved BM25 index)")
    ap.add_argument("--search-url", default=None, help="a running retrieval service for the search tool "
                    "(scripts/retrieval_server.py); default: start one over --index-dir for this session")
    ap.add_argument("--question", default=None, help="answer this one question and exit (no REPL)")
    ap.add_argument("--backend", choices=("hf", "vllm"), default="hf", help="hf: transformers (default); vllm: an "
                    "OpenAI-compatible server at --url")
    ap.add_argument("--url", default=None, help="the server's API root for --backend vllm, e.g. http://localhost:8000/v1")
    ap.add_argument("--model-name", default=None, help="the served model's name (default: the server's first model)")
    ap.add_argument("--device", default=None, help="hf backend: cpu or cuda (default: cuda when available)")
    ap.add_argument("--template", choices=tuple(TEMPLATES), default="auto", help="the training prompt around the "
                    "question: hotpotqa, gsm8k, plain, or auto (hotpotqa with search, gsm8k with the calculator alone)")
    ap.add_argument("--tool-format", default="hermes", help="the tool-call format (default hermes)")
    ap.add_argument("--max-turns", type=int, default=5, help="model replies per question (default 5)")
    ap.add_argument("--max-response-length", type=int, default=4096,
                    help="tokens after the prompt per question, tool results included (default 4096)")
    ap.add_argument("--temperature", type=float, default=0.0, help="0 (default): greedy; above 0: sampled")
    ap.add_argument("--seed", type=int, default=0, help="sampling seed (hf backend)")
    ap.add_argument("--show-chars", type=int, default=600, help="print at most this much of each tool result")
    return ap


WEIGHTS = ("*.safetensors", "*.bin", "*.safetensors.index.json", "*.bin.index.json")


def model_folder(path: str) -> Path:
    "The Hugging Face folder inside a checkpoint path, or a clear error."
    p = Path(path).expanduser()
    if not p.exists():
        raise UsageError(f"checkpoint folder {str(p)!r} does not exist")
    for cand in (p, p / "policy", p / "huggingface", p / "actor" / "huggingface"):
        if (cand / "config.json").is_file():
            if not any(next(cand.glob(w), None) for w in WEIGHTS):
                # verl's checkpoints keep config and tokenizer in actor/huggingface, and the weights there only when
                # the run saved hf_model (our runs do); otherwise the weights are FSDP shards that need merging
                raise UsageError(
                    f"{str(cand)!r} holds a config.json but no weights. For a verl checkpoint saved without hf_model, "
                    "merge its shards first: python -m verl.model_merger merge --backend fsdp --local_dir "
                    f"{cand.parent} --target_dir merged/   then: python scripts/chat.py merged/ ...")
            return cand
    raise UsageError(f"{str(p)!r} holds no model: expected config.json there (a Hugging Face folder, e.g. verl's "
                     "merged checkpoint), in policy/ (a checkpoint of the reference trainer) or in actor/huggingface/ "
                     "(a verl checkpoint)")


def tool_specs(args) -> dict:
    "The rows' tools_kwargs for the requested tools, checked (search: its service's url is filled in by `build`)."
    import agent_r1_tutorial.retrieval_server  # noqa: F401  (registers the search tools)
    from agent_r1_tutorial.tools import list_tools

    names = [t.strip() for t in args.tools.split(",") if t.strip()]
    if not names:
        raise UsageError("--tools names no tool")
    unknown = [t for t in names if t not in list_tools()]
    if unknown:
        raise UsageError(f"unknown tool {unknown[0]!r}; available: {', '.join(list_tools())}")
    kwargs = {t: {"create_kwargs": dict(TOOL_DEFAULTS.get(t, {}))} for t in names}
    if "search" in names:  # the model sees `search`; it runs as search_service, over the retrieval service
        if args.search_url:
            if not re.match(r"^https?://[^/\s]+/?$", args.search_url):
                raise UsageError(f"--search-url must look like http://127.0.0.1:8765, got {args.search_url!r}")
        elif not args.index_dir:
            raise UsageError("the search tool needs --index-dir (a folder written by build_corpus_index) "
                             "or --search-url (a running retrieval service)")
        else:
            idx = Path(args.index_dir).expanduser()
            if not (idx / "config.json").is_file():
                raise UsageError(f"--index-dir {str(idx)!r} is not a saved retriever (no config.json)")
        kwargs = {("search_service" if t == "search" else t): v for t, v in kwargs.items()}
        kwargs["search_service"]["create_kwargs"]["url"] = args.search_url
    return kwargs


def search_service(args, tools_kwargs: dict):
    "Start a retrieval service over --index-dir for this session (stopped at exit), unless --search-url names one."
    if "search_service" not in tools_kwargs or args.search_url:
        return None
    from agent_r1_tutorial.retrieval_server import RetrievalServer

    service = RetrievalServer(index_dirs={"default": Path(args.index_dir).expanduser()}, device=args.device or "cpu")
    atexit.register(service.stop)
    tools_kwargs["search_service"]["create_kwargs"]["url"] = service.start()
    return service


def prompt_template(args, tools: list[str]) -> str:
    from agent_r1_tutorial import verl_data as vd

    name = args.template
    if name == "auto":
        name = "hotpotqa" if "search_service" in tools else "gsm8k" if tools == ["calculator"] else "plain"
    t = TEMPLATES[name]
    return getattr(vd, t) if t.isupper() else t


class OpenAICompletionsServer:
    "verl's server-manager interface (`async generate`) over an OpenAI-compatible server, with the standard library."

    def __init__(self, url: str, tokenizer, model: str | None = None, timeout: float = 300):
        if not re.match(r"^https?://[^/\s:]+(:\d+)?(/\S*)?$", url or ""):
            raise UsageError(f"--url must look like http://host:port/v1, got {url!r}")
        self.url, self.tokenizer, self.timeout = url.rstrip("/"), tokenizer, timeout
        self.model = model or self._request("/models")["data"][0]["id"]

    def _request(self, path: str, body: dict | None = None) -> dict:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"the server at {self.url} answered {path} with HTTP {e.code}: "
                               f"{e.read()[:300].decode(errors='replace')}") from None
        except (urllib.error.URLError, OSError) as e:
            raise RuntimeError(f"cannot reach an OpenAI-compatible server at {self.url} "
                               f"({getattr(e, 'reason', e)}); start one with `vllm serve <checkpoint>`") from None
        except json.JSONDecodeError:
            raise RuntimeError(f"the server at {self.url} did not answer {path} with JSON") from None

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        from agent_r1_tutorial.verl_bridge import TokenIds

        n = int(sampling_params.get("max_tokens") or 512)
        body = {"model": self.model, "prompt": list(prompt_ids), "max_tokens": n,
                "temperature": float(sampling_params.get("temperature", 0.0)), "skip_special_tokens": False}
        res = await asyncio.to_thread(self._request, "/completions", body)
        try:
            choice = res["choices"][0]
            text, finish = choice["text"], choice.get("finish_reason")
        except (KeyError, IndexError, TypeError):
            raise RuntimeError(f"the server at {self.url} answered /completions without choices[0].text") from None
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        eos = self.tokenizer.eos_token_id
        if finish == "stop" and (not ids or ids[-1] != eos):
            ids.append(eos)  # the server stopped at the end of the turn and left the EOS out of the text
        return TokenIds(token_ids=ids[:n] or [eos], log_probs=None, stop_reason="completed")


def build(args):
    "Everything a conversation needs: tokenizer, server, and a function making a data row from a question."
    if args.max_turns < 1 or args.max_response_length < 1:
        raise UsageError("--max-turns and --max-response-length must be positive")
    if args.temperature < 0:
        raise UsageError("--temperature must be >= 0")
    if args.backend == "vllm" and not args.url:
        raise UsageError("--backend vllm needs --url (the server's API root, e.g. http://localhost:8000/v1)")
    folder = model_folder(args.checkpoint)
    tools_kwargs = tool_specs(args)
    tools = list(tools_kwargs)
    template = prompt_template(args, tools)
    search_service(args, tools_kwargs)

    import transformers
    from transformers import AutoTokenizer

    transformers.utils.logging.disable_progress_bar()  # no "Loading weights" bar between the turns
    tok = AutoTokenizer.from_pretrained(folder)
    if args.backend == "vllm":
        server = OpenAICompletionsServer(args.url, tok, args.model_name)
    else:
        import torch
        from transformers import AutoModelForCausalLM

        from agent_r1_tutorial.rollout import HFBackend
        from agent_r1_tutorial.verl_bridge import LocalServerManager

        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        model = AutoModelForCausalLM.from_pretrained(folder, dtype="auto").to(device)
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        backend = HFBackend(model, pad, generator=torch.Generator(device=device).manual_seed(args.seed))
        server = LocalServerManager(backend, tok, verl_types=False)

    def row(question: str) -> dict:
        return {"raw_prompt": [{"role": "user", "content": template.format(question=question.strip())}],
                "tools_kwargs": tools_kwargs,
                "extra_info": {"env_kwargs": {"env": "tool", "tools": tools, "tool_format": args.tool_format,
                                              "max_turns": args.max_turns}}}

    from agent_r1_tutorial.verl_bridge import env_from_row

    env_from_row(row("check"), tok)  # builds the tools once (loads the index): bad tool settings fail here
    return tok, server, row


def _show(text: str, n: int) -> str:
    text = text.strip()
    return text if len(text) <= n else text[:n] + f" …[{len(text) - n} more characters]"


def answer(question: str, tok, server, row, args, out=None) -> str | None:
    "Play one episode for `question`, printing every turn; return the final answer (None if there is none)."
    from agent_r1_tutorial.verl_bridge import env_from_row, run_agent_episode

    out = out or sys.stdout

    env, task = env_from_row(row(question), tok)

    def on_step(step):
        k = step.info.get("turn", 0) + 1
        print(f"[turn {k}] model:\n{_show(step.action_text, 4000)}", file=out)
        if step.feedback:
            print(f"[turn {k}] tools:\n{_show(step.feedback, args.show_chars)}", file=out)
        out.flush()

    sp = {"temperature": args.temperature}
    traj = asyncio.run(run_agent_episode(server, tok, env, task, sp, args.max_response_length, args.max_turns,
                                         on_step=on_step))
    final = traj.steps[-1].info.get("answer")
    if final is not None:
        print(f"answer: {final}", file=out)
    else:
        print(f"(no answer: the episode ended with {traj.reason})", file=out)
    return final


def main(argv=None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    try:
        tok, server, row = build(args)
        if args.question is not None:
            if not args.question.strip():
                raise UsageError("--question is empty")
            answer(args.question, tok, server, row, args)
            return 0
        print("Ask a question (an empty line, 'exit' or Ctrl-D ends).", flush=True)
        while True:
            try:
                q = input("you> ")
            except EOFError:
                print()
                return 0
            if q.strip().lower() in ("", "exit", "quit"):
                return 0
            answer(q, tok, server, row, args)
    except UsageError as e:
        ap.print_usage(sys.stderr)
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (ValueError, RuntimeError, OSError, ImportError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
