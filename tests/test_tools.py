"""Tests for agent_r1_tutorial.tools beyond the examples in nbs/03_tools.ipynb: fuzzed parsers, every failure path of
run_tool_calls, the calculator against Python's own arithmetic, and the sandbox under attack."""
import asyncio
import json
import math
import os
import re
import socket
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

from agent_r1_tutorial.sandbox import PythonTool, SandboxResult, run_sandboxed, sandbox_support, strip_fence
from agent_r1_tutorial.tools import (
    BaseTool, CalculatorError, CalculatorTool, HermesFormat, ParsedResponse, Registry, SearchR1Format, ToolCall,
    ToolResult, arun_tool_calls, format_number, get_format, get_tool, list_formats, list_tools, register_tool,
    resolve_tools, run_tool_calls, run_tool_calls_batch, safe_eval, tag_blocks, truncate_text,
)

FORMATS = [HermesFormat(), SearchR1Format()]
TAGS = ["<tool_call>", "</tool_call>", "<answer>", "</answer>", "<search>", "</search>", "<think>", "</think>",
        "<information>", "<tool_response>"]
JSON_BITS = ['{"name": "calculator", "arguments": {"expression": "1+1"}}', '{"name": ', '"arguments"', "{", "}", "[",
             "]", '"', ":", ",", "null", "1e999", '"\\u0000"', '{"name": "x", "arguments": "{\\"a\\": 1}"}',
             '{"name": 3}', '{"name": "", "arguments": {}}', '"' + "a" * 50]
fragments = st.lists(st.one_of(st.sampled_from(TAGS + JSON_BITS), st.text(max_size=6)), max_size=30).map("".join)


def _check_parsed(p):
    assert isinstance(p, ParsedResponse) and isinstance(p.content, str)
    assert all(isinstance(c, ToolCall) and isinstance(c.name, str) and c.name and isinstance(c.arguments, dict)
               for c in p.calls)
    assert p.answer is None or isinstance(p.answer, str)
    assert all(isinstance(e, str) and e for e in p.errors)


# ---------------------------------------------------------------- parsers


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
@given(text=st.one_of(st.text(), fragments))
@settings(max_examples=300, deadline=None)
def test_parsers_never_raise(fmt, text):
    _check_parsed(fmt.parse(text))


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
@given(obj=st.one_of(st.none(), st.integers(), st.binary(), st.lists(st.text())))
def test_parsers_refuse_non_text_without_raising(fmt, obj):
    p = fmt.parse(obj)
    assert not p.calls and p.errors and "must be text" in p.errors[0]


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
@given(text=st.text().filter(lambda t: "<" not in t and ">" not in t))
def test_text_without_tags_is_plain_content(fmt, text):
    p = fmt.parse(text)
    assert (p.calls, p.errors, p.answer, p.content) == ([], [], None, text.strip())


filler = st.text(alphabet=st.characters(blacklist_characters="<>"), max_size=20)
bodies = st.one_of(st.text(alphabet=st.characters(blacklist_characters="<>"), max_size=40),
                   st.sampled_from(JSON_BITS), st.builds(json.dumps, st.dictionaries(st.text(max_size=5), st.integers())))


@given(parts=st.lists(st.tuples(filler, bodies), max_size=6), tail=filler)
@settings(max_examples=300, deadline=None)
def test_every_hermes_block_is_a_call_or_an_error(parts, tail):
    "A malformed call never vanishes silently: each <tool_call> block gives a call or an error message."
    text = "".join(f"{f}<tool_call>{b}</tool_call>" for f, b in parts) + tail
    p = HermesFormat().parse(text)
    call_errors = [e for e in p.errors if e.startswith("tool call")]
    assert len(p.calls) + len(call_errors) == len(parts)
    for c in p.calls:
        assert c.raw.startswith("<tool_call>") and c.raw.endswith("</tool_call>")


@given(parts=st.lists(st.tuples(filler, filler), max_size=6), tail=filler)
def test_every_search_block_is_a_call_or_an_error(parts, tail):
    text = "".join(f"{f}<search>{q}</search>" for f, q in parts) + tail
    p = SearchR1Format().parse(text)
    assert len(p.calls) + len([e for e in p.errors if e.startswith("search")]) == len(parts)
    assert [c.arguments["query"] for c in p.calls] == [q.strip() for _, q in parts if q.strip()]


