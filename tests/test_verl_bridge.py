"""The verl bridge (chapter 12): registration, the trainer patch, the reward function, data preparation, the
configuration for every algorithm, the index, preflight checks, the GPU pins and the full-scale dry run.

verl (CPU build) is needed for most tests and they are skipped without it; the library module itself must import
without verl, which the first test checks in a clean interpreter.
"""
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ROOT
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_r1_tutorial import verl_bridge as vb
from agent_r1_tutorial.advantages import ADV_ESTIMATORS
from agent_r1_tutorial.losses import AGG_MODES, POLICY_LOSSES

HAS_VERL = __import__("importlib").util.find_spec("verl") is not None
needs_verl = pytest.mark.skipif(not HAS_VERL, reason="verl (CPU build) is not installed")


def _run(cmd, env=None, timeout=600, cwd=ROOT):
    res = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})
    return res.returncode, res.stdout, res.stderr


# ---------------------------------------------------------------- importing without verl


def test_module_imports_without_verl_and_says_what_to_install():
    code = textwrap.dedent("""
        import sys
        sys.modules["verl"] = None  # makes `import verl` fail, as in the core CPU environment
        import agent_r1_tutorial.verl_bridge as vb
        assert "verl" not in [m.split(".")[0] for m in sys.modules if sys.modules[m] is not None]
        rows = vb.hotpotqa_rows(vb.hotpotqa_toy_sample(4), "train")  # data preparation needs no verl
        print(len(rows), vb.verl_overrides(vb.VerlRunConfig("ppo"))[0])
        try:
            vb.register_with_verl()
        except ImportError as e:
            print("ImportError:", e)
    """)
    code_, out, err = _run([sys.executable, "-c", code], env={vb.EXTERNAL_MODULES_ENV: ""})
    assert code_ == 0, err
    assert "4 algorithm.adv_estimator=ar1_gae" in out
    assert "register_with_verl needs verl" in out and "scripts/setup.sh dev" in out


# ---------------------------------------------------------------- registries


@pytest.fixture(scope="module")
def core_algos():
    if not HAS_VERL:
        pytest.skip("verl is not installed")
    from verl.trainer.ppo import core_algos

    vb.register_with_verl()
    return core_algos


def test_registration_puts_every_name_in_verls_registries(core_algos):
    out = vb.register_with_verl()
    assert out["adv_estimators"] == [f"ar1_{n}" for n in ADV_ESTIMATORS]
    assert out["policy_losses"] == [f"ar1_{n}" for n in POLICY_LOSSES]
    for n in ADV_ESTIMATORS:
        fn = core_algos.get_adv_estimator_fn(f"ar1_{n}")
        assert fn.__wrapped__ is ADV_ESTIMATORS[n] and fn.__name__ == f"ar1_{n}"
    for n in POLICY_LOSSES:
        assert core_algos.get_policy_loss_fn(f"ar1_{n}").__wrapped__ is POLICY_LOSSES[n]
    assert core_algos.get_adv_estimator_fn("grpo").__module__.startswith("verl")  # verl's own names untouched
    assert vb.register_with_verl() == out  # idempotent: no "already registered" error


def _outcome_batch(rng, dtype=torch.float32):
    bs, T = int(rng.integers(2, 10)), int(rng.integers(2, 14))
    m = (rng.random((bs, T)) < 0.8).astype(float)
    m[:, 0] = 1
    r = np.zeros((bs, T))
    for i in range(bs):
        r[i, np.nonzero(m[i])[0][-1]] = rng.choice([0.0, 0.5, 1.0])
    idx = np.array([f"u{j}" for j in rng.integers(0, 3, bs)], dtype=object)
    return torch.tensor(r, dtype=dtype), torch.tensor(m, dtype=dtype), idx


@pytest.mark.parametrize("name", ["grpo", "drgrpo", "rloo", "reinforce_pp"])
def test_estimators_through_verl_give_our_numbers(core_algos, name):
    from omegaconf import OmegaConf

    rng = np.random.default_rng(len(name))
    fn = core_algos.get_adv_estimator_fn(f"ar1_{name}")
    for _ in range(40):
        r, m, idx = _outcome_batch(rng)
        cfg = OmegaConf.create({"gamma": float(rng.choice([1.0, 0.9])), "norm_adv_by_std_in_grpo": bool(rng.random() < 0.5)})
        # exactly the keyword arguments verl's generic call passes (ray_trainer.compute_advantage)
        adv, ret = fn(token_level_rewards=r, response_mask=m, config=cfg, index=idx)
        adv2, ret2 = ADV_ESTIMATORS[name](r, m, index=idx, config=cfg)
        torch.testing.assert_close(adv, adv2)
        torch.testing.assert_close(ret, ret2)


def test_value_estimators_refuse_verls_generic_call(core_algos):
    r, m, idx = _outcome_batch(np.random.default_rng(0))
    with pytest.raises(ValueError, match="needs the critic's `values`"):
        core_algos.get_adv_estimator_fn("ar1_gae")(token_level_rewards=r, response_mask=m, config=None, index=idx)
    with pytest.raises(ValueError, match="trajectory_uids"):
        core_algos.get_adv_estimator_fn("ar1_step_gae")(token_level_rewards=r, response_mask=m, values=r)
    # given what they need, they are ours
    adv = core_algos.get_adv_estimator_fn("ar1_gae")(token_level_rewards=r, response_mask=m, values=r * 0.5, config=None)
    torch.testing.assert_close(adv[0], ADV_ESTIMATORS["gae"](r, r * 0.5, m)[0])


