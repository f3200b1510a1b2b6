"""scripts/train_agent.py: the command line of chapter 16a (the chapter's own cells test the trainer and the agent)."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run(*args):
    res = subprocess.run([sys.executable, "scripts/train_agent.py", *args], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    return res.returncode, res.stdout, res.stderr


def test_load_agent_names_what_is_wrong(tmp_path):
    from agent_r1_tutorial.blackbox import AGENTS, httpx_agent, load_agent, openai_agent
    assert load_agent(AGENTS["openai"]) is openai_agent and load_agent(AGENTS["httpx"]) is httpx_agent
    mine = tmp_path / "mine.py"
    mine.write_text("def agent(base_url, task):\n    return 'x'\n")
    assert load_agent("mine.py:agent", str(tmp_path))("u", {}) == "x"  # a file, found from the launch's folder
    assert load_agent("mine:agent", str(tmp_path))("u", {}) == "x"  # a module beside the launch, not installed
    for spec, err, msg in [("nosuch", ValueError, "named 'module:function' or 'file.py:function', got 'nosuch'"),
                           ("no_such_module_xyz:f", ImportError, "cannot import the agent's module 'no_such_module_xyz'"),
                           ("math:no_such_name", ValueError, "math has no function 'no_such_name'"),
                           ("math:pi", ValueError, "math has no function 'pi'"),
                           (f"{tmp_path}/gone.py:agent", FileNotFoundError, "gone.py does not exist")]:
        with pytest.raises(err, match=msg):
            load_agent(spec)


def test_cli_refuses_bad_options_and_a_missing_run(tmp_path):
    code, _, err = _run("--agent", "math:pi")
    assert code == 2 and "--agent math:pi: math has no function 'pi'" in err
    code, _, err = _run("--steps", "0")
    assert code == 2 and "--steps must be a positive integer, got 0" in err
    code, _, err = _run("--run", str(tmp_path / "nothing"), "--out", str(tmp_path / "out"))
    assert code == 2 and "holds no model: run `bash speedrun.sh` first" in err
    assert not (tmp_path / "out").exists()  # nothing is written before the inputs are checked


# ------------------------------------------------------------------ `--agent` on verl (chapter 16a, at scale)
AGENT_FILE = '''"""A user's own agent: the openai package and httpx, nothing from agent_r1_tutorial."""
import json

import httpx
import openai

