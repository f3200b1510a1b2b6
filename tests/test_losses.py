"""Properties of agent_r1_tutorial.losses beyond the examples in nbs/09_losses.ipynb (parity with verl is in
test_parity_verl.py)."""
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from agent_r1_tutorial.losses import (AGG_MODES, POLICY_LOSSES, agg_loss, apply_kl_penalty, compute_entropy_loss,
                                      compute_kl_loss, compute_policy_loss_gspo, compute_policy_loss_vanilla,
                                      compute_value_loss, entropy_from_logits, get_policy_loss, kl_penalty)

F64 = torch.float64
seeds = st.integers(0, 2**32 - 1)


def mask_batch(seed, bs=None, T=None):
    rng = np.random.default_rng(seed)
    bs, T = bs or int(rng.integers(1, 6)), T or int(rng.integers(1, 10))
    m = torch.tensor((np.arange(T)[None] < rng.integers(0, T + 1, size=bs)[:, None]).astype(float))
    return rng, torch.tensor(rng.normal(size=(bs, T))), m


# ---------------------------------------------------------------- aggregation


@given(seeds)
@settings(max_examples=60, deadline=None)
def test_token_weights_follow_the_table(seed):
    "The gradient of each mode with respect to a token's loss is the weight the chapter's table gives it."
    rng, x, m = mask_batch(seed)
    L = m.sum(-1)
    B = max(int((L > 0).sum()), 1)
    T = m.shape[1]
    expected = {
        "token-mean": m / max(float(m.sum()), 1.0),
        "token-sum": m,
        "seq-mean-token-sum": m / B,
        "seq-mean-token-mean": m / (L[:, None] + 1e-8) / B,
        "seq-mean-token-sum-norm": m / (B * T),
    }
    for mode in AGG_MODES:
        x_ = x.clone().requires_grad_(True)
        agg_loss(x_, m, mode).backward()
        torch.testing.assert_close(x_.grad, expected[mode], msg=mode)


@given(seeds)
@settings(max_examples=40, deadline=None)
def test_masked_entries_and_empty_rows_change_nothing(seed):
    rng, x, m = mask_batch(seed)
    junk = x.masked_fill(m == 0, float("nan"))
    junk[:, -1:] = torch.where(m[:, -1:] == 0, torch.tensor(float("inf"), dtype=F64), junk[:, -1:])
    x2 = torch.cat([junk, torch.full((1, x.shape[1]), float("-inf"), dtype=F64)])
    m2 = torch.cat([m, torch.zeros(1, x.shape[1], dtype=F64)])
    for mode in AGG_MODES:
        a, b = agg_loss(x, m, mode), agg_loss(x2, m2, mode)
        assert torch.isfinite(b)
        torch.testing.assert_close(a, b, msg=mode)


def test_agg_loss_bad_input():
    x, m = torch.zeros(2, 3), torch.ones(2, 3)
    with pytest.raises(ValueError, match="unknown loss_agg_mode 'seq-mean'"):
        agg_loss(x, m, "seq-mean")
    with pytest.raises(ValueError, match="loss_mask has shape"):
        agg_loss(x, m[:, :2])
    with pytest.raises(ValueError, match="binary"):
        agg_loss(x, m * 3)
    with pytest.raises(ValueError, match="loss_mat must have shape"):
        agg_loss(x[0], m[0])


# ---------------------------------------------------------------- policy losses


def one_token(ratio, adv, **cfg):
    old = torch.zeros(1, 1, dtype=F64)
    return compute_policy_loss_vanilla(old, torch.tensor([[math.log(ratio)]], dtype=F64),
                                       torch.tensor([[adv]], dtype=F64), torch.ones(1, 1), config=cfg)[0].item()


@given(st.floats(1e-3, 50.0), st.floats(-5.0, 5.0), st.floats(0.0, 0.9), st.floats(0.0, 2.0), st.floats(1.01, 10.0))
@settings(max_examples=200, deadline=None)
def test_vanilla_loss_closed_form(ratio, adv, low, high, c):
    "A >= 0: -A min(r, 1+high). A < 0: |A| min(max(r, 1-low), c). (The min/max forms of clip, pessimism, dual clip.)"
    got = one_token(ratio, adv, clip_ratio_low=low, clip_ratio_high=high, clip_ratio_c=c)
    want = -adv * min(ratio, 1 + high) if adv >= 0 else -adv * min(max(ratio, 1 - low), c)
    assert math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12), (got, want)


