"""Properties of agent_r1_tutorial.rewards beyond the examples in nbs/07_rewards.ipynb: answer metrics, fuzzed turn
parsing and format checks, GSM8K numbers, the answer-plus-format gate, process-reward placement and normalisation,
and the verl entry point."""
import inspect
import json
import string

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings, strategies as st

from agent_r1_tutorial.rewards import (SCORERS, answer_format_score, combine_process_outcome, compute_score,
                                       exact_match, extract_answer, extract_final_number, f1_score, format_reward,
                                       gsm8k_score, normalize_answer, numbers_match, place_outcome_reward,
                                       place_step_rewards, prime_normalize, qa_score, register_scorer,
                                       segment_ends, split_turns, substring_match)

words = st.text(alphabet=string.ascii_letters + string.digits, min_size=1, max_size=8)
phrases = st.lists(words, min_size=1, max_size=5).map(" ".join)
noisy = st.text(alphabet=string.printable + "éü—", max_size=40)
TAGS = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<answer>",
        "</answer>", "<search>", "</search>", "<information>", "</information>", "<|im_start|>", "<|im_end|>",
        "user\n", "assistant\n", '{"name": "search", "arguments": {}}', "{", "}"]
tagged = st.lists(st.one_of(noisy, st.sampled_from(TAGS)), max_size=25).map("".join)


# ---------------------------------------------------------------- answer metrics


@given(noisy)
def test_normalisation_is_idempotent_and_canonical(s):
    n = normalize_answer(s)
    assert normalize_answer(n) == n
    assert n == n.strip() and "  " not in n and n == n.lower()
    assert not any(ch in n for ch in string.punctuation)


@given(phrases, phrases)
@settings(max_examples=200)
def test_metric_hierarchy(pred, gold):
    "EM = 1 implies F1 = 1; EM = 1 implies a substring match when the gold is not empty; all lie in [0, 1]."
    em, f1, sub = exact_match(pred, gold), f1_score(pred, gold), substring_match(pred, gold)
    assert all(0.0 <= x <= 1.0 for x in (em, f1, sub))
    if em == 1.0:
        assert f1 == 1.0
        assert sub == 1.0 or not normalize_answer(gold)
    assert exact_match(pred, pred) == 1.0
    assert f1_score(pred, [gold, pred]) == 1.0 or not normalize_answer(pred)  # the best gold counts


@given(phrases, phrases, phrases)
def test_a_gold_among_other_words_is_a_substring_match(before, gold, after):
    assume(normalize_answer(gold))
    assert substring_match(f"{before}, {gold}! {after}", gold) == 1.0


@given(st.lists(words, min_size=1, max_size=6), st.randoms())
def test_f1_ignores_word_order(tokens, rnd):
    shuffled = tokens[:]
    rnd.shuffle(shuffled)
    assume(normalize_answer(" ".join(tokens)) not in ("yes", "no", "noanswer"))
    assert abs(f1_score(" ".join(shuffled), " ".join(tokens)) - 1.0) < 1e-12


# ---------------------------------------------------------------- turns and format: fuzzing


@given(tagged, st.sampled_from(["hermes", "search_r1"]), st.booleans())
@settings(max_examples=300)
def test_parsers_never_raise_and_stay_in_range(text, fmt, think):
    turns = split_turns(text, fmt)
    assert len(turns) >= 1 and all(isinstance(t, str) for t in turns)
    assert 0.0 <= format_reward(text, fmt, think) <= 1.0
    ans = extract_answer(text, fmt)
    assert ans is None or isinstance(ans, str)
    res = qa_score(text, "paris", fmt)
    assert -1.0 <= res["score"] <= 1.0 and set(res) == {"score", "acc", "format"}
    assert -1.0 <= gsm8k_score(text, "#### 3", fmt)["score"] <= 1.0


# The regular expressions these parsers used before they became linear scans: exponential on degenerate text (a
# tiny policy's output once stalled verl's reward workers for minutes), but a faithful oracle on short text.
import re  # noqa: E402

_OLD_OBS = {"hermes": re.compile(r"\s*(?:<\|im_end\|>)?\s*(?:<\|im_start\|>)?\s*(?:(?:user|tool)\n)?\s*"
                                 r"(?:<tool_response>.*?</tool_response>\s*)+"
                                 r"(?:<\|im_end\|>)?\s*(?:<\|im_start\|>)?\s*(?:assistant\n)?", re.S),
            "search_r1": re.compile(r"\s*(?:<information>.*?</information>\s*)+", re.S)}