@pytest.mark.parametrize("loss", sorted(POLICY_LOSSES))
@pytest.mark.parametrize("mode", AGG_MODES)
def test_policy_loss_adapter_matches_verl_with_global_batch_normalisation(core_algos, loss, mode):
    from verl.workers.config.actor import ActorConfig

    rng = np.random.default_rng(10 * AGG_MODES.index(mode) + sorted(POLICY_LOSSES).index(loss))
    for trial in range(12):
        bs, T = int(rng.integers(1, 8)), int(rng.integers(1, 12))
        m = torch.tensor(rng.random((bs, T)) < 0.7)
        old = torch.tensor(rng.normal(-1, 0.3, (bs, T)))
        adv = torch.tensor(rng.normal(size=(bs, T)))
        cfg = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size=2, clip_ratio=0.2, clip_ratio_high=0.28)
        dp = [1, 2, 4][trial % 3]
        if dp > 1 or trial % 2:
            cfg.global_batch_info.update(dp_size=dp, batch_num_tokens=int(m.sum()) + int(rng.integers(0, 30)),
                                         global_batch_size=bs + int(rng.integers(0, 9)),
                                         loss_scale_factor=float(rng.integers(1, 40)) if trial % 4 == 1 else None)
        lp_o = (old + torch.tensor(rng.normal(0, 0.2, (bs, T)))).requires_grad_(True)
        lp_v = lp_o.detach().clone().requires_grad_(True)
        if trial == 5:
            m[:] = False  # an all-padding micro-batch
        ours, om = core_algos.get_policy_loss_fn(f"ar1_{loss}")(old, lp_o, adv, m, mode, cfg)
        theirs, tm = core_algos.get_policy_loss_fn(loss)(old, lp_v, adv, m, mode, cfg)
        if not m.any() and not cfg.global_batch_info:
            # verl divides 0 by 0 here (NaN); ours gives 0, the deliberate difference pinned in test_parity_verl
            assert ours.item() == 0.0
            continue
        torch.testing.assert_close(ours, theirs.to(ours.dtype), rtol=1e-7, atol=1e-9)
        if m.any():
            ours.backward()
            theirs.backward()
            torch.testing.assert_close(lp_o.grad, lp_v.grad, rtol=1e-7, atol=1e-9)
        assert om.keys() == tm.keys()


def test_global_loss_scale_bad_input():
    m = torch.ones(2, 3)
    with pytest.raises(ValueError, match="batch_num_tokens"):
        vb.global_loss_scale(m, "token-mean", dp_size=2)
    with pytest.raises(ValueError, match="global_batch_size"):
        vb.global_loss_scale(m, "seq-mean-token-mean", dp_size=2)
    with pytest.raises(ValueError, match="unknown loss_agg_mode"):
        vb.global_loss_scale(m, "sum")
    assert vb.global_loss_scale(m, "token-sum", dp_size=3) == 3.0


def test_verl_name_rejects_unknown_names():
    with pytest.raises(ValueError, match="neither an advantage estimator"):
        vb.verl_name("ppo")


# ---------------------------------------------------------------- the trainer patch


@pytest.fixture(scope="module")
def patched(core_algos):
    vb.register_with_verl(patch_trainer=True)
    from verl.trainer.ppo.v1 import trainer_base, utils

    return utils, trainer_base


def _step_batch(rng, n_prompts=3, T=7):
    from verl import DataProto

    keys, outcome = [], []
    for p in range(n_prompts):
        for s in range(2):
            k, o = int(rng.integers(1, 4)), float(rng.choice([0.0, 0.3, 1.0]))
            keys += [f"q_{p}_{s}_{i}" for i in range(k)]  # uids with "_" inside
            outcome += [o] * k
    n = len(keys)
    mask = torch.tensor(rng.random((n, T)) < 0.85, dtype=torch.float32)
    mask[:, 0] = 1
    scores = torch.zeros(n, T)
    last = mask.shape[1] - 1 - mask.flip(-1).argmax(-1)
    scores[torch.arange(n), last] = torch.tensor(outcome)
    vals = torch.tensor(rng.normal(size=(n, T)), dtype=torch.float32)
    uid = np.array([k.rsplit("_", 2)[0] for k in keys], dtype=object)
    t = {"token_level_rewards": scores, "token_level_scores": scores, "response_mask": mask, "values": vals}
    return keys, lambda: DataProto.from_dict(tensors={k: v.clone() for k, v in t.items()}, non_tensors={"uid": uid})


def test_patch_is_installed_in_both_modules_and_idempotent(patched):
    utils, trainer_base = patched
    assert trainer_base.compute_advantage_for_multi_trajectories is utils.compute_advantage_for_multi_trajectories
    first = utils.compute_advantage_for_multi_trajectories
    vb.patch_verl_trainer()
    assert utils.compute_advantage_for_multi_trajectories.__ar1_original__ is first.__ar1_original__


