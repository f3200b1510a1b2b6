"""The verl agent loop (chapter 12): environments built from data rows, episodes played token-in/token-out through a
server manager, both layouts, the response budget, rewards, and the loop constructed and post-processed the way
verl's agent-loop worker does it (chapter 14), against a CPU server manager backed by the tiny model or a scripted policy.

Tests that need verl are skipped without it; the rest need only the library.
"""
import asyncio
import copy
import json
import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_r1_tutorial import verl_bridge as vb
from agent_r1_tutorial import verl_data as vd
from agent_r1_tutorial import verl_launch as vl
from agent_r1_tutorial.envs import ToolEnv
from agent_r1_tutorial.masks import env_suffix_ids
from agent_r1_tutorial.rewards import compute_score
from agent_r1_tutorial.rollout import HFBackend, ScriptedBackend
from agent_r1_tutorial.tinylm import build_tiny_lm
from agent_r1_tutorial.tools import BaseTool, CalculatorTool, ToolResult, register_tool

torch.set_num_threads(1)  # the machine's two cores are shared
HAS_VERL = __import__("importlib").util.find_spec("verl") is not None
needs_verl = pytest.mark.skipif(not HAS_VERL, reason="verl (CPU build) is not installed")


@pytest.fixture(scope="module")
def lm():
    return build_tiny_lm()


@pytest.fixture(scope="module")
def tok(lm):
    return lm[0]


def calc_row(a=12, b=5, c=5, max_turns=4):
    "A GSM8K-style row written by the data preparation (one toy record)."
    rec = {"question": f"A shop packs pencils in {a} boxes of {b}. It also has {c} loose pencils. How many pencils "
                       "does it have?", "answer": f"... #### {a * b + c}"}
    row = vd.gsm8k_rows([rec], "train", max_turns=max_turns)[0]
    return {**row, "raw_prompt": row["prompt"], "tools_kwargs": row["extra_info"]["tools_kwargs"]}


def calc_expert(context: str) -> str:
    "Call the calculator on the problem's numbers, then answer with what the tool returned."
    if "<tool_response>" not in context:
        a, b, c = re.findall(r"in (\d+) boxes of (\d+)\. It also has (\d+)", context)[-1]
        return '<tool_call>\n{"name": "calculator", "arguments": {"expression": "' + f"{a} * {b} + {c}" + '"}}\n</tool_call>'
    return "<answer>" + re.findall(r"<tool_response>\n(.*?)\n</tool_response>", context, re.S)[-1] + "</answer>"


def scripted(tok, policy=calc_expert, verl_types=False):
    return vb.LocalServerManager(ScriptedBackend(tok, policy), tok, verl_types=verl_types)


def sampled(lm, seed, verl_types=False):
    tok, model = lm
    return vb.LocalServerManager(HFBackend(model, tok.pad_token_id, generator=torch.Generator().manual_seed(seed)), tok,
                                 verl_types=verl_types)


def play(server, tok, row, budget=512, max_turns=None, sp=None):
    env, task = vb.env_from_row(row, tok)
    return asyncio.run(vb.run_agent_episode(server, tok, env, task, sp or {"temperature": 1.0, "logprobs": True},
                                            budget, max_turns))


# ---------------------------------------------------------------- environments from rows


def test_env_from_row_builds_what_the_row_asks_for(tok):
    row = calc_row(max_turns=4)
    env, task = vb.env_from_row(row, tok, max_turns=3, max_tool_response_chars=77)
    assert isinstance(env, ToolEnv) and sorted(env.tools) == ["calculator"]
    assert env.max_turns == 3 and env.max_tool_response_chars == 77 and env.format.name == "hermes"
    assert env.tools["calculator"].max_exponent == 1000
    assert task == {"prompt": row["prompt"]}
    assert vb.env_from_row(row, tok, max_turns=9)[0].max_turns == 4  # the row's own budget is the smaller


