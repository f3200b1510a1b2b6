"""The verl bridge (chapter 12): registration of our estimators, losses and agent loop, the trainer patch and the
reward function. The data and the index are tested in test_verl_data.py, the configuration, launch, preflight and
dry run in test_verl_launch.py, the agent loop's episodes in test_verl_agent_loop.py.

verl (CPU build) is needed for most tests and they are skipped without it; the library modules themselves must import
without verl, which the first test checks in a clean interpreter.
"""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from conftest import ROOT

from agent_r1_tutorial import verl_bridge as vb
from agent_r1_tutorial import verl_launch as vl
from agent_r1_tutorial.advantages import ADV_ESTIMATORS
from agent_r1_tutorial.losses import AGG_MODES, POLICY_LOSSES

HAS_VERL = __import__("importlib").util.find_spec("verl") is not None
needs_verl = pytest.mark.skipif(not HAS_VERL, reason="verl (CPU build) is not installed")


def _run(cmd, env=None, timeout=600, cwd=ROOT):
    res = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})
    return res.returncode, res.stdout, res.stderr


# ---------------------------------------------------------------- importing without verl


def test_modules_import_without_verl_and_say_what_to_install():
    code = textwrap.dedent("""
        import sys
        sys.modules["verl"] = None  # makes `import verl` fail, as in the core CPU environment
        import agent_r1_tutorial.verl_bridge as vb
        import agent_r1_tutorial.verl_data as vd
        import agent_r1_tutorial.verl_launch as vl
        import agent_r1_tutorial.verl_cpu as vc  # the CPU run's module too: its verl classes are built on first use
        assert "verl" not in [m.split(".")[0] for m in sys.modules if sys.modules[m] is not None]
        rows = vd.hotpotqa_rows(vd.hotpotqa_toy_sample(4), "train")  # data preparation needs no verl
        print(len(rows), vl.verl_overrides(vl.VerlRunConfig("ppo"))[0])
        try:
            vb.register_with_verl()
        except ImportError as e:
            print("ImportError:", e)
        try:
            vc.cpu_platform_class()
        except ImportError:
            print("cpu platform needs verl")
    """)
    code_, out, err = _run([sys.executable, "-c", code], env={vb.EXTERNAL_MODULES_ENV: ""})
    assert code_ == 0, err
    assert "4 algorithm.adv_estimator=ar1_gae" in out
    assert "register_with_verl needs verl" in out and "scripts/setup.sh dev" in out
    assert "cpu platform needs verl" in out


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


# ---------------------------------------------------------------- log-probs and entropy without flash-attn


@needs_verl
def test_env_var_installs_the_chunked_logits_in_a_fresh_process():
    "Every verl process (the FSDP workers compute the log-probs) gets the chunked functions when it imports verl."
    probe = ("import verl.utils.torch_functional as F; import verl.trainer.ppo.core_algos; "
             "print(F.logprobs_from_logits_v2.__module__, F.entropy_from_logits.__module__, "
             "F.entropy_from_logits.__ar1_original__.__module__)")
    code, out, err = _run([sys.executable, "-c", probe], env={vb.EXTERNAL_MODULES_ENV: vb.MODULE_NAME})
    assert code == 0, err
    assert out.split()[-3:] == [vb.MODULE_NAME, vb.MODULE_NAME, "verl.utils.torch_functional"]


@needs_verl
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunk", [1, 7, 256])
def test_chunked_logits_equal_float64_forward_and_backward(dtype, chunk):
    g = torch.Generator().manual_seed(chunk)
    z64 = torch.randn(2, 13, 301, dtype=torch.float64, generator=g) * 5
    y = torch.randint(0, 301, (2, 13), generator=g)
    z = z64.to(dtype).double().requires_grad_()  # the same values at the dtype's precision, for the reference
    zc = z.detach().to(dtype).requires_grad_()
    w = torch.randn(2, 13, dtype=torch.float64, generator=g)
    ref_lp = torch.log_softmax(z, -1).gather(-1, y[..., None]).squeeze(-1)
    ref_h = -(torch.softmax(z, -1) * torch.log_softmax(z, -1)).sum(-1)
    for ours, ref in ((vb.chunked_log_probs(zc, y, chunk), ref_lp), (vb.chunked_entropy(zc, chunk), ref_h)):
        assert ours.dtype == torch.float32 and ours.shape == (2, 13)
        assert (ours.double() - ref).abs().max() < 1e-4
        zc.grad = z.grad = None
        (ours.double() * w).sum().backward()
        (ref * w).sum().backward()
        tol = 1e-5 if dtype == torch.float32 else 2e-2  # the gradient is written in the logits' dtype
        assert (zc.grad.double() - z.grad).abs().max() < tol


