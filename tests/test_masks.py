"""Property tests for agent_r1_tutorial.masks, beyond the examples in nbs/02_masks.ipynb.

Trajectories come from seeded generators: `random_trajectory` in text mode (composed tool calls, hundreds of seeds)
and in model mode (actions sampled from a small Qwen2 with their real log-probs)."""
import copy
import math
import random

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from agent_r1_tutorial.masks import (collate, compute_log_probs, env_suffix, env_suffix_ids, growing_layout,
                                     initial_prompt_ids, mask_explorer, mask_html, plot_layouts, plot_mask,
                                     random_trajectory, reencode, sample_actions, step_layout)
from agent_r1_tutorial.mdp import Step, Trajectory
from agent_r1_tutorial.tinylm import IM_END, TOOL_CALL_END, build_tiny_lm, tiny_qwen2, toy_conversations

SEEDS = range(300)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    "Tiny models gain nothing from intra-op threads, and on a shared CPU the threads contend badly."
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def tok():
    return build_tiny_lm(seed=0)[0]


@pytest.fixture(scope="module")
def small_model(tok):
    "Fast to sample from; random weights, so its samples exercise odd token sequences."
    return tiny_qwen2(tok, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                      seed=1).eval()


@pytest.fixture(scope="module")
def text_trajs(tok):
    return [random_trajectory(tok, seed=s) for s in SEEDS]


@pytest.fixture(scope="module")
def model_trajs(tok, small_model):
    return [random_trajectory(tok, seed=s, model=small_model, max_action_tokens=8, n_turns=1 + s % 3)
            for s in range(12)]


def _render(tok, messages, tools):
    return tok.apply_chat_template(messages, tools=tools, tokenize=False)


# ---- the growing layout: ids, masks, roles


def _check_growing(t: Trajectory):
    g = growing_layout(t)
    resp, mask = np.array(g["response_ids"]), np.array(g["response_mask"])
    n = len(resp)
    for key in ("response_mask", "response_logprobs", "token_level_rewards", "step_ids"):
        assert len(g[key]) == n, key
    # the ids under mask 1 are exactly the sampled ids, in order, and their count is the sampled count
    assert resp[mask == 1].tolist() == [i for s in t.steps for i in s.action_ids]
    assert int(mask.sum()) == t.num_policy_tokens
    # no environment token is ever under mask 1, and no policy token under mask 0
    roles = t.token_roles()[len(g["prompt_ids"]):]
    assert all((r == "model") == bool(m) for r, m in zip(roles, mask))
    assert resp[mask == 0].tolist() == [i for s in t.steps for i in s.env_ids]
    # log-probs: the sampler's at mask 1, zero elsewhere
    lps = np.array(g["response_logprobs"])
    assert lps[mask == 1].tolist() == [l for s in t.steps for l in s.action_logprobs]
    assert (lps[mask == 0] == 0).all()
    # step ids mark exactly the policy tokens, each with its step
    sid = np.array(g["step_ids"])
    assert ((sid >= 0) == (mask == 1)).all()
    assert sid[mask == 1].tolist() == [k for k, s in enumerate(t.steps) for _ in s.action_ids]
    # rewards: step rewards on each action's last token, the outcome on the last policy token
    rew = np.array(g["token_level_rewards"])
    assert math.isclose(rew.sum(), t.total_reward, abs_tol=1e-9)
    last_policy = np.nonzero(mask)[0][-1]
    ends = np.nonzero(np.diff(np.r_[sid, -1]) != 0)[0]  # last position of each run of step ids
    ends = [e for e in ends if sid[e] >= 0]
    for k, e in enumerate(ends):
        expected = t.steps[k].reward + (t.outcome_reward if e == last_policy else 0.0)
        assert math.isclose(rew[e], expected, abs_tol=1e-12)
    assert np.count_nonzero(rew[np.setdiff1d(np.arange(n), ends)]) == 0
    assert g["prompt_ids"] + g["response_ids"] == t.sequence_ids()
    return g


def test_growing_layout_properties_on_composed_trajectories(text_trajs):
    for t in text_trajs:
        _check_growing(t)


