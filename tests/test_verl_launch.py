"""verl's configuration, launch and dry run (chapter 14): every algorithm composed and validated with verl's own code,
the launch commands, the preflight checks, the GPU pins and the full-scale dry run.

Tests that need verl are skipped without it; the rest need only the library and the scripts.
"""
import json
import re
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
from conftest import ROOT

from agent_r1_tutorial import verl_bridge as vb
from agent_r1_tutorial import verl_data as vd
from agent_r1_tutorial import verl_launch as vl

HAS_VERL = __import__("importlib").util.find_spec("verl") is not None
needs_verl = pytest.mark.skipif(not HAS_VERL, reason="verl (CPU build) is not installed")


def _run(cmd, env=None, timeout=600, cwd=ROOT):
    res = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})
    return res.returncode, res.stdout, res.stderr


# ---------------------------------------------------------------- configuration


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory):
    from agent_r1_tutorial.tinylm import build_tiny_lm

    d = tmp_path_factory.mktemp("tiny-model")
    tok, model = build_tiny_lm()
    tok.save_pretrained(d)
    model.save_pretrained(d)
    return str(d)


@needs_verl
@pytest.mark.parametrize("algo", vl.ALGORITHMS)
def test_every_algorithm_composes_and_validates(algo, stand_in):
    run = vl.VerlRunConfig(algo)
    cfg = vl.compose_verl_config(vl.verl_overrides(run))
    check = vl.validate_verl_config(cfg, model_path=stand_in)
    r = vl.RECIPES[algo]
    assert cfg.algorithm.adv_estimator == f"ar1_{r.adv_estimator}" == check["adv_estimator"]
    assert cfg.actor_rollout_ref.actor.policy_loss.loss_mode == "ar1_vanilla"
    assert check["use_critic"] is r.critic and check["use_reference_policy"] is True  # KL in the loss or the reward
    assert cfg.algorithm.use_kl_in_reward is (r.kl == "reward")
    assert cfg.actor_rollout_ref.rollout.n == r.n and cfg.actor_rollout_ref.rollout.multi_turn.enable
    assert cfg.actor_rollout_ref.model.override_config.attn_implementation == "sdpa"
    assert cfg.actor_rollout_ref.model.use_remove_padding is False
    assert cfg.reward.custom_reward_function.path == "pkg://agent_r1_tutorial.rewards"
    assert cfg.ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES == vb.MODULE_NAME
    assert "actor_rollout_ref.model" in check["sections"] and "actor_rollout_ref.actor" in check["sections"]
    assert ("critic" in check["sections"]) is r.critic


@needs_verl
@pytest.mark.parametrize("algo", ["grpo", "ppo"])  # KL in the loss, KL in the reward
def test_a_zero_kl_coefficient_builds_no_reference_model_and_bypass_skips_the_recompute(algo, stand_in):
    "kl_coef=0 turns the KL term off, so verl builds no reference model; bypass_mode uses the rollout's log-probs."
    cfg = vl.compose_verl_config(vl.verl_overrides(vl.VerlRunConfig(algo, kl_coef=0.0, bypass_mode=True)))
    check = vl.validate_verl_config(cfg, model_path=stand_in)
    assert check["use_reference_policy"] is False
    assert cfg.actor_rollout_ref.actor.use_kl_loss is False and cfg.algorithm.use_kl_in_reward is False
    assert cfg.algorithm.rollout_correction.bypass_mode is True
    default = vl.compose_verl_config(vl.verl_overrides(vl.VerlRunConfig(algo)))
    assert default.algorithm.rollout_correction.bypass_mode is False  # the GPU run recomputes (vLLM's log-probs differ)


@needs_verl
def test_validation_without_the_model_says_what_it_skipped():
    check = vl.validate_verl_config(vl.compose_verl_config(vl.verl_overrides(vl.VerlRunConfig("ppo"))))
    assert check["model_checked_with"] is None
    assert any("actor_rollout_ref.model" in s for s in check["skipped"])
    assert any(s.startswith("critic") for s in check["skipped"])


