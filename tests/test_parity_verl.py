"""Parity with verl 0.9.1: every advantage estimator, KL estimator, aggregation mode and policy loss of the tutorial
against verl's own implementation, on many random batches.

The batches have ragged responses, tool segments (mask-0 runs) inside responses, empty responses, groups of one,
groups whose scores are all equal, and rewards in places where they should not be (on tool tokens and padding), so
that both implementations must agree on what they read and what they ignore. float64 is compared to 1e-8 and float32
to 1e-5. Step-level GAE has no verl twin; it is compared with a slow loop-by-loop reference written here.

verl is imported only in this file (the library must run without it). Where the tutorial deliberately differs from
verl, a test named `test_difference_*` pins the difference.
"""
import math
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

verl_algos = pytest.importorskip("verl.trainer.ppo.core_algos", reason="verl 0.9.1 is not installed")
import verl.utils.torch_functional as verl_F  # noqa: E402

from agent_r1_tutorial import advantages as A  # noqa: E402
from agent_r1_tutorial import losses as L  # noqa: E402

N_BATCHES = 150  # random batches per (estimator, dtype)
TOL = {torch.float64: dict(rtol=1e-8, atol=1e-8), torch.float32: dict(rtol=1e-5, atol=1e-5)}
DTYPES = [torch.float64, torch.float32]
COUNTS = defaultdict(int)  # (check, dtype) -> batches compared, printed at the end of the run


def _close(ours, theirs, dtype, what):
    torch.testing.assert_close(ours, theirs.to(ours.dtype), **TOL[dtype], msg=lambda m: f"{what}: {m}")


# ---------------------------------------------------------------- random batches


def random_mask(rng, bs, T):
    "Right-padded responses of random length, some empty, with tool segments (mask 0) inside some of them."
    mask = np.zeros((bs, T))
    for i in range(bs):
        if rng.random() < 0.12:
            continue  # an empty response
        L = int(rng.integers(1, T + 1))
        row = np.ones(L)
        for _ in range(int(rng.integers(0, 3))):  # up to two tool segments
            a = int(rng.integers(1, max(L, 2)))
            row[a:a + int(rng.integers(1, 5))] = 0.0
        mask[i, :L] = row
    return mask


def random_groups(rng, bs):
    "Group ids: sizes 1 to 5 in random order, as strings (verl's uids) or ints."
    ids, g = [], 0
    while len(ids) < bs:
        ids += [g] * int(rng.integers(1, 6))
        g += 1
    ids = np.array(ids[:bs])
    rng.shuffle(ids)
    return np.array([f"uid-{i}" for i in ids], dtype=object) if rng.random() < 0.5 else ids


def random_batch(rng, dtype):
    bs, T = int(rng.integers(1, 13)), int(rng.integers(1, 25))
    mask = random_mask(rng, bs, T)
    index = random_groups(rng, bs)
    rewards = np.zeros((bs, T))
    kind = rng.random()
    last = [np.nonzero(mask[i])[0] for i in range(bs)]
    # an outcome on the last policy token; from a small set, so that equal scores (ties) are common
    outcome = rng.choice([0.0, 0.5, 1.0, 0.1], size=bs)
    if rng.random() < 0.3:  # a whole group with one score
        outcome[index == index[0]] = outcome[0]
    for i in range(bs):
        if len(last[i]):
            rewards[i, last[i][-1]] = outcome[i]
    if kind < 0.4:  # dense rewards too (process rewards, KL penalty), on policy tokens
        rewards += rng.normal(size=(bs, T)) * mask * 0.3
    elif kind < 0.55:  # rewards anywhere, even on tool tokens and padding
        rewards += rng.normal(size=(bs, T)) * 0.3
    values = rng.normal(size=(bs, T))
    t = lambda x: torch.tensor(x, dtype=dtype)
    return SimpleNamespace(rewards=t(rewards), values=t(values), mask=t(mask), index=index,
                           gamma=float(rng.choice([1.0, 0.99, 0.9])), lam=float(rng.choice([1.0, 0.95, 0.5, 0.0])))


