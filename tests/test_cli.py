"""The two README commands (and the set-up under them) answer bad input with a clear message, never a traceback."""
import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT


def run(cmd, env=None, timeout=600):
    e = dict(os.environ, **(env or {}))
    res = subprocess.run(["bash", *cmd], cwd=ROOT, capture_output=True, text=True, env=e, timeout=timeout)
    assert "Traceback" not in res.stdout + res.stderr, res.stdout + res.stderr
    return res.returncode, res.stdout, res.stderr


@pytest.fixture
def fake_python(tmp_path):
    "An interpreter that claims to be Python 3.8."
    p = tmp_path / "python3.8"
    p.write_text("#!/bin/sh\necho 3.8\n")
    p.chmod(0o755)
    return str(p)


@pytest.mark.parametrize("args, rc, msg", [
    (["nope"], 2, "invalid choice: 'nope' (choose from 'grpo', 'ppo', 'reinforce_pp', 'rloo', 'steppo')"),
    (["--nope"], 2, "unrecognized arguments: --nope"),
    (["grpo", "--scale", "huge"], 2, "invalid choice: 'huge'"),
    (["--seed", "-3"], 2, "--seed must be a non-negative integer"),
    (["--seed", "x"], 2, "invalid int value: 'x'"),
])
def test_speedrun_rejects_bad_input(args, rc, msg):
    code, out, err = run(["speedrun.sh", *args])
    assert code == rc and msg in err, (code, out, err)


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has nvidia-smi")
def test_speedrun_full_scale_needs_gpus():
    code, out, err = run(["speedrun.sh", "grpo", "--scale", "full"])
    assert code == 2 and "needs NVIDIA GPUs" in err and "--dry-run" in err


def test_speedrun_help_lists_the_algorithms():
    code, out, err = run(["speedrun.sh", "--help"])
    assert code == 0 and all(a in out for a in ("grpo", "ppo", "reinforce_pp", "rloo", "steppo"))


@pytest.mark.parametrize("cmd", [["speedrun.sh"], ["scripts/test.sh"], ["scripts/setup.sh", "dev"]])
def test_unsupported_python_is_refused(cmd, fake_python, tmp_path):
    venv = tmp_path / "venv"
    code, out, err = run(cmd, env={"PYTHON": fake_python, "AR1_VENV": str(venv)})
    assert code == 1 and "needs Python 3.10 to 3.13" in err and "Python 3.8" in err, err
    assert not venv.exists(), "nothing may be set up with an unsupported Python"


def test_missing_python_is_named(tmp_path):
    code, out, err = run(["speedrun.sh"], env={"PYTHON": "/no/such/python3", "AR1_VENV": str(tmp_path / "v")})
    assert code == 1 and "'/no/such/python3' was not found" in err


@pytest.mark.parametrize("args, msg", [
    (["--nope"], "unknown option '--nope'"),
    (["--flags", "fast"], "unknown test flag 'fast'"),
    (["--flags"], "--flags needs a value"),
])
def test_test_command_rejects_bad_input(args, msg):
    code, out, err = run(["scripts/test.sh", *args])
    assert code == 2 and msg in err, err


def test_setup_rejects_unknown_profile():
    code, out, err = run(["scripts/setup.sh", "gpu-please"])
    assert code == 2 and "unknown argument 'gpu-please'" in err


@pytest.mark.parametrize("args, msg", [
    (["--task", "chess"], "invalid choice: 'chess' (choose from 'search', 'arith', 'textworld', 'alfworld', 'gsm8k')"),
    (["--task", "gsm8k"], "--task gsm8k runs at full scale"),
    (["--retriever", "google"], "invalid choice: 'google'"),
    (["--preset", "huge"], "invalid choice: 'huge'"),
    (["--threads", "0"], "--threads must be a positive integer"),
    (["--set", "rl_steps"], "--set needs KEY=VALUE"),
    (["--nnodes", "0"], "--nnodes must be a positive integer"),
    (["--nnodes", "2"], "--nnodes above 1 needs --head ADDRESS"),  # the reference trainer runs in one process
    (["--engine", "verl", "--nnodes", "2", "--head", "10.0.0.1"], "--engine verl --nnodes N starts its N Ray nodes"),
])
def test_speedrun_rejects_bad_tiny_options(args, msg):
    code, out, err = run(["speedrun.sh", "--scale", "tiny", *args])
    assert code == 2 and msg in err, (code, out, err)