@pytest.mark.parametrize("kw, msg", [
    (dict(algorithm="dpo"), "choose one of ['ppo', 'grpo', 'reinforce_pp', 'rloo', 'steppo']"),
    (dict(algorithm="rloo", n=1), "needs n >= 2"),
    (dict(n_gpus_per_node=0), "n_gpus_per_node=0: must be a positive int"),
    (dict(train_batch_size=True), "must be a positive int"),
    (dict(ppo_mini_batch_size=256), "cannot exceed train_batch_size"),
    (dict(rollout_tp=3), "must divide the number of GPUs"),
    (dict(actor_lr=0.0), "must be in (0, 1)"),
    (dict(gpu_memory_utilization=1.5), "must be in (0, 1)"),
    (dict(attn_implementation="flash3"), "choose 'sdpa'"),
    (dict(policy_loss="ppo"), "choose one of ['gspo', 'vanilla']"),
    (dict(loss_agg_mode="mean"), "choose one of"),
    (dict(model_path="a model,with comma"), "without spaces"),
    (dict(extra_overrides=("novalue",)), "'key=value' strings"),
])
def test_bad_knobs_are_refused_with_the_reason(kw, msg):
    with pytest.raises(ValueError, match=__import__("re").escape(msg)):
        vl.VerlRunConfig(**kw)


def test_overrides_are_generated_from_one_place():
    for algo in vl.ALGORITHMS:
        ov = vl.verl_overrides(vl.VerlRunConfig(algo))
        keys = [o.split("=", 1)[0] for o in ov]
        assert len(keys) == len(set(keys)), f"{algo}: a key is set twice"
    fa = vl.verl_overrides(vl.VerlRunConfig("ppo", attn_implementation="flash_attention_2"))
    assert not any("attn_implementation" in o or "use_remove_padding" in o for o in fa)
    last = vl.verl_overrides(vl.VerlRunConfig("grpo", extra_overrides=("trainer.total_epochs=3",)))
    assert last[-1] == "trainer.total_epochs=3"
    assert "trainer.total_training_steps=7" in vl.verl_overrides(vl.VerlRunConfig(total_training_steps=7))


@needs_verl
def test_verl_refuses_what_verl_would_refuse(stand_in):
    small = vl.VerlRunConfig("grpo", train_batch_size=3, ppo_mini_batch_size=3, n=2)
    with pytest.raises(ValueError, match="must be divisible"):
        vl.validate_verl_config(vl.compose_verl_config(vl.verl_overrides(small)), stand_in)
    with pytest.raises(ValueError, match="not registered with verl"):
        ov = vl.verl_overrides(vl.VerlRunConfig()) + ["actor_rollout_ref.actor.policy_loss.loss_mode=ar1_nope"]
        vl.validate_verl_config(vl.compose_verl_config(ov), stand_in)
    with pytest.raises(ValueError, match="needs a critic"):
        ov = vl.verl_overrides(vl.VerlRunConfig("steppo")) + ["critic.enable=False"]
        vl.validate_verl_config(vl.compose_verl_config(ov), stand_in)
    with pytest.raises(ValueError, match="rejected the overrides"):
        vl.compose_verl_config(["trainer.no_such_key=1"])


def test_launch_commands():
    one = vl.launch_commands(vl.VerlRunConfig("rloo"))
    assert list(one) == ["train"]
    assert one["train"].startswith(f"{vb.EXTERNAL_MODULES_ENV}={vb.MODULE_NAME} .venv-gpu/bin/python -m verl.trainer.main_ppo")
    assert "algorithm.adv_estimator=ar1_rloo" in one["train"]
    many = vl.launch_commands(vl.VerlRunConfig("ppo", nnodes=2, n_gpus_per_node=8), head_address="10.1.2.3")
    assert list(many) == ["head", "worker", "submit"]
    assert "ray start --head" in many["head"] and "--num-gpus=8" in many["head"]
    assert "--address=10.1.2.3:6379" in many["worker"]
    assert "ray job submit --address=http://10.1.2.3:8265" in many["submit"] and "trainer.nnodes=2" in many["submit"]
    assert vb.MODULE_NAME in many["submit"].split(" -- ", 1)[1]  # the job's entrypoint carries the registration
    # a search run: every node starts its retrieval service before it joins, and a single node before it trains
    served = vl.launch_commands(vl.VerlRunConfig("grpo", nnodes=2), head_address="10.1.2.3", retrieval_index="/d/idx")
    for step in ("head", "worker"):
        assert served[step].startswith(".venv-gpu/bin/python scripts/retrieval_server.py --index-dir default=/d/idx")
        assert "--port 8765 --background ./retrieval-\"$(hostname)\".log && " in served[step]
    assert "retrieval_server" not in served["submit"]
    assert list(vl.launch_commands(vl.VerlRunConfig("grpo"), retrieval_index="/d/idx")) == ["retrieval", "train"]


# ---------------------------------------------------------------- preflight


import preflight  # noqa: E402  (scripts/, on the path through conftest)

SMI = ("0, NVIDIA H100 80GB HBM3, 81559, 570.86.15\n1, NVIDIA H100 80GB HBM3, 81559, 570.86.15\n"
       "2, NVIDIA H100 80GB HBM3, 81559, 570.86.15\n3, NVIDIA H100 80GB HBM3, 81559, 570.86.15\n")