# strings that hold the tags themselves, "</" and backslashes: what a careless formatter would let end a block early
tagged_text = st.lists(st.one_of(st.sampled_from(TAGS + ["</", "<\\/", "\\", '"']), st.text(max_size=6)),
                       max_size=5).map("".join)
json_values = st.recursive(st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.text(max_size=10) | tagged_text
                           | st.floats(allow_nan=False, allow_infinity=False),
                           lambda kids: st.lists(kids, max_size=3) | st.dictionaries(tagged_text, kids, max_size=3),
                           max_leaves=8)
names = st.one_of(st.from_regex(r"[A-Za-z_][A-Za-z0-9_-]{0,20}", fullmatch=True),
                  tagged_text.filter(lambda s: s and s.strip() == s))  # the parser strips a name's outer spaces
calls_st = st.lists(st.builds(ToolCall, names, st.dictionaries(tagged_text, json_values, max_size=4)), max_size=4)


@given(calls=calls_st)
@settings(max_examples=300, deadline=None)
def test_hermes_round_trip(calls):
    "Whatever `format_calls` writes, `parse` reads back exactly, closing tags inside the arguments included."
    fmt = HermesFormat()
    text = fmt.format_calls(calls)
    p = fmt.parse(text)
    assert p.errors == []
    assert [(c.name, c.arguments) for c in p.calls] == [(c.name, c.arguments) for c in calls]
    assert text.count("</tool_call>") == len(calls)  # the only closing tags are the blocks' own


@given(queries=st.lists(st.text(min_size=1, max_size=30).filter(lambda q: q.strip() and "<" not in q), max_size=4))
def test_search_r1_round_trip(queries):
    fmt = SearchR1Format()
    calls = [ToolCall("search", {"query": q}) for q in queries]
    assert [c.arguments for c in fmt.parse(fmt.format_calls(calls)).calls] == [{"query": q.strip()} for q in queries]


def test_answers_and_unclosed_tags():
    h = HermesFormat()
    assert h.parse("<answer> a </answer> then <answer>b</answer>").answer == "b"  # the last complete answer counts
    p = h.parse("<answer>a</answer><answer>cut off")
    assert p.answer == "a" and any("not closed" in e for e in p.errors)
    assert h.parse('<tool_call>{"name": "x", "arguments": {"a": "<answer>no</answer>"}}</tool_call>').answer is None
    p = h.parse("</tool_call>")
    assert p.errors == ["found </tool_call> without a matching <tool_call>"]
    p = h.parse('<tool_call>{"name": "x"}')
    assert not p.calls and "opened but not closed" in p.errors[0]


def test_result_messages():
    res = [ToolResult("a"), ToolResult.error("nope", "unknown_tool")]
    assert HermesFormat().format_results(res) == [{"role": "tool", "content": "a"}, {"role": "tool", "content": "Error: nope"}]
    msgs = SearchR1Format().format_results(res)
    assert msgs == [{"role": "user", "content": "<information>a</information>\n<information>Error: nope</information>"}]
    assert SearchR1Format().format_results([]) == []
    assert list_formats() == ["hermes", "search_r1"] or {"hermes", "search_r1"} <= set(list_formats())
    with pytest.raises(ValueError, match="unknown format 'nope'"):
        get_format("nope")
    with pytest.raises(ValueError, match="offers one tool"):
        SearchR1Format().instructions({"search": None, "calculator": None})


# ---------------------------------------------------------------- tools and run_tool_calls


class Echo(BaseTool):
    name = "echo"
    description = "Echo a text."
    parameters = {"type": "object", "properties": {"text": {"type": "string", "maxLength": 50},
                                                   "n": {"type": "integer", "minimum": 0}},
                  "required": ["text"], "additionalProperties": False}

    def execute(self, text, n=1):
        return ToolResult(text * n, reward=0.1)


class Boom(BaseTool):
    name = "boom"
    description = "Raises."

    def execute(self):
        raise RuntimeError("kaput")


class Slow(BaseTool):
    name = "slow"
    description = "Blocks its thread."
    parameters = {"type": "object", "properties": {"s": {"type": "number"}}, "required": ["s"]}

    def execute(self, s):
        time.sleep(s)
        return ToolResult("done")


class OwnTimeout(BaseTool):
    name = "own_timeout"
    description = "Raises a TimeoutError of its own."

    def execute(self):
        raise TimeoutError("upstream timed out")


class Wrong(BaseTool):
    name = "wrong"
    description = "Returns the wrong type."

    def execute(self):
        return 42