def test_env_from_row_reads_rows_as_parquet_and_numpy_give_them(tok):
    row = calc_row()
    row["raw_prompt"] = np.array(row["raw_prompt"], dtype=object)  # what DataProto non-tensor batches hold
    row["extra_info"]["env_kwargs"]["tools"] = np.array(["calculator"], dtype=object)
    row["extra_info"]["env_kwargs"]["max_tokens"] = None  # struct fields of other rows arrive as None
    row["tools_kwargs"] = {"calculator": {"create_kwargs": {"max_exponent": 50, "index_dir": None}}, "search": None}
    env, task = vb.env_from_row(row, tok)
    assert env.tools["calculator"].max_exponent == 50 and env.max_tokens is None
    assert isinstance(task["prompt"], list) and task["prompt"][0]["role"] == "user"
    del row["tools_kwargs"]  # before RLHFDataset lifts them, tools_kwargs live in extra_info
    assert vb.env_from_row(row, tok)[0].tools["calculator"].max_exponent == 1000


def test_env_from_row_context_policy(tok):
    row = calc_row()
    row["extra_info"]["env_kwargs"].update(max_tokens=600, context_policy={"name": "trim", "keep_last": 2})
    env, _ = vb.env_from_row(row, tok)
    assert type(env.context_policy).__name__ == "TrimToolOutputs" and env.context_policy.keep_last == 2
    assert env.count_tokens is not None and env.max_tokens == 600


@pytest.mark.parametrize("mutate, msg", [
    (lambda r: r["extra_info"].pop("env_kwargs"), "has no 'env_kwargs'"),
    (lambda r: r["extra_info"]["env_kwargs"].update(tools=["abacus"]), "unknown tool 'abacus'"),
    (lambda r: r["extra_info"]["env_kwargs"].update(env="gym"), "unknown environment 'gym'"),
    (lambda r: r["extra_info"]["env_kwargs"].update(context_policy="summarize"), "unknown context_policy 'summarize'"),
    (lambda r: (r.pop("raw_prompt"), r.pop("prompt")), "no prompt messages"),
])
def test_env_from_row_names_what_is_wrong(tok, mutate, msg):
    row = calc_row()
    mutate(row)
    with pytest.raises(ValueError, match=re.escape(msg)):
        vb.env_from_row(row, tok)
    with pytest.raises(TypeError, match="must be a dict"):
        vb.env_from_row([row])


# ---------------------------------------------------------------- episodes, token in and token out


def test_scripted_episode_chains_the_servers_context(tok):
    server = scripted(tok)
    traj = play(server, tok, calc_row())
    assert (traj.num_steps, traj.reason, traj.is_append_only()) == (2, "answer", True)
    first, second = server.calls
    assert second["prompt_ids"] == first["prompt_ids"] + first["token_ids"] + traj.steps[0].env_ids
    env, _ = vb.env_from_row(calc_row(), tok)
    assert traj.steps[0].env_ids == env_suffix_ids(tok, [{"role": "tool", "content": "65"}], True,
                                                   tools=env.tool_schemas)
    assert first["request_id"] == second["request_id"] == traj.uid  # one request id: the same server every turn
    assert traj.steps[0].info["tool_rewards"] == [0.0] and traj.steps[0].reward == 0.0


def _check_growing(out, server, traj, budget):
    resp, mask = np.array(out["response_ids"]), np.array(out["response_mask"])
    lp = np.array(out["response_logprobs"])
    assert len(resp) == len(mask) == len(lp) <= budget
    assert resp[mask == 1].tolist() == [i for c in server.calls for i in c["token_ids"]]
    assert np.allclose(lp[mask == 1], [x for c in server.calls for x in c["log_probs"]], atol=1e-6)
    assert resp[mask == 0].tolist() == [i for s in traj.steps for i in s.env_ids] and (lp[mask == 0] == 0).all()
    assert out["prompt_ids"] == server.calls[0]["prompt_ids"]
    for k in range(1, len(server.calls)):  # each call's prompt is the previous one plus what followed it
        p = server.calls[k - 1]
        assert server.calls[k]["prompt_ids"] == p["prompt_ids"] + p["token_ids"] + traj.steps[k - 1].env_ids


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 10_000), budget=st.integers(4, 96))
def test_sampled_episode_keeps_sampled_ids_and_logprobs(lm, seed, budget):
    tok = lm[0]
    server = sampled(lm, seed)
    traj = play(server, tok, calc_row(), budget=budget)
    (out,) = vb.episode_outputs(traj, tok, "sequence", calc_row())
    _check_growing(out, server, traj, budget)
    steps = vb.episode_outputs(traj, tok, "step", calc_row())
    assert [o["response_ids"] for o in steps] == [c["token_ids"] for c in server.calls]
    assert [o["prompt_ids"] for o in steps] == [c["prompt_ids"] for c in server.calls]
    assert all(set(o["response_mask"]) == {1} for o in steps)


