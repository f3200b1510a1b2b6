"""The tiny speedrun's data and pieces (chapter 11): worlds, questions, the expert, configuration, the report."""
import json
import random
import subprocess
import sys

import pytest
from conftest import ROOT
from hypothesis import given, settings, strategies as st

from agent_r1_tutorial.speedrun import SpeedrunConfig, write_report
from agent_r1_tutorial.worlds import (
    WorldSearch, arith_expert, arith_env, make_arith_tasks, make_split, make_world, parse_question, play, search_expert,
)
from agent_r1_tutorial.rollout import SamplingParams, ScriptedBackend
from agent_r1_tutorial.tinylm import build_tiny_lm


@pytest.fixture(scope="module")
def tok():
    return build_tiny_lm(vocab_size=600, hidden_size=16, num_hidden_layers=1)[0]


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10**6), n=st.integers(1, 6))
def test_splits_share_no_name(seed, n):
    train = make_split(n, 1, seed=seed)
    held = make_split(n, 1, seed=seed + 1, banned=train.names())
    assert not train.names() & held.names()
    # and no two worlds of one split share a name either
    seen = set()
    for w in train.worlds:
        assert not seen & w.names()
        seen |= w.names()


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10**6))
def test_every_question_parses_to_its_chain(seed):
    split = make_split(2, 3, seed=seed)
    for t in split.tasks:
        entity, path = parse_question(t["question"])
        assert entity == t["chain"][0] and len(path) == t["hops"]


def test_expert_solves_every_task_with_bm25(tok):
    split = make_split(10, 3, seed=5)
    trajs = play(ScriptedBackend(tok, search_expert), tok, split.tasks, WorldSearch(split.worlds, "bm25"),
                 SamplingParams(max_new_tokens=128))
    assert [t.outcome_reward for t in trajs] == [1.0] * len(split.tasks)
    # tool calls per episode equal the hops
    for t, task in zip(trajs, split.tasks):
        assert sum(s.info.get("n_calls", 0) for s in t.steps) == task["hops"]


def test_expert_without_search_gets_nothing_right(tok):
    split = make_split(5, 2, seed=6)
    trajs = play(ScriptedBackend(tok, search_expert), tok, split.tasks, WorldSearch(split.worlds, "none"),
                 SamplingParams(max_new_tokens=128))
    assert all(t.outcome_reward == 0.0 for t in trajs)


def test_process_reward_pays_retrieval_hits_only(tok):
    split = make_split(3, 2, seed=7, hops=(2,))
    envs = WorldSearch(split.worlds, "bm25", k=1, process_reward=0.25)
    trajs = play(ScriptedBackend(tok, search_expert), tok, split.tasks, envs, SamplingParams(max_new_tokens=128))
    for t in trajs:  # both searches of a two-hop episode find a new passage of the chain
        assert [s.reward for s in t.steps] == [0.25, 0.25, 0.0]
    # with two passages per search, the first search can already retrieve both chain passages: the second pays nothing
    wide = play(ScriptedBackend(tok, search_expert), tok, split.tasks, WorldSearch(split.worlds, "bm25", k=2,
                process_reward=0.25), SamplingParams(max_new_tokens=128))
    assert all(t.steps[0].reward == 0.25 and sum(s.reward for s in t.steps) <= 0.5 for t in wide)
    assert any(t.steps[1].reward == 0.0 for t in wide)  # a second search that only re-finds a paid passage: unpaid
    # the same search twice in one episode pays once; a new episode of the same environment pays again
    task, env = split.tasks[0], envs(split.tasks[0])
    call = '<tool_call>\n{"name": "search", "arguments": {"query": "%s"}}\n</tool_call>' % task["chain"][0]
    for _ in range(2):
        env.reset(**task)
        assert [env.step(call)[1] for _ in range(2)] == [0.25, 0.0]


def test_arith_expert_and_bad_problems(tok):
    tasks = make_arith_tasks(12, seed=3)
    trajs = play(ScriptedBackend(tok, arith_expert), tok, tasks, arith_env, SamplingParams(max_new_tokens=96))
    assert all(t.outcome_reward == 1.0 for t in trajs)
    assert all(str(eval(t["expression"])) == t["answer"] for t in tasks)
    with pytest.raises(ValueError, match="n must be a positive int"):
        make_arith_tasks(0, seed=0)
    assert arith_expert("<|im_start|>user\nWhat is the capital of Peru?<|im_end|>\n") == "<answer>unknown</answer>"