def test_speedrun_names_an_unknown_config_field(tmp_path):
    code, out, err = run(["speedrun.sh", "--scale", "tiny", "--out", str(tmp_path), "--set", "learning_rate=1"])
    assert code == 1 and "unknown option(s) ['learning_rate']" in err and "rl_lr" in err, err
    code, out, err = run(["speedrun.sh", "--scale", "tiny", "--out", str(tmp_path), "--set", "sft_hops=3"])
    assert code == 1 and "sft_hops must be a non-empty selection of 1 and 2" in err, err
    assert not any(tmp_path.iterdir()), "no run folder for a run that never started"


def test_speedrun_tiny_end_to_end(tmp_path):
    "The CI preset of the real pipeline through the README command: every stage, the report card, reloadable models."
    code, out, err = run(["speedrun.sh", "--preset", "ci", "--out", str(tmp_path), "--set", "search_k=2"], timeout=1800)
    assert code == 0, out + err
    (run_dir,) = tmp_path.iterdir()
    assert run_dir.name == "tiny-search-grpo-s0-ci"
    for stage in ("data", "sft", "rl", "eval"):
        assert f"  {stage} " in out and (run_dir / f".{stage}.done").exists(), (stage, out)
    report = (run_dir / "report.md").read_text()
    for row in ("no-tool baseline", "SFT only", "SFT + grpo", "## Wall time per stage", "## Machine and versions",
                "agent tokens/s", "plots/rl.png"):
        assert row in report, row
    for f in ("plots/sft.png", "plots/rl.png", "episodes.jsonl", "rl/metrics.jsonl", "final_model/config.json"):
        assert (run_dir / f).exists(), f
    assert "NOT BUILT YET" not in out
    # the chat entry point questions the trained agent on a fresh world
    res = subprocess.run([sys.executable, "scripts/chat_tiny.py", str(run_dir), "--examples", "1"], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0 and "never seen in training" in res.stdout and "[agent, turn 1]" in res.stdout, res
    assert res.stdout.count("gold:") == 2 and "Traceback" not in res.stderr
    assert "2 passage(s) per query" in res.stdout  # the run's search_k (config.json), not the chat's default of 1
    # a finished run is kept: the same command starts a new folder beside it
    code, out, err = run(["speedrun.sh", "--preset", "ci", "--out", str(tmp_path), "--set", "rl_steps=1"],
                         timeout=1800)
    assert code == 0, out + err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny-search-grpo-s0-ci", "tiny-search-grpo-s0-ci-2"]


def test_speedrun_textworld_end_to_end(tmp_path):
    "The text-game speedrun's CI preset through the README command, its report card, and a new game played by its agent."
    code, out, err = run(["speedrun.sh", "--task", "textworld", "--preset", "ci", "--out", str(tmp_path)], timeout=1800)
    assert code == 0, out + err
    (run_dir,) = tmp_path.iterdir()
    assert run_dir.name == "tiny-textworld-grpo-s0-ci"
    for stage in ("data", "sft", "rl", "eval"):
        assert f"  {stage} " in out and (run_dir / f".{stage}.done").exists(), (stage, out)
    assert "held-out win" in out and "11a · The text-game speedrun" in out and "NOT BUILT YET" not in out
    report = (run_dir / "report.md").read_text()
    for row in ("## Held-out games", "the dawdling teacher", "the optimal expert", "SFT alone", "SFT + RL",
                "## Win rate by level", "plots/win_by_level.png", "| all |"):
        assert row in report, row
    res = subprocess.run([sys.executable, "scripts/chat_tiny.py", str(run_dir), "--level", "2", "--world", "3"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0 and "never seen in training" in res.stdout, res
    assert "[agent, turn 1]" in res.stdout and "--> " in res.stdout and "Traceback" not in res.stderr
    res = subprocess.run([sys.executable, "scripts/chat_tiny.py", str(run_dir), "--level", "0"], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 2 and "--level must be an integer from 1 to 300" in res.stderr, res


@pytest.mark.parametrize("args, msg", [
    (["--algorithms", "grpo,dqn"], "--algorithms takes a comma list of"),
    (["--seeds", "0,x"], "--seeds takes a comma list of non-negative ints"),
    (["--seeds", "-1"], "--seeds takes a comma list of non-negative ints"),
])
def test_bench_gamerun_rejects_bad_input(args, msg, tmp_path):
    res = subprocess.run([sys.executable, "scripts/bench_gamerun.py", "--out", str(tmp_path), *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and msg in res.stderr and "Traceback" not in res.stderr, res
    assert not any(tmp_path.iterdir())


def test_bench_gamerun_names_a_bad_field(tmp_path):
    res = subprocess.run([sys.executable, "scripts/bench_gamerun.py", "--out", str(tmp_path), "--set", "dawdle=2"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 1 and "dawdle must be in [0, 1)" in res.stderr and "Traceback" not in res.stderr, res


def test_bench_gamerun_starts_rl_from_an_earlier_sft(tmp_path):
    "--sft-from reuses each seed's data and SFT stages, refuses other SFT settings, and names a missing run."
    def bench(out, *args):
        cmd = [sys.executable, "scripts/bench_gamerun.py", "--preset", "ci", "--seeds", "0", "--algorithms", "grpo",
               "--quiet", "--out", str(tmp_path / out), *args]
        return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)

    res = bench("a")
    assert res.returncode == 0 and "seed 0 grpo" in res.stdout, res
    res = bench("b", "--sft-from", str(tmp_path / "a"), "--set", "rl_steps=3")
    assert res.returncode == 0, res
    a, b = (json.loads((tmp_path / d / "bench.json").read_text())[0] for d in ("a", "b"))
    assert (a["rl_steps"], b["rl_steps"]) == (2, 3) and a["sft_win"] == b["sft_win"]
    stages = lambda d: json.loads((tmp_path / d / "grpo-s0" / "stages.json").read_text())
    assert stages("b")["sft"] == stages("a")["sft"]  # the SFT stage was copied, not run again
    res = bench("c", "--sft-from", str(tmp_path / "a"), "--set", "dawdle=0.5")
    assert res.returncode == 1 and "a fork changes RL settings only" in res.stderr, res
    assert "not ['dawdle']" in res.stderr, res
    res = bench("d", "--sft-from", str(tmp_path / "nothing"))
    assert res.returncode == 1 and "no run grpo-s0 to start seed 0 from" in res.stderr, res
    assert not (tmp_path / "c").exists() and not (tmp_path / "d").exists()


def test_chat_tiny_reads_the_tokenizer_as_trained(tmp_path):
    "A model folder holds Qwen2's config beside our tokenizer: the chat must tokenize as the run did, not as Qwen2 would."
    import chat_tiny
    from agent_r1_tutorial.tinylm import tiny_qwen2, train_tokenizer

    text = "<action>go east</action> You can: go east, look. Nelfe Fadan works for Kidu Foundry."
    trained = train_tokenizer([text] * 50, vocab_size=400, trailing_spaces=True)
    trained.save_pretrained(tmp_path)
    tiny_qwen2(trained, hidden_size=16, num_hidden_layers=1).save_pretrained(tmp_path)
    model, tok = chat_tiny.load_model(tmp_path)
    assert tok.encode(text) == trained.encode(text) and "go " in [tok.decode([i]) for i in tok.encode(text)]
    assert model.config.vocab_size == len(trained)


def test_chat_tiny_names_a_folder_without_a_model(tmp_path):
    res = subprocess.run([sys.executable, "scripts/chat_tiny.py", str(tmp_path)], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 2 and "holds no model" in res.stderr and "Traceback" not in res.stderr


def test_the_algorithm_names_agree_across_the_scales():
    "The command line lists its algorithms without importing torch (a fast --help); they must be the library's."
    import importlib.util

    from agent_r1_tutorial.trainer import ALGORITHMS
    from agent_r1_tutorial.verl_launch import ALGORITHMS as VERL_ALGORITHMS, RECIPES
    spec = importlib.util.spec_from_file_location("speedrun_cli", ROOT / "scripts" / "speedrun.py")
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    assert sorted(cli.ALGORITHMS) == sorted(ALGORITHMS) == sorted(VERL_ALGORITHMS) == sorted(RECIPES)


def test_cell_lengths_counts_long_cells_and_refuses_a_bad_limit(tmp_path):
    "scripts/cell_lengths.py: counts the export cells and functions over a limit; a bad limit or folder is refused."
    import json
    nb = {"cells": [{"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
                     "source": "#| export\ndef f():\n" + "    x = 1\n" * 70},
                    {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
                     "source": "#| export\ndef g():\n    return 1\n"}],
          "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (tmp_path / "a.ipynb").write_text(json.dumps(nb))
    script = [sys.executable, str(ROOT / "scripts" / "cell_lengths.py")]
    res = subprocess.run([*script, "--nbs", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "export cells: 2, over 60 lines: 1" in res.stdout and "functions and methods: 2, over 60 lines: 1" in res.stdout
    assert "a.ipynb: f" in res.stdout
    res = subprocess.run([*script, "--limit", "0"], capture_output=True, text=True, timeout=60)
    assert res.returncode != 0 and "--limit must be a positive number of lines" in res.stderr
    res = subprocess.run([*script, "--nbs", str(tmp_path / "none")], capture_output=True, text=True, timeout=60)
    assert res.returncode != 0 and "no notebooks in" in res.stderr


def _cli():
    import importlib.util

    spec = importlib.util.spec_from_file_location("speedrun_cli", ROOT / "scripts" / "speedrun.py")
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    return cli


def test_a_tiny_run_starts_from_a_finished_runs_sft_with_the_same_settings(tmp_path):
    "sft_source: --sft-from, else a finished run in --out whose data and SFT settings match; never a mismatched one."
    import dataclasses
    import json
    import types

    cli = _cli()
    from agent_r1_tutorial.speedrun import SpeedrunConfig

    cfg = SpeedrunConfig.preset("ci")
    args = types.SimpleNamespace(task="search", algorithm="grpo", seed=0, preset="ci", engine="verl", sft_from=None,
                                 out=str(tmp_path))
    new = tmp_path / "tiny-search-grpo-s0-ci-verl"

    def finished(name, c, sft=True):
        d = tmp_path / name
        d.mkdir()
        (d / "config.json").write_text(json.dumps(dataclasses.asdict(c)))
        if sft:
            (d / ".sft.done").write_text("")
        return d

    assert cli.sft_source(args, cfg, new) is None  # nothing to start from: the run trains its own SFT
    finished("tiny-search-ppo-s0-ci", dataclasses.replace(cfg, sft_steps=cfg.sft_steps + 1))  # other SFT settings
    finished("tiny-search-rloo-s0-ci", cfg, sft=False)  # SFT not finished
    assert cli.sft_source(args, cfg, new) is None
    other_rl = finished("tiny-search-rloo-s0-ci-2", dataclasses.replace(cfg, algorithm="rloo", rl_steps=7))
    assert cli.sft_source(args, cfg, new) == other_rl  # RL settings may differ
    main = finished("tiny-search-grpo-s0-ci", cfg)
    assert cli.sft_source(args, dataclasses.replace(cfg, rl_seed=2), new) == main  # this algorithm's run first
    new.mkdir()
    assert cli.sft_source(args, cfg, new) is None  # an existing folder is resumed as it is
    with pytest.raises(SystemExit, match="exists already"):
        cli.sft_source(types.SimpleNamespace(**{**vars(args), "sft_from": str(main)}), cfg, new)


def test_rl_seed_seeds_rl_alone_and_names_its_folder():
    "rl_seed: another RL run from the same data and SFT; bad values are refused by name."
    import types
    from pathlib import Path

    from agent_r1_tutorial.speedrun import RL_FIELDS, SpeedrunConfig, rl_trainer_config

    cfg = SpeedrunConfig(rl_seed=3)
    assert rl_trainer_config(cfg, Path("x")).seed == 3 and rl_trainer_config(SpeedrunConfig(seed=1), Path("x")).seed == 1
    assert "rl_seed" in RL_FIELDS
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="rl_seed must be a non-negative int"):
            SpeedrunConfig(rl_seed=bad)
    args = types.SimpleNamespace(task="search", algorithm="grpo", seed=0, preset="tiny", engine="verl", out="runs",
                                 tiny_set=["rl_seed=2"], retriever="dense", threads=None)
    assert _cli().tiny_run_dir(args).name == "tiny-search-grpo-s0-verl-rl2"
    two = types.SimpleNamespace(**{**vars(args), "nnodes": 2})  # --nnodes 2: verl over two Ray nodes, its own folder
    assert _cli().tiny_run_dir(two).name == "tiny-search-grpo-s0-verl-2nodes-rl2"


def test_bench_engines_refuses_bad_input(tmp_path):
    "scripts/bench_engines.py: a folder without a finished SFT stage, bad seeds or engines are refused with the reason."
    script = [sys.executable, str(ROOT / "scripts" / "bench_engines.py")]
    res = subprocess.run([*script, "--sft-from", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert res.returncode != 0 and "no finished SFT stage there" in res.stderr and "Traceback" not in res.stderr
    res = subprocess.run([*script, "--sft-from", str(tmp_path), "--seeds", "a"], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 2 and "--seeds takes comma-separated integers" in res.stderr
    res = subprocess.run([*script, "--sft-from", str(tmp_path), "--engines", "vllm"], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 2 and "--engines takes a comma list of reference, verl" in res.stderr
    res = subprocess.run([*script, "--sft-from", str(tmp_path), "--eval-every", "0"], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 2 and "--eval-every must be a positive integer" in res.stderr