SEARCH = {"type": "function", "function": {"name": "search", "description": "Search the passages.", "parameters": {
    "type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}


def search(task, query):
    r = httpx.post(task["search_url"] + "/search", timeout=30,
                   json={"queries": [query], "collection": task["collection"], "k": task["k"]})
    return "\\n\\n".join(f"[{i + 1}] " + (f"{h['title']}\\n" if h["title"] else "") + h["text"]
                       for i, h in enumerate(r.json()["results"][0]))[:400]


def agent(base_url, task):
    client = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0)
    messages = [{"role": "user", "content": task["question"]}]
    for _ in range(task["max_turns"]):
        message = client.chat.completions.create(model="policy", messages=messages, tools=[SEARCH]).choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return message.content
        for call in message.tool_calls:
            query = json.loads(call.function.arguments).get("query", "")
            messages.append({"role": "tool", "tool_call_id": call.id, "content": search(task, query)})
'''


def _speedrun(*args, timeout=1800):
    res = subprocess.run(["bash", str(ROOT / "speedrun.sh"), *map(str, args)], cwd=ROOT, capture_output=True,
                         text=True, timeout=timeout)
    return res.returncode, res.stdout, res.stderr


@pytest.fixture(scope="module")
def agent_run(tmp_path_factory):
    """`bash speedrun.sh grpo --engine verl --agent my_agent.py:agent` on the CI preset: a user's agent in a file of its
    own, trained by verl's trainer on this CPU (2 GRPO steps), from the SFT model of a finished reference run."""
    pytest.importorskip("verl")
    out = tmp_path_factory.mktemp("runs")
    code, stdout, stderr = _speedrun("grpo", "--preset", "ci", "--set", "rl_steps=1", "--out", out)
    assert code == 0, (stdout + stderr)[-4000:]
    (out / "my_agent.py").write_text(AGENT_FILE)
    spec = f"{out / 'my_agent.py'}:agent"
    code, stdout, stderr = _speedrun("grpo", "--engine", "verl", "--agent", spec, "--preset", "ci", "--set",
                                     "rl_steps=2", "--out", out)
    assert code == 0, (stdout + stderr)[-4000:]
    run_dir = out / "tiny-search-grpo-s0-ci-verl-agent-agent"
    return {"dir": run_dir, "verl": run_dir / "verl", "stdout": stdout, "spec": spec}


@pytest.mark.slow
def test_verl_trains_a_users_agent_through_the_gateway_loop(agent_run):
    import json as _json
    import math

    import torch
    from transformers import AutoModelForCausalLM

    from agent_r1_tutorial.verl_data import read_rows
    from agent_r1_tutorial.verl_launch import read_verl_metrics

    assert "data and SFT stages from" in agent_run["stdout"]  # the finished run's SFT model, not a new one
    rows = read_rows(agent_run["verl"] / "data" / "train.parquet")
    assert {r["agent_name"] for r in rows} == {"ar1_gateway"} and {r["extra_info"]["agent"] for r in rows} == {
        agent_run["spec"]}
    episodes = [_json.loads(l) for f in (agent_run["verl"] / "episodes").glob("*.jsonl") for l in f.read_text().splitlines()]
    trained = [e for e in episodes if e.get("split") == "train"]
    assert len(trained) == 2 * 4 * 4  # 2 steps of 4 questions x 4 episodes, every one played by the user's agent
    assert all(e["agent"] == agent_run["spec"] and e["status"] in ("ended", "crashed") for e in episodes)
    for e in trained:  # each call's sampled ids under mask 1, nothing else; a call per model turn
        if e["calls"]:
            o = e["outputs"][0]
            assert len(o["response_ids"]) == len(o["response_mask"]) == len(o["response_logprobs"]) <= 512
            assert 0 < sum(o["response_mask"]) and e["num_steps"] == e["calls"]
    steps = [m for m in read_verl_metrics(agent_run["verl"]) if m["step"] >= 1 and "actor/pg_loss" in m]
    assert [m["step"] for m in steps] == [1, 2] and all(math.isfinite(m["actor/pg_loss"]) for m in steps)
    before = AutoModelForCausalLM.from_pretrained(agent_run["dir"] / "sft_model").state_dict()
    after = AutoModelForCausalLM.from_pretrained(agent_run["dir"] / "final_model").state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)  # the update reached the weights
    assert (agent_run["dir"] / "report.md").exists()


def test_speedrun_refuses_agent_options_it_cannot_run():
    for args, code, msg in [(["--agent", "openai", "--scale", "tiny"], 2, "--agent trains through verl: add --engine verl"),
                            (["--agent", "openai", "--task", "textworld"], 2, "--agent plays the search task"),
                            (["--agent", "nowhere.py:agent", "--engine", "verl", "--preset", "ci"], 1,
                             "--agent nowhere.py:agent: the agent's file"),
                            (["--agent", "math:tau", "--engine", "verl", "--preset", "ci"], 1,
                             "math has no function 'tau'")]:
        res = subprocess.run([sys.executable, "scripts/speedrun.py", "grpo", *args], cwd=ROOT, capture_output=True,
                             text=True, timeout=120)
        assert res.returncode == code and msg in res.stderr, res.stderr


def test_the_full_scale_dry_run_plays_the_agent_through_the_gateway_loop(tmp_path):
    "`bash speedrun.sh grpo --dry-run --agent openai`: rows, agent-loop file and launch name the gateway loop, and one"
    " episode of the agent, built as verl's worker builds it, runs on the tiny model and on a scripted searcher."
    pytest.importorskip("verl")
    import json

    code, stdout, stderr = _speedrun("grpo", "--dry-run", "--agent", "openai", "--out", tmp_path, timeout=600)
    assert code == 0, (stdout + stderr)[-4000:]
    run_dir, = tmp_path.glob("*-full-grpo-s0-dry")
    assert "agent_r1_tutorial.blackbox.Ar1GatewayLoop" in (run_dir / "agent_loop.yaml").read_text()
    assert f"agent_loop_config_path={run_dir / 'agent_loop.yaml'}" in (run_dir / "launch.sh").read_text()
    episodes = json.loads((run_dir / "agent_loop.json").read_text())
    assert {e["agent_loop"] for e in episodes.values()} == {"ar1_gateway -> agent_r1_tutorial.blackbox.Ar1GatewayLoop"}
    assert all(e["ids_and_masks_ok"] for e in episodes.values())
    searcher = episodes["scripted searcher"]  # the agent searched the dry run's retrieval service and answered right
    assert searcher["turns"] == 2 and searcher["tool_calls"] == 1 and searcher["reward_score"] == 1.0
    assert "ar1_gateway -> agent_r1_tutorial.blackbox.Ar1GatewayLoop" in json.loads(
        (run_dir / "validation.json").read_text())["agent_loop"]  # verl's agent-loop file, checked before launch
