"""The gateway (chapter 06a): a real HTTP server on 127.0.0.1, driven by the official `openai` client and by httpx.
The recorded ids must be exactly what the model sampled, and bad requests must get OpenAI's 4xx error objects."""
import json
import threading
import time

import httpx
import openai
import pytest
import torch

from agent_r1_tutorial.gateway import Gateway, GatewayError, GatewayServer, collect, episode_trajectory
from agent_r1_tutorial.masks import growing_layout, initial_prompt_ids
from agent_r1_tutorial.rollout import HFBackend, PolicyBackend, ScriptedBackend
from agent_r1_tutorial.tinylm import build_tiny_lm

SEARCH = {"type": "function", "function": {"name": "search", "description": "Search.", "parameters": {
    "type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}


@pytest.fixture(scope="module")
def tiny():
    return build_tiny_lm()


def compact_caller(query: str, answer: str):
    "A scripted model that writes its tool call as compact JSON (not the template's layout), then answers."
    def model(ctx):
        if "<tool_response>" not in ctx:
            return '<tool_call>{"name":"search","arguments":{"query":"' + query + '"}}</tool_call>'
        return f"<answer>{answer}</answer>"
    return model


class Spy(PolicyBackend):
    "Passes generate through, keeping every Generation it returned: what the model sampled, as the backend saw it."

    def __init__(self, inner):
        self.inner, self.seen = inner, []
        self.lock = threading.Lock()

    def generate(self, contexts, params, keys=None, max_new_tokens=None):
        out = self.inner.generate(contexts, params, keys, max_new_tokens)
        with self.lock:
            self.seen += [(list(c), g) for c, g in zip(contexts, out)]
        return out


def _check_recorded(gw, episode_id, spy, tok):
    "Each call's prompt and reply ids are the backend's, and the trajectory trains on exactly the sampled ids."
    ep = gw.episodes[episode_id]
    for call in ep.calls:
        (ctx, g), = [(c, g) for c, g in spy.seen if c == call.prompt_ids]
        assert call.choices[0].token_ids == g.token_ids and call.choices[0].logprobs == g.logprobs
    for prev, call in zip(ep.calls, ep.calls[1:]):  # each prompt extends the last one by the sampled reply, as sampled
        assert call.prompt_ids[:call.reused] == prev.prompt_ids + prev.choices[0].token_ids
    traj = episode_trajectory(ep, tok)
    row = growing_layout(traj)
    assert [i for i, m in zip(row["response_ids"], row["response_mask"]) if m] == [
        i for call in ep.calls for i in call.choices[0].token_ids]
    assert [lp for lp, m in zip(row["response_logprobs"], row["response_mask"]) if m] == pytest.approx(
        [lp for call in ep.calls for lp in call.choices[0].logprobs])
    return traj


def test_openai_client_sampled_chat_records_the_sampled_ids(tiny):
    tok, model = tiny
    spy = Spy(HFBackend(model, tok.pad_token_id, generator=torch.Generator().manual_seed(0)))
    gw = Gateway(spy, tok)
    with GatewayServer(gw) as server:
        assert server.url.startswith("http://127.0.0.1:")
        client = openai.OpenAI(base_url=server.episode_url("chat"), api_key="none", max_retries=0)
        messages = [{"role": "user", "content": "Tell me about rivers."}]
        for _ in range(3):
            m = client.chat.completions.create(model="policy", messages=messages, max_tokens=16).choices[0].message
            messages += [m.model_dump(exclude_none=True), {"role": "user", "content": "Go on."}]
    gw.end("chat", 0.5)
    traj = _check_recorded(gw, "chat", spy, tok)
    assert traj.num_steps == 3 and traj.is_append_only() and traj.outcome_reward == 0.5
    assert all(c.reused for c in gw.episodes["chat"].calls[1:])


def test_openai_function_calling_round_trip(tiny):
    "The model writes compact JSON; the client gets tool_calls, sends them back as data; the ids stay the sampled ones."
    tok, _ = tiny
    spy = Spy(ScriptedBackend(tok, compact_caller("Nile", "Egypt")))
    gw = Gateway(spy, tok)
    with GatewayServer(gw, api_key="secret") as server:
        client = openai.OpenAI(base_url=server.episode_url("fc"), api_key="secret", max_retries=0)
        messages = [{"role": "user", "content": "Where does the Nile end?"}]
        r = client.chat.completions.create(model="policy", messages=messages, tools=[SEARCH])
        m = r.choices[0].message
        assert r.choices[0].finish_reason == "tool_calls" and m.tool_calls[0].function.name == "search"
        assert json.loads(m.tool_calls[0].function.arguments) == {"query": "Nile"}
        messages += [m.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": m.tool_calls[0].id, "content": "The Nile ends in Egypt."}]
        r = client.chat.completions.create(model="policy", messages=messages, tools=[SEARCH])
        assert r.choices[0].message.content == "<answer>Egypt</answer>" and r.usage.prompt_tokens > 0
        done = httpx.post(f"{server.url}/episodes/fc/end", json={"reward": 1.0},
                          headers={"Authorization": "Bearer secret"})
        assert done.json() == {"episode": "fc", "status": "ended", "reward": 1.0, "calls": 2}
    traj = _check_recorded(gw, "fc", spy, tok)
    second = gw.episodes["fc"].calls[1]
    assert initial_prompt_ids(tok, second.messages, second.tools) != second.prompt_ids  # text would feed other ids
    assert set(traj.steps[0].env_roles) == {"tool", "template"} and traj.steps[-1].reason == "ended"


def test_bad_requests_get_openai_error_objects(tiny):
    tok, _ = tiny
    def broken(ctx):
        raise RuntimeError("the model fell over")
    with GatewayServer(Gateway(ScriptedBackend(tok, lambda ctx: "ok"), tok), api_key="k") as server:
        client = openai.OpenAI(base_url=server.episode_url("e"), api_key="k", max_retries=0)
        ask = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}
        cases = [({"n": 0}, "n must be an integer from 1 to 8"), ({"temperature": 5}, "temperature must be"),
                 ({"stream": True}, "streaming is not supported"), ({"messages": []}, "messages must be a non-empty"),
                 ({"messages": [{"role": "wizard", "content": "x"}]}, "role must be one of"),
                 ({"tool_choice": "required"}, "tool_choice must be 'auto' or 'none'")]
        for extra, words in cases:
            with pytest.raises(openai.BadRequestError, match=words):
                client.chat.completions.create(**{**ask, **extra})
        with pytest.raises(openai.AuthenticationError, match="incorrect API key"):
            openai.OpenAI(base_url=server.episode_url("e"), api_key="wrong", max_retries=0).chat.completions.create(
                **ask)
        h = {"Authorization": "Bearer k"}
        r = httpx.post(f"{server.url}/v1/chat/completions", content=b"{not json", headers={**h, "X-Episode-Id": "j"})
        assert r.status_code == 400 and r.json()["error"]["message"] == "the request body is not valid JSON"
        r = httpx.post(f"{server.url}/v1/chat/completions", json=ask, headers=h)  # no episode id anywhere
        assert r.status_code == 400 and "no episode id" in r.json()["error"]["message"]
        r = httpx.post(f"{server.url}/v1/chat/completions", json=ask, headers={**h, "X-Episode-Id": "hdr"})
        assert r.status_code == 200 and "hdr" in server.gateway.episodes
        r = httpx.get(f"{server.url}/nowhere", headers=h)
        assert r.status_code == 404 and r.json()["error"]["message"] == "GET /nowhere: Not Found"
        assert httpx.post(f"{server.url}/episodes/e/end", json={"reward": "lots"}, headers=h).status_code == 400
        assert httpx.post(f"{server.url}/episodes/e/end", json={"reward": 0}, headers=h).status_code == 200
        with pytest.raises(openai.ConflictError, match="episode 'e' has ended"):
            client.chat.completions.create(**ask)
        server.gateway.backend = ScriptedBackend(tok, broken)
        with pytest.raises(openai.InternalServerError, match="the policy backend failed: RuntimeError: the model fell"):
            openai.OpenAI(base_url=server.episode_url("f"), api_key="k", max_retries=0).chat.completions.create(**ask)
        url = server.url
    with pytest.raises(httpx.HTTPError):  # stopped: nothing listens there any more
        httpx.get(f"{url}/health", timeout=2)


def test_collect_keeps_episodes_apart_and_marks_failures(tiny):
    "64 agents at once, each with its own number; one in four raises, one hangs past the timeout."
    tok, _ = tiny
    import re

    def model(ctx):
        if "<tool_response>" not in ctx:
            return '<tool_call>\n{"name": "search", "arguments": {"query": "' + re.findall(r"number (\d+)", ctx)[-1] \
                + '"}}\n</tool_call>'
        return "<answer>" + re.findall(r"heard (\d+)", ctx)[-1] + "</answer>"

    def agent(base_url, task):
        if task["n"] == 63:
            time.sleep(12)  # hangs past the timeout
        client = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0)
        messages = [{"role": "user", "content": f"Say the number {task['n']}."}]
        for _ in range(3):
            m = client.chat.completions.create(model="p", messages=messages, tools=[SEARCH]).choices[0].message
            if task["n"] % 4 == 1:
                raise ValueError(f"agent {task['n']} broke")
            messages.append(m.model_dump(exclude_none=True))
            if not m.tool_calls:
                return m.content
            messages.append({"role": "tool", "tool_call_id": m.tool_calls[0].id,
                             "content": "heard " + json.loads(m.tool_calls[0].function.arguments)["query"]})

    tasks = [{"n": n} for n in range(64)]
    with GatewayServer(Gateway(ScriptedBackend(tok, model), tok)) as server:
        t0 = time.monotonic()
        trajs = collect(server, agent, tasks, lambda a, t: float(a == f"<answer>{t['n']}</answer>"), workers=64,
                        timeout=6.0)  # room for 63 agents on a busy 2-core machine
        assert time.monotonic() - t0 < 11  # the hung agent did not hold the batch
    assert trajs[63] is None  # it never called the model: nothing to train on
    for t, task in zip(trajs[:63], tasks):
        assert f"Say the number {task['n']}." in tok.decode(t.steps[0].obs_ids)
        if task["n"] % 4 == 1:
            assert (t.metadata["status"], t.num_steps) == ("crashed", 1) and "broke" in t.metadata["error"]
        else:
            assert (t.metadata["status"], t.outcome_reward, t.num_steps) == ("ended", 1.0, 2)
            assert f"heard {task['n']}" in tok.decode(t.steps[0].env_ids)
    assert server.gateway.episodes[list(server.gateway.episodes)[-1]].status in ("ended", "crashed")


def test_stop_strings_and_n(tiny):
    tok, _ = tiny
    gw = Gateway(ScriptedBackend(tok, lambda ctx: "alpha beta STOP gamma"), tok)
    r = gw.complete("s", {"messages": [{"role": "user", "content": "go"}], "stop": ["STOP"], "n": 3})
    assert [c["message"]["content"] for c in r["choices"]] == ["alpha beta "] * 3
    kept = gw.episodes["s"].calls[0].choices[0]
    assert tok.decode(kept.token_ids).endswith("STOP") and kept.stop_reason == "stop_string"
    assert r["usage"]["prompt_tokens"] == len(initial_prompt_ids(tok, [{"role": "user", "content": "go"}]))


def test_concurrent_requests_are_batched_and_one_episode_is_one_conversation(tiny):
    tok, _ = tiny
    release = threading.Event()

    class Slow(PolicyBackend):  # holds the first batch until told, so that the others queue behind it
        def __init__(self):
            self.sizes = []

        def generate(self, contexts, params, keys=None, max_new_tokens=None):
            self.sizes.append(len(contexts))
            release.wait(10)
            return ScriptedBackend(tok, lambda ctx: "ok").generate(contexts, params, keys, max_new_tokens)

    backend = Slow()
    gw = Gateway(backend, tok)
    ask = {"messages": [{"role": "user", "content": "hi"}]}
    threads = [threading.Thread(target=gw.complete, args=(f"e{i}", ask)) for i in range(6)]
    for t in threads:
        t.start()
        time.sleep(0.05)
    from agent_r1_tutorial.gateway import GatewayError
    deadline = time.monotonic() + 10
    while "e5" not in gw._busy and time.monotonic() < deadline:  # e5's request is being answered
        time.sleep(0.01)
    with pytest.raises(GatewayError, match="already has a request in flight"):
        gw.complete("e5", ask)
    release.set()
    for t in threads:
        t.join(10)
    assert sum(backend.sizes) == 6 and len(backend.sizes) < 6  # the requests queued behind the first batch went together
    assert gw.stats == {"batches": len(backend.sizes), "requests": 6}
    assert all(len(gw.episodes[f"e{i}"].calls) == 1 for i in range(6))


def test_drift_is_measured_from_the_module_alone(tiny):
    "drift_cause and drift_table outside the chapter: compact JSON re-written by the template, and nothing else."
    tok, _ = tiny
    from agent_r1_tutorial.gateway import drift_cause, drift_table

    gw = Gateway(ScriptedBackend(tok, compact_caller("x", "y")), tok)
    msgs = [{"role": "user", "content": "q"}]
    reply = gw.complete("d", {"messages": msgs, "tools": [SEARCH]})["choices"][0]["message"]
    gw.complete("d", {"messages": msgs + [reply, {"role": "tool", "content": "found y"}], "tools": [SEARCH]})
    first, second = gw.episodes["d"].calls
    assert drift_cause(tok, first) is None and drift_cause(tok, second) == "tool-call JSON re-written"
    table = drift_table(tok, {"compact JSON": [gw.episodes["d"]]})
    assert table.loc["compact JSON"].to_dict() == {"calls": 1, "re-rendered from text: wrong ids": 1.0,
                                                    "prefix-matched: wrong ids": 0.0, "tool-call JSON re-written": 1}


def test_a_trainer_forces_its_sampling_settings(tiny):
    "Forced greedy: the same prompt twice gives the same ids, whatever temperature the agent asked for."
    tok, model = tiny
    gw = Gateway(HFBackend(model, tok.pad_token_id, generator=torch.Generator().manual_seed(0)), tok,
                 sampling={"temperature": 0, "max_tokens": 12})
    ask = {"messages": [{"role": "user", "content": "Tell me a story."}], "temperature": 2, "max_tokens": 200}
    ids = [gw.complete(f"g{i}", ask) and gw.episodes[f"g{i}"].calls[0].choices[0].token_ids for i in range(2)]
    assert ids[0] == ids[1] and len(ids[0]) <= 12
    gw.sampling = {}  # back to the agent's settings: temperature 2 now samples
    sampled = [gw.complete(f"s{i}", ask) and gw.episodes[f"s{i}"].calls[0].choices[0].token_ids for i in range(2)]
    assert sampled[0] != sampled[1]


def test_batch_wait_samples_one_turn_of_many_agents_in_one_backend_call(tiny):
    tok, _ = tiny
    with pytest.raises(ValueError, match="batch_wait must be >= 0 and batch_idle > 0 seconds"):
        Gateway(ScriptedBackend(tok, lambda ctx: "hi"), tok, batch_wait=-1)
    with pytest.raises(ValueError, match="batch_idle > 0"):
        Gateway(ScriptedBackend(tok, lambda ctx: "hi"), tok, batch_idle=0)
    with pytest.raises(ValueError, match="max_in_flight must be a positive int, got 0"):
        GatewayServer(Gateway(ScriptedBackend(tok, lambda ctx: "hi"), tok), max_in_flight=0).start()

    def agent(base_url, task):  # one call each, after a stagger: without a wait they would arrive one by one
        time.sleep(0.003 * task["n"])
        client = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0)
        return client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "Go."}],
                                              max_tokens=4).choices[0].message.content

    tasks = [{"n": n} for n in range(16)]  # more than asyncio's default pool of threads (cpu_count + 4) would hold
    for wait, most in ((20.0, 1), (0.0, 16)):  # a long idle limit: a busy machine starts eight clients slowly
        gw = Gateway(ScriptedBackend(tok, lambda ctx: "hi"), tok, batch_wait=wait, batch_idle=5.0)
        with GatewayServer(gw) as server:
            trajs = collect(server, agent, tasks, lambda answer, task: float(answer == "hi"), workers=16)
        assert [t.outcome_reward for t in trajs] == [1.0] * 16 and gw.stats["requests"] == 16
        assert gw.stats["batches"] <= most  # with the wait: every open episode's request in one backend call
    assert gw.stats["batches"] > 1  # without it, the staggered requests are not all sampled together


