"""Property tests for agent_r1_tutorial.mdp, beyond the examples in nbs/01_mdp.ipynb."""
import json
import math
import random

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import given, settings, strategies as st

from agent_r1_tutorial.masks import random_trajectory
from agent_r1_tutorial.mdp import (ENV_ROLES, PRODUCERS, Step, Trajectory, encode_segments, plot_timeline,
                                   tokens_html, trajectories_from_parquet, trajectories_to_frame,
                                   trajectories_to_parquet)
from agent_r1_tutorial.tinylm import IM_END, IM_START, TOOL_RESPONSE_END, TOOL_RESPONSE_START


# the same single-thread setting and tiny models as the masks tests (pytest finds fixtures imported here)
from test_masks import one_thread, small_model, tok  # noqa: F401,E402


def toy_trajectory(seed: int, append_only: bool = True) -> Trajectory:
    "A random trajectory on toy ids (no tokenizer): random lengths, rewards, roles and endings."
    rng = random.Random(seed)
    obs = [rng.randrange(1000) for _ in range(rng.randint(1, 8))]
    n = rng.randint(1, 5)
    ending = rng.choice(["terminated", "truncated", "running"])
    steps = []
    for k in range(n):
        last = k == n - 1
        action = [rng.randrange(1000) for _ in range(rng.randint(1, 6))]
        env = [] if last else [rng.randrange(1000) for _ in range(rng.randint(0, 6))]
        roles = None if rng.random() < 0.3 else [rng.choice(ENV_ROLES) for _ in env]
        nxt = obs + action + env
        if not append_only and not last and rng.random() < 0.7:
            nxt = nxt[: rng.randint(1, len(nxt))] + [rng.randrange(1000)]  # the environment rewrites the context
        steps.append(Step(obs_ids=obs, action_ids=action,
                          action_logprobs=[-rng.expovariate(1.0) for _ in action], env_ids=env, env_roles=roles,
                          action_text=f"a{k}", feedback=f"f{k}" if env else "", reward=rng.choice([0.0, 0.5, -1.0]),
                          terminated=last and ending == "terminated", truncated=last and ending == "truncated",
                          reason=ending if last and ending != "running" else "",
                          next_obs_ids=None if last or rng.random() < 0.5 else nxt,
                          info={"k": k, "tags": ["x"] * rng.randint(0, 2)}))
        obs = nxt
    return Trajectory(steps, outcome_reward=rng.choice([0.0, 1.0, -0.25]), uid=f"toy-{seed}",
                      group=f"g{seed % 3}", metadata={"seed": seed, "nested": {"a": [1, 2]}})


# ---- round trips


@given(st.integers(0, 10**6), st.booleans())
@settings(max_examples=150, deadline=None)
def test_json_round_trip_is_exact(seed, append_only):
    t = toy_trajectory(seed, append_only)
    assert Trajectory.from_dict(json.loads(json.dumps(t.to_dict()))) == t


def test_parquet_round_trip_is_exact(tmp_path, tok):
    trajs = [toy_trajectory(s, append_only=s % 2 == 0) for s in range(60)]
    trajs += [random_trajectory(tok, seed=s) for s in range(20)]
    back = trajectories_from_parquet(trajectories_to_parquet(trajs, tmp_path / "t.parquet"))
    assert back == trajs
    # every log-prob bit survives
    assert [l for t in back for s in t.steps for l in s.action_logprobs] == \
           [l for t in trajs for s in t.steps for l in s.action_logprobs]
    df = trajectories_to_frame(trajs)
    assert len(df) == sum(t.num_steps for t in trajs)
    assert list(df.groupby("uid", sort=False).size()) == [t.num_steps for t in trajs]


def test_json_file_round_trip(tmp_path, tok):
    t = random_trajectory(tok, seed=11, n_turns=3)
    assert Trajectory.load_json(t.save_json(tmp_path / "sub" / "t.json")) == t


def test_parquet_refuses_a_damaged_file(tmp_path):
    trajs = [toy_trajectory(s) for s in range(3)]
    path = trajectories_to_parquet(trajs, tmp_path / "t.parquet")
    table = pq.read_table(path)
    pq.write_table(table.drop(["action_logprobs"]), tmp_path / "missing.parquet")
    with pytest.raises(ValueError, match=r"missing column\(s\) \['action_logprobs'\]"):
        trajectories_from_parquet(tmp_path / "missing.parquet")
    rows = table.to_pylist()
    multi = [r for r in rows if r["num_steps"] > 1]
    if multi:  # drop a middle step of some trajectory: the order check must notice
        victim = multi[0]
        kept = [r for r in rows if r is not victim]
        import pyarrow as pa
        pq.write_table(pa.Table.from_pylist(kept, schema=table.schema), tmp_path / "hole.parquet")
        with pytest.raises(ValueError, match=f"trajectory '{victim['uid']}'"):
            trajectories_from_parquet(tmp_path / "hole.parquet")