@given(seeds)
@settings(max_examples=40, deadline=None)
def test_on_policy_loss_is_minus_the_aggregated_advantage_and_its_gradient_the_policy_gradient(seed):
    rng, adv, m = mask_batch(seed)
    if m.sum() == 0:
        return
    lp = torch.tensor(-rng.exponential(size=adv.shape)).requires_grad_(True)
    for name in POLICY_LOSSES:
        for mode in AGG_MODES:
            lp.grad = None
            loss, metrics = get_policy_loss(name)(lp.detach(), lp, adv, m, mode, {"clip_ratio": 0.2})
            torch.testing.assert_close(loss, agg_loss(-adv, m, mode))
            assert metrics["actor/pg_clipfrac"] == 0.0 and abs(metrics["actor/ppo_kl"]) < 1e-12
            loss.backward()
            w = torch.zeros_like(adv, requires_grad=True)
            agg_loss(w, m, mode).backward()
            torch.testing.assert_close(lp.grad, -adv * w.grad, msg=f"{name} {mode}")


@given(seeds)
@settings(max_examples=40, deadline=None)
def test_gspo_on_one_token_sequences_is_ppo_without_dual_clip(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 8))
    old = torch.tensor(-rng.exponential(size=(n, 1)))
    new = old + torch.tensor(rng.normal(size=(n, 1)))
    adv = torch.tensor(rng.normal(size=(n, 1)))
    cfg = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.3, "clip_ratio_c": 1e9}
    m = torch.ones(n, 1)
    torch.testing.assert_close(compute_policy_loss_gspo(old, new, adv, m, "token-mean", cfg)[0],
                               compute_policy_loss_vanilla(old, new, adv, m, "token-mean", cfg)[0])


def test_gspo_ratio_is_the_geometric_mean_and_its_gradient_is_per_token():
    old = torch.zeros(1, 3, dtype=F64)
    new = torch.tensor([[0.2, -0.1, 0.05]], dtype=F64, requires_grad=True)
    adv = torch.ones(1, 3, dtype=F64)
    loss, _ = compute_policy_loss_gspo(old, new, adv, torch.ones(1, 3), "token-sum",
                                       {"clip_ratio_low": 0.5, "clip_ratio_high": 10.0})
    s = math.exp((0.2 - 0.1 + 0.05) / 3)
    assert math.isclose(loss.item(), -3 * s, rel_tol=1e-12)
    loss.backward()
    torch.testing.assert_close(new.grad, torch.full((1, 3), -s, dtype=F64))


def test_policy_loss_bad_input():
    lp, m = torch.zeros(2, 3), torch.ones(2, 3)
    nan_under_mask = lp.clone()
    nan_under_mask[1, 2] = float("nan")
    cases = [
        (lambda: compute_policy_loss_vanilla(lp, lp, lp, m, config={"clip_ratio_c": 0.5}), "clip_ratio_c must be > 1"),
        (lambda: compute_policy_loss_vanilla(lp, lp, lp, m, config={"clip_ratio_low": 1.0}), "clip_ratio_low < 1"),
        (lambda: compute_policy_loss_vanilla(lp, nan_under_mask, lp, m), "log_prob has 1 non-finite"),
        (lambda: compute_policy_loss_vanilla(lp, lp, lp[:, :2], m), "advantages has shape (2, 2)"),
        (lambda: compute_policy_loss_vanilla(lp, lp, lp, m[:1]), "response_mask has shape (1, 3)"),
        (lambda: compute_policy_loss_gspo(lp, lp, lp, m, rollout_is_weights=lp[:1]), "rollout_is_weights has shape"),
        (lambda: get_policy_loss("ppo_clip"), "unknown policy loss 'ppo_clip'"),
    ]
    for fn, text in cases:
        with pytest.raises(ValueError) as info:
            fn()
        assert text in str(info.value), (text, str(info.value))
    # NaN on padding is allowed: it is never read
    m2 = m.clone()
    m2[1, 2] = 0
    assert torch.isfinite(compute_policy_loss_vanilla(lp, nan_under_mask, lp + 1, m2)[0])


# ---------------------------------------------------------------- KL


@given(seeds, st.sampled_from([0.05, 0.3, 0.6]))  # close enough that k3's clamp at 10 never acts
@settings(max_examples=40, deadline=None)
def test_k1_and_k3_are_unbiased_k2_k3_abs_nonnegative(seed, spread):
    g = torch.Generator().manual_seed(seed % 2**31)
    ref = torch.log_softmax(torch.randn(30, generator=g, dtype=F64), -1)
    logp = torch.log_softmax(ref + spread * torch.randn(30, generator=g, dtype=F64), -1)
    p = logp.exp()
    kl = (p * (logp - ref)).sum()
    assert kl_penalty(logp, ref, "k3").max() < 10
    for name in ["k1", "k3"]:
        assert torch.isclose((p * kl_penalty(logp, ref, name)).sum(), kl, rtol=1e-9, atol=1e-12)
    for name in ["k2", "k3", "abs"]:
        assert (kl_penalty(logp, ref, name) >= 0).all()