_OLD_MARKUP = re.compile(r"<\|im_start\|>\s*(?:assistant|user|tool|system)?\s*|<\|im_end\|>|<\|endoftext\|>")
_OLD_TURN = {("hermes", "call"): r"(?:<tool_call>(.*?)</tool_call>\s*)+", ("hermes", "final"): r"<answer>(.*?)</answer>",
             ("search_r1", "call"): r"<search>(.*?)</search>", ("search_r1", "final"): r"<answer>(.*?)</answer>"}


def _old_turn_ok(turn, fmt, kind, require_think):
    from agent_r1_tutorial.rewards import _valid_call
    m = re.fullmatch(r"(?:<think>.*?</think>\s*)" + ("" if require_think else "?") + _OLD_TURN[fmt, kind], turn, re.S)
    if m is None:
        return False
    if fmt == "hermes" and kind == "call":
        return all(_valid_call(b) for b in re.findall(r"<tool_call>(.*?)</tool_call>", turn, re.S))
    return bool(m.group(1).strip())


# texts made of turns and observations as decoders render them (with and without special tokens, one or two blocks,
# bare role names or none), with tags, whitespace and stray role names (also glued to other text) mixed into the turns
OBSERVATIONS = ["<|im_end|>\n<|im_start|>user\n<tool_response>\nr\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
                "\nuser\n<tool_response>\nr\n</tool_response>\nassistant\n", "tool\n<tool_response>r</tool_response>",
                "<tool_response>a</tool_response> \n<tool_response>b</tool_response>\n", "\n<information>r</information>\n",
                "<information>a</information><information>b</information>"]
turn_text = st.lists(st.sampled_from(TAGS + [" ", "\n", "x", "y z", "assistant\n", "\nuser", "tool", "xuser\n"]), max_size=6).map("".join)
pieces = st.tuples(turn_text, st.lists(st.tuples(st.sampled_from(OBSERVATIONS), turn_text), max_size=3)).map(
    lambda t: t[0] + "".join(o + u for o, u in t[1]))


@given(pieces, st.sampled_from(["hermes", "search_r1"]), st.booleans())
@settings(max_examples=1000)
def test_linear_parsers_agree_with_the_former_regular_expressions(text, fmt, think):
    from agent_r1_tutorial.rewards import _turn_ok
    old = [_OLD_MARKUP.sub("", t).strip() for t in _OLD_OBS[fmt].split(text)]
    assert split_turns(text, fmt) == old
    for turn in old:
        for kind in ("call", "final"):
            assert _turn_ok(turn, fmt, kind, think) == _old_turn_ok(turn, fmt, kind, think), (turn, kind)


json_args = st.dictionaries(words, st.one_of(words, st.integers(), st.booleans()), max_size=3)
plain = st.text(alphabet=string.ascii_letters + string.digits + " .,?!'", min_size=1, max_size=30).filter(str.strip)


def hermes_episode(calls, answer, thoughts, special_tokens=True):
    im_start, im_end = ("<|im_start|>", "<|im_end|>") if special_tokens else ("", "")
    out = ""
    for name, args, thought in zip(calls, [c[1] for c in calls], thoughts):
        out += (f"<think>{thought}</think>\n" if thought else "")
        out += f'<tool_call>\n{json.dumps({"name": name[0], "arguments": args})}\n</tool_call>{im_end}\n'
        out += f"{im_start}user\n<tool_response>\nresult for {name[0]}\n</tool_response>{im_end}\n{im_start}assistant\n"
    return out + f"<think>done</think>\n<answer>{answer}</answer>{im_end}"


@given(st.lists(st.tuples(words, json_args), max_size=4), plain, st.lists(st.one_of(st.none(), plain), min_size=4,
                                                                         max_size=4), st.booleans())
@settings(max_examples=150, deadline=None)
def test_well_formed_hermes_episodes_parse(calls, answer, thoughts, special):
    ep = hermes_episode(calls, answer, thoughts, special)
    turns = split_turns(ep)
    assert len(turns) == len(calls) + 1
    assert format_reward(ep) == 1.0
    assert extract_answer(ep) == answer.strip()
    res = qa_score(ep, answer)
    assert res == {"score": exact_match(answer, answer), "acc": 1.0, "format": 1.0}
    if calls:  # breaking one call's JSON costs exactly its share of the intermediate half
        broken = ep.replace('{"name"', '{"name" ', 1).replace('"arguments"', '"arguments', 1)
        assert format_reward(broken) == 0.5 + 0.5 * (len(calls) - 1) / len(calls)


