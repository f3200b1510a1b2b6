"""Fault injection for the reference trainer.

A tool that raises, hangs or returns 10 MB; an environment that raises mid-episode; a reward function that returns
NaN; a kill -9 between two checkpoint writes. In each case the run goes on, or stops with a message that names the
cause; no checkpoint or log line is lost; and a run resumed from its last checkpoint equals one never interrupted.
"""
import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from agent_r1_tutorial.core import read_jsonl
from agent_r1_tutorial.envs import EnvStepError, ToolEnv
from agent_r1_tutorial.tinylm import tiny_qwen2
from agent_r1_tutorial.tools import BaseTool, HermesFormat, ParsedResponse, ToolCall, ToolResult
from agent_r1_tutorial.trainer import TargetTokensEnv, Trainer, TrainerConfig, latest_checkpoint
from test_trainer import digits, tok  # noqa: F401  the trainer tests' fixtures: the tiny tokenizer and its digit ids

TASKS = [{"question": q} for q in ["say numbers", "count", "digits"]]
SMALL = dict(prompts_per_step=2, group_size=2, max_new_tokens=8, lr=3e-3, mini_batch_size=4, micro_batch_size=2)


def trainer(tok, make_env, out_dir=None, algorithm="grpo", **kw):
    cfg = TrainerConfig(**{**SMALL, "algorithm": algorithm, "seed": 3, "out_dir": str(out_dir) if out_dir else None, **kw})
    return Trainer(tiny_qwen2(tok, seed=0), tok, make_env, TASKS, cfg)


def params(tr):
    return [p.detach().clone() for p in tr.policy.parameters()]


def same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))


# ---------------------------------------------------------------- faulty tools: the run goes on


class FaultyTool(BaseTool):
    name = "faulty"
    description = "A tool with a fault."
    parameters = {"type": "object", "properties": {}}

    def __init__(self, mode: str):
        self.mode = mode

    async def aexecute(self, arguments):
        if self.mode == "raise":
            raise RuntimeError("disk on fire")
        if self.mode == "hang":
            await asyncio.sleep(3600)
        return ToolResult("x" * 10_000_000)  # "flood": 10 MB


class AlwaysCalls(HermesFormat):
    "Reads every response as one call to the faulty tool, so that each turn of an untrained model reaches it."

    def _parse(self, text):
        return ParsedResponse(content=text, calls=[ToolCall("faulty", {})])


@pytest.mark.parametrize("mode, says", [("raise", "tool 'faulty' failed: RuntimeError: disk on fire"),
                                        ("hang", "tool 'faulty' did not finish within 0.3 s"),
                                        ("flood", "x" * 200)])  # the reply's text, cut (not an error)
def test_a_faulty_tool_becomes_an_observation_and_training_goes_on(tok, tmp_path, mode, says):
    make_env = lambda task: ToolEnv([FaultyTool(mode)], tool_format=AlwaysCalls(), max_turns=2, tool_timeout=0.3,
                                    max_tool_response_chars=500, reward_fn=lambda answer, task: 0.0)
    tr = trainer(tok, make_env, tmp_path)
    t0 = time.perf_counter()
    trajs = tr.rollout(TASKS[:2], 2)
    feedback = [s.feedback for t in trajs for s in t.steps if not s.done]
    assert len(feedback) == 4 and all(says in f for f in feedback), feedback[:1]
    assert all(len(f) <= 500 for f in feedback)  # the 10 MB reply is cut to the observation budget
    assert all(t.reason == "max_turns" for t in trajs)
    hist = tr.train(2, progress=False)
    assert len(hist) == 2 and len(read_jsonl(tmp_path / "metrics.jsonl")) == 2
    if mode == "hang":  # three rollouts of two turns, each call stopped at 0.3 s: no hang reaches the run
        assert time.perf_counter() - t0 < 30


# ---------------------------------------------------------------- an environment or a reward that fails: a clear stop


class FlakyEnv(TargetTokensEnv):
    "The toy task, with a bug that can be switched on: its second turn raises."
    broken = False

    def _step(self, action):
        if FlakyEnv.broken and len(self.scores) == 1:
            raise KeyError("score table")
        return super()._step(action)