def test_growing_layout_properties_on_sampled_trajectories(model_trajs):
    for t in model_trajs:
        _check_growing(t)


def test_step_layout_properties(text_trajs, model_trajs):
    for t in text_trajs + model_trajs:
        rows = step_layout(t)
        assert [r["response_ids"] for r in rows] == [s.action_ids for s in t.steps]
        assert [r["prompt_ids"] for r in rows] == [s.obs_ids for s in t.steps]
        assert all(r["response_mask"] == [1] * len(r["response_ids"]) for r in rows)
        assert [r["step_index"] for r in rows] == list(range(t.num_steps))
        assert [r["is_last"] for r in rows] == [False] * (t.num_steps - 1) + [True]
        assert {r["trajectory_uid"] for r in rows} == {t.uid} and {r["group"] for r in rows} == {t.group}
        assert math.isclose(sum(sum(r["token_level_rewards"]) for r in rows), t.total_reward, abs_tol=1e-9)


def test_growing_sequence_is_the_chat_templates_rendering(tok, text_trajs):
    "Appending ids and template deltas gives the template's tokens for the whole conversation."
    for t in text_trajs:
        seq = t.sequence_ids()
        whole = tok.encode(_render(tok, t.metadata["messages"], t.metadata["tools"]), add_special_tokens=False)
        upto = len(seq) - len(t.steps[-1].action_ids)
        assert seq[:upto] == whole[:upto], t.uid
        if t.reason != "max_action_tokens":  # an action cut by its budget may end mid-character
            assert seq == whole[:len(seq)], t.uid
            assert tok.decode(whole[len(seq):]) in ("\n", f"{IM_END}\n"), t.uid


def test_generator_covers_every_case(text_trajs):
    reasons = {t.reason for t in text_trajs}
    assert {"answer", "max_turns", "max_action_tokens"} <= reasons
    assert {s.info["ended_with_eos"] for t in text_trajs for s in t.steps[:-1]} == {True, False}
    assert any(s.info["num_tool_calls"] == 2 for t in text_trajs for s in t.steps)
    assert any(t.metadata["messages"][0]["role"] == "system" for t in text_trajs)
    assert {t.num_steps for t in text_trajs} == {1, 2, 3, 4}


def test_not_append_only_is_refused_with_the_step_named(text_trajs):
    t = next(t for t in text_trajs if t.num_steps >= 3)
    steps = [Step(**{**s.__dict__, "next_obs_ids": None}) for s in t.steps]
    steps[2] = Step(**{**steps[2].__dict__, "obs_ids": steps[2].obs_ids[5:]})
    bad = Trajectory(steps, uid="bad")
    with pytest.raises(ValueError, match="step 2's obs_ids is not step 1's obs_ids"):
        growing_layout(bad)
    assert len(step_layout(bad)) == t.num_steps  # the step layout takes it


# ---- the template delta


def test_env_suffix_two_endings(tok):
    for seed in range(30):
        rng = random.Random(seed)
        msgs = [{"role": "tool", "content": " ".join(rng.choice(["a", "bé", "42", "city"]) for _ in range(rng.randint(1, 9)))}
                for _ in range(rng.randint(1, 3))]
        open_, roles = env_suffix(tok, msgs, response_ended_with_eos=False)
        closed = env_suffix_ids(tok, msgs, response_ended_with_eos=True)
        assert open_ == [tok.eos_token_id] + closed
        assert roles[0] == "template" and len(roles) == len(open_)
        tool_text = tok.decode([i for i, r in zip(open_, roles) if r == "tool"])
        assert tool_text == "".join(m["content"] for m in msgs)
        no_prompt = env_suffix_ids(tok, msgs, True, add_generation_prompt=False)
        assert closed[: len(no_prompt)] == no_prompt and tok.decode(closed[len(no_prompt):]) == "<|im_start|>assistant\n"