@pytest.mark.parametrize("kw, msg", [
    ({"algorithm": "a2c"}, "unknown algorithm 'a2c'"),
    ({"retriever": "tfidf"}, "unknown retriever 'tfidf'"),
    ({"rl_hops": ()}, "rl_hops must be a non-empty selection"),
    ({"group_size": 0}, "group_size must be a positive int"),
    ({"hidden_size": 1.5}, "hidden_size must be a positive int"),
    ({"context_drill_steps": -1}, "context_drill_steps must be a non-negative int"),
])
def test_config_names_bad_values(kw, msg):
    with pytest.raises(ValueError, match=msg.replace("(", r"\(")):
        SpeedrunConfig(**kw)


def test_world_rejects_bad_sizes():
    with pytest.raises(ValueError, match="n_people must be a positive int"):
        make_world(random.Random(0), n_people=0)


def test_context_drills_follow_the_drills_in_place(tmp_path):
    "context_drill_steps: after the drills, the same drills after an episode's opening, with their copy check."
    from agent_r1_tutorial.speedrun import run_speedrun

    # the drills' own rate is ten times SFT's, so the log tells which rate the drills in place ran at
    cfg = SpeedrunConfig.preset("ci", retriever="bm25", context_drill_steps=3, sft_steps=2, drill_lr=3e-2)
    run_speedrun(cfg, tmp_path, progress=False, stages=("data", "sft"))
    drill = [json.loads(l) for l in (tmp_path / "drill.jsonl").read_text().splitlines()]
    ctx = [json.loads(l) for l in (tmp_path / "context_drill.jsonl").read_text().splitlines()]
    assert len(drill) == cfg.drill_steps and len(ctx) == 3 and 0 <= ctx[-1]["copy"] <= 1 and "copy" in drill[-1]
    assert max(r["lr"] for r in ctx) <= cfg.sft_lr < max(r["lr"] for r in drill)  # in place, at SFT's rate


def test_report_from_a_run_folder(tmp_path):
    cfg = SpeedrunConfig.preset("ci")
    (tmp_path / "config.json").write_text(json.dumps(cfg.__dict__, default=list))
    e = {"em/1-hop": 0.5, "em/2-hop": 0.25, "em/all": 0.375, "tool_calls": 1.5, "turns": 2.5, "agent_tokens_per_s": 900.0}
    (tmp_path / "eval.json").write_text(json.dumps({"sft": e, "final": {**e, "em/2-hop": 0.75}, "no_tool": e}))
    (tmp_path / "stages.json").write_text(json.dumps({"data": 1.0, "sft": 2.0, "rl": 3.0, "eval": 4.0}))
    (tmp_path / "plots").mkdir()
    text = write_report(tmp_path).read_text()
    assert "| SFT + grpo | 0.500 | 0.750 | 0.375 | 1.50 | 2.50 |" in text
    assert "| **total** | **10.0** |" in text and "900 agent tokens/s" in text