class Plain(BaseTool):
    name = "plain"
    description = "Returns a bare string."

    def execute(self):
        return "hi"


TOOLS = [Echo(), Boom(), Slow(), OwnTimeout(), Wrong(), Plain()]


@pytest.mark.parametrize("args,fragment", [
    ({}, "'text' is a required property"),
    ({"text": 5}, "5 is not of type 'string'"),
    ({"text": "x" * 51}, "is too long"),
    ({"text": "x", "n": -1}, "less than the minimum of 0"),
    ({"text": "x", "extra": 1}, "('extra' was unexpected)"),
    ({"text": "x", "n": 1.5}, "1.5 is not of type 'integer'"),
])
def test_schema_violations_become_observations(args, fragment):
    [r] = run_tool_calls([ToolCall("echo", args)], TOOLS)
    assert not r.ok and r.info["error"] == "invalid_arguments" and fragment in r.text
    assert r.text.startswith("Error: invalid arguments for 'echo'") and "Expected: text: string (required)" in r.text


def test_long_argument_values_are_not_echoed_in_full():
    [r] = run_tool_calls([ToolCall("echo", {"text": "y" * 10_000})], TOOLS)
    assert not r.ok and len(r.text) < 400


def test_every_failure_kind():
    calls = [ToolCall("echo", {"text": "ab", "n": 2}), ToolCall("nope", {}), ToolCall("boom", {}),
             ToolCall("slow", {"s": 3}), ToolCall("own_timeout", {}), ToolCall("wrong", {}), ToolCall("plain", {}),
             ToolCall(["not", "a", "name"], {}), ToolCall("echo", "not a dict")]
    t0 = time.perf_counter()
    res = run_tool_calls(calls, TOOLS, timeout=0.3)
    assert time.perf_counter() - t0 < 2.0  # the 3 s call was abandoned, and nothing waited for its thread
    assert [r.info.get("error") for r in res] == [None, "unknown_tool", "exception", "timeout", "exception",
                                                  "bad_result", None, "unknown_tool", "invalid_arguments"]
    assert res[0].text == "abab" and res[0].reward == 0.1 and res[0].ok
    assert "Available tools: boom, echo, own_timeout, plain, slow, wrong" in res[1].text
    assert "RuntimeError: kaput" in res[2].text
    assert "did not finish within 0.3 s" in res[3].text
    assert "TimeoutError: upstream timed out" in res[4].text  # the tool's own timeout is not our time limit
    assert res[6].text == "hi"
    assert all(r.text.startswith("Error") for r in res if not r.ok)


@given(n=st.integers(0, 3000), budget=st.integers(1, 500))
@settings(max_examples=50, deadline=None)
def test_over_long_outputs_are_cut_to_the_budget(n, budget):
    [r] = run_tool_calls([ToolCall("echo", {"text": "z", "n": n})], TOOLS, max_chars=budget)
    assert len(r.text) <= budget
    assert (r.text == "z" * n) == (n <= budget)
    assert ("truncated_from" in r.info) == (n > budget)


@given(text=st.text(max_size=300), budget=st.integers(0, 320), side=st.sampled_from(["left", "right", "middle"]))
def test_truncate_text_respects_its_budget(text, budget, side):
    out = truncate_text(text, budget, side)
    assert len(out) <= budget or out == text
    if len(text) <= budget:
        assert out == text
    elif budget >= 30:
        assert "characters cut" in out
        keep = out.split("…[")[0] if side != "right" else ""
        assert text.startswith(keep)


def test_calls_run_concurrently_and_in_batches():
    calls = [ToolCall("slow", {"s": 0.3})] * 6
    t0 = time.perf_counter()
    res = run_tool_calls(calls, TOOLS)
    assert time.perf_counter() - t0 < 1.2 and all(r.text == "done" for r in res)
    batch = [[ToolCall("echo", {"text": str(i), "n": j}) for j in range(i)] for i in range(5)]
    out = run_tool_calls_batch(batch, TOOLS, max_concurrency=2)
    assert [[r.text for r in rs] for rs in out] == [[str(i) * j for j in range(i)] for i in range(5)]
    with pytest.raises(ValueError, match="max_concurrency"):
        run_tool_calls_batch(batch, TOOLS, max_concurrency=0)


def test_works_inside_a_running_event_loop():
    "Jupyter runs an event loop; the synchronous entry points must still work there."
    async def main():
        sync = run_tool_calls([ToolCall("echo", {"text": "a"})], TOOLS)
        asynchronous = await arun_tool_calls([ToolCall("echo", {"text": "b"})], TOOLS)
        return sync[0].text + asynchronous[0].text
    assert asyncio.run(main()) == "ab"