@pytest.mark.parametrize("seed", range(6))
def test_patched_grpo_on_step_rows_equals_verls_grpo(patched, seed):
    from omegaconf import OmegaConf

    utils, _ = patched
    keys, make = _step_batch(np.random.default_rng(seed))
    cfg = OmegaConf.create({"norm_adv_by_std_in_grpo": True})
    ours = utils.compute_advantage_for_multi_trajectories(make(), keys, "ar1_grpo", config=cfg)
    verl = utils.compute_advantage_for_multi_trajectories.__ar1_original__(make(), keys, "grpo", config=cfg)
    torch.testing.assert_close(ours.batch["advantages"], verl.batch["advantages"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("seed", range(6))
def test_patched_step_gae_counts_each_outcome_once(patched, seed):
    utils, _ = patched
    keys, make = _step_batch(np.random.default_rng(100 + seed))
    traj, steps = vb.split_batch_keys(keys)
    d = make()
    last = torch.tensor([s == max(steps[traj == t]) for t, s in zip(traj, steps)], dtype=torch.float32)[:, None]
    want = ADV_ESTIMATORS["step_gae"](d.batch["token_level_rewards"] * last, d.batch["values"], d.batch["response_mask"],
                                      trajectory_uids=traj, step_indices=steps, gamma=0.9, lam=0.8)
    got = utils.compute_advantage_for_multi_trajectories(make(), keys, "ar1_step_gae", gamma=0.9, lam=0.8)
    torch.testing.assert_close(got.batch["advantages"], want[0])
    torch.testing.assert_close(got.batch["returns"], want[1])


def test_patched_gae_equals_verls_hardwired_gae(patched):
    from verl import DataProto
    from verl.trainer.ppo.ray_trainer import compute_advantage

    utils, _ = patched
    rng = np.random.default_rng(5)
    m = torch.tensor(rng.random((6, 9)) < 0.8, dtype=torch.float32)
    m[:, 0] = 1
    t = {"token_level_rewards": torch.tensor(rng.normal(size=(6, 9)), dtype=torch.float32) * m,
         "response_mask": m, "values": torch.tensor(rng.normal(size=(6, 9)), dtype=torch.float32)}
    make = lambda: DataProto.from_dict(tensors={k: v.clone() for k, v in t.items()})
    keys = [f"p{i}_0_0" for i in range(6)]
    ours = utils.compute_advantage_for_multi_trajectories(make(), keys, "ar1_gae", gamma=0.97, lam=0.9)
    verl = compute_advantage(make(), "gae", gamma=0.97, lam=0.9, config={"use_pf_ppo": False})
    torch.testing.assert_close(ours.batch["advantages"], verl.batch["advantages"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours.batch["returns"], verl.batch["returns"], rtol=1e-5, atol=1e-5)


def test_patch_passes_verls_names_through_and_checks_inputs(patched):
    utils, _ = patched
    keys, make = _step_batch(np.random.default_rng(9))
    orig = utils.compute_advantage_for_multi_trajectories.__ar1_original__
    a = utils.compute_advantage_for_multi_trajectories(make(), keys, "rloo", config={})
    b = orig(make(), keys, "rloo", config={})
    torch.testing.assert_close(a.batch["advantages"], b.batch["advantages"])
    with pytest.raises(ValueError, match="batch keys for"):
        utils.compute_advantage_for_multi_trajectories(make(), keys[:-1], "ar1_rloo")
    d = make()
    d.batch.pop("values")
    with pytest.raises(ValueError, match="critic.enable=True"):
        utils.compute_advantage_for_multi_trajectories(d, keys, "ar1_gae")
    with pytest.raises(ValueError, match="is not of verl's form"):
        vb.split_batch_keys(["a_b"])


@needs_verl
def test_env_var_registers_in_a_fresh_process():
    probe = ("import verl.trainer.ppo.core_algos as c, verl.trainer.ppo.v1.utils as u; "
             "from verl.experimental.agent_loop.agent_loop import _agent_loop_registry as r; import hydra; "
             "print(c.get_adv_estimator_fn('ar1_grpo').__name__, hasattr(u.compute_advantage_for_multi_trajectories, "
             "'__ar1_original__'), hydra.utils.get_class(r['ar1_agent']['_target_']).__qualname__)")
    code, out, err = _run([sys.executable, "-c", probe], env={vb.EXTERNAL_MODULES_ENV: vb.MODULE_NAME})
    assert code == 0, err
    assert out.split()[-3:] == ["ar1_grpo", "True", "Ar1AgentLoop"]  # the agent loop too, in every verl process
    code, out, err = _run([sys.executable, "-c", "import verl.trainer.ppo.core_algos as c; "
                           "print('ar1_grpo' in c.ADV_ESTIMATOR_REGISTRY)"], env={vb.EXTERNAL_MODULES_ENV: ""})
    assert code == 0 and out.split()[-1] == "False", "without the variable nothing registers"


# ---------------------------------------------------------------- reward


@needs_verl
def test_verl_loads_our_reward_function():
    from verl.trainer.ppo.reward import get_custom_reward_fn

    from agent_r1_tutorial.rewards import compute_score

    cfg = vb.compose_verl_config(vb.verl_overrides(vb.VerlRunConfig("grpo")))
    fn = get_custom_reward_fn(cfg)
    assert fn.args[0] is compute_score
    out = fn(data_source="hotpotqa/hotpot_qa", solution_str="<answer>the Mirul</answer>", ground_truth="Mirul",
             extra_info={"fmt": "hermes", "metric": "em", "num_turns": 2})
    assert out["score"] == 1.0


# ---------------------------------------------------------------- data


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(1, 20))
def test_sampling_is_seeded(seed, n):
    raw = vb.hotpotqa_toy_sample(20, seed=3)
    a, b = vb.hotpotqa_rows(raw, "train", n, seed), vb.hotpotqa_rows(raw, "train", n, seed)
    assert a == b and len(a) == n
    assert [r["extra_info"]["index"] for r in a] == list(range(n))
    ids = [r["extra_info"]["source_id"] for r in a]
    assert len(set(ids)) == n  # without replacement


def test_different_seeds_give_different_samples():
    raw = vb.gsm8k_toy_sample(50)
    samples = {tuple(r["extra_info"]["source_id"] for r in vb.gsm8k_rows(raw, "train", 10, s)) for s in range(5)}
    assert len(samples) == 5


def test_row_schema():
    (row,) = vb.hotpotqa_rows(vb.hotpotqa_toy_sample(3), "validation", 1, 0, search_index_dir="/idx")
    assert set(row) == {"data_source", "prompt", "ability", "reward_model", "agent_name", "extra_info"}
    assert row["agent_name"] == vb.AGENT_NAME and row["reward_model"]["style"] == "rule"
    assert row["prompt"][0]["role"] == "user" and "Question:" in row["prompt"][0]["content"]
    ex = row["extra_info"]
    assert ex["tools_kwargs"] == {"search": {"create_kwargs": {"k": 3, "max_chars": 1000, "index_dir": "/idx"}}}
    assert ex["env_kwargs"] == {"env": "tool", "tools": ["search"], "tool_format": "hermes", "max_turns": 5}
    assert ex["fmt"] == "hermes" and ex["metric"] == "em" and ex["need_tools_kwargs"] is True
    (g,) = vb.gsm8k_rows(vb.gsm8k_toy_sample(3), "test", 1, 0)
    assert g["data_source"] == "openai/gsm8k" and g["extra_info"]["env_kwargs"]["tools"] == ["calculator"]
    assert g["reward_model"]["ground_truth"].lstrip("-").isdigit()


@pytest.mark.parametrize("mutate, msg", [
    (lambda r: r.pop("agent_name"), "no 'agent_name' column"),
    (lambda r: r.update(prompt=[]), "non-empty list"),
    (lambda r: r.update(prompt=[{"role": "user"}]), "non-empty list"),
    (lambda r: r["reward_model"].update(ground_truth=" "), "no ground_truth"),
    (lambda r: r["extra_info"].pop("env_kwargs"), "has no 'env_kwargs'"),
    (lambda r: r["extra_info"].update(index=True), "must be a int"),
    (lambda r: r["extra_info"].update(tools_kwargs={"search": {}}), "create_kwargs"),
    (lambda r: r.update(data_source=3), "must be a str"),
])
def test_check_row_names_the_problem(mutate, msg):
    (row,) = vb.hotpotqa_rows(vb.hotpotqa_toy_sample(2), "train", 1)
    mutate(row)
    with pytest.raises((ValueError, TypeError), match=msg):
        vb.check_row(row)


def test_bad_records_and_templates():
    with pytest.raises(ValueError, match="needs a non-empty 'question' and 'answer'"):
        vb.hotpotqa_rows([{"question": "q", "answer": ""}], "train")
    with pytest.raises(ValueError, match="must contain {question}"):
        vb.hotpotqa_rows(vb.hotpotqa_toy_sample(2), "train", template="no slot")
    with pytest.raises(ValueError, match="not a number"):
        vb.gsm8k_answer("#### twelve")
    with pytest.raises(ValueError, match="no rows"):
        vb.write_rows([], "/tmp/never.parquet")
    with pytest.raises(ValueError, match="non-negative int"):
        vb.seeded_sample(5, 2, seed=-1)


def test_parquet_round_trip_and_manifest(tmp_path):
    paths = vb.prepare_gsm8k(tmp_path, vb.gsm8k_toy_sample(20), vb.gsm8k_toy_sample(8, seed=1), n_train=10, n_val=3,
                             seed=4)
    back = vb.read_rows(paths["train"])
    assert back == vb.gsm8k_rows(vb.gsm8k_toy_sample(20), "train", 10, 4)
    man = json.loads((tmp_path / "manifest.json").read_text())
    assert man["n_train"] == 10 and man["n_validation"] == 3 and man["seed"] == 4
    bad = tmp_path / "bad.json"
    bad.write_text('{"not": "a list"}')
    with pytest.raises(ValueError, match="not a HotpotQA file"):
        vb.load_hotpotqa(bad)


@needs_verl
def test_verls_dataset_reads_our_parquet(tmp_path):
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from agent_r1_tutorial.tinylm import build_tiny_lm

    tok, _ = build_tiny_lm()
    paths = vb.prepare_hotpotqa(tmp_path, vb.hotpotqa_toy_sample(12), vb.hotpotqa_toy_sample(4, seed=1), 8, 2)
    ds = RLHFDataset(str(paths["train"]), tok, OmegaConf.create({"max_prompt_length": 512, "cache_dir": str(tmp_path),
                                                                 "filter_overlong_prompts_workers": 1}))
    rows = vb.read_rows(paths["train"])
    assert len(ds) == 8
    for i in (0, 7):
        item = ds[i]
        assert item["raw_prompt"] == rows[i]["prompt"] and item["agent_name"] == vb.AGENT_NAME
        assert item["tools_kwargs"] == rows[i]["extra_info"]["tools_kwargs"] and item["index"] == i


def test_download_is_cached_and_names_failures(tmp_path):
    src = tmp_path / "a.bin"
    src.write_bytes(b"x" * 5000)
    dst = vb.download(src.as_uri(), tmp_path / "d" / "a.bin", progress=False)
    assert dst.read_bytes() == src.read_bytes() and not (tmp_path / "d" / "a.bin.part").exists()
    src.write_bytes(b"changed")
    assert vb.download(src.as_uri(), dst, progress=False).read_bytes() == b"x" * 5000  # not fetched again
    with pytest.raises(RuntimeError, match="failed"):
        vb.download((tmp_path / "missing").as_uri(), tmp_path / "m.bin", progress=False)


# ---------------------------------------------------------------- configuration


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory):
    from agent_r1_tutorial.tinylm import build_tiny_lm

    d = tmp_path_factory.mktemp("tiny-model")
    tok, model = build_tiny_lm()
    tok.save_pretrained(d)
    model.save_pretrained(d)
    return str(d)


@needs_verl
@pytest.mark.parametrize("algo", vb.ALGORITHMS)
def test_every_algorithm_composes_and_validates(algo, stand_in):
    run = vb.VerlRunConfig(algo)
    cfg = vb.compose_verl_config(vb.verl_overrides(run))
    check = vb.validate_verl_config(cfg, model_path=stand_in)
    r = vb.RECIPES[algo]
    assert cfg.algorithm.adv_estimator == f"ar1_{r.adv_estimator}" == check["adv_estimator"]
    assert cfg.actor_rollout_ref.actor.policy_loss.loss_mode == "ar1_vanilla"
    assert check["use_critic"] is r.critic and check["use_reference_policy"] is True  # KL in the loss or the reward
    assert cfg.algorithm.use_kl_in_reward is (r.kl == "reward")
    assert cfg.actor_rollout_ref.rollout.n == r.n and cfg.actor_rollout_ref.rollout.multi_turn.enable
    assert cfg.actor_rollout_ref.model.override_config.attn_implementation == "sdpa"
    assert cfg.actor_rollout_ref.model.use_remove_padding is False
    assert cfg.reward.custom_reward_function.path == "pkg://agent_r1_tutorial.rewards"
    assert cfg.ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES == vb.MODULE_NAME
    assert "actor_rollout_ref.model" in check["sections"] and "actor_rollout_ref.actor" in check["sections"]
    assert ("critic" in check["sections"]) is r.critic


@needs_verl
def test_validation_without_the_model_says_what_it_skipped():
    check = vb.validate_verl_config(vb.compose_verl_config(vb.verl_overrides(vb.VerlRunConfig("ppo"))))
    assert check["model_checked_with"] is None
    assert any("actor_rollout_ref.model" in s for s in check["skipped"])
    assert any(s.startswith("critic") for s in check["skipped"])


@pytest.mark.parametrize("kw, msg", [
    (dict(algorithm="dpo"), "choose one of ['ppo', 'grpo', 'reinforce_pp', 'rloo', 'steppo']"),
    (dict(algorithm="rloo", n=1), "needs n >= 2"),
    (dict(n_gpus_per_node=0), "n_gpus_per_node=0: must be a positive int"),
    (dict(train_batch_size=True), "must be a positive int"),
    (dict(ppo_mini_batch_size=256), "cannot exceed train_batch_size"),
    (dict(rollout_tp=3), "must divide the number of GPUs"),
    (dict(actor_lr=0.0), "must be in (0, 1)"),
    (dict(gpu_memory_utilization=1.5), "must be in (0, 1)"),
    (dict(attn_implementation="flash3"), "choose 'sdpa'"),
    (dict(policy_loss="ppo"), "choose one of ['gspo', 'vanilla']"),
    (dict(loss_agg_mode="mean"), "choose one of"),
    (dict(model_path="a model,with comma"), "without spaces"),
    (dict(extra_overrides=("novalue",)), "'key=value' strings"),
])
def test_bad_knobs_are_refused_with_the_reason(kw, msg):
    with pytest.raises(ValueError, match=__import__("re").escape(msg)):
        vb.VerlRunConfig(**kw)


def test_overrides_are_generated_from_one_place():
    for algo in vb.ALGORITHMS:
        ov = vb.verl_overrides(vb.VerlRunConfig(algo))
        keys = [o.split("=", 1)[0] for o in ov]
        assert len(keys) == len(set(keys)), f"{algo}: a key is set twice"
    fa = vb.verl_overrides(vb.VerlRunConfig("ppo", attn_implementation="flash_attention_2"))
    assert not any("attn_implementation" in o or "use_remove_padding" in o for o in fa)
    last = vb.verl_overrides(vb.VerlRunConfig("grpo", extra_overrides=("trainer.total_epochs=3",)))
    assert last[-1] == "trainer.total_epochs=3"
    assert "trainer.total_training_steps=7" in vb.verl_overrides(vb.VerlRunConfig(total_training_steps=7))


@needs_verl
def test_verl_refuses_what_verl_would_refuse(stand_in):
    small = vb.VerlRunConfig("grpo", train_batch_size=3, ppo_mini_batch_size=3, n=2)
    with pytest.raises(ValueError, match="must be divisible"):
        vb.validate_verl_config(vb.compose_verl_config(vb.verl_overrides(small)), stand_in)
    with pytest.raises(ValueError, match="not registered with verl"):
        ov = vb.verl_overrides(vb.VerlRunConfig()) + ["actor_rollout_ref.actor.policy_loss.loss_mode=ar1_nope"]
        vb.validate_verl_config(vb.compose_verl_config(ov), stand_in)
    with pytest.raises(ValueError, match="needs a critic"):
        ov = vb.verl_overrides(vb.VerlRunConfig("steppo")) + ["critic.enable=False"]
        vb.validate_verl_config(vb.compose_verl_config(ov), stand_in)
    with pytest.raises(ValueError, match="rejected the overrides"):
        vb.compose_verl_config(["trainer.no_such_key=1"])


def test_launch_commands():
    one = vb.launch_commands(vb.VerlRunConfig("rloo"))
    assert list(one) == ["train"]
    assert one["train"].startswith(f"{vb.EXTERNAL_MODULES_ENV}={vb.MODULE_NAME} .venv-gpu/bin/python -m verl.trainer.main_ppo")
    assert "algorithm.adv_estimator=ar1_rloo" in one["train"]
    many = vb.launch_commands(vb.VerlRunConfig("ppo", nnodes=2, n_gpus_per_node=8), head_address="10.1.2.3")
    assert list(many) == ["head", "worker", "submit"]
    assert "ray start --head" in many["head"] and "--num-gpus=8" in many["head"]
    assert "--address=10.1.2.3:6379" in many["worker"]
    assert "ray job submit --address=http://10.1.2.3:8265" in many["submit"] and "trainer.nnodes=2" in many["submit"]
    assert vb.MODULE_NAME in many["submit"].split(" -- ")[0]  # the job's runtime env carries the registration


# ---------------------------------------------------------------- index


class CountingEncoder:
    "A stand-in encoder (hash features) that counts its calls and can fail on a chosen call."
    name, dim = "counting", 16

    def __init__(self, fail_on=None):
        self.calls, self.fail_on = 0, fail_on

    def _emb(self, texts):
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, t in enumerate(texts):
            for w in t.lower().split():
                out[i, hash(w) % self.dim] += 1
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-6)

    def encode_docs(self, texts):
        self.calls += 1
        if self.calls == self.fail_on:
            raise KeyboardInterrupt("interrupted")
        return self._emb(texts)

    def encode_queries(self, queries):
        return self._emb(queries)