BANNER = "| NVIDIA-SMI 570.86.15   Driver Version: 570.86.15   CUDA Version: 12.8     |"


def test_parse_nvidia_smi():
    gpus = preflight.parse_gpus(SMI)
    assert len(gpus) == 4 and gpus[0].name == "NVIDIA H100 80GB HBM3" and gpus[0].memory_mib == 81559
    assert preflight.parse_cuda_version(BANNER) == "12.8"
    assert preflight.parse_gpus("0, Weird, GPU, Name, 40960, 535.104.05")[0].name == "Weird, GPU, Name"
    with pytest.raises(preflight.PreflightError, match="expected 4"):
        preflight.parse_gpus("0, only two")
    with pytest.raises(preflight.PreflightError, match="not index, name, memory"):
        preflight.parse_gpus("x, A100, lots, 535")


@pytest.mark.parametrize("driver, pins", [("590.10", "cu13"), ("580.65.06", "cu13"), ("570.86.15", "cu12"),
                                          ("535.104.05", "cu12"), ("525.60.13", "cu12")])
def test_pin_set_follows_the_driver(driver, pins):
    assert preflight.pin_set(driver) == pins


def test_old_driver_is_refused():
    with pytest.raises(preflight.PreflightError, match="too old"):
        preflight.pin_set("470.82.01")
    with pytest.raises(preflight.PreflightError, match="cannot read"):
        preflight.pin_set("n/a")


def test_checks_with_faked_outputs(tmp_path, monkeypatch):
    gpus = preflight.parse_gpus(SMI)
    ok = preflight.run_checks(4, 40, tmp_path, 0.001, sys.executable, smi=(gpus, "12.8"))
    assert ok.ok, ok.errors
    assert ok.info["pin_set"] == "cu12" and ok.info["cuda_version"] == "12.8"
    few = preflight.run_checks(8, 40, tmp_path, 0.001, sys.executable, smi=(gpus, "12.8"))
    assert not few.ok and "4 GPU(s) found, the run asks for 8" in few.errors[0]
    small = preflight.run_checks(4, 100, tmp_path, 0.001, sys.executable, smi=(gpus, "12.8"))
    assert any("below the 100 GiB" in e for e in small.errors)
    old = preflight.run_checks(4, 40, tmp_path, 0.001, sys.executable,
                               smi=(preflight.parse_gpus(SMI.replace("570.86.15", "450.80.02")), "11.0"))
    assert any("too old" in e for e in old.errors)
    warn = preflight.run_checks(4, 40, tmp_path, 0.001, sys.executable,
                                smi=(preflight.parse_gpus(SMI.replace("570.86.15", "550.54.15")), "12.4"))
    assert warn.ok and any("older than R570" in w for w in warn.warnings)
    monkeypatch.setattr(preflight.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10, 10, 5 * 2**30))
    disk = preflight.run_checks(4, 40, tmp_path / "not" / "yet", 150, sys.executable, smi=(gpus, "12.8"))
    assert any("5 GiB free" in e and "needs about 150 GiB" in e for e in disk.errors)


def test_python_check(tmp_path):
    r = preflight.Report()
    preflight.check_python((3, 13, 0), r, "py")
    assert not r.ok and "resolved for Python 3.11 or 3.12" in r.errors[0]
    r = preflight.Report()
    preflight.check_python((3, 12, 1), r)
    assert r.ok
    fake = tmp_path / "python3.9"
    fake.write_text("#!/bin/sh\necho 3 9 1\n")
    fake.chmod(0o755)
    assert preflight.python_version(str(fake)) == (3, 9, 1)
    with pytest.raises(preflight.PreflightError, match="was not found"):
        preflight.python_version("/no/such/python")


@pytest.fixture
def fake_smi(tmp_path):
    "A fake nvidia-smi on PATH that answers the GPU query and the banner like a 4 x H100 box with driver 580."
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    smi = bin_ / "nvidia-smi"
    smi.write_text("#!/bin/sh\nif [ -n \"$1\" ]; then printf '%s' '" + SMI.replace("570.86.15", "580.65.06") +
                   "'; else echo '" + BANNER.replace("12.8", "13.0") + "'; fi\n")
    smi.chmod(0o755)
    return {"PATH": f"{bin_}:{os.environ['PATH']}"}