def test_env_suffix_refuses_a_template_that_is_not_append_only(tok):
    weird = copy.deepcopy(tok)
    # a template that prints the number of messages first: appending a message changes earlier text
    weird.chat_template = ("{{ messages | length }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
                           "{{ m['content'] }}<|im_end|>\n{% endfor %}")
    with pytest.raises(ValueError, match="not append-only"):
        env_suffix_ids(weird, [{"role": "tool", "content": "x"}], False)
    # a template that transforms content: the ids still follow the template, the labels give up on markup
    trims = copy.deepcopy(tok)
    trims.chat_template = tok.chat_template.replace("message['content'] + '\\n</tool_response>'",
                                                    "(message['content'] | trim) + '\\n</tool_response>'")
    assert trims.chat_template != tok.chat_template
    msgs = [{"role": "tool", "content": "  padded  "}]
    ids, roles = env_suffix(trims, msgs, True)
    assert tok.decode(ids) == "\n<|im_start|>user\n<tool_response>\npadded\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    assert roles[0] == "template" and set(roles[1:]) == {"tool"}
    with pytest.raises(ValueError, match=r"messages\[1\] must be a dict with a 'role'"):
        env_suffix_ids(tok, [{"role": "tool", "content": "x"}, {"content": "y"}], False)
    with pytest.raises(TypeError, match="content'\\] must be a str"):
        env_suffix_ids(tok, [{"role": "tool", "content": 3}], False)
    with pytest.raises(ValueError, match="messages must be a non-empty list"):
        initial_prompt_ids(tok, [])


# ---- token-in/token-out


def test_reencode_is_the_identity_on_encoded_text_and_not_on_a_split_token(tok):
    for text in toy_conversations(100, seed=3, tokenizer=tok):
        ids = tok.encode(text, add_special_tokens=False)
        assert reencode(tok, ids) == ids
    born = tok.encode(" born", add_special_tokens=False)
    split = tok.encode(" ", add_special_tokens=False) + tok.encode("born", add_special_tokens=False)
    assert len(born) == 1 and len(split) == 2 and reencode(tok, split) == born


def test_sample_actions_records_the_true_log_probs(tok, small_model):
    prompt = initial_prompt_ids(tok, [{"role": "user", "content": "where?"}])
    stop = [tok.eos_token_id, tok.convert_tokens_to_ids(TOOL_CALL_END)]
    out = sample_actions(small_model, prompt, n=6, max_new_tokens=12, stop_ids=stop, temperature=0.7, seed=3)
    assert out == sample_actions(small_model, prompt, n=6, max_new_tokens=12, stop_ids=stop, temperature=0.7, seed=3)
    rows = [{"prompt_ids": prompt, "response_ids": ids, "response_mask": [1] * len(ids), "response_logprobs": lps}
            for ids, lps, _ in out]
    b = collate(rows, tok.pad_token_id)
    with torch.no_grad():
        lp = compute_log_probs(small_model, b["input_ids"], b["attention_mask"], b["position_ids"],
                               b["responses"].shape[1], temperature=0.7)
    m = b["response_mask"].bool()
    assert torch.allclose(lp[m], b["old_log_probs"][m], atol=1e-4)
    for ids, lps, fin in out:
        assert (fin == "stop") == (ids[-1] in stop) and (fin == "stop" or len(ids) == 12)
        assert all(i not in stop for i in ids[:-1])


# ---- collation


def _row_strategy():
    @st.composite
    def row(draw):
        P = draw(st.integers(1, 12))
        R = draw(st.integers(1, 12))
        mask = draw(st.lists(st.integers(0, 1), min_size=R, max_size=R))
        mask[0] = 1  # a response starts with the policy's tokens
        return {"prompt_ids": draw(st.lists(st.integers(1, 500), min_size=P, max_size=P)),
                "response_ids": draw(st.lists(st.integers(1, 500), min_size=R, max_size=R)),
                "response_mask": mask,
                "response_logprobs": [-draw(st.floats(0.0, 5.0)) * m for m in mask],
                "token_level_rewards": draw(st.lists(st.sampled_from([0.0, 0.0, 1.0, -0.5]), min_size=R, max_size=R)),
                "step_ids": [0 if m else -1 for m in mask],
                "step_index": draw(st.integers(0, 5)), "trajectory_uid": draw(st.sampled_from(["a", "b"]))}
    return row()


@given(st.lists(_row_strategy(), min_size=1, max_size=6), st.integers(1, 14), st.integers(1, 14),
       st.sampled_from(["error", "left", "right"]))