def batches(seed, dtype, n=N_BATCHES):
    rng = np.random.default_rng(seed)
    return [random_batch(rng, dtype) for _ in range(n)]


def verl_mask(b):
    "The mask verl sees: a float64 mask in float64 (see test_difference_bessel_factor_dtype), verl's int64 otherwise."
    return b.mask.clone() if b.mask.dtype == torch.float64 else b.mask.long()


# ---------------------------------------------------------------- advantage estimators


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gae_matches_verl(dtype):
    for b in batches(1, dtype):
        if b.mask.sum() < 2:  # whitening is undefined: both refuse
            with pytest.raises(ValueError):
                verl_algos.compute_gae_advantage_return(b.rewards, b.values, verl_mask(b), b.gamma, b.lam)
            with pytest.raises(ValueError, match="at least 2 entries"):
                A.compute_gae_advantage_return(b.rewards, b.values, b.mask, b.gamma, b.lam)
            continue
        va, vr = verl_algos.compute_gae_advantage_return(b.rewards, b.values, verl_mask(b), b.gamma, b.lam)
        oa, orr = A.compute_gae_advantage_return(b.rewards, b.values, b.mask, gamma=b.gamma, lam=b.lam)
        _close(oa, va, dtype, "gae advantages")
        _close(orr, vr, dtype, "gae returns")
        COUNTS["gae", dtype] += 1


def _singleton_rows(index):
    ids, counts = np.unique(index.astype(str), return_counts=True)
    alone = set(ids[counts == 1])
    return torch.tensor([str(i) in alone for i in index])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("norm", [True, False], ids=["grpo", "drgrpo"])
def test_grpo_and_drgrpo_match_verl(dtype, norm):
    for b in batches(2, dtype):
        va, vr = verl_algos.compute_grpo_outcome_advantage(b.rewards, verl_mask(b), b.index,
                                                           norm_adv_by_std_in_grpo=norm)
        if norm:
            oa, orr = A.compute_grpo_outcome_advantage(b.rewards, b.mask, b.index)
        else:
            oa, orr = A.get_adv_estimator("drgrpo")(token_level_rewards=b.rewards, response_mask=b.mask,
                                                    index=b.index, config={"norm_adv_by_std_in_grpo": True})
        if norm and dtype == torch.float64:  # see test_difference_grpo_singleton_epsilon
            alone = _singleton_rows(b.index)
            assert vr is va  # verl returns one tensor twice
            va = va.clone()
            va[alone] = va[alone] * (torch.tensor(1.0) + 1e-6).item() / (1 + 1e-6)
            vr = va
        _close(oa, va, dtype, "grpo advantages")
        _close(orr, vr, dtype, "grpo returns")
        COUNTS["grpo" if norm else "drgrpo", dtype] += 1


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rloo_matches_verl(dtype):
    for b in batches(3, dtype):
        va, vr = verl_algos.compute_rloo_outcome_advantage(b.rewards, verl_mask(b), b.index)
        oa, orr = A.compute_rloo_outcome_advantage(b.rewards, b.mask, b.index, config=SimpleNamespace(gamma=0.5))
        _close(oa, va, dtype, "rloo advantages")
        _close(orr, vr, dtype, "rloo returns")
        COUNTS["rloo", dtype] += 1


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_reinforce_pp_matches_verl(dtype):
    for b in batches(4, dtype):
        cfg = SimpleNamespace(gamma=b.gamma)
        if b.mask.sum() < 2:
            with pytest.raises(ValueError):
                verl_algos.compute_reinforce_plus_plus_outcome_advantage(b.rewards, verl_mask(b), config=cfg)
            with pytest.raises(ValueError, match="at least 2 entries"):
                A.compute_reinforce_plus_plus_outcome_advantage(b.rewards, b.mask, config=cfg)
            continue
        va, vr = verl_algos.compute_reinforce_plus_plus_outcome_advantage(b.rewards, verl_mask(b), config=cfg,
                                                                          index=b.index)
        oa, orr = A.get_adv_estimator("reinforce_pp")(token_level_rewards=b.rewards, response_mask=b.mask,
                                                      config=cfg, index=b.index)
        _close(oa, va, dtype, "reinforce++ advantages")
        _close(orr, vr, dtype, "reinforce++ returns")
        COUNTS["reinforce_pp", dtype] += 1