def test_greedy_is_deterministic_and_logprobs_are_optional(lm):
    tok = lm[0]
    a, b = sampled(lm, 0), sampled(lm, 1)
    ta = play(a, tok, calc_row(), budget=32, sp={"temperature": 0})
    tb = play(b, tok, calc_row(), budget=32, sp={"temperature": 0})
    assert [s.action_ids for s in ta.steps] == [s.action_ids for s in tb.steps]
    t = play(sampled(lm, 2), tok, calc_row(), budget=16, sp={"temperature": 1.0, "logprobs": False})
    (out,) = vb.episode_outputs(t, tok, "sequence", calc_row())
    assert out["response_logprobs"] is None


def test_response_budget_is_never_exceeded_and_masks_stay_aligned(tok):
    # 37 ids of call, then 18 of tool reply: with 50 tokens, the reply does not fit and is not appended
    server = scripted(tok)
    traj = play(server, tok, calc_row(), budget=50)
    assert (traj.num_steps, traj.reason, traj.truncated) == (1, "max_response_length", True)
    (out,) = vb.episode_outputs(traj, tok, "sequence", calc_row())
    assert out["response_ids"] == server.calls[0]["token_ids"] and set(out["response_mask"]) == {1}
    # with 20 tokens the call itself is cut; the environment reads a broken call, its reply does not fit either
    server = scripted(tok)
    traj = play(server, tok, calc_row(), budget=20)
    (out,) = vb.episode_outputs(traj, tok, "sequence", calc_row())
    assert len(out["response_ids"]) == len(out["response_mask"]) == 20 and traj.truncated
    assert server.calls[0]["token_ids"] == out["response_ids"]
    # an explicit cap cuts ids, mask and log-probs together
    long_traj = play(scripted(tok), tok, calc_row(), budget=512)
    (cut,) = vb.episode_outputs(long_traj, tok, "sequence", calc_row(), max_response_length=40)
    assert len(cut["response_ids"]) == len(cut["response_mask"]) == len(cut["response_logprobs"]) == 40


def test_a_server_that_overshoots_max_tokens_is_cut_to_the_budget(tok):
    class Greedy:  # ignores max_tokens, as a misconfigured server might
        calls = 0

        async def generate(self, request_id, *, prompt_ids, sampling_params, **kw):
            self.calls += 1
            return vb.TokenIds(token_ids=[5] * 100, log_probs=[-1.0] * 100)
    traj = asyncio.run(vb.run_agent_episode(Greedy(), tok, *vb.env_from_row(calc_row(), tok), None, 30))
    (out,) = vb.episode_outputs(traj, tok, "sequence", calc_row())
    assert len(out["response_ids"]) == len(out["response_logprobs"]) == 30


def test_an_aborted_turn_ends_the_episode_and_keeps_the_turns_before_it(tok):
    "verl aborts requests when it drains its servers: the episode ends there (reason 'aborted'), nothing raises."
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1 + 1"}}\n</tool_call>'

    class AbortsSecond:
        calls = 0

        async def generate(self, request_id, *, prompt_ids, sampling_params, **kw):
            self.calls += 1
            if self.calls == 1:
                ids = tok(call, add_special_tokens=False).input_ids + [tok.eos_token_id]
                return vb.TokenIds(token_ids=ids, log_probs=[-0.5] * len(ids))
            return vb.TokenIds(token_ids=[], log_probs=[], stop_reason="aborted")
    traj = asyncio.run(vb.run_agent_episode(AbortsSecond(), tok, *vb.env_from_row(calc_row(), tok), None, 512))
    assert (traj.num_steps, traj.truncated, traj.reason) == (1, True, "aborted")
    (out,) = vb.episode_outputs(traj, tok, "sequence", calc_row())
    assert sum(out["response_mask"]) == len(traj.steps[0].action_ids) and out["extra_fields"]["end_reason"] == "aborted"

    class AbortsFirst:
        async def generate(self, request_id, *, prompt_ids, sampling_params, **kw):
            return vb.TokenIds(token_ids=[], log_probs=[], stop_reason="aborted")
    with pytest.raises(RuntimeError, match="the server aborted the first turn"):
        asyncio.run(vb.run_agent_episode(AbortsFirst(), tok, *vb.env_from_row(calc_row(), tok), None, 512))


