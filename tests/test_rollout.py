"""Properties of the rollout backends and the multi-turn loop, beyond the examples in nbs/06_rollout.ipynb."""
import copy
import random

import pytest
import torch

from agent_r1_tutorial.envs import Action, AgentEnv, Observation, ToolEnv
from agent_r1_tutorial.masks import compute_log_probs, growing_layout
from agent_r1_tutorial.rollout import (AgentEnvLoop, EchoEnv, HFBackend, SamplingParams, ScriptedBackend,
                                       benchmark_rollout, to_batch)
from agent_r1_tutorial.tinylm import build_tiny_lm
from agent_r1_tutorial.tools import CalculatorTool


@pytest.fixture(scope="module")
def lm():
    torch.set_num_threads(1)  # the tests are many tiny forwards: threads only contend
    return build_tiny_lm(seed=0)


class RandomEnv(AgentEnv):
    "Appends a random-length tool reply each turn, or ends (terminated or truncated) at random."
    name = "random_test_env"

    def __init__(self, seed):
        super().__init__()
        self.rng = random.Random(seed)

    def _reset(self, question="q", **task):
        self.messages = [{"role": "user", "content": question}]
        return Observation(list(self.messages))

    def _step(self, action):
        self.messages = self.messages + [{"role": "assistant", "content": action.text}]
        u = self.rng.random()
        if u < 0.2:
            return Observation(list(self.messages)), 0.5, True, False, {"reason": "answer", "outcome_reward": 1.0}
        if u < 0.3:
            return Observation(list(self.messages)), 0.0, False, True, {"reason": "max_tokens"}
        reply = " ".join(self.rng.choice(["a", "river", "42", "born", "city"]) for _ in range(self.rng.randint(1, 12)))
        self.messages = self.messages + [{"role": "tool", "content": reply}]
        return Observation(list(self.messages)), self.rng.choice([0.0, 0.1, -0.1]), False, False, {"reason": None}


@pytest.mark.parametrize("seed", range(6))
def test_loop_records_exact_tokens_and_logprobs(lm, seed):
    tok, model = lm
    backend = HFBackend(model, tok.pad_token_id, generator=torch.Generator().manual_seed(seed))
    loop = AgentEnvLoop(backend, tok, SamplingParams(max_new_tokens=10, stop_token_ids=(tok.eos_token_id,)),
                        max_context=400, max_turns=5)
    trajs = loop.run([RandomEnv(seed * 10 + i) for i in range(5)], [{"question": f"q{i}"} for i in range(5)])
    assert len(trajs) == 5
    for t in trajs:
        assert t.done and t.is_append_only()
        assert t.steps[-1].env_ids == []
        for k, s in enumerate(t.steps[:-1]):  # each next context is the old one + sampled ids + env ids
            assert t.steps[k + 1].obs_ids == s.obs_ids + s.action_ids + s.env_ids
        row = growing_layout(t)
        ids = torch.tensor([row["prompt_ids"] + row["response_ids"]])
        ones = torch.ones_like(ids)
        lp = compute_log_probs(model, ids, ones, ones.cumsum(1) - 1, len(row["response_ids"]))[0]
        m = torch.tensor(row["response_mask"]).bool()
        assert torch.allclose(lp[m], torch.tensor(row["response_logprobs"])[m], atol=1e-4)


def test_cache_reuse_gives_identical_rollouts(lm):
    tok, model = lm
    res = benchmark_rollout(model, tok, n_episodes=6, turns=3, max_new_tokens=8, seed=3)
    assert res["same_tokens"]
    assert res["fed_tokens_reuse"] < res["fed_tokens_reencode"]


def test_context_budget_truncates(lm):
    tok, model = lm
    backend = HFBackend(model, tok.pad_token_id, generator=torch.Generator().manual_seed(0))
    params = SamplingParams(max_new_tokens=16)
    prompt_len = len(tok.apply_chat_template([{"role": "user", "content": "go"}], tokenize=True,
                                             add_generation_prompt=True))
    loop = AgentEnvLoop(backend, tok, params, max_context=prompt_len + 40, max_turns=20)
    trajs = loop.run([EchoEnv(turns=50) for _ in range(3)], [{"question": "go"}] * 3)
    for t in trajs:
        assert t.truncated and t.reason == "max_context"
        assert all(len(s.obs_ids) + len(s.action_ids) <= prompt_len + 40 for s in t.steps)