# ---------------------------------------------------------------- step-level GAE: no verl twin, a slow reference


def slow_step_gae(rewards, values, mask, traj, steps, gamma, lam):
    "Step-level GAE written the slow way: Python floats, dictionaries and loops, straight from the definition."
    n, T = rewards.shape
    R = [sum(float(rewards[i, t]) for t in range(T) if mask[i, t] == 1) for i in range(n)]
    first = [next((t for t in range(T) if mask[i, t] == 1), 0) for i in range(n)]
    V = [float(values[i, first[i]]) for i in range(n)]
    by_traj = defaultdict(dict)
    for i in range(n):
        by_traj[traj[i]][int(steps[i])] = i
    adv = [0.0] * n
    for rows in by_traj.values():
        a_next, v_next = 0.0, 0.0
        for k in sorted(rows, reverse=True):
            i = rows[k]
            adv[i] = R[i] + gamma * v_next - V[i] + gamma * lam * a_next
            a_next, v_next = adv[i], V[i]
    ret = [adv[i] + V[i] for i in range(n)]
    has = [i for i in range(n) if any(mask[i, t] == 1 for t in range(T))]
    n_has = len(has)  # the masked mean's count carries verl's 1e-8 (the chapter's convention for empty masks)
    mu = sum(adv[i] for i in has) / (n_has + 1e-8)
    var = sum((adv[i] - mu) ** 2 for i in has) / (n_has + 1e-8) * (n_has / (n_has - 1))
    white = [(a - mu) / math.sqrt(var + 1e-8) for a in adv]
    m = mask.double()
    return torch.tensor(white, dtype=torch.float64)[:, None] * m, torch.tensor(ret, dtype=torch.float64)[:, None] * m


def random_step_batch(rng, dtype):
    "Step rows: several trajectories of 1-5 steps each, rows shuffled; step responses are right-padded."
    n_traj = int(rng.integers(1, 6))
    traj, steps = [], []
    for j in range(n_traj):
        K = int(rng.integers(1, 6))
        traj += [f"traj-{j}"] * K
        steps += list(range(K))
    order = rng.permutation(len(traj))
    traj, steps = np.array(traj, dtype=object)[order], np.array(steps)[order]
    n, T = len(traj), int(rng.integers(1, 10))
    lengths = rng.integers(0 if rng.random() < 0.2 else 1, T + 1, size=n)
    mask = (np.arange(T)[None] < lengths[:, None]).astype(float)
    rewards = rng.normal(size=(n, T)) * mask * (rng.random(size=(n, 1)) < 0.5)
    t = lambda x: torch.tensor(x, dtype=dtype)
    return SimpleNamespace(rewards=t(rewards), values=t(rng.normal(size=(n, T))), mask=t(mask), traj=traj,
                           steps=steps, gamma=float(rng.choice([1.0, 0.99, 0.9])),
                           lam=float(rng.choice([1.0, 0.95, 0.0])))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_step_gae_matches_slow_reference(dtype):
    rng = np.random.default_rng(5)
    for _ in range(N_BATCHES):
        b = random_step_batch(rng, dtype)
        kw = dict(trajectory_uids=b.traj, step_indices=b.steps, gamma=b.gamma, lam=b.lam)
        if int(b.mask.bool().any(-1).sum()) < 2:
            with pytest.raises(ValueError, match="at least 2 entries"):
                A.compute_step_gae_advantage_return(b.rewards, b.values, b.mask, **kw)
            continue
        oa, orr = A.compute_step_gae_advantage_return(b.rewards, b.values, b.mask, **kw)
        ra, rr = slow_step_gae(b.rewards.double(), b.values.double(), b.mask, b.traj, b.steps, b.gamma, b.lam)
        _close(oa, ra, dtype, "step_gae advantages")
        _close(orr, rr, dtype, "step_gae returns")
        COUNTS["step_gae (slow reference)", dtype] += 1


# ---------------------------------------------------------------- losses