def test_preflight_host_checks_are_sized_for_task_and_algorithm(tmp_path, monkeypatch):
    "RAM, /dev/shm, compilers and Python.h, and disk for the checkpoints under --out, from faked measurements."
    monkeypatch.setattr(preflight.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10, 10, 500 * 2**30))
    (tmp_path / "Python.h").write_text("")
    fine = {"ram_gib": 256, "shm_gib": 32, "which": lambda t: f"/usr/bin/{t}", "include": tmp_path}
    needs = {}
    for task, critic, params in (("search", False, 1.5), ("search", True, 1.5), ("alfworld", True, 4.0)):
        r = preflight.Report()
        preflight.check_host(r, task, critic, tmp_path / "runs", params, sys.executable, fine)
        assert r.ok, r.errors
        needs[task, critic] = r.info["out_disk"]["need_gib"]
    assert needs == {("search", False): 42, ("search", True): 84, ("alfworld", True): 224}  # PPO's critic doubles it
    poor = {"ram_gib": 31.4, "shm_gib": 0.0625, "which": lambda t: None if t in ("gcc", "cmake") else f"/usr/bin/{t}",
            "include": tmp_path / "nowhere"}
    monkeypatch.setattr(preflight.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10, 10, 100 * 2**30))
    r = preflight.Report()
    preflight.check_host(r, "alfworld", True, tmp_path / "runs", 4.0, "/usr/bin/python3.12", poor)
    text = "\n".join(r.errors)
    assert "this machine has 31 GiB of RAM; a alfworld run needs about 96 GiB" in text
    assert "/dev/shm holds 0.06 GiB" in text and "--shm-size" in text
    assert "missing build tools: gcc, cmake" in text and "jericho" in text
    assert f"no Python.h in {tmp_path / 'nowhere'}" in text and "python3.12-dev" in text
    assert "100 GiB free at" in text and "about 224 GiB there (actor and critic checkpoints" in text
    assert len(r.errors) == 5
    r = preflight.Report()  # the search task needs no cmake
    preflight.check_host(r, "search", False, tmp_path, 1.5, sys.executable, {**fine, "which": poor["which"]})
    assert r.errors == ["missing build tools: gcc (Triton compiles its helpers with gcc): apt-get install "
                        "build-essential cmake"]


def test_preflight_command_line(fake_smi, tmp_path):
    code, out, err = _run([sys.executable, "scripts/preflight.py", "--pin-set"], env=fake_smi)
    assert code == 0 and out.strip() == "cu13"
    code, out, err = _run([sys.executable, "scripts/preflight.py", "--disk-path", str(tmp_path), "--min-disk-gib",
                           "0.001", "--python", sys.executable], env=fake_smi)
    assert code == 0 and "GPUs: 4" in out and "pin set cu13" in out and "preflight: ok" in out, out + err
    code, out, err = _run([sys.executable, "scripts/preflight.py", "--gpus", "8", "--min-disk-gib", "0.001",
                           "--json"], env=fake_smi)
    assert code == 1 and json.loads(out)["errors"][0].startswith("4 GPU(s) found")
    code, out, err = _run([sys.executable, "scripts/preflight.py", "--nvidia-smi", "no-such-smi"])
    assert code == 1 and "'no-such-smi' was not found" in out
    code, out, err = _run([sys.executable, "scripts/preflight.py", "--gpus", "0"])
    assert code == 2 and "--gpus must be at least 1" in err


# ---------------------------------------------------------------- the GPU environment


def test_gpu_pins_are_consistent():
    "Every top-level pin of each set agrees with its constraints file, and flash-attn is nowhere."
    gpu = ROOT / "scripts" / "gpu"
    sys.path.insert(0, str(gpu))
    try:
        import resolve
    finally:
        sys.path.remove(str(gpu))
    for pins in ("cu12", "cu13"):
        req = [l.split("#")[0].strip() for l in (gpu / f"requirements-{pins}.txt").read_text().splitlines()]
        con = resolve.read_constraints(gpu / f"constraints-{pins}.txt")
        assert not any("flash" in l.lower() for l in req) and "flash-attn" not in con and "faiss-cpu" not in con
        for line in req:
            line = line.split("#")[0].strip()
            if "==" in line:
                name, version = line.split("==")
                name = name.split("[")[0].strip().lower()
                assert any(v == version for v, _ in con[name]), f"{pins}: {name}=={version} vs {con.get(name)}"
    assert resolve.read_constraints(gpu / "constraints-cu12.txt")["vllm"] == [("0.19.1", None)]
    assert resolve.read_constraints(gpu / "constraints-cu13.txt")["torch"] == [("2.11.0", None)]