def test_index_build_resumes_after_an_interruption_and_is_cached(tmp_path):
    passages = vb.hotpotqa_passages(vb.hotpotqa_toy_sample(20))
    enc = CountingEncoder(fail_on=3)
    with pytest.raises(KeyboardInterrupt):
        vb.build_corpus_index(passages, tmp_path, encoder=enc, shard_size=10, progress=False)
    assert len(list((tmp_path / "shards").glob("emb-*.npy"))) == 2 and not (tmp_path / "config.json").exists()
    enc2 = CountingEncoder()
    vb.build_corpus_index(passages, tmp_path, encoder=enc2, shard_size=10, progress=False)
    n_shards = -(-len(passages) // 10)
    assert enc2.calls == n_shards - 2, "finished shards must not be recomputed"
    assert json.loads((tmp_path / "config.json").read_text())["n_docs"] == len(passages)
    enc3 = CountingEncoder()
    vb.build_corpus_index(passages, tmp_path, encoder=enc3, shard_size=10, progress=False)
    assert enc3.calls == 0  # cached
    with pytest.raises(ValueError, match="shard_size"):
        vb.build_corpus_index(passages, tmp_path / "x", encoder=enc3, shard_size=0)


def test_beir_corpus_reads_zip_gz_and_jsonl(tmp_path):
    import gzip
    import zipfile

    lines = [json.dumps({"_id": f"d{i}", "title": f"T{i}", "text": "" if i == 1 else f"text {i}"}) for i in range(3)]
    (tmp_path / "c.jsonl").write_text("\n".join(lines) + "\n")
    with gzip.open(tmp_path / "c.jsonl.gz", "wt") as f:
        f.write("\n".join(lines) + "\n")
    with zipfile.ZipFile(tmp_path / "hotpotqa.zip", "w") as z:
        z.writestr("hotpotqa/corpus.jsonl", "\n".join(lines) + "\n")
    for p in ("c.jsonl", "c.jsonl.gz", "hotpotqa.zip"):
        assert [d["id"] for d in vb.beir_corpus(tmp_path / p)] == ["d0", "d2"]  # the empty passage is skipped


# ---------------------------------------------------------------- preflight


import preflight  # noqa: E402  (scripts/, on the path through conftest)

SMI = ("0, NVIDIA H100 80GB HBM3, 81559, 570.86.15\n1, NVIDIA H100 80GB HBM3, 81559, 570.86.15\n"
       "2, NVIDIA H100 80GB HBM3, 81559, 570.86.15\n3, NVIDIA H100 80GB HBM3, 81559, 570.86.15\n")
BANNER = "| NVIDIA-SMI 570.86.15   Driver Version: 570.86.15   CUDA Version: 12.8     |"


def test_parse_nvidia_smi():
    gpus = preflight.parse_gpus(SMI)
    assert len(gpus) == 4 and gpus[0].name == "NVIDIA H100 80GB HBM3" and gpus[0].memory_mib == 81559
    assert preflight.parse_cuda_version(BANNER) == "12.8"
    assert preflight.parse_gpus("0, Weird, GPU, Name, 40960, 535.104.05")[0].name == "Weird, GPU, Name"
    with pytest.raises(preflight.PreflightError, match="expected 4"):
        preflight.parse_gpus("0, only two")
    with pytest.raises(preflight.PreflightError, match="not index, name, memory"):
        preflight.parse_gpus("x, A100, lots, 535")


@pytest.mark.parametrize("driver, pins", [("590.10", "cu13"), ("580.65.06", "cu13"), ("570.86.15", "cu12"),
                                          ("535.104.05", "cu12"), ("525.60.13", "cu12")])
def test_pin_set_follows_the_driver(driver, pins):
    assert preflight.pin_set(driver) == pins


def test_old_driver_is_refused():
    with pytest.raises(preflight.PreflightError, match="too old"):
        preflight.pin_set("470.82.01")
    with pytest.raises(preflight.PreflightError, match="cannot read"):
        preflight.pin_set("n/a")


def test_checks_with_faked_outputs(tmp_path, monkeypatch):
    gpus = preflight.parse_gpus(SMI)
    ok = preflight.run_checks(4, 40, tmp_path, 0.001, sys.executable, smi=(gpus, "12.8"))
    assert ok.ok, ok.errors
    assert ok.info["pin_set"] == "cu12" and ok.info["cuda_version"] == "12.8"
    few = preflight.run_checks(8, 40, tmp_path, 0.001, sys.executable, smi=(gpus, "12.8"))
    assert not few.ok and "4 GPU(s) found, the run asks for 8" in few.errors[0]
    small = preflight.run_checks(4, 100, tmp_path, 0.001, sys.executable, smi=(gpus, "12.8"))
    assert any("below the 100 GiB" in e for e in small.errors)
    old = preflight.run_checks(4, 40, tmp_path, 0.001, sys.executable,
                               smi=(preflight.parse_gpus(SMI.replace("570.86.15", "450.80.02")), "11.0"))
    assert any("too old" in e for e in old.errors)
    warn = preflight.run_checks(4, 40, tmp_path, 0.001, sys.executable,
                                smi=(preflight.parse_gpus(SMI.replace("570.86.15", "550.54.15")), "12.4"))
    assert warn.ok and any("older than R570" in w for w in warn.warnings)
    monkeypatch.setattr(preflight.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10, 10, 5 * 2**30))
    disk = preflight.run_checks(4, 40, tmp_path / "not" / "yet", 150, sys.executable, smi=(gpus, "12.8"))
    assert any("5 GiB free" in e and "needs about 150 GiB" in e for e in disk.errors)