def test_bad_programming_input_fails_loudly():
    with pytest.raises(TypeError, match="list of ToolCall"):
        run_tool_calls(["calculator"], TOOLS)
    with pytest.raises(TypeError, match="tools must be"):
        run_tool_calls([], 42)
    with pytest.raises(ValueError, match="two tools are named 'echo'"):
        resolve_tools([Echo(), Echo()])
    with pytest.raises(ValueError, match="unknown tool 'zzz'"):
        resolve_tools(["zzz"])


def test_registry_and_specs():
    assert {"calculator", "python"} <= set(list_tools())
    table = resolve_tools(["calculator", {"name": "python", "timeout": 1.0}, Echo()])
    assert sorted(table) == ["calculator", "echo", "python"] and table["python"].timeout == 1.0
    reg = Registry("thing")
    reg.register(Echo)
    with pytest.raises(ValueError, match="already registered"):
        reg.register(Boom, name="echo")
    with pytest.raises(TypeError, match="BaseTool subclass"):
        register_tool(dict)
    # a notebook's copy of a library class (defined in __main__) may be replaced by the library's own, and back
    NotebookEcho = type("Echo", (BaseTool,), {"name": "echo", "__module__": "__main__", "__qualname__": "Echo"})
    reg.register(NotebookEcho)
    assert reg.get("echo") is NotebookEcho
    Elsewhere = type("Echo", (BaseTool,), {"name": "echo", "__module__": "other.pkg", "__qualname__": "Echo"})
    Echo.__module__, saved = "some.lib", Echo.__module__
    try:
        reg.register(Echo)
        with pytest.raises(ValueError, match="already registered"):
            reg.register(Elsewhere)  # same name and qualname, two real modules: a genuine clash
    finally:
        Echo.__module__ = saved


def test_tool_result_checks_its_fields():
    with pytest.raises(TypeError):
        ToolResult(b"bytes")
    with pytest.raises(ValueError):
        ToolResult("x", reward=float("inf"))
    with pytest.raises(TypeError):
        ToolResult("x", info=[])


def test_openai_schemas_fit_verl():
    "Our tools must be able to sit behind verl: its pydantic schema accepts what openai_schema() returns."
    schemas = pytest.importorskip("verl.tools.schemas")
    for name in ("calculator", "python"):
        s = get_tool(name).openai_schema()
        parsed = schemas.OpenAIFunctionToolSchema.model_validate(s)
        assert parsed.function.name == name and parsed.function.parameters.required
    call = ToolCall("calculator", {"expression": "1+1"}).to_openai()["function"]
    fn, bad = schemas.OpenAIFunctionCallSchema.from_openai_function_parsed_schema(
        schemas.OpenAIFunctionParsedSchema(**call))
    assert not bad and fn.arguments == {"expression": "1+1"}


# ---------------------------------------------------------------- calculator

leaf = st.one_of(st.integers(-50, 50).map(str), st.floats(-100, 100, allow_nan=False).map(lambda x: f"{x:.3f}"))


def _expr(draw_kids):
    return st.one_of(
        st.tuples(draw_kids, st.sampled_from(["+", "-", "*", "/", "//", "%"]), draw_kids).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        st.tuples(draw_kids, st.integers(-3, 3)).map(lambda t: f"({t[0]}) ** {t[1]}"),
        draw_kids.map(lambda e: f"-{e}"))


expressions = st.recursive(leaf, _expr, max_leaves=6).filter(lambda e: len(e) <= 200)


@given(expr=expressions)
@settings(max_examples=400, deadline=None)
def test_calculator_agrees_with_python(expr):
    try:
        expected = eval(expr, {"__builtins__": {}})  # the reference, on expressions this test generated
    except (ZeroDivisionError, OverflowError):
        with pytest.raises(CalculatorError):
            safe_eval(expr)
        return
    if isinstance(expected, complex) or (isinstance(expected, float) and not math.isfinite(expected)) or abs(expected) > 1e100:
        with pytest.raises(CalculatorError):
            safe_eval(expr)
        return
    try:
        got = safe_eval(expr)
    except CalculatorError as e:  # only the limits may refuse what Python computes
        assert "limit" in str(e) or "not a real number" in str(e) or "finite" in str(e), (expr, e)
        return
    assert got == pytest.approx(expected, rel=1e-12, abs=1e-12) and type(got) is type(expected)