def _python312():
    "A CPython 3.12 to resolve for (the GPU box's likely Python); None if this machine has none."
    cands = [os.environ.get("AR1_PY312"), shutil.which("python3.12")]
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    cands += sorted(str(p) for p in root.glob("3.12*/bin/python3.12"))
    for c in filter(None, cands):
        try:
            if subprocess.run([c, "-c", "import sys; assert sys.version_info[:2] == (3, 12)"],
                              capture_output=True, timeout=30).returncode == 0:
                return c
        except OSError:
            pass
    return None


@pytest.mark.slow
@pytest.mark.parametrize("pins", ["cu12", "cu13"])
def test_gpu_pins_resolve_on_pypi(pins):
    "pip resolves each pinned set for Linux x86_64 / CPython 3.12 (1-4 minutes each, network-bound)."
    gpu = ROOT / "scripts" / "gpu"
    sys.path.insert(0, str(gpu))
    try:
        import resolve
    finally:
        sys.path.remove(str(gpu))
    py = _python312() or sys.executable
    r = resolve.resolve(pins, py, constraints=True)
    print(f"{pins} on Python {r['python_version']}: rc={r['rc']}, {len(r['resolved'])} packages, {r['seconds']} s")
    assert r["rc"] == 0, r["tail"]
    con = resolve.read_constraints(gpu / f"constraints-{pins}.txt")
    for name, version in r["resolved"].items():
        assert any(v == version for v, _ in con[name.lower()]), (name, version, con.get(name.lower()))


def test_setup_gpu_rejects_bad_input(tmp_path):
    code, out, err = _run(["bash", "scripts/setup_gpu.sh", "cu11"])
    assert code == 2 and "unknown argument 'cu11'" in err
    fake = tmp_path / "python3.13"
    fake.write_text("#!/bin/sh\necho 3.13\n")
    fake.chmod(0o755)
    venv = tmp_path / "venv"
    code, out, err = _run(["bash", "scripts/setup_gpu.sh", "cu12"], env={"PYTHON": str(fake), "AR1_GPU_VENV": str(venv)})
    assert code == 1 and "pinned for Python 3.11 or 3.12" in err and "Python 3.13" in err
    assert not venv.exists()
    code, out, err = _run(["bash", "scripts/setup_gpu.sh"], env={"PATH": "/usr/bin:/bin", "AR1_GPU_VENV": str(venv)})
    assert code == 1 and "nvidia-smi" in err and "pass 'cu12' or 'cu13'" in err


# ---------------------------------------------------------------- the dry run


@needs_verl
@pytest.mark.parametrize("algo", vl.ALGORITHMS)
def test_dry_run_in_process(algo, tmp_path, capsys):
    import speedrun

    assert speedrun.main([algo, "--dry-run", "--out", str(tmp_path), "--seed", "3"]) == 0
    out = capsys.readouterr().out
    (run_dir,) = tmp_path.iterdir()
    r = vl.RECIPES[algo]
    assert f"full-{algo}-s3-dry" in run_dir.name
    assert "VERL_USE_EXTERNAL_MODULES=agent_r1_tutorial.verl_bridge .venv-gpu/bin/python -m verl.trainer.main_ppo" in out
    assert f"algorithm.adv_estimator=ar1_{r.adv_estimator}" in out
    check = json.loads((run_dir / "validation.json").read_text())
    assert check["use_critic"] is r.critic and check["adv_estimator"] == f"ar1_{r.adv_estimator}"
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(run_dir / "verl_config.yaml")
    assert cfg.algorithm.adv_estimator == check["adv_estimator"] and cfg.data.seed == 3
    assert cfg.data.train_files == str(run_dir / "data" / "train.parquet")
    launch = (run_dir / "launch.sh").read_text()
    assert launch.count("verl.trainer.main_ppo") == 1
    # the node's retrieval service over the index starts first, and stops when the script ends
    assert f"scripts/retrieval_server.py --index-dir default={(run_dir / 'index').resolve()} --device cuda" in launch
    assert launch.index("retrieval_server.py") < launch.index("main_ppo") and "trap 'kill" in launch
    # the metrics path reaches verl's TaskRunner through Ray's runtime env, not through inheritance
    assert f"+ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH={(run_dir / 'metrics-1.jsonl').resolve()}" in launch
    rows = vd.read_rows(run_dir / "data" / "train.parquet")
    assert rows[0]["extra_info"]["tools_kwargs"]["search_service"]["create_kwargs"]["url"] == "http://127.0.0.1:8765"
    assert "retrieval service over the dry run's index at http://127.0.0.1:" in out
    assert re.search(r"the retrieval service answered [1-9]\d* search", out)  # the scripted searcher's, at least
    assert (run_dir / "index" / "config.json").exists()
    report = (run_dir / "report.md").read_text()
    assert "validated; agent loop ran on CPU; not launched (needs GPUs)" in report and "**Dry run.**" in report
    # the train stage built our agent loop as verl does and played episodes on the tiny model against the index
    episodes = json.loads((run_dir / "agent_loop.json").read_text())
    assert set(episodes) == {"tiny model", "scripted searcher"}
    assert all(e["ids_and_masks_ok"] and e["layout"] == r.layout for e in episodes.values())
    assert episodes["scripted searcher"]["tool_calls"] == 1 and "## Agent loop (dry run)" in report
    assert f"agent loop: ar1_agent -> agent_r1_tutorial.verl_bridge.Ar1AgentLoop (layout: {r.layout})" in out


