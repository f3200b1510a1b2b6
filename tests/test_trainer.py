"""The reference trainer: learning on a toy task, exact resume, and bad configurations."""
import math

import numpy as np
import pytest
import torch

from agent_r1_tutorial.core import read_jsonl
from agent_r1_tutorial.tinylm import build_tiny_lm, tiny_qwen2
from agent_r1_tutorial.trainer import (ALGORITHMS, NonFiniteError, TargetTokensEnv, Trainer, TrainerConfig,
                                       latest_checkpoint)


@pytest.fixture(scope="module")
def tok():
    torch.set_num_threads(1)
    return build_tiny_lm(seed=0)[0]


@pytest.fixture(scope="module")
def digits(tok):
    return [i for t, i in tok.get_vocab().items() if any(ch.isdigit() for ch in t)]


TASKS = [{"question": q} for q in ["say numbers", "count", "digits"]]


def make(tok, digits, **kw):
    cfg = TrainerConfig(**{**dict(prompts_per_step=4, group_size=4, max_new_tokens=8, lr=3e-3, mini_batch_size=16,
                                  micro_batch_size=8), **kw})
    env = lambda task: TargetTokensEnv(digits, turns=2, eos_id=tok.eos_token_id)
    return Trainer(tiny_qwen2(tok, seed=0), tok, env, TASKS, cfg)


def test_ppo_raises_the_toy_reward(tok, digits, tmp_path):
    "A stated margin: the mean reward of the last 5 steps beats the first 5 by at least 0.15 (chance is ~0.05)."
    tr = make(tok, digits, algorithm="ppo", seed=0, out_dir=str(tmp_path))
    hist = tr.train(20, progress=False)
    r = [m["reward/outcome_mean"] for m in hist]
    assert np.mean(r[-5:]) > np.mean(r[:5]) + 0.15, r
    assert len(read_jsonl(tmp_path / "metrics.jsonl")) == 20
    assert all(math.isfinite(m["critic/vf_loss"]) for m in hist)


def test_steppo_resumes_exactly(tok, digits, tmp_path):
    kw = dict(algorithm="steppo", prompts_per_step=2, group_size=2, mini_batch_size=4, micro_batch_size=2, seed=5)
    a = make(tok, digits, out_dir=str(tmp_path / "a"), **kw)
    ma = a.train(3, progress=False)
    b = make(tok, digits, out_dir=str(tmp_path / "b"), save_every=2, **kw)
    b.train(2, progress=False)
    ck = latest_checkpoint(tmp_path / "b")
    assert ck is not None and ck.name == "step_000002"
    c = make(tok, digits, out_dir=str(tmp_path / "c"), **kw)
    assert c.load_checkpoint(ck) == 2
    mc = c.train(1, progress=False)
    for p1, p2 in zip(a.policy.parameters(), c.policy.parameters()):
        assert torch.equal(p1, p2)
    for p1, p2 in zip(a.critic.parameters(), c.critic.parameters()):
        assert torch.equal(p1, p2)
    assert ma[2]["reward/outcome_mean"] == mc[0]["reward/outcome_mean"]


def test_checkpoint_reloads_as_hugging_face_model(tok, digits, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tr = make(tok, digits, prompts_per_step=2, group_size=2, mini_batch_size=4, micro_batch_size=2,
              out_dir=str(tmp_path))
    tr.train(1, progress=False)
    ck = tr.save_checkpoint()
    m = AutoModelForCausalLM.from_pretrained(ck / "policy")
    t = AutoTokenizer.from_pretrained(ck / "policy")
    assert t.chat_template == tok.chat_template
    for p1, p2 in zip(m.parameters(), tr.policy.parameters()):
        assert torch.equal(p1, p2)
    with pytest.raises(ValueError, match="trained with 'grpo'"):
        make(tok, digits, algorithm="rloo", prompts_per_step=2, group_size=2, mini_batch_size=4,
             micro_batch_size=2).load_checkpoint(ck)


@pytest.mark.parametrize("kw, msg", [
    (dict(algorithm="a2c"), "unknown algorithm 'a2c'"),
    (dict(mini_batch_size=64), "larger than the batch"),
    (dict(micro_batch_size=32, mini_batch_size=16), "must not exceed mini_batch_size"),
    (dict(process_rewards="sometimes"), "process_rewards must be one of"),
    (dict(gamma=1.5), "gamma and lam must be in [0, 1]"),
    (dict(kl_coef=-1), "kl_coef must be >= 0"),
    (dict(ppo_epochs=0), "ppo_epochs must be a positive int"),
])
def test_bad_configs_are_rejected(kw, msg):
    with pytest.raises(ValueError) as e:
        TrainerConfig(**{**dict(prompts_per_step=4, group_size=4), **kw})
    assert msg in str(e.value)


def test_missing_critic_for_ppo(tok, digits):
    with pytest.raises(ValueError, match="ppo needs a critic"):
        make(tok, digits, algorithm="ppo", init_critic_from_policy=False)


def test_nan_stops_before_the_update(tok, digits):
    def bad(scores, batch, trajs):
        return scores * float("nan")
    tr = make(tok, digits, prompts_per_step=2, group_size=2, mini_batch_size=4, micro_batch_size=2)
    tr.score_fn = bad
    before = [p.clone() for p in tr.policy.parameters()]
    with pytest.raises(NonFiniteError, match="step 0: token_level_rewards"):
        tr.step()
    assert all(torch.equal(x, y) for x, y in zip(before, tr.policy.parameters()))


@pytest.mark.gpu
@pytest.mark.parametrize("algorithm,kw", [("ppo", {}), ("grpo", dict(filter_groups=True, bypass_mode=True))])
def test_trainer_learns_on_cuda(tok, digits, algorithm, kw, tmp_path):
    "The CPU test's margin, on a GPU: the last 5 steps' mean reward beats the first 5 by at least 0.15."
    tr = make(tok, digits, algorithm=algorithm, device="cuda", seed=0, out_dir=str(tmp_path), **kw)
    hist = tr.train(20, progress=False)
    assert next(tr.policy.parameters()).is_cuda
    assert all(math.isfinite(m["actor/pg_loss"]) for m in hist)
    r = [m["reward/outcome_mean"] for m in hist]
    assert np.mean(r[-5:]) > np.mean(r[:5]) + 0.15, r
