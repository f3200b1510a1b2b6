"""Property tests for agent_r1_tutorial.core, beyond the examples in nbs/00_core.ipynb."""
import math
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from agent_r1_tutorial.core import MetricsLogger, ema, env_report, get_device, read_jsonl, seed_everything

finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False)


@given(st.lists(finite, min_size=1, max_size=200), st.floats(min_value=0, max_value=0.999))
def test_corrected_ema_stays_within_the_range_seen_so_far(xs, beta):
    out = ema(xs, beta)
    for t in range(len(xs)):
        lo, hi = min(xs[: t + 1]), max(xs[: t + 1])
        assert lo - 1e-6 * (1 + abs(lo)) <= out[t] <= hi + 1e-6 * (1 + abs(hi))


@given(st.lists(st.one_of(finite, st.just(float("nan"))), min_size=1, max_size=100), st.floats(0, 0.99))
def test_ema_skips_missing_points(xs, beta):
    out = ema(xs, beta)
    kept = [x for x in xs if not math.isnan(x)]
    if kept:
        np.testing.assert_allclose(out[~np.isnan(xs)], ema(kept, beta), rtol=1e-9, atol=1e-9)
    first = next((i for i, x in enumerate(xs) if not math.isnan(x)), len(xs))
    assert np.isnan(out[:first]).all() and not np.isnan(out[first:]).any()


@given(st.lists(st.dictionaries(st.text(min_size=1, max_size=8).filter(lambda k: k not in ("step", "time")),
                                st.one_of(st.integers(-2**40, 2**40), finite, st.booleans(), st.none(),
                                          st.text(max_size=20)), max_size=5), min_size=1, max_size=10))
@settings(max_examples=50, deadline=None)
def test_metrics_round_trip(tmp_path_factory, records):
    path = tmp_path_factory.mktemp("log") / "m.jsonl"
    with MetricsLogger(path) as log:
        for i, rec in enumerate(records):
            log.log(i, **rec)
    back = read_jsonl(path)
    assert [r["step"] for r in back] == list(range(len(records)))
    for rec, got in zip(records, back):
        assert {k: got[k] for k in rec} == rec


def test_a_crash_keeps_every_finished_line(tmp_path):
    path = tmp_path / "m.jsonl"
    log = MetricsLogger(path)
    for i in range(5):
        log.log(i, loss=1.0 / (i + 1))
    # no close(): the process "dies" here; every line was flushed when it was logged
    assert len(read_jsonl(path)) == 5
    with open(path, "a") as f:
        f.write('{"step": 5, "lo')  # torn mid-write
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert [r["step"] for r in read_jsonl(path)] == [0, 1, 2, 3, 4]
    log.close()


def test_seed_everything_reproduces_torch_sampling():
    seed_everything(123)
    a = torch.multinomial(torch.ones(50), 10, generator=None)
    seed_everything(123)
    b = torch.multinomial(torch.ones(50), 10)
    assert torch.equal(a, b)
    with pytest.raises(TypeError, match="seed must be an int"):
        seed_everything("7")


def test_get_device_and_env_report_agree():
    rep = env_report()
    assert (get_device("auto").type == "cuda") == bool(rep["gpus"])
    assert rep["packages"]["agent_r1_tutorial"] is not None