def test_context_rewrites_fall_back_to_retemplating(lm):
    "An environment that rewrites history yields a trajectory that only the step layout accepts."
    tok, model = lm

    class Forgetful(EchoEnv):
        def _step(self, action):
            obs, r, term, trunc, info = super()._step(action)
            return Observation(obs.messages[-1:]), r, term, trunc, info  # keeps only the last message

    backend = HFBackend(model, tok.pad_token_id, generator=torch.Generator().manual_seed(0))
    loop = AgentEnvLoop(backend, tok, SamplingParams(max_new_tokens=6), max_context=1000)
    (t,) = loop.run([Forgetful(turns=3)], [{"question": "go"}])
    assert not t.is_append_only()
    with pytest.raises(ValueError, match="step"):
        growing_layout(t)
    batch = to_batch([t], tok.pad_token_id, layout="step")
    assert batch["input_ids"].shape[0] == t.num_steps


def test_scripted_expert_on_calculator(lm):
    tok, _ = lm
    calls = []

    def expert(ctx):
        if "<tool_response>" in ctx.split("<|im_start|>user")[-1]:
            return "<answer>" + ctx.split("<tool_response>\n")[-1].split("\n</tool_response>")[0] + "</answer>"
        calls.append(1)
        return '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 ** 10"}}\n</tool_call>'

    env = ToolEnv([CalculatorTool()], tokenizer=tok, reward_fn=lambda a, task: float(a == "1024"))
    (t,) = AgentEnvLoop(ScriptedBackend(tok, expert), tok, SamplingParams(max_new_tokens=64)).run(
        [env], [{"question": "what is 2 to the 10th?"}])
    assert t.outcome_reward == 1.0 and t.num_steps == 2 and len(calls) == 1
    assert all(lp == 0.0 for s in t.steps for lp in s.action_logprobs)


def test_loop_rejects_bad_input(lm):
    tok, model = lm
    backend = HFBackend(model, tok.pad_token_id)
    with pytest.raises(TypeError, match="backend must be a PolicyBackend"):
        AgentEnvLoop("not a backend", tok, SamplingParams())
    loop = AgentEnvLoop(backend, tok, SamplingParams(max_new_tokens=4))
    with pytest.raises(ValueError, match="one task per environment"):
        loop.run([EchoEnv()], [])
    with pytest.raises(ValueError, match="uids must be distinct"):
        loop.run([EchoEnv(), EchoEnv()], [{}, {}], uids=["a", "a"])
    with pytest.raises(ValueError, match="pad_token_id"):
        HFBackend(model, -1)

    class NaNOutcome(EchoEnv):
        def _step(self, action):
            obs, r, term, trunc, info = super()._step(action)
            return obs, r, True, False, {"reason": "answer", "outcome_reward": float("nan")}

    with pytest.raises(ValueError, match="non-finite outcome reward"):
        loop.run([NaNOutcome()], [{}])


@pytest.mark.gpu
@pytest.mark.parametrize("fast_decode,share_prompts", [(False, False), (True, True)])
def test_loop_on_cuda_records_the_samplers_logprobs(lm, fast_decode, share_prompts):
    "On a GPU, with and without the growing cache and shared prompts: the recorded log-probs are a fresh forward's."
    tok, model = lm
    m = copy.deepcopy(model).to("cuda")
    backend = HFBackend(m, tok.pad_token_id, fast_decode=fast_decode, share_prompts=share_prompts,
                        generator=torch.Generator(device="cuda").manual_seed(0))
    loop = AgentEnvLoop(backend, tok, SamplingParams(max_new_tokens=10, stop_token_ids=(tok.eos_token_id,)),
                        max_context=400, max_turns=5)
    # groups of four episodes on one question each, as GRPO samples them, so the shared prefill is exercised
    trajs = loop.run([RandomEnv(i) for i in range(8)], [{"question": f"q{i // 4}"} for i in range(8)])
    assert all(t.done and t.is_append_only() for t in trajs)
    for t in trajs:
        row = growing_layout(t)
        ids = torch.tensor([row["prompt_ids"] + row["response_ids"]], device="cuda")
        ones = torch.ones_like(ids)
        lp = compute_log_probs(m, ids, ones, ones.cumsum(1) - 1, len(row["response_ids"]))[0].cpu()
        mask = torch.tensor(row["response_mask"]).bool()
        assert torch.allclose(lp[mask], torch.tensor(row["response_logprobs"])[mask], atol=1e-3)


@pytest.mark.gpu
def test_cache_reuse_on_cuda_feeds_fewer_tokens(lm):
    tok, model = lm
    res = benchmark_rollout(copy.deepcopy(model).to("cuda"), tok, n_episodes=6, turns=3, max_new_tokens=8, seed=3)
    assert res["fed_tokens_reuse"] < res["fed_tokens_reencode"]
    assert res["same_tokens"], "the cached and re-encoded rollouts sampled different tokens on the GPU"