def test_a_turn_cut_by_the_budget_before_any_call_truncates(tok):
    "Rambling past the response budget is a budget cut (truncated, max_new_tokens), not a choice to stop."
    ramble = lambda ctx: "Let me think about the pencils step by step. " * 40
    traj = play(scripted(tok, ramble), tok, calc_row(), budget=60)
    assert (traj.num_steps, traj.terminated, traj.truncated, traj.reason) == (1, False, True, "max_new_tokens")
    # the same words ending within the budget: the model stopped without acting
    short = lambda ctx: "Let me think."
    traj = play(scripted(tok, short), tok, calc_row(), budget=60)
    assert (traj.terminated, traj.truncated, traj.reason) == (True, False, "no_tool_call")


def test_turn_budgets(tok):
    always_call = lambda ctx: '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1 + 1"}}\n</tool_call>'
    traj = play(scripted(tok, always_call), tok, calc_row(max_turns=3), budget=2048)
    assert (traj.num_steps, traj.reason) == (3, "max_turns")  # the environment's own limit
    traj = play(scripted(tok, always_call), tok, calc_row(max_turns=3), budget=2048, max_turns=2)
    assert (traj.num_steps, traj.reason, traj.steps[-1].env_ids) == (2, "max_turns", [])  # the loop's cap
    (out,) = vb.episode_outputs(traj, tok, "sequence", calc_row())
    assert out["num_turns"] == 4 and out["extra_fields"]["tool_rewards"] == [0.0, 0.0]
    with pytest.raises(ValueError, match="max_response_length must be a positive int"):
        play(scripted(tok), tok, calc_row(), budget=0)


@register_tool
class _LongEcho(BaseTool):
    "A test tool whose long replies push a small context budget over, so that the context policy rewrites it."
    name = "long_echo"
    description = "Echo the text many times."
    parameters = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}

    def execute(self, text: str) -> ToolResult:
        return ToolResult(" ".join([text] * 60))


def test_rewritten_context_gives_one_growing_row_per_stretch_scored_as_a_whole(tok):
    def policy(ctx):
        n = ctx.count("<tool_response>")
        if n < 3:
            return '<tool_call>\n{"name": "long_echo", "arguments": {"text": "word%d"}}\n</tool_call>' % n
        return "<answer>65</answer>"
    row = calc_row(max_turns=6)
    row["extra_info"]["env_kwargs"].update(tools=["long_echo", "calculator"], max_tokens=1000,
                                           context_policy={"name": "trim", "keep_last": 1, "shorten_to": 20})
    server = scripted(tok, policy)
    traj = play(server, tok, row, budget=4096)
    assert traj.reason == "answer" and not traj.is_append_only()
    rewritten = [k for k, s in enumerate(traj.steps) if s.info.get("context_rewritten")]
    assert rewritten and all(traj.steps[k].env_ids == [] and traj.steps[k].info["score_env_ids"] for k in rewritten)
    outs = vb.episode_outputs(traj, tok, "sequence", row)
    assert len(outs) == len(rewritten) + 1
    assert [o["prompt_ids"] for o in outs][1:] == [server.calls[k + 1]["prompt_ids"] for k in rewritten]
    assert [i for o in outs for i, m in zip(o["response_ids"], o["response_mask"]) if m] == \
        [i for c in server.calls for i in c["token_ids"]]
    assert [o["reward_score"] for o in outs[:-1]] == [None] * len(rewritten)
    text = tok.decode(vb.episode_response_ids(traj), skip_special_tokens=True)
    assert text.count("<tool_response>") == 3  # the score reads every reply, also the rewritten ones
    assert outs[-1]["reward_score"] == compute_score("openai/gsm8k", text, "65", row["extra_info"])["score"] == 1.0