def test_an_environment_that_raises_stops_the_run_naming_it_and_the_run_resumes_exactly(tok, digits, tmp_path):
    make_env = lambda task: FlakyEnv(digits, turns=2, eos_id=tok.eos_token_id)
    ref = trainer(tok, make_env, tmp_path / "ref")
    ref.train(3, progress=False)  # the run that nothing interrupts

    tr = trainer(tok, make_env, tmp_path / "run", save_every=1)
    tr.train(2, progress=False)
    before = params(tr)
    FlakyEnv.broken = True
    try:
        with pytest.raises(EnvStepError) as e:
            tr.train(1, progress=False)
    finally:
        FlakyEnv.broken = False
    msg = str(e.value)
    assert msg.startswith("episode ") and "(FlakyEnv) raised KeyError in step: 'score table'" in msg, msg
    assert same(before, params(tr)) and tr.global_step == 2  # nothing was updated
    ck = latest_checkpoint(tmp_path / "run")
    assert ck.name == "step_000002" and len(read_jsonl(tmp_path / "run" / "metrics.jsonl")) == 2

    resumed = trainer(tok, make_env, tmp_path / "run", save_every=1)
    assert resumed.load_checkpoint(ck) == 2
    resumed.train(1, progress=False)
    assert same(params(ref), params(resumed))
    rewards = lambda d: [r["reward/outcome_mean"] for r in read_jsonl(d / "metrics.jsonl")]
    assert rewards(tmp_path / "ref") == rewards(tmp_path / "run")


def test_a_reward_function_returning_nan_stops_the_run_naming_it(tok, tmp_path):
    class AlwaysAnswers(HermesFormat):
        def _parse(self, text):
            return ParsedResponse(content=text, answer="42")
    make_env = lambda task: ToolEnv([], tool_format=AlwaysAnswers(), reward_fn=lambda answer, task: float("nan"))
    tr = trainer(tok, make_env, tmp_path, save_every=1)
    before = params(tr)
    with pytest.raises(EnvStepError, match=r"reward_fn returned nan for the answer '42': an outcome reward must be"):
        tr.train(1, progress=False)
    assert same(before, params(tr)) and tr.global_step == 0
    assert latest_checkpoint(tmp_path) is None and not (tmp_path / "metrics.jsonl").read_text()


# ---------------------------------------------------------------- kill -9 between two checkpoint writes

KILLED_RUN = """
import os, signal, sys, torch
torch.set_num_threads(1)
sys.path.insert(0, {tests!r})
from test_faults import SMALL, TASKS
from agent_r1_tutorial.tinylm import build_tiny_lm, tiny_qwen2
from agent_r1_tutorial.trainer import TargetTokensEnv, Trainer, TrainerConfig
tok = build_tiny_lm(seed=0)[0]
digits = [i for t, i in tok.get_vocab().items() if any(ch.isdigit() for ch in t)]
save = torch.save
def dies_writing_step_3(obj, *a, **k):  # the policy of step 3 is written, its trainer state is not
    if isinstance(obj, dict) and obj.get("step") == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    return save(obj, *a, **k)
torch.save = dies_writing_step_3
cfg = TrainerConfig(**{{**SMALL, "algorithm": "ppo", "seed": 3, "out_dir": {out!r}, "save_every": 1}})
Trainer(tiny_qwen2(tok, seed=0), tok, lambda t: TargetTokensEnv(digits, turns=2, eos_id=tok.eos_token_id), TASKS,
        cfg).train(4, progress=False)
"""


@pytest.mark.skipif(os.name != "posix", reason="needs kill -9")
def test_kill_9_between_two_checkpoint_writes_loses_nothing_and_resumes_exactly(tok, digits, tmp_path):
    out = tmp_path / "run"
    script = KILLED_RUN.format(tests=os.path.dirname(__file__), out=str(out))
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert p.returncode == -signal.SIGKILL, p.stderr[-2000:]
    # the half-written checkpoint is ignored; the last complete one and every logged line are there
    assert (out / "checkpoints" / "step_000003.tmp").exists()
    ck = latest_checkpoint(out)
    assert ck.name == "step_000002"
    logged = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in logged] == [1, 2, 3]  # step 3 was logged before its checkpoint was written

    make_env = lambda task: TargetTokensEnv(digits, turns=2, eos_id=tok.eos_token_id)
    resumed = trainer(tok, make_env, out, algorithm="ppo", save_every=1)
    assert resumed.load_checkpoint(ck) == 2
    # the line of step 3 moved beside the log (it will be logged again), nothing deleted
    assert [r["step"] for r in read_jsonl(out / "metrics.rolled_back.jsonl")] == [3]
    resumed.train(2, progress=False)
    ref = trainer(tok, make_env, tmp_path / "ref", algorithm="ppo")
    ref.train(4, progress=False)
    assert same(params(ref), params(resumed))
    assert same([p.detach() for p in ref.critic.parameters()], [p.detach() for p in resumed.critic.parameters()])
    strip = lambda rows: [{k: v for k, v in r.items() if k != "time" and not k.startswith("time/")
                           and k != "rollout/tokens_per_s"} for r in rows]
    assert strip(read_jsonl(out / "metrics.jsonl")) == strip(read_jsonl(tmp_path / "ref" / "metrics.jsonl"))
    rolled = strip(read_jsonl(out / "metrics.rolled_back.jsonl"))
    assert rolled == strip(read_jsonl(out / "metrics.jsonl"))[2:3]  # the killed step 3 was the same step 3
    assert latest_checkpoint(out).name == "step_000004" and not (out / "checkpoints" / "step_000003.tmp").exists()