@needs_verl
def test_launch_runs_in_the_gpu_environment_speedrun_sh_built(tmp_path, monkeypatch, capsys):
    "AR1_GPU_VENV moves the GPU environment (setup_gpu.sh builds it there): launch.sh names that interpreter."
    import speedrun

    venv = tmp_path / "elsewhere" / "gpu-env"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    monkeypatch.setenv("AR1_GPU_VENV", str(venv))
    assert speedrun.main(["grpo", "--dry-run", "--out", str(tmp_path / "runs")]) == 0
    (run_dir,) = (tmp_path / "runs").iterdir()
    launch = (run_dir / "launch.sh").read_text()
    assert f"{venv}/bin/python -m verl.trainer.main_ppo" in launch
    assert f"{venv}/bin/python scripts/retrieval_server.py" in launch and ".venv-gpu" not in launch
    # the gate's preflight checks the environment that exists, not the interpreter it would be built from
    seen, real = {}, preflight.run_checks
    monkeypatch.setattr(preflight, "run_checks", lambda **kw: seen.update(kw) or real(**kw))
    args = types.SimpleNamespace(gpus=None, data_dir=str(tmp_path), dry_run=True, task="search", algorithm="grpo",
                                 out=str(tmp_path), model=None, smoke=False)
    speedrun.full_preflight(None, args, gate=True)
    assert seen["python_exe"] == str(venv / "bin" / "python")