@given(text=st.one_of(st.text(max_size=250), fragments))
@settings(max_examples=300, deadline=None)
def test_calculator_only_ever_raises_calculator_errors(text):
    try:
        v = safe_eval(text)
    except CalculatorError:
        return
    assert isinstance(v, (int, float)) and abs(v) <= 1e100


@pytest.mark.parametrize("expr", ["__import__('os')", "().__class__", "[1][0]", "{}", "lambda: 1", "a", "1 if 1 else 2",
                                  "2 ** 10000", "10 ** 50 * 10 ** 60", "(-1) ** 0.5", "~1", "not 1", "1 @ 2", "1 << 3",
                                  "f'{1}'", "b'1'", "1j", "(" * 100 + ")" * 100])
def test_calculator_refuses(expr):
    with pytest.raises(CalculatorError):
        safe_eval(expr)
    r = CalculatorTool()(expression=expr)
    assert not r.ok and r.text.startswith("Error")


def test_calculator_formats_results():
    assert [format_number(safe_eval(e)) for e in ["2**64", "1/4", "6/3", "1e20"]] == ["18446744073709551616", "0.25", "2", "1e+20"]


# ---------------------------------------------------------------- the sandbox

SUPPORT = sandbox_support()
needs_landlock = pytest.mark.skipif(not SUPPORT["landlock_abi"], reason="Landlock is not available on this kernel")
needs_seccomp = pytest.mark.skipif(not SUPPORT["seccomp"], reason="seccomp filters are not available here")
posix_only = pytest.mark.skipif(os.name != "posix", reason="the sandbox needs a POSIX system")


def _processes_mentioning(text: str) -> list[int]:
    "Processes whose command line contains `text` (each sandbox run's command line holds its unique folder)."
    found = []
    for p in Path("/proc").glob("[0-9]*"):
        try:
            if text.encode() in (p / "cmdline").read_bytes():
                found.append(int(p.name))
        except OSError:
            pass
    return found


def _left_nothing_behind(r: SandboxResult):
    assert not Path(r.workdir).exists(), "the sandbox folder was not removed"
    if Path("/proc").exists():
        assert _processes_mentioning(r.workdir) == [], "a sandboxed process survived the run"


def _observe(code, **kw):
    tool = PythonTool(**{"timeout": 2.0, "memory_mb": 256, **kw})
    t0 = time.perf_counter()
    res = tool(code=code)
    return res, time.perf_counter() - t0


@posix_only
def test_sandbox_runs_ordinary_code():
    r = run_sandboxed("import json, math\nprint(json.dumps({'pi': round(math.pi, 3)}))")
    assert r.returncode == 0 and r.stdout == '{"pi": 3.142}\n' and not r.timed_out
    _left_nothing_behind(r)


@posix_only
def test_attack_infinite_loop():
    res, dt = _observe("while True:\n    pass")
    assert not res.ok and res.info["timed_out"] and "did not finish within 2 s" in res.text and dt < 4


@posix_only
def test_attack_sleeping_forever():
    res, dt = _observe("import time\ntime.sleep(10**6)")
    assert not res.ok and res.info["timed_out"] and dt < 4


@posix_only
@pytest.mark.parametrize("code", ["x = bytearray(10**10)", "a = []\nwhile True:\n    a.append('x' * 10**7)"])
def test_attack_memory_bomb(code):
    res, dt = _observe(code)
    assert not res.ok and "ran out of memory (limit 256 MB)" in res.text and dt < 4


@posix_only
@needs_seccomp
@pytest.mark.parametrize("code", ["import os\nwhile True:\n    os.fork()",
                                  "import os\nwhile True:\n    os.fork() or os.setsid()",
                                  "import subprocess\nsubprocess.run(['sleep', '100'])",
                                  "import multiprocessing as mp\np = mp.Process(target=print)\np.start()"])
def test_attack_fork_bomb_and_subprocesses(code):
    res, dt = _observe(code)
    assert not res.ok and "starting new processes is not allowed" in res.text and dt < 4


@posix_only
@needs_seccomp
def test_threads_are_still_allowed():
    res, _ = _observe("import threading\nt = threading.Thread(target=lambda: print('in a thread'))\nt.start(); t.join()")
    assert res.ok and res.text == "in a thread"