def loss_batch(rng, dtype, allow_empty=False):
    "Log-probs, advantages and a mask for a policy loss; some log-ratios beyond verl's +-20 clamp."
    while True:
        bs, T = int(rng.integers(1, 10)), int(rng.integers(1, 20))
        mask = random_mask(rng, bs, T)
        if allow_empty or mask.sum() > 0:
            break
    old = -rng.exponential(2.0, size=(bs, T))
    new = old + rng.normal(size=(bs, T)) * rng.choice([0.05, 0.3, 1.5])
    far = rng.random(size=(bs, T)) < 0.05
    new[far] = old[far] + rng.choice([-25.0, 25.0], size=int(far.sum()))
    adv = rng.normal(size=(bs, T)) * (rng.random(size=(bs, T)) > 0.1)  # some exact zeros
    t = lambda x: torch.tensor(x, dtype=dtype)
    return SimpleNamespace(old=t(old), new=t(new), adv=t(adv), mask=t(mask),
                           weights=t(rng.uniform(0.5, 1.5, size=(bs, T))) if rng.random() < 0.3 else None)


def actor_config(rng, **extra):
    from verl.workers.config.actor import ActorConfig

    clip = float(rng.choice([0.1, 0.2, 0.3]))
    low = float(rng.choice([clip, 0.15]))
    high = float(rng.choice([clip, 0.28, 4e-4]))
    c = float(rng.choice([1.5, 3.0, 10.0]))
    return ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size=2, clip_ratio=clip, clip_ratio_low=low,
                       clip_ratio_high=high, clip_ratio_c=c, **extra)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mode", L.AGG_MODES)
def test_agg_loss_matches_verl(dtype, mode):
    rng = np.random.default_rng(7)
    for _ in range(N_BATCHES):
        b = loss_batch(rng, dtype)
        loss_mat = b.adv * 3 + 1
        scale = None if rng.random() < 0.5 else float(rng.integers(1, 50))
        theirs = verl_algos.agg_loss(loss_mat, verl_mask(b), mode, loss_scale_factor=scale)
        ours = L.agg_loss(loss_mat, b.mask, mode, loss_scale_factor=scale)
        _close(ours, theirs, dtype, f"agg_loss {mode}")
        COUNTS[f"agg_loss {mode}", dtype] += 1