def test_step_layout_scores_in_the_loop_what_verl_would_score_on_the_growing_row(tok):
    traj = play(scripted(tok), tok, calc_row(), budget=512)
    (seq,) = vb.episode_outputs(traj, tok, "sequence", calc_row())
    steps = vb.episode_outputs(traj, tok, "step", calc_row())
    growing_text = tok.decode(seq["response_ids"], skip_special_tokens=True)  # what verl's reward manager decodes
    verl_would = compute_score("openai/gsm8k", growing_text, "65", calc_row()["extra_info"])
    assert seq["reward_score"] is None  # one growing row: verl scores it
    assert steps[-1]["reward_score"] == verl_would["score"] == 1.0
    assert steps[-1]["extra_fields"]["reward_extra_info"] == verl_would
    assert [o["extra_fields"]["row_index"] for o in steps] == [0, 1]
    with pytest.raises(ValueError, match="needs the dataset row"):
        vb.episode_outputs(traj, tok, "step")
    with pytest.raises(ValueError, match="layout must be one of"):
        vb.episode_outputs(traj, tok, "growing")


def test_an_outcome_judged_by_the_environment_is_the_reward_score(tok):
    row = calc_row()
    env = ToolEnv([CalculatorTool()], max_turns=4, reward_fn=lambda answer, task: 0.75 if answer == "65" else 0.0)
    traj = asyncio.run(vb.run_agent_episode(scripted(tok), tok, env, {"prompt": row["prompt"]}, None, 512))
    assert traj.outcome_reward == 0.75 and traj.metadata["outcome_from_env"]
    (out,) = vb.episode_outputs(traj, tok, "sequence", row)
    assert out["reward_score"] == 0.75 and out["extra_fields"]["turn_scores"] == [0.0, 0.0]  # the outcome is not a step reward


def test_local_server_manager_bad_input(tok):
    server = scripted(tok, lambda ctx: "<answer>65</answer>")
    call = lambda **sp: asyncio.run(server.generate("r", prompt_ids=[1, 2, 3], sampling_params=sp))
    with pytest.raises(ValueError, match="top_p=0.9"):
        call(top_p=0.9)
    with pytest.raises(ValueError, match="repetition_penalty"):
        call(repetition_penalty=1.2)
    with pytest.raises(ValueError, match="text models only"):
        asyncio.run(server.generate("r", prompt_ids=[1], sampling_params={}, image_data=[object()]))
    with pytest.raises(TypeError, match="must be a PolicyBackend"):
        vb.LocalServerManager(object(), tok, verl_types=False)
    out = call(max_tokens=3, top_p=1.0, top_k=-1, repetition_penalty=1.0)
    assert isinstance(out, vb.TokenIds) and len(out.token_ids) == 3 and out.stop_reason == "completed"


# ---------------------------------------------------------------- inside verl


@pytest.fixture(scope="module")
def registered():
    if not HAS_VERL:
        pytest.skip("verl is not installed")
    return vb.register_with_verl()


def _cfg(algo="grpo", **kw):
    return vl.compose_verl_config(vl.verl_overrides(vl.VerlRunConfig(algo, **kw)))


def _instantiate(cfg, server, tok):
    "Verbatim what verl 0.9.1's AgentLoopWorker._run_agent_loop does for each row."
    import hydra
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap, _agent_loop_registry
    from verl.utils.dataset.rl_dataset import RLHFDataset

    return hydra.utils.instantiate(config=_agent_loop_registry[vb.AGENT_NAME], trainer_config=DictConfigWrap(config=cfg),
                                   server_manager=server, tokenizer=tok, processor=None, hf_model_type="qwen2",
                                   dataset_cls=RLHFDataset, data_config=DictConfigWrap(cfg.data),
                                   tools=ToolListWrap([]))