@posix_only
def test_attack_huge_output():
    res, dt = _observe("while True:\n    print('spam' * 1000)", max_output_chars=500)
    assert not res.ok and "more output than allowed" in res.text and dt < 4
    assert len(res.text) < 1200  # output budget plus a short diagnosis


@posix_only
def test_long_but_finite_output_is_cut_keeping_both_ends():
    res, _ = _observe("for i in range(5000):\n    print(i)", max_output_chars=200)
    assert res.ok and res.info["truncated"] and res.text.startswith("0\n1\n") and res.text.endswith("4999")


@posix_only
@needs_landlock
def test_attack_write_outside_its_folder(tmp_path):
    target = tmp_path / "pwned.txt"
    for code in [f"open({str(target)!r}, 'w').write('x')",
                 f"import os\nos.makedirs({str(tmp_path / 'newdir')!r})",
                 f"import shutil\nshutil.rmtree({str(tmp_path)!r})",
                 f"import os\nos.symlink('/etc/passwd', {str(tmp_path / 'link')!r})"]:
        res, _ = _observe(code)
        assert not res.ok and "PermissionError" in res.text, (code, res.text)
    assert tmp_path.exists() and list(tmp_path.iterdir()) == []


@posix_only
def test_writing_inside_its_folder_works():
    res, _ = _observe("import os\nopen('a.txt', 'w').write('hello')\nprint(open('a.txt').read(), os.listdir('.'))")
    assert res.ok and res.text == "hello ['a.txt']"


@posix_only
def test_attack_read_parent_environment(monkeypatch):
    monkeypatch.setenv("AR1_TEST_SECRET", "s3cr3t-value")
    res, _ = _observe("import os\nprint(sorted(os.environ))\nprint(os.environ['AR1_TEST_SECRET'])")
    assert not res.ok and "KeyError: 'AR1_TEST_SECRET'" in res.text and "s3cr3t" not in res.text
    assert "HOME" in res.text and "PATH" in res.text and os.environ["AR1_TEST_SECRET"] == "s3cr3t-value"


@posix_only
@needs_landlock
def test_attack_read_parent_environment_through_proc():
    res, _ = _observe("import os\nprint(open(f'/proc/{os.getppid()}/environ', 'rb').read()[:50])")
    assert not res.ok and "PermissionError" in res.text
    res, _ = _observe("print(open('/proc/self/status').read().splitlines()[0])")  # its own /proc stays readable
    assert res.ok and res.text.startswith("Name:")


@posix_only
@pytest.mark.skipif((SUPPORT["landlock_abi"] or 0) < 6, reason="signal scoping needs Landlock ABI 6 (Linux 6.12)")
def test_attack_signal_the_parent():
    res, _ = _observe("import os\nos.kill(os.getppid(), 0)")  # signal 0 only checks permission: harmless if it passes
    assert not res.ok and "PermissionError" in res.text


@posix_only
@pytest.mark.skipif((SUPPORT["landlock_abi"] or 0) < 4, reason="TCP restrictions need Landlock ABI 4 (Linux 6.7)")
def test_attack_network_to_a_local_listener():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        res, _ = _observe(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)")
    assert not res.ok and "PermissionError" in res.text


@posix_only
def test_attack_lift_its_own_limits():
    "Started by root, the code could raise its hard limits back, unless its capabilities are gone."
    res, _ = _observe("import resource as r\nr.setrlimit(r.RLIMIT_AS, (r.RLIM_INFINITY, r.RLIM_INFINITY))\nprint('lifted')")
    assert not res.ok and "lifted" not in res.text and ("ValueError" in res.text or "PermissionError" in res.text)


@posix_only
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
def test_capabilities_are_dropped():
    res, _ = _observe("print(open('/proc/self/status').read())")
    caps = dict(line.split(":\t") for line in res.text.splitlines() if line.startswith("Cap"))
    assert res.ok and int(caps["CapEff"], 16) == 0 and int(caps["CapPrm"], 16) == 0 and int(caps["CapAmb"], 16) == 0
    if os.geteuid() == 0:
        assert int(caps["CapBnd"], 16) == 0  # no exec can bring them back


@posix_only
def test_no_inherited_file_descriptors(tmp_path):
    f = open(tmp_path / "parent_secret.txt", "w+")
    try:
        f.write("secret")
        f.flush()
        os.set_inheritable(f.fileno(), True)  # even a descriptor marked inheritable must not reach the sandbox
        res, _ = _observe(f"import os\nprint(sorted(os.listdir('/proc/self/fd')))\nos.fstat({f.fileno()})")
        assert not res.ok and "Bad file descriptor" in res.text
        if Path("/proc/self/fd").exists():
            first_line = res.text.splitlines()[0]
            assert set(eval(first_line)) <= {"0", "1", "2", "3"}  # stdin/out/err, and listdir's own descriptor
    finally:
        f.close()


