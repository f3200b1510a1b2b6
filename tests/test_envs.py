"""Tests for agent_r1_tutorial.envs beyond nbs/05_envs.ipynb: the environment contract on random action sequences
(no step after the end, budgets respected, rewards accounted), the context policies, and the transcript."""
import asyncio
import json
import math
import time

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from agent_r1_tutorial.envs import (
    Action, AgentEnv, ContextBudget, FullHistory, Observation, Summarize, ToolEnv, Transcript, TrimToolOutputs,
    approx_token_count, chat_token_counter, list_envs, make_env, register_env, step_envs,
)
from agent_r1_tutorial.search import BM25Retriever, SearchTool, toy_corpus
from agent_r1_tutorial.tools import BaseTool, HermesFormat, SearchR1Format, ToolCall, ToolResult

H = HermesFormat()
DOCS, QUESTIONS = toy_corpus(20, seed=1)
SEARCH = SearchTool(BM25Retriever(DOCS), k=2, max_chars=400, found_reward=0.1, empty_reward=-0.05)

ACTIONS = [
    H.format_calls([ToolCall("calculator", {"expression": "6 * 7"})]),
    H.format_calls([ToolCall("calculator", {"expression": "1/0"})]),  # a valid call whose tool reports an error
    H.format_calls([ToolCall("search", {"query": DOCS[0].title})]),
    H.format_calls([ToolCall("search", {"query": "qqqzzz"})]),  # finds nothing
    H.format_calls([ToolCall("calculator", {"expression": "1+1"}), ToolCall("search", {"query": "river"})]),
    "<tool_call>{'name': 'calculator'}</tool_call>",  # not JSON
    '<tool_call>{"name": "nope", "arguments": {}}</tool_call>',  # unknown tool
    '<tool_call>{"name": "calculator", "arguments": {"expr": "1"}}</tool_call>',  # invalid arguments
    '<tool_call>{"name": "calculator", "arguments": {"expression": "2+2"}}',  # cut off
    "<answer>42</answer>",
    "I think the answer is 42.",  # neither a call nor an answer
    "",
    "<search>river</search>",  # the other format's tags: plain text to Hermes
    H.format_calls([ToolCall("search", {"query": f"{d.title} river founded"}) for d in DOCS[:4]]),  # long results
]
REASONS = {"answer", "no_tool_call", "max_turns", "max_tokens"}


def summarize(old):
    return f"{len(old)} earlier messages."


POLICIES = [FullHistory(), TrimToolOutputs(keep_last=1, shorten_to=50), Summarize(summarize, keep_last_turns=1)]


def reward_fn(answer, task):
    return float(answer == task["ground_truth"])


@given(seq=st.lists(st.sampled_from(range(len(ACTIONS))), min_size=1, max_size=8),
       max_turns=st.integers(1, 5), extra_tokens=st.one_of(st.none(), st.integers(0, 600)),
       policy=st.sampled_from(range(len(POLICIES))), invalid=st.floats(-1, 0))
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_contract_on_random_action_sequences(seq, max_turns, extra_tokens, policy, invalid):
    probe = ToolEnv(["calculator", SEARCH])
    prompt_tokens = approx_token_count(probe.reset(question="What is 6 * 7?").messages)
    max_tokens = None if extra_tokens is None else prompt_tokens + extra_tokens
    env = ToolEnv(["calculator", SEARCH], max_turns=max_turns, max_tokens=max_tokens, context_policy=POLICIES[policy],
                  invalid_call_reward=invalid, reward_fn=reward_fn)
    obs = env.reset(question="What is 6 * 7?", ground_truth="42")
    history = list(env.history)
    steps = 0
    for i in seq:
        if env.done:
            break
        obs, reward, terminated, truncated, info = env.step(ACTIONS[i])
        steps += 1
        # history only grows, by the action and then the tool messages
        assert env.history[: len(history)] == history and env.history[len(history)] == {"role": "assistant", "content": ACTIONS[i]}
        history = list(env.history)
        assert env.turn == steps <= max_turns
        assert math.isfinite(reward) and not (terminated and truncated)
        assert info["n_calls"] == info["n_valid_calls"] + info["n_invalid_calls"] == len(info["tool_rewards"])
        expected = sum(info["tool_rewards"]) + (info["outcome_reward"] or 0.0)
        assert reward == pytest.approx(expected)
        assert all(r == invalid for r, res in zip(info["tool_rewards"], info["tool_results"]) if not res.ok)
        if isinstance(POLICIES[policy], FullHistory):
            assert obs.messages == env.history
        if info["parse_errors"] and info["answer"] is None:  # every malformed call became an error observation
            errs = [m["content"] for m in env.history[-info["n_calls"]:]]
            assert sum(e.startswith("Error") for e in errs) >= len(info["parse_errors"])
        if terminated or truncated:
            assert info["reason"] in REASONS and env.end_reason == info["reason"]
            assert (info["reason"] in ("answer", "no_tool_call")) == terminated
            if info["reason"] == "max_turns":
                assert env.turn == max_turns
            if info["reason"] == "max_tokens":
                assert max_tokens is not None and approx_token_count(obs.messages) > max_tokens
        else:
            assert info["reason"] is None
            if max_tokens is not None:  # the model is never asked to act on a context over the budget
                assert approx_token_count(obs.messages) <= max_tokens
    assert len(env.step_rewards) == len(env.tool_rewards) == len(env.infos) == steps
    if env.done:
        with pytest.raises(RuntimeError, match="the episode has ended"):
            env.step("again")
        obs = env.reset(question="Once more?", ground_truth="x")  # a finished environment can start over
        assert not env.done and env.turn == 0 and env.step_rewards == []