# ---- the growing sequence


@given(st.integers(0, 10**6))
@settings(max_examples=200, deadline=None)
def test_sequence_and_roles_line_up(seed):
    t = toy_trajectory(seed)
    seq, roles = t.sequence_ids(), t.token_roles()
    assert len(seq) == len(roles) == len(t.prompt_ids) + sum(len(s.action_ids) + len(s.env_ids) for s in t.steps)
    assert roles.count("model") == t.num_policy_tokens
    assert [i for i, r in zip(seq, roles) if r == "model"] == [i for s in t.steps for i in s.action_ids]
    assert set(roles) <= set(PRODUCERS)
    assert roles[: len(t.prompt_ids)] == ["prompt"] * len(t.prompt_ids)
    for k, s in enumerate(t.steps):  # every observation is a prefix of the sequence
        assert seq[: len(s.obs_ids)] == s.obs_ids


@given(st.integers(0, 10**6), st.data())
@settings(max_examples=150, deadline=None)
def test_any_rewrite_of_an_observation_is_caught_and_named(seed, data):
    t = toy_trajectory(seed)
    if t.num_steps < 2:
        return
    k = data.draw(st.integers(1, t.num_steps - 1))
    obs = list(t.steps[k].obs_ids)
    pos = data.draw(st.integers(0, len(obs) - 1))
    obs[pos] += 1
    steps = [Step(**{**t.steps[j].__dict__, "next_obs_ids": None}) for j in range(t.num_steps)]
    steps[k] = Step(**{**steps[k].__dict__, "obs_ids": obs})
    bad = Trajectory(steps, uid="bad")
    assert bad.append_only_violation() == (k, pos)
    with pytest.raises(ValueError, match=f"step {k}'s obs_ids is not step {k - 1}'s"):
        bad.sequence_ids()


def test_only_the_last_step_may_end_the_episode():
    t = toy_trajectory(3)
    done = Step([1], [2], [-0.1], truncated=True, reason="max_turns")
    with pytest.raises(ValueError, match="step 0 is truncated \\('max_turns'\\) but is not the last step of 2"):
        Trajectory([done, Step([1, 2], [3], [-0.2])])
    assert Trajectory([Step([1], [2], [-0.1]), done]).truncated
    assert not t.steps[0].done or t.num_steps == 1


# ---- bad input named


@pytest.mark.parametrize("change, message", [
    ({"action_ids": []}, "action_ids is empty"),
    ({"obs_ids": []}, "obs_ids is empty"),
    ({"action_logprobs": [-0.1, -0.2, -0.3]}, "action_logprobs has 3 values but action_ids has 2"),
    ({"action_logprobs": [-0.1, float("nan")]}, "action_logprobs[1] = nan is not finite"),
    ({"action_logprobs": [-0.1, 0.01]}, "action_logprobs[1] = 0.01 is positive"),
    ({"action_ids": [1, -2]}, "action_ids[1] = -2 is negative"),
    ({"env_ids": [1, "2"]}, "env_ids[1] must be an int token id"),
    ({"env_ids": [1, 2], "env_roles": ["tool"]}, "env_roles has 1 labels but env_ids has 2"),
    ({"env_ids": [1], "env_roles": ["model"]}, "env_roles may only hold"),
    ({"next_obs_ids": [0.5]}, "next_obs_ids[0] must be an int"),
    ({"terminated": True, "truncated": True, "reason": "x"}, "both terminated and truncated"),
    ({"truncated": True}, "reason is empty"),
    ({"reason": "why"}, "neither terminated nor truncated"),
    ({"reward": float("inf")}, "reward = inf is not finite"),
    ({"reward": "1"}, "reward must be a number"),
    ({"action_text": None}, "action_text must be a str"),
    ({"info": {"x": object()}}, "info must hold only JSON-serialisable"),
    ({"obs_ids": "123"}, "obs_ids must be a list"),
])
def test_bad_steps_name_the_field(change, message):
    ok = dict(obs_ids=[1, 2], action_ids=[3, 4], action_logprobs=[-0.1, -0.2])
    with pytest.raises((ValueError, TypeError)) as e:
        Step(**{**ok, **change})
    assert message in str(e.value)