@settings(max_examples=300, deadline=None)
def test_collate_keeps_every_field_aligned(rows, P, R, truncation):
    over_p = any(len(r["prompt_ids"]) > P for r in rows)
    over_r = any(len(r["response_ids"]) > R for r in rows)
    if (over_p and truncation != "left") or (over_r and truncation != "right"):
        with pytest.raises(ValueError, match="over max_(prompt|response)_length"):
            collate(rows, 0, P, R, truncation)
        return
    b = collate(rows, 0, P, R, truncation)
    bs = len(rows)
    assert b["input_ids"].shape == b["attention_mask"].shape == b["position_ids"].shape == (bs, P + R)
    for key in ("responses", "response_mask", "old_log_probs", "token_level_rewards", "step_ids"):
        assert b[key].shape == (bs, R), key
    assert torch.equal(b["input_ids"], torch.cat([b["prompts"], b["responses"]], 1))
    for i, r in enumerate(rows):
        p = r["prompt_ids"][-P:]  # left truncation keeps the last tokens
        n = min(len(r["response_ids"]), R)  # right truncation keeps the first tokens
        am = b["attention_mask"][i]
        # left-padded prompt, right-padded response, real tokens in between and nothing else
        assert am.tolist() == [0] * (P - len(p)) + [1] * (len(p) + n) + [0] * (R - n)
        assert b["input_ids"][i][am.bool()].tolist() == p + r["response_ids"][:n]
        assert (b["input_ids"][i][~am.bool()] == 0).all()
        # positions count real tokens only
        assert b["position_ids"][i][am.bool()].tolist() == list(range(len(p) + n))
        # every per-token field is its ids' slice, padded with its neutral value
        assert b["response_mask"][i].tolist() == r["response_mask"][:n] + [0] * (R - n)
        assert b["old_log_probs"][i].tolist() == pytest.approx(r["response_logprobs"][:n] + [0.0] * (R - n))
        assert b["step_ids"][i].tolist() == r["step_ids"][:n] + [-1] * (R - n)
        rew = b["token_level_rewards"][i]
        assert rew.sum().item() == pytest.approx(sum(r["token_level_rewards"]), abs=1e-5)  # moved, never lost
        assert (rew[n:] == 0).all()
        assert b["prompt_truncated"][i] == len(r["prompt_ids"]) - len(p)
        assert b["response_truncated"][i] == len(r["response_ids"]) - n
    assert b["step_index"].tolist() == [r["step_index"] for r in rows]
    assert b["trajectory_uid"] == [r["trajectory_uid"] for r in rows]


@pytest.mark.parametrize("change, message", [
    ({"response_mask": [1, 0]}, "row 0: response_mask has 2 entries but response_ids has 3"),
    ({"response_logprobs": [-1.0]}, "row 0: response_logprobs has 1 entries"),
    ({"token_level_rewards": [0.0] * 4}, "row 0: token_level_rewards has 4 entries"),
    ({"step_ids": [0]}, "row 0: step_ids has 1 entries"),
    ({"response_mask": [1, 0, 3]}, "response_mask must hold only 0 and 1"),
    ({"prompt_ids": []}, "row 0: prompt_ids is empty"),
    ({"response_ids": [], "response_mask": []}, "row 0: response_ids is empty"),
    ({"prompt_ids": [1, 2.0]}, "row 0: prompt_ids must hold int token ids"),
    ({"response_logprobs": [float("nan"), 0.0, 0.0]}, "must be finite"),
])
def test_collate_bad_rows_name_the_problem(change, message):
    row = {"prompt_ids": [4, 5], "response_ids": [6, 7, 8], "response_mask": [1, 1, 0],
           "response_logprobs": [-0.1, -0.2, 0.0]}
    with pytest.raises((ValueError, TypeError)) as e:
        collate([{**row, **change}], pad_token_id=0)
    assert message in str(e.value)