def test_endings_and_rewards():
    env = ToolEnv(["calculator"], max_turns=3, reward_fn=reward_fn, invalid_call_reward=-0.2)
    env.reset(question="q", ground_truth="42")
    _, r, term, trunc, info = env.step(ACTIONS[5])
    assert (r, term, trunc, info["n_invalid_calls"]) == (-0.2, False, False, 1)
    assert info["tool_results"][0].info["error"] == "parse_error"
    _, r, term, trunc, info = env.step(ACTIONS[0] + "\n<answer>42</answer>")  # answer wins; the call is not run
    assert (r, term, info["reason"], info["ignored_calls"], info["n_calls"]) == (1.0, True, "answer", 1, 0)
    env.reset(question="q", ground_truth="42")
    *_, info = env.step("no call here")
    assert info["reason"] == "no_tool_call" and info["outcome_reward"] == 0.0


def test_step_before_reset_and_concurrent_steps():
    env = ToolEnv(["calculator"])
    with pytest.raises(RuntimeError, match="call reset\\(\\) before step\\(\\)"):
        env.step("x")

    class Slow(BaseTool):
        name = "slow_env_test"
        description = "sleeps"

        async def aexecute(self, arguments):
            await asyncio.sleep(0.2)
            return ToolResult("ok")
    env = ToolEnv([Slow()])
    env.reset(question="q")
    call = H.format_calls([ToolCall("slow_env_test", {})])

    async def both():
        return await asyncio.gather(env.astep(call), env.astep(call), return_exceptions=True)
    first, second = asyncio.run(both())
    assert isinstance(first, tuple) and isinstance(second, RuntimeError) and "another step" in str(second)


def test_bad_tasks_and_settings():
    env = ToolEnv(["calculator"], max_tokens=50)
    with pytest.raises(ValueError, match="more than max_tokens=50"):
        env.reset(question="long " * 200)
    with pytest.raises(ValueError, match="exactly one of them"):
        env.reset(question="a", prompt="b")
    with pytest.raises(TypeError, match="prompt must be"):
        ToolEnv(["calculator"]).reset(prompt=[{"no": "role"}])
    with pytest.raises(ValueError, match="max_tokens must be"):
        ToolEnv(["calculator"], max_tokens=0)
    with pytest.raises(ValueError, match="unknown tool"):
        ToolEnv(["no_such_tool"])
    with pytest.raises(ValueError, match="unknown format"):
        ToolEnv(["calculator"], tool_format="xml")
    with pytest.raises(TypeError, match="must be an Action or a str"):
        e = ToolEnv(["calculator"])
        e.reset(question="q")
        e.step(123)


def test_prompts_and_system_messages():
    env = ToolEnv(["calculator"])
    obs = env.reset(prompt=[{"role": "system", "content": "You are terse."}, {"role": "user", "content": "2+2?"}])
    assert obs.messages[0]["content"].startswith("You are terse.\n\n") and "<answer>" in obs.messages[0]["content"]
    assert len(obs.messages) == 2 and obs.tools[0]["function"]["name"] == "calculator"
    obs.messages.append({"role": "user", "content": "injected"})  # an observation is a copy
    assert len(env.context) == 2
    env = ToolEnv(["calculator"], system_prompt=None)
    assert [m["role"] for m in env.reset(question="q").messages] == ["user"]


