"""verl's own trainer on this CPU (chapter 15): `bash speedrun.sh grpo --engine verl` end to end on the CI preset, and
what the run must show: the weights changed, finite metrics, multi-turn episodes of our agent loop with tool calls and a
response mask over the model's tokens only, scores from our reward function, checkpoints that resume, and one update
equal to the reference trainer's.

These tests start Ray and verl's workers: a few minutes on 2 cores, most of it in one module-scoped run.
"""
import json
import math
import os
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import ROOT

HAS_VERL = __import__("importlib").util.find_spec("verl") is not None
pytestmark = pytest.mark.skipif(not HAS_VERL, reason="verl (CPU build) is not installed")


def speedrun(*args, timeout=1200):
    res = subprocess.run(["bash", str(ROOT / "speedrun.sh"), *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                         timeout=timeout)
    return res.returncode, res.stdout, res.stderr


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The CI preset's speedrun with its RL stage on verl (2 GRPO steps of 4 questions x 4 episodes, held-out EM after
    each), started from the data and SFT stages of a reference-trainer run in the same folder, as a user does after the
    main job."""
    out = tmp_path_factory.mktemp("runs")
    code, stdout, stderr = speedrun("grpo", "--preset", "ci", "--set", "rl_steps=1", "--out", out)
    assert code == 0, (stdout + stderr)[-4000:]
    code, stdout, stderr = speedrun("grpo", "--engine", "verl", "--preset", "ci", "--set", "rl_steps=2", "--set",
                                    "rl_eval_every=1", "--out", out)
    assert code == 0, (stdout + stderr)[-4000:]
    run_dir = out / "tiny-search-grpo-s0-ci-verl"
    return {"dir": run_dir, "verl": run_dir / "verl", "stdout": stdout, "source": out / "tiny-search-grpo-s0-ci"}


def test_the_verl_run_starts_from_the_finished_runs_sft_model(run):
    "The verl run reuses the reference run's SFT model (same settings) instead of training its own."
    assert f"data and SFT stages from {run['source']}" in run["stdout"]
    weights = lambda d: (d / "sft_model" / "model.safetensors").read_bytes()
    assert weights(run["dir"]) == weights(run["source"])  # the same SFT model, byte for byte
    assert json.loads((run["dir"] / "stages.json").read_text())["sft"] == \
        json.loads((run["source"] / "stages.json").read_text())["sft"]  # its SFT time is the source's: not retrained
    report = (run["dir"] / "report.md").read_text()  # and the report card says whose times those are
    assert f"copied from run `{run['source'].name}`: their times are that run's" in report


def test_held_out_em_is_measured_on_verls_checkpoints_as_on_the_reference_trainers(run):
    "evaluate_checkpoints wrote rl/eval.jsonl every rl_eval_every steps, and the report card draws it beside SFT's."
    from agent_r1_tutorial.speedrun import em_timeline

    recs = [json.loads(l) for l in (run["dir"] / "rl" / "eval.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs] == [1]  # step 2 is the eval stage's, as for the reference trainer
    assert {"em/1-hop", "em/2-hop", "after_2_searches/2-hop"} <= recs[0].keys()
    ckpt = run["verl"] / "checkpoints" / "global_step_1"
    assert abs(recs[0]["time"] - ckpt.stat().st_mtime) < 1  # on the run's time axis, not the evaluation's
    assert [p["step"] for p in em_timeline(run["dir"]) if p["stage"] == "rl"] == [1, 2]
    report = (run["dir"] / "report.md").read_text()
    assert "| SFT + grpo (verl's trainer) |" in report and "| RL | 1 |" in report


def test_the_same_questions_went_through_both_rollouts(run):
    "both_rollouts: verl's validation and evaluate_agent on the same questions, before and after training."
    import pandas as pd

    b = json.loads((run["verl"] / "both_rollouts.json").read_text())
    assert b["questions"] == len(pd.read_parquet(run["verl"] / "data" / "validation.parquet"))
    assert b["verl_steps"] == [0, 2] and set(b["ours"]) == set(b["verl"]) == {"sft", "final"}
    assert all(0.0 <= v <= 1.0 for d in (b["ours"], b["verl"]) for v in d.values())
    assert "through both rollouts" in (run["dir"] / "report.md").read_text()


def test_the_cli_ran_every_stage_on_verl(run):
    out = run["stdout"]
    assert "rl         done" in out and "2 verl steps" in out and "15 · verl on a CPU" in out
    assert "actor_rollout_ref.rollout.name=ar1_hf" in out  # the CPU overrides are printed, with their reasons
    assert all((run["dir"] / f".{s}.done").exists() for s in ("data", "sft", "rl", "eval"))
    report = (run["dir"] / "report.md").read_text()
    assert "SFT + grpo" in report and "## verl's trainer on this CPU" in report


def test_metrics_are_finite_and_the_weights_changed(run):
    from transformers import AutoModelForCausalLM

    from agent_r1_tutorial.verl_cpu import read_verl_metrics

    steps = [m for m in read_verl_metrics(run["verl"]) if m["step"] >= 1]
    assert [m["step"] for m in steps] == [1, 2]
    for m in steps:
        for k in ("actor/pg_loss", "actor/grad_norm", "critic/score/mean", "timing_s/gen", "timing_s/update_actor"):
            assert math.isfinite(m[k]), (m["step"], k, m[k])
    assert any(m["actor/grad_norm"] > 0 for m in steps)
    before = AutoModelForCausalLM.from_pretrained(run["dir"] / "sft_model").state_dict()
    after = AutoModelForCausalLM.from_pretrained(run["dir"] / "final_model").state_dict()
    moved = max(float((after[k] - before[k]).abs().max()) for k in before)
    decay_only = 2 * 2e-5 * 0.01 * max(float(w.abs().max()) for w in before.values())  # AdamW's decay, 2 steps
    assert moved > 10 * decay_only, moved  # the gradient moved them, not the weight decay alone


def test_our_agent_loop_played_multi_turn_episodes_with_a_mask_over_model_tokens(run):
    from transformers import AutoTokenizer

    from agent_r1_tutorial.verl_cpu import mask_segments, read_episodes

    tok = AutoTokenizer.from_pretrained(run["dir"] / "sft_model")
    for step in (1, 2):
        eps = read_episodes(run["verl"], step)
        assert len(eps) == 16 and len({(e["uid"], e["session_id"]) for e in eps}) == 16
    eps = read_episodes(run["verl"], None, None)
    assert any(e["num_steps"] >= 2 and e["num_tool_calls"] >= 1 for e in eps)  # multi-turn, with searches
    seen_tool_reply = False
    for e in eps:
        for o in e["outputs"]:
            assert len(o["response_ids"]) == len(o["response_mask"]) == len(o["response_logprobs"])
            assert o["response_mask"][0] == 1  # a response starts with what the model sampled
            for (m, text), lp in zip(mask_segments(o, tok), _runs(o)):
                if m == 0:  # what the environment said: a tool reply in its chat markup, no log-probs
                    assert text.lstrip().startswith("<|im_start|>user") or text.startswith("<|im_end|>"), text
                    assert "<tool_response>" in text and all(x == 0.0 for x in lp), text
                    seen_tool_reply = True
                else:  # what the model sampled (whatever it wrote, tags included), with its sampling log-probs
                    assert all(x <= 0 for x in lp) and any(x < 0 for x in lp)
    assert seen_tool_reply


def _runs(o):
    "The response log-probs cut where the mask changes (as mask_segments cuts the text)."
    out, i, mask, lps = [], 0, o["response_mask"], o["response_logprobs"]
    while i < len(mask):
        j = i
        while j < len(mask) and mask[j] == mask[i]:
            j += 1
        out.append(lps[i:j])
        i = j
    return out


def _opening(row, tok):
    "The ids an episode on a verl data row starts from, with `tok` (system prompt, tools, question, assistant header)."
    from agent_r1_tutorial.masks import initial_prompt_ids
    from agent_r1_tutorial.verl_bridge import env_from_row

    env, reset = env_from_row(row, tok)
    obs = env.reset(**reset)
    return initial_prompt_ids(tok, obs.messages, obs.tools)


def test_verl_fed_the_policy_the_ids_it_was_trained_on(run):
    "verl loads its tokenizer with AutoTokenizer from the model folder: its prompts must be the SFT tokenizer's ids."
    import pandas as pd
    from transformers import PreTrainedTokenizerFast

    from agent_r1_tutorial.verl_cpu import read_episodes

    tok = PreTrainedTokenizerFast.from_pretrained(run["dir"] / "tokenizer")  # the tokenizer SFT trained with
    rows = pd.read_parquet(run["verl"] / "data" / "train.parquet")
    eps = read_episodes(run["verl"], 1)
    for e in eps:
        row = rows.iloc[e["index"]].to_dict()
        assert row["extra_info"]["index"] == e["index"] and row["reward_model"]["ground_truth"] == e["ground_truth"]
        assert e["outputs"][0]["prompt_ids"] == _opening(row, tok), row["extra_info"]["question"]


def test_every_loader_reads_the_ids_the_policy_was_trained_on(run):
    "AutoTokenizer and verl's hf_tokenizer, with and without trust_remote_code, on every folder the run wrote."
    import pandas as pd
    from transformers import AutoTokenizer, PreTrainedTokenizerFast
    from verl.utils import hf_tokenizer

    from agent_r1_tutorial.verl_cpu import latest_verl_checkpoint

    ref = PreTrainedTokenizerFast.from_pretrained(run["dir"] / "tokenizer")
    rows = pd.read_parquet(run["verl"] / "data" / "train.parquet").head(8)
    texts = [ref.decode(_opening(r, ref)) for r in rows.to_dict("records")]
    for r in rows.to_dict("records"):  # a search call and an answer with a name, and a number
        name = r["reward_model"]["ground_truth"]
        texts.append(f'<tool_call>\n{{"name": "world_search", "arguments": {{"query": "{name}"}}}}\n</tool_call>'
                     f" <answer>{name}</answer> 2047")
    want = ref(texts, add_special_tokens=False).input_ids
    verl_ckpt = latest_verl_checkpoint(run["verl"] / "checkpoints") / "actor" / "huggingface"
    for folder in (run["dir"] / "sft_model", run["dir"] / "final_model", run["dir"] / "tokenizer", verl_ckpt):
        loaders = {"AutoTokenizer": lambda trc: AutoTokenizer.from_pretrained(folder, trust_remote_code=trc),
                   "verl hf_tokenizer": lambda trc: hf_tokenizer(str(folder), trust_remote_code=trc)}
        # verl's own checkpoint keeps the auto_map entry but not the module it names (verl saves the tokenizer itself)
        for trc in (False,) if folder == verl_ckpt else (False, True):
            for name, load in loaders.items():
                got = load(trc)(texts, add_special_tokens=False).input_ids
                assert got == want, (folder.name, name, trc)


def test_verl_scored_each_episode_with_our_reward_function(run):
    from transformers import AutoTokenizer

    from agent_r1_tutorial.rewards import compute_score
    from agent_r1_tutorial.verl_cpu import read_episodes

    tok = AutoTokenizer.from_pretrained(run["dir"] / "sft_model")
    for step in (1, 2):
        verl_scores = {json.loads(l)["uid"]: json.loads(l)["score"]
                       for l in (run["verl"] / "rollouts" / f"{step}.jsonl").read_text().splitlines()}
        eps = read_episodes(run["verl"], step)
        assert len(verl_scores) == len(eps)
        for e in eps:
            text = tok.decode(e["outputs"][-1]["response_ids"], skip_special_tokens=True)  # as verl's reward loop
            ours = compute_score("tiny_qa", text, e["ground_truth"], {"fmt": "hermes", "metric": "em"})["score"]
            assert verl_scores[f"{e['uid']}_{e['session_id']}_0"] == pytest.approx(ours), text


def test_one_update_equals_the_reference_trainers(run):
    from agent_r1_tutorial.speedrun import SpeedrunConfig
    from agent_r1_tutorial.verl_cpu import cpu_run_config, reference_replay

    cfg = SpeedrunConfig.preset("ci", rl_steps=2)
    verl_run = cpu_run_config(cfg, run["dir"] / "sft_model", run["verl"], max_prompt_length=256)
    r = reference_replay(verl_run, run["verl"], step=1)
    assert r["rows"] == 16 and r["groups"] == 4
    for k in ("actor/pg_loss", "actor/grad_norm"):  # float32 on both sides: only the order of operations differs
        assert r["reference"][k] == pytest.approx(r["verl"][k], rel=1e-5, abs=1e-6), k
    assert r["max_weight_diff"] < 0.1 * cfg.rl_lr  # under a tenth of one Adam step (where |g| is as small as eps)


def test_a_checkpoint_was_written_and_the_run_resumes_from_it(run, capsys):
    from agent_r1_tutorial.speedrun import SpeedrunConfig, build_suite
    from agent_r1_tutorial.verl_cpu import latest_verl_checkpoint, read_verl_metrics, verl_rl_stage

    ckpt = latest_verl_checkpoint(run["verl"] / "checkpoints")
    assert ckpt.name == "global_step_2"
    assert next((ckpt / "actor" / "huggingface").glob("*.safetensors"), None) is not None  # hf_model saved
    # float32 weights, labelled so: from_pretrained on a checkpoint loads the model that was trained, not bfloat16
    assert json.loads((ckpt / "actor" / "huggingface" / "config.json").read_text())["dtype"] == "float32"
    assert (ckpt / "data.pt").exists()  # the data loader's position
    cfg = SpeedrunConfig.preset("ci", rl_steps=2)
    res = verl_rl_stage(cfg, run["dir"], build_suite(cfg), steps=3)
    assert "resuming from global_step_2" in capsys.readouterr().out
    assert latest_verl_checkpoint(run["verl"] / "checkpoints").name == "global_step_3"
    second = {json.loads(l)["step"]: json.loads(l)["data"] for l in (run["verl"] / "metrics-2.jsonl").read_text().splitlines()}
    trained = [step for step, m in second.items() if "actor/pg_loss" in m]
    assert trained == [3], second.keys()  # it trained step 3 only (it validated first, logged at step 2)
    assert [m["step"] for m in read_verl_metrics(run["verl"]) if m["step"] >= 1] == [1, 2, 3]
    assert (run["verl"] / "train-1.log").exists() and (run["verl"] / "train-2.log").exists()  # no log lost


def test_bad_input_is_refused_with_a_reason(tmp_path):
    from agent_r1_tutorial.speedrun import SpeedrunConfig
    from agent_r1_tutorial.verl_cpu import cpu_run_config, launch_verl, verl_rl_stage

    code, _, err = speedrun("grpo", "--engine", "verl", "--task", "arith", "--out", tmp_path)
    assert code == 2 and "--engine verl runs the search task" in err
    code, _, err = speedrun("grpo", "--engine", "verl", "--dry-run", "--out", tmp_path)
    assert code == 2 and "drop one of them" in err
    with pytest.raises(FileNotFoundError, match="run the data and sft stages first"):
        verl_rl_stage(SpeedrunConfig.preset("ci"), tmp_path, suite=None)
    with pytest.raises(ValueError, match="runs the search task"):
        verl_rl_stage(SpeedrunConfig.preset("ci", task="arith"), tmp_path, suite=None)
    import dataclasses

    bad = cpu_run_config(SpeedrunConfig.preset("ci"), tmp_path, tmp_path / "verl", 128)
    bad = dataclasses.replace(bad, extra_overrides=bad.extra_overrides + ("algorithm.no_such_key=1",))
    with pytest.raises(RuntimeError, match="exited with status"):
        launch_verl(bad, tmp_path / "verl", timeout=300)
    assert "no_such_key" in (tmp_path / "verl" / "train-1.log").read_text()  # the log keeps verl's own message


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["ppo", "reinforce_pp", "rloo", "steppo"])
def test_every_other_algorithm_runs_a_step(algorithm, run, tmp_path):
    import shutil

    from agent_r1_tutorial.speedrun import SpeedrunConfig, build_suite
    from agent_r1_tutorial.verl_cpu import verl_rl_stage

    shutil.copytree(run["dir"] / "sft_model", tmp_path / "sft_model")
    cfg = SpeedrunConfig.preset("ci", algorithm=algorithm, rl_steps=1)
    res = verl_rl_stage(cfg, tmp_path, build_suite(cfg), verbose=False)
    m = next(x for x in res["metrics"] if x["step"] == 1)
    assert math.isfinite(m["actor/pg_loss"]) and math.isfinite(m["actor/grad_norm"])
    if algorithm in ("ppo", "steppo"):  # verl's critic, loaded with the patched loader, trained
        assert math.isfinite(m["critic/vf_loss"])


def _questions(rollouts: Path, step: int) -> list[str]:
    "The prompts verl sampled at a step (its rollout dump), sorted: which questions the step trained on."
    return sorted(json.loads(l)["input"] for l in (rollouts / f"{step}.jsonl").read_text().splitlines())


@pytest.fixture(scope="module")
def two_nodes(run):
    "`bash speedrun.sh grpo --engine verl --nnodes 2`: the CI preset's run over a head and a worker node on this machine."
    out = run["source"].parent
    code, stdout, stderr = speedrun("grpo", "--engine", "verl", "--preset", "ci", "--nnodes", "2", "--set",
                                    "rl_steps=3", "--out", out, timeout=1800)
    assert code == 0, (stdout + stderr)[-4000:]
    run_dir = out / "tiny-search-grpo-s0-ci-verl-2nodes"
    return {"dir": run_dir, "verl": run_dir / "verl", "stdout": stdout}


@pytest.mark.slow
def test_verl_trains_across_two_ray_nodes_through_the_multi_node_launch(two_nodes):
    "The head and a worker, each its own raylet with its own resources; verl placed a training process on each."
    from agent_r1_tutorial.verl_cpu import read_verl_metrics

    assert "2 Ray nodes on this machine: head" in two_nodes["stdout"]
    launch = (two_nodes["verl"] / "launch-1.sh").read_text()  # chapter 14's three commands, as a GPU cluster runs them
    assert "ray start --head" in launch and "ray start --address=127.0.0.1:" in launch and "ray job submit" in launch
    assert "trainer.nnodes=2" in launch and "RAY_AUTH_MODE=token" in launch
    placement = json.loads((two_nodes["verl"] / "placement-1.json").read_text())
    nodes = {n["node_id"]: n for n in placement["nodes"]}
    assert len(nodes) == 2 and all(n["state"] == "ALIVE" and n["resources"]["GPU"] == 1 for n in nodes.values())
    where = lambda cls: sorted(a["node"] for a in placement["actors"] if a["class"] == cls)
    assert where("WorkerDict") == ["head", "worker 1"]  # one training process (FSDP rank) per node
    assert where("HFRolloutServer") == ["head", "worker 1"]  # each rollout server beside its replica's process
    steps = [m for m in read_verl_metrics(two_nodes["verl"]) if m["step"] >= 1]
    assert [m["step"] for m in steps] == [1, 2, 3]
    assert all(math.isfinite(m["actor/pg_loss"]) and math.isfinite(m["actor/grad_norm"]) for m in steps)
    assert (two_nodes["dir"] / "final_model" / "config.json").exists() and (two_nodes["dir"] / "report.md").exists()


@pytest.mark.slow
def test_a_lost_node_stops_the_run_with_its_name_and_the_restart_resumes(two_nodes, tmp_path):
    "The worker's raylet killed during step 2: an error naming the node, no hang, logs and checkpoint kept; resumed."
    import shutil
    import threading
    import time

    from agent_r1_tutorial.speedrun import SpeedrunConfig, build_suite
    from agent_r1_tutorial.verl_cpu import LocalRayCluster, latest_verl_checkpoint, read_verl_metrics, verl_rl_stage

    shutil.copytree(two_nodes["dir"] / "sft_model", tmp_path / "sft_model")
    cfg = SpeedrunConfig.preset("ci", rl_steps=3)
    suite, verl = build_suite(cfg), tmp_path / "verl"
    killed = {}
    with LocalRayCluster(2) as cluster:
        def kill_in_step_2():
            while latest_verl_checkpoint(verl / "checkpoints") is None:
                time.sleep(1)
            time.sleep(3)
            killed["pid"], killed["at"] = cluster.kill_node(1), time.time()

        threading.Thread(target=kill_in_step_2, daemon=True).start()
        with pytest.raises(RuntimeError) as err:
            verl_rl_stage(cfg, tmp_path, suite, cluster=cluster, verbose=False)
        msg, waited = str(err.value), time.time() - killed["at"]
        assert "(worker 1, " in msg and "was lost during the run" in msg and "WorkerDict" in msg, msg
        assert "the last checkpoint is global_step_1" in msg and "train-1.log" in msg
        assert waited < 150, waited  # the guard's minute, then the job is stopped: no hang
        assert (verl / "checkpoints" / "global_step_1").is_dir() and (verl / "train-1.log").stat().st_size > 0

        cluster.add_node()  # the worker comes back as a new node
        res = verl_rl_stage(cfg, tmp_path, suite, cluster=cluster, verbose=True)
    assert latest_verl_checkpoint(verl / "checkpoints").name == "global_step_3"
    assert [m["step"] for m in read_verl_metrics(verl) if m["step"] >= 1] == [1, 2, 3]
    second = [json.loads(l) for l in (verl / "metrics-2.jsonl").read_text().splitlines()]
    # the restart validated global_step_1's weights (logged at step 1), then trained steps 2 and 3 only
    assert [m["step"] for m in second if "actor/pg_loss" in m["data"]] == [2, 3]
    # the data loader's position came back with the checkpoint: steps 2 and 3 trained on the uninterrupted run's
    # questions (their samples differ: the CPU rollout's draws depend on how requests happen to be batched)
    for step in (2, 3):
        assert _questions(verl / "rollouts", step) == _questions(two_nodes["verl"] / "rollouts", step)
    assert math.isfinite(res["metrics"][-1]["actor/pg_loss"])