def _run(cfg, server, tok, row, **sp):
    async def go():  # the worker builds and runs each loop inside its event loop
        loop = _instantiate(cfg, server, tok)
        return loop, await loop.run(vl.verl_sampling_params(cfg) | {"logprobs": True, **sp}, **row)
    return asyncio.run(go())


@needs_verl
def test_the_loop_is_registered_and_locatable(registered):
    import hydra
    from verl.experimental.agent_loop.agent_loop import AgentLoopBase, _agent_loop_registry

    assert registered["agent_loops"] == [vb.AGENT_NAME]
    assert _agent_loop_registry[vb.AGENT_NAME] == {"_target_": "agent_r1_tutorial.verl_bridge.Ar1AgentLoop"}
    cls = hydra.utils.get_class(_agent_loop_registry[vb.AGENT_NAME]["_target_"])
    assert cls is vb.verl_agent_loop_class() is vb.Ar1AgentLoop and issubclass(cls, AgentLoopBase)
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        vb.Nope


@needs_verl
def test_verl_builds_our_loop_and_runs_a_scripted_calculator_episode(registered, tok):
    from verl.experimental.agent_loop.agent_loop import AgentLoopOutput
    from verl.workers.rollout.replica import TokenOutput

    cfg, server, row = _cfg("grpo", max_response_length=256), scripted(tok, verl_types=True), calc_row()
    loop, out = _run(cfg, server, tok, row)
    assert isinstance(loop, vb.verl_agent_loop_class()) and loop.layout == "sequence"
    assert (loop.response_length, loop.prompt_length, loop.max_turns) == (256, 1024, 5)
    assert isinstance(out, AgentLoopOutput) and out.reward_score is None and out.num_turns == 4
    other = scripted(tok, lambda ctx: "ok", verl_types=True)
    assert isinstance(asyncio.run(other.generate("x", prompt_ids=[1], sampling_params={"max_tokens": 1})), TokenOutput)
    assert out.extra_fields["tool_rewards"] == [0.0] and out.extra_fields["turn_scores"] == [0.0, 0.0]
    assert out.extra_fields["end_reason"] == "answer" and out.extra_fields["num_tool_calls"] == 1
    resp, mask = np.array(out.response_ids), np.array(out.response_mask)
    assert resp[mask == 1].tolist() == [i for c in server.calls for i in c["token_ids"]]
    d = out.as_dict()
    assert {"prompts", "responses", "response_mask", "rollout_log_probs"} <= set(d) and "rm_scores" not in d
    assert d["responses"].shape == d["response_mask"].shape == d["rollout_log_probs"].shape


@needs_verl
def test_verls_postprocessing_and_reward_manager_score_it_1(registered, tok):
    from verl.trainer.ppo.reward import load_reward_manager

    cfg, server, row = _cfg("grpo", max_response_length=256), scripted(tok, verl_types=True), calc_row()
    _, out = _run(cfg, server, tok, row)
    batch = asyncio.run(vl.verl_postprocess([out], [row], cfg, tok))
    assert tuple(batch.batch["responses"].shape) == (1, 256) and tuple(batch.batch["prompts"].shape) == (1, 1024)
    m = batch.batch["response_mask"][0]
    assert m[:len(out.response_mask)].tolist() == out.response_mask and int(m.sum()) == sum(out.response_mask)
    assert batch.batch["responses"][0, :len(out.response_ids)].tolist() == out.response_ids
    assert batch.non_tensor_batch["__num_turns__"].tolist() == [4]
    rcfg = vl.compose_verl_config(["actor_rollout_ref.rollout.name=vllm",
                                   f"reward.custom_reward_function.path={vb.REWARD_FUNCTION['path']}",
                                   f"reward.custom_reward_function.name={vb.REWARD_FUNCTION['name']}"])

    async def score():
        return await load_reward_manager(rcfg, tok).run_single(batch)
    assert asyncio.run(score())["reward_score"] == 1.0