@needs_verl
def test_chunked_logits_reject_bad_input():
    z, y = torch.zeros(3, 5), torch.zeros(3, dtype=torch.long)
    with pytest.raises(ValueError, match=r"labels have shape \(4,\)"):
        vb.chunked_log_probs(z, torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="chunk must be a positive number of rows, got 0"):
        vb.chunked_entropy(z, 0)
    with pytest.raises(ValueError, match=r"shape \(\.\.\., vocab\)"):
        vb.chunked_log_probs(torch.zeros(5), y)
    assert vb.chunked_log_probs(z, y).shape == (3,)


def test_bench_logits_compares_side_by_side_and_rejects_bad_options(tmp_path):
    code, out, err = _run([sys.executable, "scripts/bench_logits.py", "--rows", "0"])
    assert code == 2 and "--rows must be a positive integer, got 0" in err
    code, out, err = _run([sys.executable, "scripts/bench_logits.py", "--device", "tpu"])
    assert code == 2 and "--device must be cpu or cuda" in err
    code, out, err = _run([sys.executable, "scripts/bench_logits.py", "--rows", "10", "--batch", "3"])
    assert code == 2 and "--rows (10) must be a multiple of --batch (3)" in err
    code, out, err = _run([sys.executable, "scripts/bench_logits.py", "--model", "tiny", "--vocab", "2000"])
    assert code == 2 and "--model uses its own vocabulary" in err
    if not HAS_VERL:
        return
    code, out, err = _run([sys.executable, "scripts/bench_logits.py", "--rows", "96", "--vocab", "2000", "--chunk", "32",
                           "--batch", "4", "--backward", "--out", str(tmp_path / "b.json")])
    assert code == 0, err
    import json
    res = {r["variant"]: r for r in json.loads((tmp_path / "b.json").read_text())["results"]}
    assert set(res) == {"verl_logprobs", "chunked_logprobs", "verl_entropy", "chunked_entropy"}
    assert res["chunked_logprobs"]["max_error"] < 1e-4 and res["chunked_entropy"]["max_error"] < 1e-3
    assert res["verl_logprobs"]["dtype"] == "torch.bfloat16" and res["chunked_logprobs"]["dtype"] == "torch.float32"
    assert "chunked / verl's fallback" in out and "(4 x 24)" in out


@pytest.mark.slow
@needs_verl
def test_bench_logits_with_a_models_forward_pass(tmp_path):
    import json
    # a tiny model (the script's own quick check): a minute on a CPU, most of it the 151,936-entry vocabulary
    code, out, err = _run([sys.executable, "scripts/bench_logits.py", "--rows", "64", "--batch", "2", "--model", "tiny",
                           "--out", str(tmp_path / "m.json")])
    assert code == 0, err
    res = json.loads((tmp_path / "m.json").read_text())
    assert [r["variant"] for r in res["results"]] == ["verl", "chunked"] and res["model"] == "tiny"
    assert all(r["seconds"] > 0 and r["params"] > 0 for r in res["results"])


def test_bench_encoder_times_the_index_encoder_and_rejects_bad_options(tmp_path):
    code, out, err = _run([sys.executable, "scripts/bench_encoder.py", "--passages", "0"])
    assert code == 2 and "--passages and --batch-size must be positive integers" in err
    code, out, err = _run([sys.executable, "scripts/bench_encoder.py", "--tokenizer", str(tmp_path)])
    assert code == 2 and "no WordPiece tokenizer folder" in err
    code, out, err = _run([sys.executable, "scripts/bench_encoder.py", "--passages", "16", "--size", "small",
                           "--batch-size", "8", "--out", str(tmp_path / "e.json")])
    assert code == 0, err
    import json
    res = json.loads((tmp_path / "e.json").read_text())["results"]
    assert [r["dtype"] for r in res] == ["fp32"] and res[0]["passages_per_s"] > 0  # fp16 only on a GPU
    assert "16 passages" in out and "passages/s" in out


# ---------------------------------------------------------------- reward


@needs_verl
def test_verl_loads_our_reward_function():
    from verl.trainer.ppo.reward import get_custom_reward_fn

    from agent_r1_tutorial.rewards import compute_score

    cfg = vl.compose_verl_config(vl.verl_overrides(vl.VerlRunConfig("grpo")))
    fn = get_custom_reward_fn(cfg)
    assert fn.args[0] is compute_score
    out = fn(data_source="hotpotqa/hotpot_qa", solution_str="<answer>the Mirul</answer>", ground_truth="Mirul",
             extra_info={"fmt": "hermes", "metric": "em", "num_turns": 2})
    assert out["score"] == 1.0