def test_python_check(tmp_path):
    r = preflight.Report()
    preflight.check_python((3, 13, 0), r, "py")
    assert not r.ok and "resolved for Python 3.11 or 3.12" in r.errors[0]
    r = preflight.Report()
    preflight.check_python((3, 12, 1), r)
    assert r.ok
    fake = tmp_path / "python3.9"
    fake.write_text("#!/bin/sh\necho 3 9 1\n")
    fake.chmod(0o755)
    assert preflight.python_version(str(fake)) == (3, 9, 1)
    with pytest.raises(preflight.PreflightError, match="was not found"):
        preflight.python_version("/no/such/python")


@pytest.fixture
def fake_smi(tmp_path):
    "A fake nvidia-smi on PATH that answers the GPU query and the banner like a 4 x H100 box with driver 580."
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    smi = bin_ / "nvidia-smi"
    smi.write_text("#!/bin/sh\nif [ -n \"$1\" ]; then printf '%s' '" + SMI.replace("570.86.15", "580.65.06") +
                   "'; else echo '" + BANNER.replace("12.8", "13.0") + "'; fi\n")
    smi.chmod(0o755)
    return {"PATH": f"{bin_}:{os.environ['PATH']}"}


def test_preflight_command_line(fake_smi, tmp_path):
    code, out, err = _run([sys.executable, "scripts/preflight.py", "--pin-set"], env=fake_smi)
    assert code == 0 and out.strip() == "cu13"
    code, out, err = _run([sys.executable, "scripts/preflight.py", "--disk-path", str(tmp_path), "--min-disk-gib",
                           "0.001", "--python", sys.executable], env=fake_smi)
    assert code == 0 and "GPUs: 4" in out and "pin set cu13" in out and "preflight: ok" in out, out + err
    code, out, err = _run([sys.executable, "scripts/preflight.py", "--gpus", "8", "--min-disk-gib", "0.001",
                           "--json"], env=fake_smi)
    assert code == 1 and json.loads(out)["errors"][0].startswith("4 GPU(s) found")
    code, out, err = _run([sys.executable, "scripts/preflight.py", "--nvidia-smi", "no-such-smi"])
    assert code == 1 and "'no-such-smi' was not found" in out
    code, out, err = _run([sys.executable, "scripts/preflight.py", "--gpus", "0"])
    assert code == 2 and "--gpus must be at least 1" in err