def test_bench_rl_matters_reuses_sft_and_refuses_a_different_one(tmp_path):
    "The RL-matters benchmark at CI size: its table, then other RL settings from the same SFT stage (not re-run)."
    bench = [sys.executable, "scripts/bench_speedrun.py", "rl-matters", "--seeds", "0", "--preset", "ci", "--quiet",
             "--set", "retriever=bm25", "--set", "sft_hops=1,2", "--set", "sft_two_hop_share=0.5", "--set", "sft_two_hop_stop=0.5"]
    res = subprocess.run([*bench, "--out", str(tmp_path / "a")], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "50% of the two-hop ones, 50% of which a flawed expert answers after one search" in res.stdout
    assert "Two-hop EM lift from RL" in res.stdout
    sft_log = (tmp_path / "a" / "rl-matters-s0" / "sft.jsonl").read_text()
    res = subprocess.run([*bench, "--set", "process_reward=0.5", "--sft-from", str(tmp_path / "a"),
                          "--out", str(tmp_path / "b")], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "process reward 0.5" in res.stdout
    b = tmp_path / "b" / "rl-matters-s0"
    assert (b / "sft.jsonl").read_text() == sft_log  # the SFT stage was copied, not trained again
    assert json.loads((b / "config.json").read_text())["process_reward"] == 0.5 and (b / "final_model").exists()
    res = subprocess.run([*bench, "--set", "sft_steps=3", "--sft-from", str(tmp_path / "a"), "--out", str(tmp_path / "c")],
                         cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert res.returncode != 0 and "differs in ['sft_steps']" in res.stderr and "Traceback" not in res.stderr
    res = subprocess.run([*bench, "--set", "sft_two_hop_stop=0.2", "--sft-from", str(tmp_path / "a"),
                          "--out", str(tmp_path / "d")], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert res.returncode != 0 and "differs in ['sft_two_hop_stop']" in res.stderr  # other demonstrations: refused


def test_bench_rl_speed_compares_the_switches_side_by_side(tmp_path):
    "rl-speed at CI size: the four settings from one SFT checkpoint, their throughput and the ratio; bad --steps refused."
    bench = [sys.executable, "scripts/bench_speedrun.py", "rl-speed", "--seeds", "0", "--preset", "ci", "--quiet",
             "--set", "retriever=bm25", "--out", str(tmp_path)]
    res = subprocess.run([*bench, "--steps", "2"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout + res.stderr
    rows = [l for l in res.stdout.splitlines() if l.startswith(("| transformers' decoding", "| + "))]
    assert len(rows) == 4 and all(float(r.split("|")[2]) > 0 for r in rows)  # episodes/s of each
    assert "Episodes per second: **" in res.stdout and (tmp_path / "bench-rl-speed.md").exists()
    res = subprocess.run([*bench, "--steps", "0"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode != 0 and "--steps must be >= 1" in res.stderr


def test_bench_sft_speed_times_both_losses_side_by_side(tmp_path):
    "sft-speed at CI size: SFT and drill rows, each with both timings and their ratio; the arithmetic task refused."
    bench = [sys.executable, "scripts/bench_speedrun.py", "sft-speed", "--seeds", "0", "--preset", "ci", "--quiet",
             "--set", "retriever=bm25", "--out", str(tmp_path)]
    res = subprocess.run([*bench, "--steps", "3"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    rows = {l.split("|")[1].strip(): l.split("|")[2:-1]
            for l in res.stdout.splitlines() if l.startswith(("| SFT", "| drill"))}
    assert set(rows) == {"SFT", "drill"}
    for cells in rows.values():
        share, slow, fast, ratio = cells[1].strip(), float(cells[2]), float(cells[3]), cells[4].strip()
        assert 0 < int(share.rstrip("%")) < 100 and slow > 0 and fast > 0 and ratio.endswith("×")
    assert (tmp_path / "bench-sft-speed.md").exists()
    res = subprocess.run([*bench, "--steps", "2", "--set", "task=arith"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode != 0 and "sft-speed measures the search task" in res.stderr and "Traceback" not in res.stderr


def test_bench_algorithms_refuses_an_unknown_algorithm(tmp_path):
    res = subprocess.run([sys.executable, "scripts/bench_speedrun.py", "algorithms", "--algorithms", "grpo,a2c",
                          "--preset", "ci", "--quiet", "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode != 0 and "unknown algorithm(s) ['a2c']" in res.stderr and "Traceback" not in res.stderr
    assert not any(tmp_path.iterdir())  # refused before any work


def test_bench_arith_reports_each_seed_beside_the_no_calculator_baseline(tmp_path):
    res = subprocess.run([sys.executable, "scripts/bench_speedrun.py", "arith", "--seeds", "0", "--preset", "ci",
                          "--quiet", "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout + res.stderr
    rows = [l for l in res.stdout.splitlines() if l.startswith("| 0 |")]
    assert len(rows) == 1 and rows[0].rstrip().endswith(("| met |", "| not met |"))
    assert 0 <= float(rows[0].split("|")[2]) <= 1 and "Seeds meeting the target: **" in res.stdout
    assert (tmp_path / "arith-s0" / "report.md").read_text().count("no-calculator baseline") == 1