@needs_verl
def test_step_layout_through_verl_returns_a_list_and_refuses_the_legacy_worker(registered, tok):
    from verl.experimental.agent_loop.agent_loop import AgentLoopOutput

    cfg, server, row = _cfg("steppo", max_response_length=256), scripted(tok, verl_types=True), calc_row()
    loop, outs = _run(cfg, server, tok, row)
    assert loop.layout == "step" and isinstance(outs, list) and all(isinstance(o, AgentLoopOutput) for o in outs)
    assert [o.response_ids for o in outs] == [c["token_ids"] for c in server.calls]
    assert [o.reward_score for o in outs] == [None, 1.0]
    assert outs[-1].extra_fields["reward_extra_info"]["acc"] == 1.0  # the v1 worker copies this onto earlier rows
    d = outs[-1].as_dict()
    assert d["rm_scores"][-1] == 1.0 and d["rm_scores"][:-1].abs().sum() == 0
    legacy = _cfg("steppo", max_response_length=256, extra_overrides=("trainer.use_v1=False",))
    with pytest.raises(RuntimeError, match="takes one output per row"):
        _run(legacy, scripted(tok, verl_types=True), tok, row)
    with pytest.raises(ValueError, match="only verl's v1 trainer"):
        vl.validate_verl_config(legacy)


@needs_verl
def test_layout_comes_from_the_recipe(registered):
    for algo in vl.ALGORITHMS:
        cfg = _cfg(algo)
        assert cfg.actor_rollout_ref.rollout.custom.ar1_layout == vl.RECIPES[algo].layout
    check = vl.validate_verl_config(_cfg("steppo"))
    assert check["agent_loop"] == "ar1_agent -> agent_r1_tutorial.verl_bridge.Ar1AgentLoop (layout: step)"
    ov = [o if "ar1_layout" not in o else "+actor_rollout_ref.rollout.custom.ar1_layout=rows"
          for o in vl.verl_overrides(vl.VerlRunConfig("grpo"))]
    with pytest.raises(ValueError, match="choose one of"):
        vl.validate_verl_config(vl.compose_verl_config(ov))


@pytest.fixture(scope="module")
def hotpot(tmp_path_factory):
    "A HotpotQA-style row whose search tool loads a small BM25 index of the sample's passages."
    from agent_r1_tutorial.search import BM25Retriever

    sample = vd.hotpotqa_toy_sample(8, seed=0)
    index = tmp_path_factory.mktemp("index") / "bm25"
    BM25Retriever(vd.hotpotqa_passages(sample)).save(index)
    row = vd.hotpotqa_rows(sample, "train", n=1, seed=0, search_index_dir=str(index))[0]
    return {**row, "raw_prompt": row["prompt"]}


def searcher(row):
    def policy(ctx):
        if "<tool_response>" not in ctx:
            return ('<tool_call>\n{"name": "search", "arguments": {"query": ' + json.dumps(row["extra_info"]["question"])
                    + '}}\n</tool_call>')
        return f"<answer>{row['reward_model']['ground_truth']}</answer>"
    return policy


@needs_verl
def test_search_episode_over_a_local_index(registered, tok, hotpot):
    server = scripted(tok, searcher(hotpot), verl_types=True)
    _, outs = _run(_cfg("steppo", max_response_length=1024), server, tok, hotpot)
    assert len(outs) == 2 and outs[-1].reward_score == 1.0
    reply = tok.decode(outs[1].prompt_ids[len(outs[0].prompt_ids) + len(outs[0].response_ids):])
    assert "<tool_response>" in reply and any(t in reply for t in hotpot["extra_info"]["supporting_titles"])


@needs_verl
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tiny_model_through_verl_keeps_ids_masks_and_budget(registered, lm, hotpot, seed):
    tok = lm[0]
    cfg = _cfg("grpo", max_response_length=48)
    server = sampled(lm, seed, verl_types=True)
    _, out = _run(cfg, server, tok, hotpot)
    resp, mask, lp = np.array(out.response_ids), np.array(out.response_mask), np.array(out.response_logprobs)
    assert len(resp) == len(mask) == len(lp) <= 48
    assert resp[mask == 1].tolist() == [i for c in server.calls for i in c["token_ids"]]
    assert np.allclose(lp[mask == 1], [x for c in server.calls for x in c["log_probs"]], atol=1e-6)
    batch = asyncio.run(vl.verl_postprocess([out], [hotpot], cfg, tok)).batch
    assert batch["response_mask"][0, :len(mask)].tolist() == mask.tolist()
    assert int(batch["attention_mask"][0, 1024:].sum()) == len(resp)