def test_collate_budget_errors():
    row = {"prompt_ids": [4, 5, 6], "response_ids": [7, 8, 9], "response_mask": [1, 0, 1],
           "token_level_rewards": [0.0, 0.0, 1.0]}
    with pytest.raises(ValueError, match="row 0: the prompt has 3 tokens, over max_prompt_length=2"):
        collate([row], 0, 2, 3)
    with pytest.raises(ValueError, match="row 0: the response has 3 tokens, over max_response_length=1"):
        collate([row], 0, 3, 1, truncation="left")
    with pytest.raises(ValueError, match="truncation must be one of"):
        collate([row], 0, truncation="both")
    with pytest.raises(ValueError, match="pad_token_id must be an int"):
        collate([row], -1)
    b = collate([row], 0, 3, 2, truncation="right")
    assert b["token_level_rewards"].tolist() == [[1.0, 0.0]]  # moved onto the last kept policy token
    no_policy = {**row, "response_mask": [0, 0, 1]}
    with pytest.raises(ValueError, match="no policy token to carry the dropped reward"):
        collate([no_policy], 0, 3, 2, truncation="right")


# ---- log-probs: both layouts agree, padding changes nothing


def test_both_layouts_give_the_same_policy_log_probs(tok, small_model, model_trajs):
    gb = collate([growing_layout(t) for t in model_trajs], tok.pad_token_id)
    sb = collate([r for t in model_trajs for r in step_layout(t)], tok.pad_token_id)
    with torch.no_grad():
        lg = compute_log_probs(small_model, gb["input_ids"], gb["attention_mask"], gb["position_ids"],
                               gb["responses"].shape[1])
        ls = compute_log_probs(small_model, sb["input_ids"], sb["attention_mask"], sb["position_ids"],
                               sb["responses"].shape[1])
    pg, ps = lg[gb["response_mask"].bool()], ls[sb["response_mask"].bool()]
    sampled = torch.tensor([l for t in model_trajs for s in t.steps for l in s.action_logprobs])
    assert len(pg) == len(ps) == len(sampled) == sum(t.num_policy_tokens for t in model_trajs)
    assert torch.allclose(pg, ps, atol=1e-4) and torch.allclose(pg, sampled, atol=1e-4)


def test_padding_does_not_change_log_probs(tok, small_model, model_trajs):
    rows = [growing_layout(t) for t in model_trajs[:4]]
    tight = collate(rows, tok.pad_token_id)
    P, R = tight["prompts"].shape[1], tight["responses"].shape[1]
    loose = collate(rows, tok.pad_token_id, P + 7, R + 5)
    with torch.no_grad():
        a, ea = compute_log_probs(small_model, tight["input_ids"], tight["attention_mask"], tight["position_ids"], R,
                                  return_entropy=True)
        b = compute_log_probs(small_model, loose["input_ids"], loose["attention_mask"], loose["position_ids"], R + 5)
    assert torch.allclose(a, b[:, :R], atol=1e-4)
    assert (ea >= 0).all() and (ea <= math.log(len(tok)) + 1e-4).all()


def test_compute_log_probs_bad_input(tok, small_model):
    ids = torch.ones(2, 6, dtype=torch.long)
    am = torch.ones_like(ids)
    with pytest.raises(ValueError, match="position_ids has shape"):
        compute_log_probs(small_model, ids, am, am[:, :5], 2)
    with pytest.raises(ValueError, match="response_length must be an int in \\[1, 5\\]"):
        compute_log_probs(small_model, ids, am, am, 6)
    with pytest.raises(ValueError, match="input_ids must be \\(batch, length\\)"):
        compute_log_probs(small_model, ids[0], am[0], am[0], 2)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        compute_log_probs(small_model, ids, am, am, 2, temperature=0.0)


# ---- views


def test_views_render(tok, text_trajs):
    t = next(t for t in text_trajs if t.num_steps == 3)
    for layout in ("growing", "steps"):
        h = mask_html(t, tok, layout, context=3)
        assert h.count('border-bottom:2px solid #000" title=') == t.num_policy_tokens
        assert h.count("mask 1: trained") == 1  # one legend, above the first block
        fig = plot_mask(t, tok, layout)
        plt.close(fig)
    plt.close(plot_layouts(t))
    ex = mask_explorer([t], tok)
    assert "growing row" in ex.children[1].value
    with pytest.raises(ValueError, match="layout must be"):
        mask_html(t, tok, "diagonal")