def test_max_calls_per_turn_and_process_rewards():
    seen = []

    def bonus(call, result, task):
        seen.append((call.name if call else None, result.ok))
        return 0.5 if call is not None and call.name == "search" and task["gold"] in result.info.get("doc_ids", []) else None
    env = ToolEnv(["calculator", SEARCH], max_calls_per_turn=2, process_reward_fn=bonus)
    env.reset(question="q", gold=DOCS[0].id)
    calls = [ToolCall("search", {"query": DOCS[0].title}), ToolCall("search", {"query": "qqqzzz"}),
             ToolCall("calculator", {"expression": "1"})]
    _, r, _, _, info = env.step(H.format_calls(calls))
    assert info["tool_rewards"] == [0.5, -0.05, -0.1]  # gold found; found nothing; refused (third call)
    assert info["tool_results"][2].info["error"] == "too_many_calls" and r == pytest.approx(0.35)
    assert seen == [("search", True), ("search", True)]


def test_search_r1_environment_and_trimming_its_information():
    env = ToolEnv([SEARCH], tool_format="search_r1", max_turns=6, max_tokens=400,
                  context_policy=TrimToolOutputs(keep_last=1, shorten_to=20))
    obs = env.reset(question="Tell me about the towns.")
    assert obs.tools is None and "<search>" in obs.messages[0]["content"]
    for d in DOCS[:5]:
        if env.done:
            break
        obs, *_ = env.step(f"<search>{d.title} river founded</search>")
        assert obs.messages[-1]["role"] == "user" and obs.messages[-1]["content"].startswith("<information>")
    infos = [m["content"] for m in obs.messages if m["content"].startswith("<information>")]
    assert infos[-1].endswith("</information>")  # the newest is whole
    assert any("[shortened]" in m or "removed" in m for m in infos[:-1])  # older ones were trimmed


def test_step_envs_runs_a_batch_concurrently():
    class Wait(BaseTool):
        name = "wait_env_test"
        description = "waits"

        async def aexecute(self, arguments):
            await asyncio.sleep(0.25)
            return ToolResult("done")
    envs = [ToolEnv([Wait()]) for _ in range(6)]
    for e in envs:
        e.reset(question="q")
    t0 = time.perf_counter()
    out = step_envs(envs, [H.format_calls([ToolCall("wait_env_test", {})])] * 6)
    assert time.perf_counter() - t0 < 1.0 and all(o[0].messages[-1]["content"] == "done" for o in out)
    with pytest.raises(ValueError, match="6 environments but 1 actions"):
        step_envs(envs, ["x"])


def test_registry_and_dataset_rows(tmp_path):
    BM25Retriever(DOCS).save(tmp_path / "idx")
    row = {"env": {"name": "tool", "kwargs": {"tools": ["calculator", {"name": "search", "index_dir": str(tmp_path / "idx")}],
                                              "max_turns": 2}}}
    row = json.loads(json.dumps(row))  # what a parquet row gives back: plain JSON
    env = make_env(row["env"]["name"], **row["env"]["kwargs"])
    assert isinstance(env, ToolEnv) and sorted(env.tools) == ["calculator", "search"] and "tool" in list_envs()
    with pytest.raises(TypeError, match="AgentEnv subclass"):
        register_env(dict)
    with pytest.raises(ValueError, match="unknown environment"):
        make_env("nope")


def test_a_broken_subclass_is_caught():
    class Broken(AgentEnv):
        def _reset(self, **task):
            return Observation([{"role": "user", "content": "hi"}])

        def _step(self, action):
            return "not a tuple"

    class NaNReward(Broken):
        def _step(self, action):
            return Observation([]), float("nan"), False, False, {}
    b = Broken()
    b.reset()
    with pytest.raises(TypeError, match="5-tuple"):
        b.step("x")
    n = NaNReward()
    n.reset()
    with pytest.raises(ValueError, match="not a finite number"):
        n.step("x")


# ---------------------------------------------------------------- context policies

messages_st = st.lists(st.tuples(st.sampled_from(["assistant", "tool", "user"]), st.text(max_size=300)),
                       min_size=0, max_size=12)


@given(body=messages_st, max_tokens=st.integers(10, 400), keep_last=st.integers(0, 3), shorten_to=st.integers(0, 80),
       trim_to=st.sampled_from([1.0, 0.75, 0.5, 0.1]))