# ---------------------------------------------------------------- the GPU environment


def test_gpu_pins_are_consistent():
    "Every top-level pin of each set agrees with its constraints file, and flash-attn is nowhere."
    gpu = ROOT / "scripts" / "gpu"
    sys.path.insert(0, str(gpu))
    try:
        import resolve
    finally:
        sys.path.remove(str(gpu))
    for pins in ("cu12", "cu13"):
        req = [l.split("#")[0].strip() for l in (gpu / f"requirements-{pins}.txt").read_text().splitlines()]
        con = resolve.read_constraints(gpu / f"constraints-{pins}.txt")
        assert not any("flash" in l.lower() for l in req) and "flash-attn" not in con and "faiss-cpu" not in con
        for line in req:
            line = line.split("#")[0].strip()
            if "==" in line:
                name, version = line.split("==")
                name = name.split("[")[0].strip().lower()
                assert any(v == version for v, _ in con[name]), f"{pins}: {name}=={version} vs {con.get(name)}"
    assert resolve.read_constraints(gpu / "constraints-cu12.txt")["vllm"] == [("0.19.1", None)]
    assert resolve.read_constraints(gpu / "constraints-cu13.txt")["torch"] == [("2.11.0", None)]


def _python312():
    "A CPython 3.12 to resolve for (the GPU box's likely Python); None if this machine has none."
    cands = [os.environ.get("AR1_PY312"), shutil.which("python3.12")]
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    cands += sorted(str(p) for p in root.glob("3.12*/bin/python3.12"))
    for c in filter(None, cands):
        try:
            if subprocess.run([c, "-c", "import sys; assert sys.version_info[:2] == (3, 12)"],
                              capture_output=True, timeout=30).returncode == 0:
                return c
        except OSError:
            pass
    return None