def test_a_response_budget_caps_replies_and_refuses_calls_past_it(tiny):
    "The trainer's row holds at most response_budget tokens after its prompt: replies are cut to the room left, and a"
    " call with no room gets OpenAI's context_length_exceeded (a 400 the agent sees), not a silently longer row."
    tok, _ = tiny
    with pytest.raises(ValueError, match="response_budget must be a positive int or None, got 0"):
        Gateway(ScriptedBackend(tok, lambda ctx: "hi"), tok, response_budget=0)
    gw = Gateway(ScriptedBackend(tok, compact_caller("Nile", "Egypt")), tok, response_budget=12)
    with GatewayServer(gw) as server:
        client = openai.OpenAI(base_url=server.episode_url("b"), api_key="none", max_retries=0)
        messages = [{"role": "user", "content": "Where does the Nile end?"}]
        r = client.chat.completions.create(model="policy", messages=messages, tools=[SEARCH])
        first = gw.episodes["b"].calls[0]
        assert len(first.choices[0].token_ids) == 12 and r.choices[0].finish_reason == "length"  # cut to the budget
        messages += [r.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "A long reply " * 9}]
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="policy", messages=messages, tools=[SEARCH])
        assert e.value.body["code"] == "context_length_exceeded" and "budget of 12 tokens" in e.value.body["message"]
    assert len(gw.episodes["b"].calls) == 1  # the refused call recorded nothing


def test_a_released_episode_stays_closed(tiny):
    "release hands the record over and forgets it; a late call from the same agent is refused, not a new episode."
    tok, _ = tiny
    gw = Gateway(ScriptedBackend(tok, lambda ctx: "hi"), tok)
    ask = {"messages": [{"role": "user", "content": "Go."}]}
    gw.complete("r", ask)
    with pytest.raises(ValueError, match="'r' is open: end it before releasing it"):
        gw.release("r")
    gw.end("r", 1.0)
    ep = gw.release("r")
    assert ep.reward == 1.0 and len(ep.calls) == 1 and "r" not in gw.episodes
    with pytest.raises(GatewayError, match="'r' has ended") as e:
        gw.complete("r", ask)
    assert e.value.status == 409 and "r" not in gw.episodes
    with pytest.raises(GatewayError, match="already ended"):
        gw.end("r", 0.0)