@posix_only
@pytest.mark.parametrize("code", [
    "while True:\n    pass", "import os\nwhile True:\n    os.fork()", "x = bytearray(10**10)",
    "while True:\n    print('x' * 1000)"])
def test_attacks_leave_nothing_behind(code):
    r = run_sandboxed(code, timeout=1.5, memory_mb=256)
    assert r.returncode != 0 and r.duration_s < 4
    _left_nothing_behind(r)


@posix_only
def test_a_crash_in_the_code_reports_the_traceback():
    res, _ = _observe("def f(x):\n    return 1 / x\nf(0)")
    assert not res.ok and "line 2, in f" in res.text and "return 1 / x" in res.text
    assert res.text.endswith("ZeroDivisionError: division by zero")


def test_sandbox_rejects_bad_settings():
    with pytest.raises(TypeError, match="code must be a str"):
        run_sandboxed(b"print(1)")
    with pytest.raises(ValueError, match="timeout must be a positive"):
        run_sandboxed("print(1)", timeout=0)
    with pytest.raises(ValueError, match="memory_mb"):
        run_sandboxed("print(1)", memory_mb=1)


def test_runner_can_be_swapped():
    seen = []

    def fake_runner(code):
        seen.append(code)
        return SandboxResult(stdout="from the container\n", stderr="", returncode=0, timed_out=False, duration_s=0.01)
    tool = PythonTool(runner=fake_runner)
    r = tool(code="```python\nprint(1)\n```")
    assert r.ok and r.text == "from the container" and seen == ["print(1)"]


# the pattern `strip_fence` replaces, kept as the oracle: it is right, but quadratic in a run of spaces
_FENCE_ORACLE = re.compile(r"^\s*```[a-zA-Z0-9_+-]*\s*\n(.*?)\n?\s*```\s*$", re.S)


@given(code=st.lists(st.sampled_from(["```", "\n", " ", "\t", "py", "thon", "x = 1", "é", "+", "`", "\r\n"]),
                     max_size=12).map("".join))
@settings(max_examples=1000, deadline=None)
def test_strip_fence_agrees_with_the_regex(code):
    m = _FENCE_ORACLE.match(code)
    assert strip_fence(code) == (m.group(1) if m else code)


def test_strip_fence_is_linear_on_degenerate_code():
    "A run of spaces (quadratic for the regex: 20,000 took it a second) and a tower of fences, each one pass."
    code = "```\n" + " " * 1_000_000 + "x\n```"
    assert strip_fence(code) == " " * 1_000_000 + "x"
    assert strip_fence("```" * 300_000) == "```" * 300_000  # no line break after the tag: not a fence


# system calls the sandbox's seccomp filter refuses (x86-64 numbers, written out independently of the filter), with
# arguments under which 25 of the 31 succeed or fail otherwise without the filter (unshare(CLONE_NEWUSER) and ptrace
# succeed, setns(-1) is EBADF, personality(0xffffffff) reads the persona); the other six (pivot_root, fsopen, fsmount,
# fspick, move_mount, userfaultfd) are refused for want of a capability the sandbox dropped as well
DENIED_X86 = {"unshare": (272, (0x10000000,)), "setns": (308, (-1, 0)), "mount": (165, (0, 0, 0, 0, 0)),
              "umount2": (166, (0, 0)), "pivot_root": (155, (0, 0)), "chroot": (161, (0,)),
              "ptrace": (101, (0, 0, 0, 0)), "process_vm_readv": (310, (1, 0, 0, 0, 0, 0)),
              "process_vm_writev": (311, (1, 0, 0, 0, 0, 0)), "bpf": (321, (0, 0, 0)),
              "perf_event_open": (298, (0, 0, -1, -1, 0)), "userfaultfd": (323, (0,)), "keyctl": (250, (0, -3, 0)),
              "add_key": (248, (0, 0, 0, 0, 0)), "request_key": (249, (0, 0, 0, 0)), "kexec_load": (246, (0, 0, 0, 0)),
              "kexec_file_load": (320, (-1, -1, 0, 0, 0)), "init_module": (175, (0, 0, 0)),
              "finit_module": (313, (-1, 0, 0)), "delete_module": (176, (0, 0)), "personality": (135, (0xFFFFFFFF,)),
              "io_uring_setup": (425, (1, 0)), "io_uring_enter": (426, (-1, 0, 0, 0, 0, 0)),
              "io_uring_register": (427, (-1, 0, 0, 0)), "open_tree": (428, (-1, 0, 0)),
              "move_mount": (429, (-1, 0, -1, 0, 0)), "fsopen": (430, (0, 0)), "fsconfig": (431, (-1, 0, 0, 0, 0)),
              "fsmount": (432, (-1, 0, 0)), "fspick": (433, (-1, 0, 0)), "mount_setattr": (442, (-1, 0, 0, 0, 0))}
