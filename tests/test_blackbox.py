"""scripts/train_agent.py: the command line of chapter 16a (the chapter's own cells test the trainer and the agent)."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import train_agent  # noqa: E402


def _run(*args):
    res = subprocess.run([sys.executable, "scripts/train_agent.py", *args], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    return res.returncode, res.stdout, res.stderr


def test_load_agent_names_what_is_wrong():
    from agent_r1_tutorial.blackbox import httpx_agent, openai_agent
    assert train_agent.load_agent("openai") is openai_agent and train_agent.load_agent("httpx") is httpx_agent
    assert train_agent.load_agent("agent_r1_tutorial.blackbox:httpx_agent") is httpx_agent
    for spec, msg in [("nosuch", "must be openai, httpx or module:function"),
                      ("no_such_module_xyz:f", "No module named 'no_such_module_xyz'"),
                      ("math:no_such_name", "has no attribute 'no_such_name'"), ("math:pi", "pi is not a function")]:
        with pytest.raises(ValueError, match=msg):
            train_agent.load_agent(spec)


def test_cli_refuses_bad_options_and_a_missing_run(tmp_path):
    code, _, err = _run("--agent", "math:pi")
    assert code == 2 and "pi is not a function" in err
    code, _, err = _run("--steps", "0")
    assert code == 2 and "--steps must be a positive integer, got 0" in err
    code, _, err = _run("--run", str(tmp_path / "nothing"), "--out", str(tmp_path / "out"))
    assert code == 2 and "holds no model: run `bash speedrun.sh` first" in err
    assert not (tmp_path / "out").exists()  # nothing is written before the inputs are checked