KL_NAMES = ["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "k1+", "k3+", "low_var_kl+", "abs+", "k2+"]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", KL_NAMES)
def test_kl_estimators_match_verl_values_and_gradients(dtype, name):
    rng = np.random.default_rng(8)
    for _ in range(N_BATCHES // 3):
        b = loss_batch(rng, dtype, allow_empty=True)
        ref = b.old  # far log-ratios exercise k3's clamps
        lp_v, lp_o = b.new.clone().requires_grad_(True), b.new.clone().requires_grad_(True)
        theirs, ours = verl_algos.kl_penalty(lp_v, ref, name), L.kl_penalty(lp_o, ref, name)
        _close(ours, theirs, dtype, f"kl {name}")
        (theirs * b.mask).sum().backward()
        (ours * b.mask).sum().backward()
        _close(lp_o.grad, lp_v.grad, dtype, f"kl {name} gradient")
        COUNTS[f"kl_penalty {name}", dtype] += 1


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("loss_name", ["vanilla", "gspo"])
def test_policy_losses_match_verl(dtype, loss_name):
    rng = np.random.default_rng(9 if loss_name == "vanilla" else 10)
    for _ in range(N_BATCHES):
        b = loss_batch(rng, dtype)
        cfg = actor_config(rng)
        mode = str(rng.choice(L.AGG_MODES))
        lp_v, lp_o = b.new.clone().requires_grad_(True), b.new.clone().requires_grad_(True)
        v_loss, v_metrics = verl_algos.get_policy_loss_fn(loss_name)(b.old, lp_v, b.adv, verl_mask(b), mode, cfg,
                                                                     rollout_is_weights=b.weights)
        o_loss, o_metrics = L.get_policy_loss(loss_name)(b.old, lp_o, b.adv, b.mask, mode, cfg,
                                                         rollout_is_weights=b.weights)
        _close(o_loss, v_loss, dtype, f"{loss_name} loss ({mode})")
        v_loss.backward()
        o_loss.backward()
        _close(lp_o.grad, lp_v.grad, dtype, f"{loss_name} gradient ({mode})")
        assert v_metrics.keys() == o_metrics.keys()
        for k in v_metrics:
            assert math.isclose(o_metrics[k], v_metrics[k], rel_tol=1e-5, abs_tol=1e-6), (k, o_metrics, v_metrics)
        COUNTS[f"policy loss {loss_name}", dtype] += 1


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_entropy_matches_verl(dtype):
    rng = np.random.default_rng(11)
    for _ in range(N_BATCHES // 3):
        b = loss_batch(rng, dtype)
        logits = torch.tensor(rng.normal(size=(*b.mask.shape, 7)) * rng.choice([0.1, 1.0, 30.0]), dtype=dtype)
        _close(L.entropy_from_logits(logits), verl_F.entropy_from_logits(logits), dtype, "entropy")
        mode = str(rng.choice(L.AGG_MODES))
        _close(L.compute_entropy_loss(logits, b.mask, mode),
               verl_algos.compute_entropy_loss(logits, verl_mask(b), mode), dtype, "entropy loss")
        COUNTS["entropy", dtype] += 1


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_value_loss_matches_verl(dtype):
    rng = np.random.default_rng(12)
    for _ in range(N_BATCHES):
        b = loss_batch(rng, dtype)
        values, returns = b.old, b.old + b.adv
        vp_v = (values + b.new - b.old).detach().requires_grad_(True)
        vp_o = vp_v.detach().clone().requires_grad_(True)
        clip, mode = float(rng.choice([0.1, 0.5, 10.0])), str(rng.choice(L.AGG_MODES))
        v_loss, v_frac = verl_algos.compute_value_loss(vp_v, returns, values, verl_mask(b), clip, mode)
        o_loss, o_frac = L.compute_value_loss(vp_o, returns, values, b.mask, clip, mode)
        _close(o_loss, v_loss, dtype, "value loss")
        _close(o_frac, v_frac, dtype, "value clipfrac")
        v_loss.backward()
        o_loss.backward()
        _close(vp_o.grad, vp_v.grad, dtype, "value loss gradient")
        COUNTS["value loss", dtype] += 1


def _verl_apply_kl_penalty():
    "verl's own `apply_kl_penalty` (ray_trainer imports on CPU with the verl-core extra that the test set-up installs)."
    from verl.trainer.ppo.ray_trainer import apply_kl_penalty

    return apply_kl_penalty


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_apply_kl_penalty_matches_verl(dtype):
    verl_apply = _verl_apply_kl_penalty()
    rng = np.random.default_rng(13)
    for _ in range(N_BATCHES // 2):
        b = loss_batch(rng, dtype, allow_empty=True)
        name, beta = str(rng.choice(["kl", "k1", "abs", "mse", "low_var_kl", "k3"])), float(rng.uniform(0, 0.5))
        scores = b.adv
        batch = {"response_mask": verl_mask(b), "token_level_scores": scores, "old_log_probs": b.new,
                 "ref_log_prob": b.old}
        data = SimpleNamespace(batch=type("Batch", (dict,), {"batch_size": (len(scores),)})(batch))
        data, v_metrics = verl_apply(data, verl_algos.FixedKLController(beta), kl_penalty=name)
        rewards, o_metrics = L.apply_kl_penalty(scores, b.new, b.old, b.mask, beta, kl_penalty=name)
        _close(rewards, data.batch["token_level_rewards"], dtype, f"in-reward kl {name}")
        assert math.isclose(o_metrics["actor/reward_kl_penalty"], v_metrics["actor/reward_kl_penalty"],
                            rel_tol=1e-5, abs_tol=1e-6)
        assert o_metrics["actor/reward_kl_penalty_coeff"] == v_metrics["actor/reward_kl_penalty_coeff"]
        COUNTS["apply_kl_penalty", dtype] += 1


# ---------------------------------------------------------------- answer normalisation and exact match


def random_answers(seed, n=400):
    rng = np.random.default_rng(seed)
    pieces = ["The", "the", "a", "An", "Eiffel", "tower", "  ", ".", ",", "!", "-", "'s", "1990", "Paris", "théâtre",
              "ANd", "an", "\t", "\n", "(", ")", "$", "%", "yes", "No", "x"]
    return ["".join(rng.choice(pieces, size=int(rng.integers(0, 8)))) for _ in range(n)]


def test_answer_normalisation_and_exact_match_match_verl():
    from verl.utils.reward_score import search_r1_like_qa_em as sr1

    from agent_r1_tutorial import rewards as R

    answers = random_answers(14)
    for pred, gold in zip(answers, answers[1:] + answers[:1]):
        assert R.normalize_answer(pred) == sr1.normalize_answer(pred), pred
        golds = [gold, pred] if len(pred) % 2 else [gold]
        assert R.exact_match(pred, golds) == sr1.em_check(pred, golds), (pred, golds)
        COUNTS["normalize_answer / exact_match", "str"] += 1


# ---------------------------------------------------------------- deliberate differences, pinned


def test_difference_bessel_factor_dtype():
    """verl computes n/(n-1) from integer tensors when the mask is an integer tensor, and PyTorch divides them in
    float32; in float64 verl's whitened advantages then differ from ours by ~1e-8 to 1e-7 relative. Replacing the
    float64 factor in our formula by the float32 one reproduces verl exactly."""
    worst = 0.0
    for b in batches(6, torch.float64, n=60):
        if b.mask.sum() < 3:
            continue
        va, _ = verl_algos.compute_gae_advantage_return(b.rewards, b.values, b.mask.long(), b.gamma, b.lam)
        oa, orr = A.compute_gae_advantage_return(b.rewards, b.values, b.mask, gamma=b.gamma, lam=b.lam)
        raw = orr - b.values
        n = b.mask.sum()
        bessel32 = (n.long() / (n.long() - 1)).item()  # what verl's integer division gives: a float32 number
        mean = (raw * b.mask).sum() / n  # with an int64 mask verl's "+ 1e-8" is lost in float32 too
        var = ((raw - mean) ** 2 * b.mask).sum() / n * bessel32
        torch.testing.assert_close(va, (raw - mean) * torch.rsqrt(var + 1e-8), rtol=1e-11, atol=1e-11)
        worst = max(worst, float(((oa - va).abs() / (va.abs() + 1e-3)).max()))
    assert 1e-10 < worst < 1e-6, worst  # a real difference, and a tiny one


def test_difference_grpo_singleton_epsilon():
    "verl's lone-row std is a float32 1.0, so 1 + 1e-6 is rounded to float32 even for float64 scores."
    r = torch.tensor([[0.0, 0.7], [0.3, 0.0], [0.0, 1.0]], dtype=torch.float64)
    m = torch.ones(3, 2, dtype=torch.float64)
    idx = np.array(["solo", "pair", "pair"])
    va, _ = verl_algos.compute_grpo_outcome_advantage(r, m, idx)
    oa, _ = A.compute_grpo_outcome_advantage(r, m, idx)
    assert float(va[0, 0]) == 0.7 / float(np.float32(1.0) + np.float32(1e-6))
    assert float(oa[0, 0]) == 0.7 / (1.0 + 1e-6)
    assert 1e-8 < abs(float(va[0, 0] - oa[0, 0])) < 1e-7
    torch.testing.assert_close(oa[1:], va[1:], rtol=1e-12, atol=1e-12)  # groups of two agree exactly


def test_difference_bad_input_raises():
    "verl returns numbers for a non-binary mask and for NaN rewards; we refuse both and name the tensor."
    r = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    v = torch.zeros(2, 3)
    soft = torch.tensor([[1.0, 0.5, 1.0], [1.0, 1.0, 1.0]])
    va, _ = verl_algos.compute_gae_advantage_return(r, v, soft, 1.0, 1.0)
    assert torch.isfinite(va).all()
    with pytest.raises(ValueError, match="response_mask must be binary"):
        A.compute_gae_advantage_return(r, v, soft, 1.0, 1.0)
    nan_r = r.clone()
    nan_r[0, 1] = float("nan")
    va, _ = verl_algos.compute_grpo_outcome_advantage(nan_r, torch.ones(2, 3), np.array([0, 0]))
    assert torch.isnan(va).all()
    with pytest.raises(ValueError, match="token_level_rewards has 1 non-finite"):
        A.compute_grpo_outcome_advantage(nan_r, torch.ones(2, 3), np.array([0, 0]))
    # the same for the losses: verl aggregates over a soft mask; we refuse it
    assert torch.isfinite(verl_algos.agg_loss(r, soft, "token-mean"))
    with pytest.raises(ValueError, match="loss_mask must be binary"):
        L.agg_loss(r, soft, "token-mean")
    with pytest.raises(ValueError, match="unknown loss_agg_mode"):
        L.agg_loss(r, soft.round(), "seq-mean")


def test_difference_empty_batch_loss_is_zero_not_nan():
    "A (micro-)batch without a single policy token: verl's aggregation divides 0 by 0; ours gives 0."
    loss_mat = torch.randn(3, 4, requires_grad=True)
    mask = torch.zeros(3, 4)
    for mode in L.AGG_MODES:
        theirs, ours = verl_algos.agg_loss(loss_mat, mask, mode), L.agg_loss(loss_mat, mask, mode)
        if mode == "token-sum":
            assert theirs.item() == ours.item() == 0.0
            continue
        assert torch.isnan(theirs), mode
        assert ours.item() == 0.0, mode
        ours.backward()
        assert torch.equal(loss_mat.grad, torch.zeros(3, 4))


def test_difference_nan_on_padding_does_not_leak():
    "verl's sequence-level modes multiply by the mask, so a NaN on padding (e.g. -inf - -inf) poisons the loss."
    old = torch.tensor([[-1.0, -2.0, float("-inf")], [-0.5, float("-inf"), float("-inf")]])
    new = torch.tensor([[-1.1, -1.9, float("-inf")], [-0.4, float("-inf"), float("-inf")]])
    adv = torch.tensor([[1.0, 1.0, 0.0], [-1.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    from verl.workers.config.actor import ActorConfig

    cfg = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size=2, clip_ratio=0.2)
    for mode in L.AGG_MODES:
        theirs, _ = verl_algos.compute_policy_loss_vanilla(old, new, adv, mask, mode, cfg)
        ours, _ = L.compute_policy_loss_vanilla(old, new, adv, mask, mode, cfg)
        assert torch.isfinite(ours), mode
        if mode.startswith("seq-mean"):
            assert torch.isnan(theirs), mode
        else:  # verl's token-level modes select with the mask, like ours
            torch.testing.assert_close(ours, theirs)
    # off the mask anything goes, on the mask we refuse
    with pytest.raises(ValueError, match="log_prob has 1 non-finite"):
        L.compute_policy_loss_vanilla(old, new.nan_to_num(nan=0.0, neginf=0.0).index_put((torch.tensor([0]),
                                      torch.tensor([0])), torch.tensor(float("nan"))), adv, mask, "token-mean", cfg)


def test_difference_substring_match_is_by_whole_words():
    "verl's (Search-R1's) substring check finds the gold '1' inside '1990'; ours matches whole words only."
    from verl.utils.reward_score import search_r1_like_qa_em as sr1

    from agent_r1_tutorial import rewards as R

    assert sr1.subem_check("born in 1990", "1") == 1 and R.substring_match("born in 1990", "1") == 0.0
    assert sr1.subem_check("the Eiffel Tower, Paris", "eiffel tower") == 1
    assert R.substring_match("the Eiffel Tower, Paris", "eiffel tower") == 1.0
    assert sr1.subem_check("anything", "The") == 1 and R.substring_match("anything", "The") == 0.0  # empty gold


def test_report_counts():
    "Runs last in this file: prints how many random batches each check compared (pytest -s shows it)."
    for (what, dtype), n in sorted(COUNTS.items(), key=str):
        print(f"parity {what:28s} {str(dtype):14s} {n:4d} batches")