@pytest.mark.slow
@pytest.mark.parametrize("pins", ["cu12", "cu13"])
def test_gpu_pins_resolve_on_pypi(pins):
    "pip resolves each pinned set for Linux x86_64 / CPython 3.12 (1-4 minutes each, network-bound)."
    gpu = ROOT / "scripts" / "gpu"
    sys.path.insert(0, str(gpu))
    try:
        import resolve
    finally:
        sys.path.remove(str(gpu))
    py = _python312() or sys.executable
    r = resolve.resolve(pins, py, constraints=True)
    print(f"{pins} on Python {r['python_version']}: rc={r['rc']}, {len(r['resolved'])} packages, {r['seconds']} s")
    assert r["rc"] == 0, r["tail"]
    con = resolve.read_constraints(gpu / f"constraints-{pins}.txt")
    for name, version in r["resolved"].items():
        assert any(v == version for v, _ in con[name.lower()]), (name, version, con.get(name.lower()))


def test_setup_gpu_rejects_bad_input(tmp_path):
    code, out, err = _run(["bash", "scripts/setup_gpu.sh", "cu11"])
    assert code == 2 and "unknown argument 'cu11'" in err
    fake = tmp_path / "python3.13"
    fake.write_text("#!/bin/sh\necho 3.13\n")
    fake.chmod(0o755)
    venv = tmp_path / "venv"
    code, out, err = _run(["bash", "scripts/setup_gpu.sh", "cu12"], env={"PYTHON": str(fake), "AR1_GPU_VENV": str(venv)})
    assert code == 1 and "pinned for Python 3.11 or 3.12" in err and "Python 3.13" in err
    assert not venv.exists()
    code, out, err = _run(["bash", "scripts/setup_gpu.sh"], env={"PATH": "/usr/bin:/bin", "AR1_GPU_VENV": str(venv)})
    assert code == 1 and "nvidia-smi" in err and "pass 'cu12' or 'cu13'" in err