@needs_verl
def test_agent_loop_dry_run(registered, lm, hotpot):
    tok, model = lm
    r = vl.agent_loop_dry_run(_cfg("grpo"), hotpot, tok, model, response_length=32, seed=1)
    assert r["ids_and_masks_ok"] and r["layout"] == "sequence" and r["response_tokens"] <= 32
    assert r["agent_loop"] == "ar1_agent -> agent_r1_tutorial.verl_bridge.Ar1AgentLoop"
    r = vl.agent_loop_dry_run(_cfg("steppo"), hotpot, tok, policy=searcher(hotpot), response_length=1024)
    assert (r["layout"], r["outputs"], r["tool_calls"], r["reward_score"], r["ids_and_masks_ok"]) == ("step", 2, 1, 1.0, True)
    with pytest.raises(ValueError, match="a model or a scripted policy"):
        vl.agent_loop_dry_run(_cfg("grpo"), hotpot, tok, model, policy=searcher(hotpot))


def test_game_episodes_report_one_key_set_however_they_end(tok, tmp_path):
    """verl takes a batch's reward_extra_info keys from its first episode: a game won, lost to the loop's turn cap, cut
    by the response budget or answered without a command reports the scorers' keys, and the game judges every one."""
    from agent_r1_tutorial.textgames import write_alfworld_fixture

    game = write_alfworld_fixture(tmp_path)
    row = {"data_source": "alfworld", "raw_prompt": [{"role": "user", "content": "Play the ALFWorld game."}],
           "reward_model": {"ground_truth": ""},
           "extra_info": {"env_kwargs": {"env": "textgame", "start": "alfworld", "max_steps": 30},
                          "reset_kwargs": {"game": str(game)}}}
    from agent_r1_tutorial.textgames import TextGameEnv

    planner = TextGameEnv(max_steps=30, start="alfworld_plan")  # the rows' "alfworld" games skip the planner
    planner.reset(game=str(game))
    solution = planner.walkthrough
    turn = lambda ctx: ctx.count("<|im_start|>assistant") - 1
    look = lambda ctx: "<action>look</action>"
    play = lambda policy, budget, max_turns: asyncio.run(vb.run_agent_episode(
        scripted(tok, policy), tok, *vb.env_from_row(row, tok), None, budget, max_turns=max_turns))
    first = play(look, 1024, 1).steps[0]
    room = len(first.action_ids) + len(first.env_ids) // 2  # the first turn fits, the game's answer to it does not
    players = {
        "won": (lambda ctx: f"<action>{solution[min(turn(ctx), len(solution) - 1)]}</action>", 1024, None),
        "turn cap": (look, 1024, 2),
        "response budget": (look, room, None),
        "cut mid-command": (look, 4, None),  # the game truncates a turn cut before its command ends
        "no command": (lambda ctx: "I will look around." if turn(ctx) == 0 else "<action>look</action>", 1024, 2),
    }
    infos = {}
    for name, (policy, budget, max_turns) in players.items():
        traj = play(policy, budget, max_turns)
        assert traj.metadata["outcome_from_env"], name  # the game judged it: verl's reward function is not called
        (out,) = vb.episode_outputs(traj, tok, "sequence", row)
        assert out["reward_score"] == traj.outcome_reward, name
        infos[name] = (traj.reason, out["extra_fields"]["reward_extra_info"])
    assert infos["won"] == ("won", {"score": 1.0, "acc": 1.0, "format": 1.0})
    assert infos["turn cap"] == ("max_turns", {"score": 0.0, "acc": 0.0, "format": 1.0})
    assert infos["response budget"] == ("max_response_length", {"score": 0.0, "acc": 0.0, "format": 1.0})
    assert infos["cut mid-command"] == ("max_new_tokens", {"score": 0.0, "acc": 0.0, "format": 0.0})
    assert infos["no command"] == ("max_turns", {"score": 0.0, "acc": 0.0, "format": 0.5})