@needs_verl
def test_smoke_dry_run_is_one_gpu_a_small_model_and_three_steps(tmp_path, capsys):
    "bash speedrun.sh grpo --smoke: what a new GPU box runs first; here its dry run, and its verdict on fake metrics."
    import speedrun

    assert speedrun.main(["grpo", "--smoke", "--dry-run", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    (run_dir,) = tmp_path.iterdir()
    assert run_dir.name.endswith("full-grpo-s0-smoke-dry")
    launch = (run_dir / "launch.sh").read_text()
    for o in ("trainer.n_gpus_per_node=1", "actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct",
              "trainer.total_training_steps=3", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
              "data.train_batch_size=8", "trainer.save_freq=3", "trainer.test_freq=3"):
        assert o in launch, o
    assert len(vd.read_rows(run_dir / "data" / "train.parquet")) == 64  # the smoke run's 64 questions
    assert "retrieval_server.py" in launch and "--background" in launch
    ckpt = run_dir / "checkpoints" / "global_step_3"
    ckpt.mkdir(parents=True)
    steps = [{"step": i, "timing_s/step": t, "actor/perf/max_memory_allocated_gb": 9.5} for i, t in ((1, 90.0), (2, 30.0),
                                                                                                   (3, 32.0))]
    assert speedrun.smoke_verdict(steps, ckpt) == "PASS, 31.0 s per step"
    assert "smoke: PASS (3 steps, 31.0 s per step after the first, peak GPU memory of the actor 9.5 GB" in \
        capsys.readouterr().out
    assert speedrun.smoke_verdict(steps[:2], ckpt) == "FAIL"
    assert "smoke: FAIL (2 of 3 steps logged)" in capsys.readouterr().out
    assert speedrun.smoke_verdict(steps, None) == "FAIL"


@needs_verl
def test_gsm8k_dry_run_in_process(tmp_path, capsys):
    "Agent-R1's sanity path at full scale: GSM8K with the calculator, no index, no retrieval service."
    import speedrun

    assert speedrun.main(["grpo", "--task", "gsm8k", "--dry-run", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    (run_dir,) = tmp_path.iterdir()
    assert run_dir.name.endswith("full-gsm8k-grpo-s0-dry")
    rows = vd.read_rows(run_dir / "data" / "train.parquet")
    assert len(rows) == 32 and rows[0]["data_source"] == "openai/gsm8k"
    assert rows[0]["extra_info"]["env_kwargs"]["tools"] == ["calculator"]
    launch = (run_dir / "launch.sh").read_text()
    assert "data.max_response_length=2048" in launch and "retrieval_server" not in launch
    assert "GSM8K (the calculator) needs no retrieval index" in out
    episodes = json.loads((run_dir / "agent_loop.json").read_text())
    solver = episodes["scripted solver"]
    assert solver["tool_calls"] == 1 and solver["ids_and_masks_ok"] and solver["end_reason"] == "answer"
    assert "verl's validation after the last step: EM on the validation problems" in out


def test_smoke_needs_the_full_scale_and_the_search_task():
    code, out, err = _run([sys.executable, "scripts/speedrun.py", "grpo", "--smoke", "--scale", "tiny"])
    assert code == 2 and "--smoke checks a GPU box" in err
    code, out, err = _run([sys.executable, "scripts/speedrun.py", "grpo", "--smoke", "--dry-run", "--task", "alfworld"])
    assert code == 2 and "--smoke runs the search task on one node" in err


@needs_verl
def test_alfworld_dry_run_in_process(tmp_path, capsys):
    "The ALFWorld task's dry run: a game in ALFWorld's format as verl rows, no index, the game played through the loop."
    import speedrun

    assert speedrun.main(["grpo", "--task", "alfworld", "--dry-run", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    (run_dir,) = tmp_path.iterdir()
    assert "full-alfworld-grpo-s0-dry" in run_dir.name and "task=alfworld" in out
    assert "ALFWorld needs no retrieval index" in out and not (run_dir / "index").exists()
    rows = vd.read_rows(run_dir / "data" / "train.parquet")
    assert rows[0]["data_source"] == "alfworld" and rows[0]["extra_info"]["env_kwargs"]["start"] == "alfworld"
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(run_dir / "verl_config.yaml")
    assert cfg.actor_rollout_ref.model.path == "Qwen/Qwen3-4B-Instruct-2507"
    assert cfg.actor_rollout_ref.rollout.multi_turn.max_assistant_turns == 50
    episodes = json.loads((run_dir / "agent_loop.json").read_text())
    assert set(episodes) == {"tiny model", "scripted player"}
    assert all(e["ids_and_masks_ok"] for e in episodes.values())
    # the game's own solution wins it: five commands, one turn each, reward 1
    p = episodes["scripted player"]
    assert (p["reward_score"], p["turns"], p["end_reason"]) == (1.0, 5, "won")


@needs_verl
def test_speedrun_sh_dry_run(tmp_path):
    "The README's command on a machine without GPUs: bash speedrun.sh grpo --dry-run."
    code, out, err = _run(["bash", "speedrun.sh", "grpo", "--dry-run", "--out", str(tmp_path), "--gpus", "8",
                           "--override", "trainer.total_training_steps=5"], timeout=900)
    assert code == 0, out + err
    assert "Traceback" not in out + err
    assert "scale=full task=search algorithm=grpo" in out
    assert "trainer.n_gpus_per_node=8" in out and "trainer.total_training_steps=5" in out
    for stage in ("preflight", "env", "data", "index", "train", "eval"):
        assert f"  {stage} " in out
    (run_dir,) = tmp_path.iterdir()
    assert (run_dir / "launch.sh").exists() and (run_dir / "verl_config.yaml").exists()


def test_speedrun_full_options_are_checked():
    code, out, err = _run(["bash", "speedrun.sh", "grpo", "--dry-run", "--task", "arith"])
    assert code == 2 and "--task arith is a CPU task; at full scale the tasks are search, alfworld" in err
    code, out, err = _run(["bash", "speedrun.sh", "--scale", "tiny", "--task", "alfworld"])
    assert code == 2 and "--task alfworld runs at full scale" in err and "--dry-run" in err
    code, out, err = _run(["bash", "speedrun.sh", "grpo", "--dry-run", "--gpus", "0"])
    assert code == 2 and "--gpus must be a positive integer" in err
    code, out, err = _run(["bash", "speedrun.sh", "grpo", "--dry-run", "--override", "novalue"])
    assert code == 2 and "--override needs KEY=VALUE" in err


def test_multi_node_job_has_no_runtime_env_conflict():
    "Ray refuses to merge a job's runtime env with ray.init's when both set a variable: the job sets none."
    cmds = vl.launch_commands(vl.VerlRunConfig("grpo", nnodes=2, n_gpus_per_node=8), head_address="10.0.0.1")
    assert "--runtime-env-json" not in cmds["submit"]
    entry = cmds["submit"].split(" -- ", 1)[1]
    assert entry.startswith(f"env {vb.EXTERNAL_MODULES_ENV}={vb.MODULE_NAME} /")  # absolute: runs in Ray's job supervisor
    assert f"+ray_kwargs.ray_init.runtime_env.env_vars.{vb.EXTERNAL_MODULES_ENV}={vb.MODULE_NAME}" in entry


def test_checkpoints_hold_hugging_face_weights_and_runs_log_their_rollouts():
    ov = vl.verl_overrides(vl.VerlRunConfig("grpo", rollout_data_dir="runs/x/rollouts", episode_dir="runs/x/episodes"))
    assert "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]" in ov
    assert "trainer.rollout_data_dir=runs/x/rollouts" in ov and "+actor_rollout_ref.rollout.custom.ar1_episode_dir=runs/x/episodes" in ov
    assert not any("save_contents" in o for o in vl.verl_overrides(vl.VerlRunConfig("grpo", save_hf_model=False)))
    with pytest.raises(ValueError, match="episode_dir"):
        vl.VerlRunConfig("grpo", episode_dir="a folder with spaces")


def test_full_run_folder_is_stable_and_resumes(tmp_path, monkeypatch, capsys):
    "`bash speedrun.sh grpo` started again finds its folder, and verl's checkpoints in it (stages stubbed: no GPU here)."
    import speedrun

    seen = []
    monkeypatch.setattr(speedrun, "nvidia_gpus", lambda: ["GPU 0: stand-in"])
    for name in ("preflight", "env", "data", "index", "train", "eval"):
        monkeypatch.setitem(speedrun.BUILT, f"full/{name}", lambda run_dir, args, name=name: seen.append((name, run_dir)) or "ok")
    for attempt in (1, 2):
        assert speedrun.main(["grpo", "--out", str(tmp_path)]) == 0
        if attempt == 1:
            ckpt = tmp_path / "full-grpo-s0" / "checkpoints"
            ckpt.mkdir(parents=True)
            (ckpt / "latest_checkpointed_iteration.txt").write_text("7")
    dirs = {d for _, d in seen}
    assert dirs == {tmp_path / "full-grpo-s0"}
    assert "resuming the run in" in capsys.readouterr().out


def test_full_eval_reports_verls_last_validation(tmp_path):
    import speedrun

    lines = [{"step": 0, "data": {"val-core/hotpotqa/hotpot_qa/acc/mean@1": 0.21}},
             {"step": 5, "data": {"actor/pg_loss": 0.1}},
             {"step": 10, "data": {"val-core/hotpotqa/hotpot_qa/acc/mean@1": 0.43}}]
    (tmp_path / "metrics-1.jsonl").write_text("\n".join(json.dumps(l) for l in lines))
    args = speedrun.parser().parse_args(["grpo"])
    assert speedrun.full_eval(tmp_path, args) == "EM 0.430 at step 10"
    # where episodes report no "acc" (a registered scorer with only a score), verl's core metric is "reward"
    (tmp_path / "metrics-1.jsonl").write_text(json.dumps({"step": 5, "data": {"val-core/alfworld/reward/mean@1": 0.6}}))
    alf = speedrun.parser().parse_args(["grpo", "--task", "alfworld"])
    assert speedrun.full_eval(tmp_path, alf) == "success rate 0.600 at step 5"
    (tmp_path / "metrics-1.jsonl").write_text(json.dumps(lines[1]))
    with pytest.raises(SystemExit, match="logged no validation"):
        speedrun.full_eval(tmp_path, args)


def test_validate_checks_every_loop_of_the_agent_loop_file(tmp_path):
    "verl's agent-loop file is read by every worker at launch: a loop it names that does not import is refused here."
    from agent_r1_tutorial.blackbox import gateway_loop_config

    bad = tmp_path / "loops.yaml"
    bad.write_text("- name: mine\n  _target_: no_such_module_ar1.MyLoop\n")
    with pytest.raises(ValueError, match=r"names 'mine' -> no_such_module_ar1.MyLoop, which does not import here"):
        vl.validate_verl_config(vl.compose_verl_config(vl.verl_overrides(vl.VerlRunConfig(
            "grpo", agent_loop_config_path=str(bad)))))
    with pytest.raises(ValueError, match="agent_loop_config_path=.*gone.yaml: no such file"):
        vl.validate_verl_config(vl.compose_verl_config(vl.verl_overrides(vl.VerlRunConfig(
            "grpo", agent_loop_config_path=str(tmp_path / "gone.yaml")))))
    good = gateway_loop_config(tmp_path / "agent_loop.yaml")
    check = vl.validate_verl_config(vl.compose_verl_config(vl.verl_overrides(vl.VerlRunConfig(
        "grpo", agent_loop_config_path=str(good)))))
    assert check["agent_loop"].endswith("; ar1_gateway -> agent_r1_tutorial.blackbox.Ar1GatewayLoop (from the agent-loop "
                                        "file)")