@settings(max_examples=200, deadline=None)
def test_trim_keeps_what_it_must(body, max_tokens, keep_last, shorten_to, trim_to):
    prompt = [{"role": "system", "content": "s" * 40}, {"role": "user", "content": "the task"}]
    msgs = prompt + [{"role": r, "content": c} for r, c in body]
    budget = ContextBudget(approx_token_count, max_tokens, n_protected=2)
    out = TrimToolOutputs(keep_last=keep_last, shorten_to=shorten_to, trim_to=trim_to)(msgs, budget)
    assert len(out) == len(msgs) and out[:2] == prompt
    tool_idx = [i for i, m in enumerate(msgs) if i >= 2 and m["role"] == "tool"]
    newest = set(tool_idx[max(0, len(tool_idx) - keep_last):])
    for i, (a, b) in enumerate(zip(msgs, out)):
        assert a["role"] == b["role"]
        if i not in tool_idx or i in newest:
            assert a == b  # the prompt, the model's messages and the newest tool outputs are never touched
        assert len(b["content"]) <= len(a["content"])  # a trim never lengthens a message
    if budget.fits(msgs):
        assert out == msgs
    # the most a trim can remove: each old output shortened, then replaced by the (shorter) placeholder
    floor = [dict(m) for m in msgs]
    for i in [j for j in tool_idx if j not in newest]:
        c = floor[i]["content"]
        if len(c) > shorten_to + len(" …[shortened]"):
            c = c[:shorten_to].rstrip() + " …[shortened]"
        placeholder = "[earlier tool output removed to save space]"
        floor[i]["content"] = placeholder if len(placeholder) < len(c) else c
    if budget.fits(floor):
        assert budget.fits(out)
    target = ContextBudget(approx_token_count, int(max_tokens * trim_to), n_protected=2)
    if not budget.fits(msgs) and target.fits(floor):
        assert target.fits(out)  # over the limit, it trims down to trim_to's share where that can be reached


@given(body=messages_st, keep=st.integers(0, 3))
@settings(max_examples=100, deadline=None)
def test_summarize_keeps_the_prompt_and_the_last_turns(body, keep):
    prompt = [{"role": "user", "content": "the task"}]
    msgs = prompt + [{"role": r, "content": c} for r, c in body]
    budget = ContextBudget(approx_token_count, 5, n_protected=1)  # always over budget
    out = Summarize(lambda old: f"{len(old)} old", keep_last_turns=keep)(msgs, budget)
    assert out[0] == prompt[0]
    starts = [i for i, m in enumerate(msgs) if i >= 1 and m["role"] == "assistant"]
    if len(starts) > keep:
        cut = starts[len(starts) - keep] if keep else len(msgs)
        assert out[1]["content"].startswith("Summary of the earlier steps:") and out[2:] == msgs[cut:]
    else:
        assert out == msgs


def test_summarize_must_return_text():
    msgs = [{"role": "user", "content": "t"}, {"role": "assistant", "content": "a" * 100}, {"role": "assistant", "content": "b"}]
    with pytest.raises(TypeError, match="must return a str"):
        Summarize(lambda old: 3)(msgs, ContextBudget(approx_token_count, 5, 1))


def test_exact_token_counter():
    from agent_r1_tutorial.tinylm import build_tiny_lm
    tok, _ = build_tiny_lm()
    env = ToolEnv(["calculator"], tokenizer=tok, max_tokens=2000)
    obs = env.reset(question="What is 2+2?")
    text = tok.apply_chat_template(obs.messages, tools=obs.tools, tokenize=False, add_generation_prompt=True)
    assert env.count_tokens(obs.messages) == len(tok(text, add_special_tokens=False).input_ids)
    *_, info = env.step(ACTIONS[0])
    assert info["n_tokens"] == chat_token_counter(tok, obs.tools)(env.context)


# ---------------------------------------------------------------- transcripts


def test_transcript_escapes_and_labels():
    msgs = [{"role": "user", "content": "<script>alert(1)</script>"}, {"role": "assistant", "content": "<answer>x</answer>"}]
    t = Transcript(msgs, step_rewards=[1.0], reasons=["answer"], n_prompt=1, title="t & t")
    h = t.to_html()
    assert "<script>" not in h and "&lt;script&gt;" in h and "t &amp; t" in h
    assert "step 1 · reward +1.00 · ended: answer" in h and "#2b8a3e" in h  # the assistant's colour
    assert t._repr_html_() == h
    s = str(t)
    assert "--- assistant  [step 1 · reward +1.00 · ended: answer]" in s and "<answer>x</answer>" in s


def test_env_transcript_marks_tool_results_of_either_format():
    env = ToolEnv([SEARCH], tool_format="search_r1", max_turns=2)
    env.reset(question="q")
    env.step(f"<search>{DOCS[0].title}</search>")
    h = env.transcript().to_html()
    assert "USER (TOOL RESULTS)" in h and "#d9480f" in h