@given(st.lists(plain, max_size=4), plain)
@settings(max_examples=100, deadline=None)
def test_well_formed_search_r1_episodes_parse(queries, answer):
    ep = "".join(f"<think>t</think><search>{q}</search>\n<information>docs</information>\n" for q in queries)
    ep += f"<answer>{answer}</answer>"
    assert split_turns(ep, "search_r1")[-1] == f"<answer>{answer}</answer>"
    assert format_reward(ep, "search_r1") == 1.0
    assert format_reward(ep, "search_r1", require_think=True) == 0.5  # the final turn has no think block
    assert qa_score(ep, answer, "search_r1")["acc"] == 1.0


def test_require_think_checks_every_turn():
    ep = hermes_episode([("search", {})], "x", ["thinking"])
    assert format_reward(ep, require_think=True) == 1.0
    no_think = hermes_episode([("search", {})], "x", [None])
    assert format_reward(no_think, require_think=True) == 0.5
    assert format_reward(no_think) == 1.0


def test_bad_format_names():
    with pytest.raises(ValueError, match="unknown format 'xml'"):
        format_reward("x", "xml")
    with pytest.raises(ValueError, match="unknown format"):
        extract_answer("x", "Hermes")
    with pytest.raises(TypeError, match="solution_str must be a str"):
        format_reward(b"<answer>x</answer>")


# ---------------------------------------------------------------- GSM8K numbers


@given(st.integers(-10**9, 10**9), st.integers(0, 99), st.booleans(), st.booleans())
def test_final_numbers_are_canonical(n, cents, commas, dollars):
    text = f"{n:,}" if commas else str(n)
    text = ("$" if dollars else "") + text + (f".{cents:02d}" if cents else "")
    expected = str(n) if not cents else f"{n}.{cents:02d}".rstrip("0")
    if n < 0 and cents:
        expected = f"-{abs(n)}.{cents:02d}".rstrip("0")
    assert extract_final_number(f"Working: 1 + 2 = 3. So the answer is {text}.") == expected
    assert numbers_match(f"The answer is {text}", f"blah 7 blah\n#### {text}") == 1.0


def test_hashes_win_over_later_numbers_and_boxed_over_plain():
    assert extract_final_number("#### 42\nchecked with 7 steps") == "42"
    assert extract_final_number("\\boxed{5} since 2 + 3") == "5"
    assert extract_final_number("") is None
    assert numbers_match("", "#### 4") == 0.0
    assert numbers_match("4", "no number in the gold") == 0.0


# ---------------------------------------------------------------- the answer-plus-format gate


@given(st.floats(0, 1), st.floats(0, 1), st.floats(0, 1), st.floats(0, 1))
def test_gate_ordering(c1, f1, c2, f2):
    s1, s2 = answer_format_score(c1, f1), answer_format_score(c2, f2)
    assert -1.0 <= s1 <= 1.0
    if f1 == 1.0 and f2 < 1.0:
        assert s1 > s2  # any well-formed episode beats any malformed one
    if f1 < 1.0 and f2 < 1.0 and f1 <= f2:
        assert s1 <= s2  # among malformed ones more format is never worse
    if f1 == f2 == 1.0 and c1 <= c2:
        assert s1 <= s2


def test_gate_bad_values():
    for c, f in [(-0.1, 1.0), (0.5, 1.5), (float("nan"), 1.0)]:
        with pytest.raises(ValueError, match="must lie in"):
            answer_format_score(c, f)


# ---------------------------------------------------------------- process rewards