@given(seeds, st.sampled_from(["k1", "kl", "k3", "low_var_kl", "abs"]))
@settings(max_examples=30, deadline=None)
def test_plus_suffix_keeps_the_value_and_takes_the_k2_gradient(seed, name):
    g = torch.Generator().manual_seed(seed % 2**31)
    ref = torch.randn(6, generator=g, dtype=F64)
    lp1 = torch.randn(6, generator=g, dtype=F64).requires_grad_(True)
    lp2 = lp1.detach().clone().requires_grad_(True)
    v = kl_penalty(lp1, ref, name + "+")
    assert torch.equal(v, kl_penalty(lp1.detach(), ref, name))
    v.sum().backward()
    kl_penalty(lp2, ref, "k2").sum().backward()
    torch.testing.assert_close(lp1.grad, lp2.grad)


def test_kl_aliases_and_in_reward_penalty():
    lp, ref = torch.randn(3, 4, dtype=F64), torch.randn(3, 4, dtype=F64)
    for a, b in [("kl", "k1"), ("mse", "k2"), ("low_var_kl", "k3")]:
        assert torch.equal(kl_penalty(lp, ref, a), kl_penalty(lp, ref, b))
    scores, m = torch.randn(3, 4, dtype=F64), torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
    same, metrics = apply_kl_penalty(scores, lp, ref, m, beta=0.0)
    assert torch.equal(same, scores) and metrics["actor/reward_kl_penalty_coeff"] == 0.0
    rewards, _ = apply_kl_penalty(scores, lp, ref, m, beta=0.3, kl_penalty="k3")
    assert torch.equal(rewards[m == 0], scores[m == 0])  # nothing is charged off the mask
    torch.testing.assert_close(rewards, scores - 0.3 * kl_penalty(lp, ref, "k3") * m)
    torch.testing.assert_close(compute_kl_loss(lp, ref, m, "k2", "seq-mean-token-sum"),
                               agg_loss(kl_penalty(lp, ref, "k2"), m, "seq-mean-token-sum"))
    with pytest.raises(ValueError, match="unknown KL estimator 'k3-'"):
        kl_penalty(lp, ref, "k3-")
    with pytest.raises(ValueError, match="token_level_scores has 1 non-finite"):
        apply_kl_penalty(scores.index_put((torch.tensor([0]), torch.tensor([0])), torch.tensor(float("nan"),
                         dtype=F64)), lp, ref, m, 0.1)


# ---------------------------------------------------------------- entropy and value loss


@given(seeds, st.floats(0.01, 100.0))
@settings(max_examples=40, deadline=None)
def test_entropy_bounds_and_definition(seed, scale):
    g = torch.Generator().manual_seed(seed % 2**31)
    logits = torch.randn(4, 9, generator=g, dtype=F64) * scale
    h = entropy_from_logits(logits)
    assert (h >= -1e-9).all() and (h <= math.log(9) + 1e-9).all()
    torch.testing.assert_close(entropy_from_logits(logits + 3.0), h)
    if scale < 10:
        p = torch.softmax(logits, -1)
        torch.testing.assert_close(h, -(p * p.log()).sum(-1))


def test_entropy_loss_bad_input():
    with pytest.raises(ValueError, match="logits must have shape"):
        compute_entropy_loss(torch.zeros(2, 3), torch.ones(2, 3))
    with pytest.raises(ValueError, match="loss_mask has shape"):
        compute_entropy_loss(torch.zeros(2, 3, 5), torch.ones(2, 4))


@given(seeds)
@settings(max_examples=40, deadline=None)
def test_value_loss_limits(seed):
    rng, ret, m = mask_batch(seed)
    values = torch.tensor(rng.normal(size=ret.shape))
    vpreds = values + torch.tensor(rng.normal(size=ret.shape))
    wide, _ = compute_value_loss(vpreds, ret, values, m, cliprange_value=1e9)
    torch.testing.assert_close(wide, 0.5 * agg_loss((vpreds - ret) ** 2, m))
    zero, _ = compute_value_loss(vpreds, ret, values, m, cliprange_value=0.0)
    torch.testing.assert_close(zero, 0.5 * agg_loss(torch.maximum((vpreds - ret) ** 2, (values - ret) ** 2), m))
    with pytest.raises(ValueError, match="values has shape"):
        compute_value_loss(vpreds, ret, values[:, :0], m, 0.2)