def test_bad_trajectories_name_the_problem():
    s = Step([1], [2], [-0.1])
    for kwargs, message in [
        (dict(steps=[]), "steps must be a non-empty list"),
        (dict(steps=[s, 3]), "steps[1] must be a Step"),
        (dict(steps=[s], outcome_reward=float("nan")), "outcome_reward = nan is not finite"),
        (dict(steps=[s], uid=""), "uid is empty"),
        (dict(steps=[s], metadata={"f": {1, 2}}), "metadata must hold only JSON-serialisable"),
        (dict(steps=[Step([1], [2], [-0.1], next_obs_ids=[1, 2, 9]), Step([1, 2, 3], [4], [-0.1])]),
         "step 0's next_obs_ids differs from step 1's obs_ids at position 2"),
    ]:
        with pytest.raises((ValueError, TypeError)) as e:
            Trajectory(**kwargs)
        assert message in str(e.value), (message, str(e.value))
    d = toy_trajectory(1).to_dict()
    d["steps"][0]["colour"] = "red"
    with pytest.raises(ValueError, match=r"steps\[0\] has unknown field\(s\) \['colour'\]"):
        Trajectory.from_dict(d)
    with pytest.raises(ValueError, match="repeats uid"):
        trajectories_to_frame([toy_trajectory(1), toy_trajectory(1)])


# ---- labelled tokenization


@given(st.lists(st.tuples(st.sampled_from(["tool", "template", "x"]),
                          st.lists(st.sampled_from(["the", " city", "\n", " ", "42", "é", "✓", IM_END, IM_START,
                                                    TOOL_RESPONSE_START, TOOL_RESPONSE_END, "<", "|>"]),
                                   min_size=1, max_size=6).map("".join)),
                min_size=1, max_size=6))
@settings(max_examples=200, deadline=None)
def test_encode_segments_tokenizes_the_joined_text(tok, segments):
    ids, labels = encode_segments(tok, segments)
    text = "".join(t for _, t in segments)
    assert ids == tok.encode(text, add_special_tokens=False)
    assert len(labels) == len(ids)
    assert set(labels) <= {lab for lab, _ in segments}
    if len({lab for lab, _ in segments}) == 1:
        assert labels == [segments[0][0]] * len(ids)


def test_encode_segments_labels_markup_delimited_pieces_exactly(tok):
    rng = random.Random(0)
    for _ in range(50):
        content = " ".join(rng.choice(["Ada", "born", "in", "Lisbon", "42", "ü", "."]) for _ in range(rng.randint(1, 8)))
        ids, labels = encode_segments(tok, [("template", f"{IM_END}\n{IM_START}user\n{TOOL_RESPONSE_START}\n"),
                                            ("tool", content), ("template", f"\n{TOOL_RESPONSE_END}{IM_END}")])
        assert tok.decode([i for i, l in zip(ids, labels) if l == "tool"]) == content


# ---- log P(tau): gradient only at the policy's tokens


def test_logit_gradient_is_zero_exactly_where_the_environment_produced_the_next_token(tok, small_model):
    for seed in range(4):
        t = random_trajectory(tok, seed=seed, n_turns=2 + seed % 2, model=small_model, max_action_tokens=6)
        seq, roles = torch.tensor([t.sequence_ids()]), t.token_roles()
        logits = small_model(seq).logits[0]
        logits.retain_grad()
        lp = torch.log_softmax(logits[:-1], -1).gather(-1, seq[0, 1:, None]).squeeze(-1)
        is_model = torch.tensor([r == "model" for r in roles[1:]])
        policy = lp[is_model].sum()
        (policy + math.log(1 / 3) * (t.num_steps - 1)).backward()
        g = logits.grad[:-1].norm(dim=-1)
        assert (g[is_model] > 0).all() and (g[~is_model] == 0).all()
        # the policy term is what the sampler recorded
        assert abs(policy.item() - sum(sum(s.action_logprobs) for s in t.steps)) < 1e-3


# ---- people-facing views


def test_transcripts_and_html_cover_every_token(tok):
    for seed in range(10):
        t = random_trajectory(tok, seed=seed)
        text = t.transcript(tok)
        for k in range(t.num_steps):
            assert f"── step {k} · model · {len(t.steps[k].action_ids)} tokens" in text
        page = t.transcript_html(tok)
        n_legend = len(set(t.token_roles()))
        assert page.count('<span style="background') == len(t.sequence_ids()) + n_legend
    with pytest.raises(ValueError, match="masks has 1 entries but there are 2 tokens"):
        tokens_html(["a", "b"], ["model", "tool"], masks=[1])


def test_plot_timeline_draws_and_refuses_a_rewritten_context():
    fig = plot_timeline(toy_trajectory(5))
    assert len(fig.axes) == 2
    plt.close(fig)
    t = toy_trajectory(7, append_only=False)
    if not t.is_append_only():
        with pytest.raises(ValueError, match="is not append-only"):
            plot_timeline(t)