# ---------------------------------------------------------------- the dry run


@needs_verl
@pytest.mark.parametrize("algo", vb.ALGORITHMS)
def test_dry_run_in_process(algo, tmp_path, capsys):
    import speedrun

    assert speedrun.main([algo, "--dry-run", "--out", str(tmp_path), "--seed", "3"]) == 0
    out = capsys.readouterr().out
    (run_dir,) = tmp_path.iterdir()
    r = vb.RECIPES[algo]
    assert f"full-{algo}-s3-dry" in run_dir.name
    assert "VERL_USE_EXTERNAL_MODULES=agent_r1_tutorial.verl_bridge .venv-gpu/bin/python -m verl.trainer.main_ppo" in out
    assert f"algorithm.adv_estimator=ar1_{r.adv_estimator}" in out
    check = json.loads((run_dir / "validation.json").read_text())
    assert check["use_critic"] is r.critic and check["adv_estimator"] == f"ar1_{r.adv_estimator}"
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(run_dir / "verl_config.yaml")
    assert cfg.algorithm.adv_estimator == check["adv_estimator"] and cfg.data.seed == 3
    assert cfg.data.train_files == str(run_dir / "data" / "train.parquet")
    assert (run_dir / "launch.sh").read_text().count("verl.trainer.main_ppo") == 1
    rows = vb.read_rows(run_dir / "data" / "train.parquet")
    assert rows[0]["extra_info"]["tools_kwargs"]["search"]["create_kwargs"]["index_dir"] == str(run_dir / "index")
    assert (run_dir / "index" / "config.json").exists()
    report = (run_dir / "report.md").read_text()
    assert "validated; agent loop ran on CPU; not launched (needs GPUs)" in report and "**Dry run.**" in report
    # the train stage built our agent loop as verl does and played episodes on the tiny model against the index
    episodes = json.loads((run_dir / "agent_loop.json").read_text())
    assert set(episodes) == {"tiny model", "scripted searcher"}
    assert all(e["ids_and_masks_ok"] and e["layout"] == r.layout for e in episodes.values())
    assert episodes["scripted searcher"]["tool_calls"] == 1 and "## Agent loop (dry run)" in report
    assert f"agent loop: ar1_agent -> agent_r1_tutorial.verl_bridge.Ar1AgentLoop (layout: {r.layout})" in out


@needs_verl
def test_speedrun_sh_dry_run(tmp_path):
    "The README's command on a machine without GPUs: bash speedrun.sh grpo --dry-run."
    code, out, err = _run(["bash", "speedrun.sh", "grpo", "--dry-run", "--out", str(tmp_path), "--gpus", "8",
                           "--override", "trainer.total_training_steps=5"], timeout=900)
    assert code == 0, out + err
    assert "Traceback" not in out + err
    assert "scale=full algorithm=grpo" in out
    assert "trainer.n_gpus_per_node=8" in out and "trainer.total_training_steps=5" in out
    for stage in ("preflight", "env", "data", "index", "train", "eval"):
        assert f"  {stage} " in out
    (run_dir,) = tmp_path.iterdir()
    assert (run_dir / "launch.sh").exists() and (run_dir / "verl_config.yaml").exists()


def test_speedrun_full_options_are_checked():
    code, out, err = _run(["bash", "speedrun.sh", "grpo", "--dry-run", "--gpus", "0"])
    assert code == 2 and "--gpus must be a positive integer" in err
    code, out, err = _run(["bash", "speedrun.sh", "grpo", "--dry-run", "--override", "novalue"])
    assert code == 2 and "--override needs KEY=VALUE" in err