x86_seccomp = pytest.mark.skipif(not (SUPPORT["seccomp"] and __import__("platform").machine() == "x86_64"),
                                 reason="the system-call numbers below are x86-64's, and the filter needs seccomp")


@posix_only
@x86_seccomp
@pytest.mark.parametrize("name", sorted(DENIED_X86))
def test_attack_dangerous_system_calls_are_refused(name):
    nr, args = DENIED_X86[name]
    r = run_sandboxed(f"import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                      f"print(libc.syscall({nr}, *[ctypes.c_long(a) for a in {args!r}]), ctypes.get_errno())", timeout=3)
    assert r.stdout.split() == ["-1", "1"], (name, r.stdout, r.stderr[-300:])  # -1 and EPERM


@posix_only
@x86_seccomp
def test_attack_user_namespace_leaves_the_host_unchanged():
    "unshare(CLONE_NEWUSER) is refused, the sandbox stays in its namespace, and the filter is on (mode 2)."
    r = run_sandboxed("import ctypes, os\nbefore = os.readlink('/proc/self/ns/user')\n"
                      "rc = ctypes.CDLL(None, use_errno=True).unshare(0x10000000)\n"
                      "print(rc, before == os.readlink('/proc/self/ns/user'))\n"
                      "print([l for l in open('/proc/self/status') if l.startswith('Seccomp:')][0].split()[1])",
                      timeout=3)
    assert r.stdout.split() == ["-1", "True", "2"], (r.stdout, r.stderr[-300:])


@posix_only
@needs_seccomp
@pytest.mark.parametrize("family,kind", [("AF_INET", "SOCK_DGRAM"), ("AF_INET6", "SOCK_DGRAM"),
                                         ("AF_INET", "SOCK_STREAM"), ("AF_PACKET", "SOCK_RAW"),
                                         ("AF_INET", "SOCK_RAW"), ("AF_NETLINK", "SOCK_RAW")])
def test_attack_network_sockets_are_refused(family, kind):
    "UDP, TCP, raw and netlink sockets cannot even be created, whatever Landlock covers on this kernel."
    res, _ = _observe(f"import socket\nsocket.socket(socket.{family}, socket.{kind})\nprint('opened')")
    assert not res.ok and "opened" not in res.text and "PermissionError" in res.text, res.text


@posix_only
@needs_seccomp
def test_unix_sockets_threads_and_allowed_subprocesses_still_work():
    r = run_sandboxed("import socket, threading\na, b = socket.socketpair()\na.send(b'ok')\nprint(b.recv(2).decode())\n"
                      "t = threading.Thread(target=print, args=('thread',))\nt.start()\nt.join()", timeout=3)
    assert r.stdout.split() == ["ok", "thread"], r.stderr[-300:]
    r = run_sandboxed("import subprocess\nprint(subprocess.run(['true']).returncode)", timeout=3, allow_subprocesses=True)
    assert r.stdout.strip() == "0" and r.protections["seccomp"] and not r.protections["no_subprocesses"], r.stderr[-300:]


def test_a_bad_enum_value_gets_an_error_that_lists_the_allowed_ones():
    class Mix(BaseTool):
        name, description = "mix_test", "Mix a powder with a reagent."
        parameters = {"type": "object", "required": ["powder", "reagent"],
                      "properties": {"powder": {"type": "string"},
                                     "reagent": {"type": "string", "enum": ["acid", "oil"]}}}

        def execute(self, powder, reagent):
            return ToolResult(f"{powder}+{reagent}")

    res = Mix()(powder="tiku", reagent="vinegar")
    assert not res.ok
    assert "'vinegar' is not one of" in res.text and "reagent: string (one of 'acid', 'oil') (required)" in res.text
    assert Mix()(powder="tiku", reagent="oil").text == "tiku+oil"
