"""Properties of agent_r1_tutorial.advantages beyond the examples in nbs/08_advantages.ipynb (parity with verl is in
test_parity_verl.py)."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from agent_r1_tutorial.advantages import (ADV_ESTIMATORS, compute_drgrpo_outcome_advantage,
                                          compute_gae_advantage_return, compute_grpo_outcome_advantage,
                                          compute_reinforce_plus_plus_outcome_advantage,
                                          compute_rloo_outcome_advantage, compute_step_gae_advantage_return,
                                          get_adv_estimator, masked_mean, masked_whiten)

F64 = torch.float64
seeds = st.integers(0, 2**32 - 1)


def batch(seed, bs=None, T=None, tool=True):
    "Random rows with right padding and (optionally) tool segments inside; at least two policy tokens in all."
    rng = np.random.default_rng(seed)
    bs, T = bs or int(rng.integers(1, 7)), T or int(rng.integers(2, 16))
    mask = np.zeros((bs, T))
    for i in range(bs):
        L = int(rng.integers(1, T + 1))
        mask[i, :L] = 1
        if tool and L > 2 and rng.random() < 0.7:
            a = int(rng.integers(1, L - 1))
            mask[i, a:a + int(rng.integers(1, L - a))] = 0
    mask[0, :2] = 1
    return SimpleNamespace(r=torch.tensor(rng.normal(size=(bs, T))) * torch.tensor(mask),
                           v=torch.tensor(rng.normal(size=(bs, T))), m=torch.tensor(mask), rng=rng,
                           gamma=float(rng.choice([1.0, 0.9])), lam=float(rng.choice([1.0, 0.95, 0.0])))


def discounted_to_go(r, m, gamma):
    "Reward-to-go over policy tokens only, by the definition (a double loop)."
    out = torch.zeros_like(r)
    for i in range(r.shape[0]):
        pos = [t for t in range(r.shape[1]) if m[i, t] == 1]
        for k, t in enumerate(pos):
            out[i, t] = sum(gamma ** j * r[i, u] for j, u in enumerate(pos[k:]))
    return out


# ---------------------------------------------------------------- token-level GAE


@given(seeds)
@settings(max_examples=60, deadline=None)
def test_gae_equals_gae_with_tool_columns_deleted(seed):
    b = batch(seed, bs=1)
    keep = b.m[0].bool()
    a_full, r_full = compute_gae_advantage_return(b.r, b.v, b.m, gamma=b.gamma, lam=b.lam)
    a_cut, r_cut = compute_gae_advantage_return(b.r[:, keep], b.v[:, keep], b.m[:, keep], gamma=b.gamma, lam=b.lam)
    torch.testing.assert_close(r_full[:, keep], r_cut)
    torch.testing.assert_close(a_full[:, keep], a_cut)


@given(seeds)
@settings(max_examples=40, deadline=None)
def test_gae_with_lambda_one_returns_the_discounted_reward_to_go(seed):
    b = batch(seed)
    _, ret = compute_gae_advantage_return(b.r, b.v, b.m, gamma=b.gamma, lam=1.0)
    torch.testing.assert_close(ret * b.m, discounted_to_go(b.r, b.m, b.gamma))


@given(seeds)
@settings(max_examples=40, deadline=None)
def test_gae_with_lambda_zero_is_the_td_residual(seed):
    b = batch(seed)
    _, ret = compute_gae_advantage_return(b.r, b.v, b.m, gamma=b.gamma, lam=0.0)
    for i in range(b.r.shape[0]):
        pos = [t for t in range(b.r.shape[1]) if b.m[i, t] == 1]
        for k, t in enumerate(pos):
            v_next = b.v[i, pos[k + 1]] if k + 1 < len(pos) else 0.0
            assert torch.isclose(ret[i, t] - b.v[i, t], b.r[i, t] + b.gamma * v_next - b.v[i, t])


@given(seeds)
@settings(max_examples=40, deadline=None)
def test_gae_ignores_values_and_rewards_on_tool_tokens(seed):
    b = batch(seed)
    off = 1 - b.m
    a1, r1 = compute_gae_advantage_return(b.r, b.v, b.m, gamma=b.gamma, lam=b.lam)
    a2, r2 = compute_gae_advantage_return(b.r + 5 * off, b.v + 7 * off, b.m, gamma=b.gamma, lam=b.lam)
    torch.testing.assert_close(a1 * b.m, a2 * b.m)
    torch.testing.assert_close(r1 * b.m, r2 * b.m)


def test_gae_rows_do_not_interact_before_whitening():
    b = batch(3, bs=4)
    _, ret = compute_gae_advantage_return(b.r, b.v, b.m, gamma=0.9, lam=0.8)
    for i in range(4):
        if b.m[i].sum() >= 2:
            _, ret_i = compute_gae_advantage_return(b.r[i:i + 1], b.v[i:i + 1], b.m[i:i + 1], gamma=0.9, lam=0.8)
            torch.testing.assert_close(ret[i:i + 1], ret_i)


def test_masked_whiten_statistics_and_errors():
    x = torch.randn(5, 7, dtype=F64)
    m = (torch.rand(5, 7) < 0.5).double()
    m[0, :2] = 1
    w = masked_whiten(x, m)
    n = m.sum()
    assert abs(masked_mean(w, m)) < 1e-6
    assert abs(masked_mean(w ** 2, m) * n / (n - 1) - 1) < 1e-6
    one = torch.zeros(5, 7, dtype=F64)
    one[2, 3] = 1
    with pytest.raises(ValueError, match="at least 2 entries under the mask to estimate a variance, got 1"):
        masked_whiten(x, one)


# ---------------------------------------------------------------- step-level GAE


def step_batch(seed):
    rng = np.random.default_rng(seed)
    traj, steps = [], []
    for j in range(int(rng.integers(1, 5))):
        K = int(rng.integers(1, 5))
        traj += [j] * K
        steps += list(range(K))
    traj, steps = np.array(traj), np.array(steps)
    n, T = len(traj), int(rng.integers(1, 6))
    lengths = rng.integers(1, T + 1, size=n)
    m = torch.tensor((np.arange(T)[None] < lengths[:, None]).astype(float))
    return SimpleNamespace(r=torch.tensor(rng.normal(size=(n, T))) * m, v=torch.tensor(rng.normal(size=(n, T))),
                           m=m, traj=traj, steps=steps, rng=rng, n=n)


@given(seeds)
@settings(max_examples=40, deadline=None)
def test_step_gae_is_invariant_to_row_order(seed):
    b = step_batch(seed)
    if b.n < 2:
        return
    perm = b.rng.permutation(b.n)
    kw = dict(gamma=0.9, lam=0.7)
    a, r = compute_step_gae_advantage_return(b.r, b.v, b.m, trajectory_uids=b.traj, step_indices=b.steps, **kw)
    ap, rp = compute_step_gae_advantage_return(b.r[perm], b.v[perm], b.m[perm], trajectory_uids=b.traj[perm],
                                               step_indices=b.steps[perm], **kw)
    torch.testing.assert_close(a[perm], ap)
    torch.testing.assert_close(r[perm], rp)


@given(seeds)
@settings(max_examples=40, deadline=None)
def test_step_gae_lambda_one_returns_step_reward_to_go_and_reads_only_the_first_value(seed):
    b = step_batch(seed)
    if b.n < 2:
        return
    kw = dict(trajectory_uids=b.traj, step_indices=b.steps, gamma=0.9, lam=1.0)
    _, r = compute_step_gae_advantage_return(b.r, b.v, b.m, **kw)
    R = b.r.sum(-1)
    for i in range(b.n):
        later = [j for j in range(b.n) if b.traj[j] == b.traj[i] and b.steps[j] >= b.steps[i]]
        expected = sum(0.9 ** (b.steps[j] - b.steps[i]) * R[j] for j in later)
        assert torch.isclose(r[i, 0], torch.as_tensor(expected, dtype=F64))
    v2 = b.v.clone()
    v2[:, 1:] += 100.0  # only column 0 (the first policy token) is a step's value
    torch.testing.assert_close(compute_step_gae_advantage_return(b.r, v2, b.m, **{**kw, "lam": 0.5}),
                               compute_step_gae_advantage_return(b.r, b.v, b.m, **{**kw, "lam": 0.5}))


@given(seeds)
@settings(max_examples=40, deadline=None)
def test_single_token_steps_equal_token_gae(seed):
    "Each trajectory as one row of single-token steps: token GAE and step GAE see the same decisions."
    b = step_batch(seed)
    n_traj = int(b.traj.max()) + 1
    K = int(b.steps.max()) + 1
    if b.n < 2:
        return
    R, V = b.r.sum(-1), b.v[:, 0]
    tok_r, tok_v, tok_m = (torch.zeros(n_traj, K, dtype=F64) for _ in range(3))
    tok_r[b.traj, b.steps], tok_v[b.traj, b.steps], tok_m[b.traj, b.steps] = R, V, 1.0
    a_tok, r_tok = compute_gae_advantage_return(tok_r, tok_v, tok_m, gamma=0.95, lam=0.8)
    a_step, r_step = compute_step_gae_advantage_return(R[:, None], V[:, None], torch.ones(b.n, 1, dtype=F64),
                                                       trajectory_uids=b.traj, step_indices=b.steps,
                                                       gamma=0.95, lam=0.8)
    torch.testing.assert_close(a_step[:, 0], a_tok[b.traj, b.steps])
    torch.testing.assert_close(r_step[:, 0], r_tok[b.traj, b.steps])


def test_step_gae_bad_steps():
    b = step_batch(1)
    r, v, m = torch.zeros(3, 2), torch.zeros(3, 2), torch.ones(3, 2)
    with pytest.raises(ValueError, match="more than once"):
        compute_step_gae_advantage_return(r, v, m, trajectory_uids=["a", "a", "b"], step_indices=[1, 1, 0])
    with pytest.raises(ValueError, match="must run 0, 1, ..., K-1"):
        compute_step_gae_advantage_return(r, v, m, trajectory_uids=["a", "a", "b"], step_indices=[0, 2, 0])
    with pytest.raises(ValueError, match=">= 0"):
        compute_step_gae_advantage_return(r, v, m, trajectory_uids=["a", "a", "b"], step_indices=[-1, 0, 0])
    with pytest.raises(ValueError, match="one step number per row"):
        compute_step_gae_advantage_return(r, v, m, trajectory_uids=["a", "a", "b"], step_indices=[0, 1])
    assert b.n >= 1


# ---------------------------------------------------------------- group estimators


def outcome_batch(seed):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(2, 6, size=int(rng.integers(1, 5)))
    index = np.repeat(np.arange(len(sizes)), sizes)
    rng.shuffle(index)
    n, T = len(index), int(rng.integers(1, 8))
    m = torch.tensor((np.arange(T)[None] < rng.integers(1, T + 1, size=n)[:, None]).astype(float))
    scores = torch.tensor(rng.normal(size=n))
    r = torch.zeros(n, T, dtype=F64)
    r[torch.arange(n), (m.sum(-1) - 1).long()] = scores
    return SimpleNamespace(r=r, m=m, index=index, scores=scores, n=n, rng=rng)


@given(seeds)
@settings(max_examples=50, deadline=None)
def test_group_advantages_are_centred_constant_per_row_and_zero_off_mask(seed):
    b = outcome_batch(seed)
    for fn in (compute_grpo_outcome_advantage, compute_drgrpo_outcome_advantage, compute_rloo_outcome_advantage):
        adv, ret = fn(b.r, b.m, b.index)
        assert torch.equal(adv, ret)
        assert torch.equal(adv * (1 - b.m), torch.zeros_like(adv))
        first = adv[:, 0]
        torch.testing.assert_close(adv, first[:, None] * b.m)
        for g in np.unique(b.index):
            assert abs(float(first[torch.tensor(b.index == g)].sum())) < 1e-9


@given(seeds, st.floats(0.1, 10.0), st.floats(-5.0, 5.0))
@settings(max_examples=40, deadline=None)
def test_grpo_is_invariant_to_affine_rewards_and_drgrpo_to_shifts(seed, a, c):
    b = outcome_batch(seed)
    shifted = b.r.clone()
    last = (b.m.sum(-1) - 1).long()
    shifted[torch.arange(b.n), last] = a * b.scores + c
    # (a s + c - (a mu + c)) / (a sigma + eps) = (s - mu) / (sigma + eps / a): exact, epsilon included
    torch.testing.assert_close(compute_grpo_outcome_advantage(shifted, b.m, b.index)[0],
                               compute_grpo_outcome_advantage(b.r, b.m, b.index, epsilon=1e-6 / a)[0])
    shifted[torch.arange(b.n), last] = b.scores + c
    torch.testing.assert_close(compute_drgrpo_outcome_advantage(shifted, b.m, b.index)[0],
                               compute_drgrpo_outcome_advantage(b.r, b.m, b.index)[0])


@given(seeds)
@settings(max_examples=40, deadline=None)
def test_rloo_is_score_minus_the_mean_of_the_others_and_scaled_drgrpo(seed):
    b = outcome_batch(seed)
    adv = compute_rloo_outcome_advantage(b.r, b.m, b.index)[0][:, 0]
    dr = compute_drgrpo_outcome_advantage(b.r, b.m, b.index)[0][:, 0]
    for i in range(b.n):
        others = [float(b.scores[j]) for j in range(b.n) if b.index[j] == b.index[i] and j != i]
        assert abs(float(adv[i]) - (float(b.scores[i]) - np.mean(others))) < 1e-9
        G = len(others) + 1
        assert abs(float(adv[i]) - G / (G - 1) * float(dr[i])) < 1e-9


def test_singleton_and_tied_groups():
    r = torch.tensor([[0.3], [1.0], [1.0], [1.0]], dtype=F64)
    m = torch.ones(4, 1, dtype=F64)
    idx = np.array(["solo", "tie", "tie", "tie"])
    for fn in (compute_grpo_outcome_advantage, compute_drgrpo_outcome_advantage, compute_rloo_outcome_advantage):
        adv = fn(r, m, idx)[0][:, 0]
        assert abs(float(adv[0]) - 0.3) < 1e-6, fn.__name__  # alone: its raw score
        assert torch.equal(adv[1:], torch.zeros(3, dtype=F64)), fn.__name__  # ties: no signal


# ---------------------------------------------------------------- REINFORCE++


@given(seeds)
@settings(max_examples=40, deadline=None)
def test_reinforce_pp_returns_are_the_reward_to_go_and_advantages_are_whitened(seed):
    b = batch(seed)
    adv, ret = compute_reinforce_plus_plus_outcome_advantage(b.r, b.m, gamma=b.gamma)
    torch.testing.assert_close(ret, discounted_to_go(b.r, b.m, b.gamma))
    # not exactly 0: the mean's count carries verl's 1e-8, an error of about |mean| * 1e-8 / n that whitening divides
    # by the standard deviation, so a batch of nearly equal returns (std ~1e-3) leaves ~1e-6; a missing whitening ~1
    g = ret[b.m.bool()]
    slack = 1e-6 * (1 + float(g.abs().mean() / g.std(unbiased=False).clamp_min(1e-6))) if g.numel() > 1 else 1e-6
    assert abs(float(masked_mean(adv, b.m))) < slack
    assert torch.equal(adv * (1 - b.m), torch.zeros_like(adv))


# ---------------------------------------------------------------- registry and calling convention


def test_every_estimator_accepts_verls_generic_call():
    "verl's compute_advantage passes token_level_rewards, response_mask, config and index (and more) by keyword."
    b = outcome_batch(0)
    cfg = {"gamma": 0.99, "lam": 0.95, "norm_adv_by_std_in_grpo": True}
    extra = dict(config=cfg, index=b.index, reward_baselines=torch.zeros(b.n))
    for name in ["grpo", "drgrpo", "rloo", "reinforce_pp"]:
        adv, ret = get_adv_estimator(name)(token_level_rewards=b.r, response_mask=b.m, **extra)
        assert adv.shape == ret.shape == b.r.shape
    adv, ret = get_adv_estimator("gae")(token_level_rewards=b.r, response_mask=b.m, values=b.r * 0, **extra)
    assert adv.shape == b.r.shape
    adv, ret = get_adv_estimator("step_gae")(token_level_rewards=b.r, response_mask=b.m, values=b.r * 0,
                                              trajectory_uids=np.arange(b.n), step_indices=np.zeros(b.n), **extra)
    assert adv.shape == b.r.shape
    assert sorted(ADV_ESTIMATORS) == ["drgrpo", "gae", "grpo", "reinforce_pp", "rloo", "step_gae"]


def test_explicit_hyperparameters_win_over_the_config():
    b = batch(4)
    a1 = compute_gae_advantage_return(b.r, b.v, b.m, gamma=0.5, lam=0.5, config={"gamma": 1.0, "lam": 1.0})
    a2 = compute_gae_advantage_return(b.r, b.v, b.m, config=SimpleNamespace(gamma=0.5, lam=0.5))
    torch.testing.assert_close(a1, a2)
    a3 = compute_gae_advantage_return(b.r, b.v, b.m, config={"gamma": None})  # None in a config: the default 1.0
    torch.testing.assert_close(a3, compute_gae_advantage_return(b.r, b.v, b.m, gamma=1.0, lam=1.0))


# ---------------------------------------------------------------- bad input


def test_bad_input_names_the_problem():
    r, m, v = torch.zeros(2, 3), torch.ones(2, 3), torch.zeros(2, 3)
    idx = np.array([0, 0])
    cases = [
        (lambda: compute_gae_advantage_return(r, v[:, :2], m), ValueError, "values has shape (2, 2)"),
        (lambda: compute_gae_advantage_return(r, v, m[:1]), ValueError, "response_mask has shape (1, 3)"),
        (lambda: compute_gae_advantage_return(r, v, m * 0.5), ValueError, "must be binary"),
        (lambda: compute_gae_advantage_return(r.long(), v, m), TypeError, "floating-point"),
        (lambda: compute_gae_advantage_return(r.numpy(), v, m), TypeError, "must be a torch.Tensor"),
        (lambda: compute_gae_advantage_return(r, v + float("inf"), m), ValueError, "values has 6 non-finite"),
        (lambda: compute_grpo_outcome_advantage(r, m), ValueError, "`index` is required"),
        (lambda: compute_grpo_outcome_advantage(r, m, np.array([0])), ValueError, "expected 2"),
        (lambda: compute_grpo_outcome_advantage(r, m, np.array([1, "a"], dtype=object)), TypeError, "comparable"),
        (lambda: compute_rloo_outcome_advantage(r[0], m, idx), ValueError, "must have shape (batch, response_length)"),
        (lambda: compute_reinforce_plus_plus_outcome_advantage(r, -m), ValueError, "found the value -1"),
        (lambda: compute_step_gae_advantage_return(r, v, m, step_indices=[0, 1]), ValueError, "trajectory_uids"),
        (lambda: get_adv_estimator("gae_token"), ValueError, "unknown advantage estimator 'gae_token'"),
        (lambda: get_adv_estimator(None), TypeError, "named by a string"),
    ]
    for fn, exc, text in cases:
        with pytest.raises(exc) as info:
            fn()
        assert text in str(info.value), (text, str(info.value))
    # an index given as a tensor or a list works as well as an array
    a = compute_grpo_outcome_advantage(torch.tensor([[1.0], [0.0]]), torch.ones(2, 1), torch.tensor([7, 7]))[0]
    b = compute_grpo_outcome_advantage(torch.tensor([[1.0], [0.0]]), torch.ones(2, 1), ["x", "x"])[0]
    assert torch.equal(a, b)