@given(st.integers(0, 2**32 - 1))
@settings(max_examples=60, deadline=None)
def test_segment_ends_and_placement(seed):
    rng = np.random.default_rng(seed)
    m = torch.tensor(rng.random(size=(4, 12)) < 0.6).long()
    ends = segment_ends(m)
    for i in range(4):
        starts = int(((m[i, 1:] == 1) & (m[i, :-1] == 0)).sum() + (m[i, 0] == 1))
        assert len(ends[i]) == starts
        assert all(m[i, t] == 1 and (t == 11 or m[i, t + 1] == 0) for t in ends[i])
    steps = [list(rng.normal(size=len(e))) for e in ends]
    placed = place_step_rewards(steps, m, dtype=torch.float64)
    assert torch.equal(placed * (1 - m), torch.zeros_like(placed))
    for i in range(4):
        assert np.allclose(placed[i, ends[i]].numpy(), steps[i])
    out = place_outcome_reward(torch.arange(4.0), m)
    for i in range(4):
        assert out[i].sum() == (i if ends[i] else 0) and (not ends[i] or out[i, ends[i][-1]] == i)


@given(st.integers(0, 2**32 - 1), st.floats(0.01, 100.0))
@settings(max_examples=60, deadline=None)
def test_prime_normalisation(seed, scale):
    rng = np.random.default_rng(seed)
    p = torch.tensor(rng.choice([-0.1, -0.05, 0.0, 0.0, 0.1], size=(5, 9)), dtype=torch.float64)
    assume(p.abs().sum() > 0)
    norm = prime_normalize(p)
    rtg = norm.flip(-1).cumsum(-1).flip(-1)
    peak = p.flip(-1).cumsum(-1).flip(-1).abs().max()
    assume(peak > 1e-3)
    assert abs(float(rtg.abs().max()) - 1.0) < 1e-4
    assert torch.equal(torch.sign(norm), torch.sign(p))
    torch.testing.assert_close(prime_normalize(p * scale), norm, atol=1e-3, rtol=1e-3)
    out = torch.zeros_like(p)
    torch.testing.assert_close(combine_process_outcome(out, p, weight=0.3), 0.3 * norm)
    torch.testing.assert_close(combine_process_outcome(out, p, weight=0.3, normalize=False), 0.3 * p)


def test_process_reward_bad_input():
    m = torch.tensor([[1, 0, 1]])
    with pytest.raises(ValueError, match="row 0 has 3 step rewards but only 2 turns"):
        place_step_rewards([[1.0, 2.0, 3.0]], m)
    with pytest.raises(ValueError, match="must be a \\(batch, response_length\\) tensor"):
        segment_ends(m[0])
    with pytest.raises(ValueError, match="process_rewards must be a"):
        prime_normalize(torch.zeros(3))


# ---------------------------------------------------------------- verl's entry point


def test_compute_score_has_verls_signature_and_consistent_keys():
    params = list(inspect.signature(compute_score).parameters)
    assert params[:4] == ["data_source", "solution_str", "ground_truth", "extra_info"]
    ep = hermes_episode([("search", {"q": "x"})], "Paris", ["hmm"])
    keys = set()
    for source in sorted(SCORERS):
        src = source.replace("*", "nq")
        res = compute_score(src, ep, "Paris", extra_info={"index": 0, "num_turns": 3})
        assert isinstance(res["score"], float)
        keys.add(tuple(sorted(res)))
    assert keys == {("acc", "format", "score")}  # verl needs the same keys for every sample


def test_compute_score_dispatch_and_options():
    ep = hermes_episode([], "Paris, France", [])
    assert compute_score("hotpotqa", ep, "Paris")["score"] == 0.0
    assert compute_score("hotpotqa", ep, "Paris", metric="substring")["score"] == 1.0
    assert compute_score("hotpotqa", ep, "Paris", extra_info={"metric": "f1"})["score"] == pytest.approx(2 / 3)
    assert compute_score("searchR1_hotpotqa", "<answer>Paris</answer>", {"target": ["paris"]})["score"] == 1.0
    assert compute_score("gsm8k", "<answer>3</answer>", "#### 3", metric="f1")["score"] == 1.0  # metric ignored

    @register_scorer("searchR1_special*")
    def special(solution_str, ground_truth, **kw):
        return {"score": 0.25, "acc": 0.0, "format": 0.0}

    try:
        assert compute_score("searchR1_special_v2", "x", "y")["score"] == 0.25  # the longer prefix wins
        assert compute_score("searchR1_nq", "<answer>y</answer>", "y")["score"] == 1.0
    finally:
        del SCORERS["searchR1_special*"]
    with pytest.raises(ValueError, match="no reward function for data_source 'lighteval/MATH'"):
        compute_score("lighteval/MATH", "x", "y")
    with pytest.raises(ValueError, match="unknown answer metric 'bleu'"):
        compute_score("nq", ep, "Paris", metric="bleu")
