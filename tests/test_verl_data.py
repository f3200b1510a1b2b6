"""verl's data and the retrieval index (chapter 13): seeded samples, the row schema, parquet files verl reads, downloads,
and an index build that resumes after an interruption.

The test that reads our parquet with verl's own dataset class is skipped without verl; the rest need only the library.
"""
import json
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_r1_tutorial import verl_bridge as vb
from agent_r1_tutorial import verl_data as vd

HAS_VERL = __import__("importlib").util.find_spec("verl") is not None
needs_verl = pytest.mark.skipif(not HAS_VERL, reason="verl (CPU build) is not installed")


# ---------------------------------------------------------------- data


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(1, 20))
def test_sampling_is_seeded(seed, n):
    raw = vd.hotpotqa_toy_sample(20, seed=3)
    a, b = vd.hotpotqa_rows(raw, "train", n, seed), vd.hotpotqa_rows(raw, "train", n, seed)
    assert a == b and len(a) == n
    assert [r["extra_info"]["index"] for r in a] == list(range(n))
    ids = [r["extra_info"]["source_id"] for r in a]
    assert len(set(ids)) == n  # without replacement


def test_different_seeds_give_different_samples():
    raw = vd.gsm8k_toy_sample(50)
    samples = {tuple(r["extra_info"]["source_id"] for r in vd.gsm8k_rows(raw, "train", 10, s)) for s in range(5)}
    assert len(samples) == 5


def test_row_schema():
    (row,) = vd.hotpotqa_rows(vd.hotpotqa_toy_sample(3), "validation", 1, 0, search_index_dir="/idx")
    assert set(row) == {"data_source", "prompt", "ability", "reward_model", "agent_name", "extra_info"}
    assert row["agent_name"] == vb.AGENT_NAME and row["reward_model"]["style"] == "rule"
    assert row["prompt"][0]["role"] == "user" and "Question:" in row["prompt"][0]["content"]
    ex = row["extra_info"]
    assert ex["tools_kwargs"] == {"search": {"create_kwargs": {"k": 3, "max_chars": 1000, "index_dir": "/idx"}}}
    assert ex["env_kwargs"] == {"env": "tool", "tools": ["search"], "tool_format": "hermes", "max_turns": 5}
    assert ex["fmt"] == "hermes" and ex["metric"] == "em" and ex["need_tools_kwargs"] is True
    # through a retrieval service (chapter 04a): the row names the service's tool, the model still sees `search`
    (served,) = vd.hotpotqa_rows(vd.hotpotqa_toy_sample(3), "train", 1, 0, search_url="http://127.0.0.1:8765")
    ex = served["extra_info"]
    assert ex["tools_kwargs"] == {"search_service": {"create_kwargs": {"k": 3, "max_chars": 1000,
                                                                       "url": "http://127.0.0.1:8765"}}}
    assert ex["env_kwargs"]["tools"] == ["search_service"]
    with pytest.raises(ValueError, match="give search_url .* or search_index_dir .*, not both"):
        vd.hotpotqa_rows(vd.hotpotqa_toy_sample(3), "train", 1, 0, search_url="http://x:1", search_index_dir="/idx")
    (g,) = vd.gsm8k_rows(vd.gsm8k_toy_sample(3), "test", 1, 0)
    assert g["data_source"] == "openai/gsm8k" and g["extra_info"]["env_kwargs"]["tools"] == ["calculator"]
    assert g["reward_model"]["ground_truth"].lstrip("-").isdigit()


@pytest.mark.parametrize("mutate, msg", [
    (lambda r: r.pop("agent_name"), "no 'agent_name' column"),
    (lambda r: r.update(prompt=[]), "non-empty list"),
    (lambda r: r.update(prompt=[{"role": "user"}]), "non-empty list"),
    (lambda r: r["reward_model"].update(ground_truth=" "), "no ground_truth"),
    (lambda r: r["extra_info"].pop("env_kwargs"), "has no 'env_kwargs'"),
    (lambda r: r["extra_info"].update(index=True), "must be a int"),
    (lambda r: r["extra_info"].update(tools_kwargs={"search": {}}), "create_kwargs"),
    (lambda r: r.update(data_source=3), "must be a str"),
])
def test_check_row_names_the_problem(mutate, msg):
    (row,) = vd.hotpotqa_rows(vd.hotpotqa_toy_sample(2), "train", 1)
    mutate(row)
    with pytest.raises((ValueError, TypeError), match=msg):
        vd.check_row(row)


def test_bad_records_and_templates():
    with pytest.raises(ValueError, match="needs a non-empty 'question' and 'answer'"):
        vd.hotpotqa_rows([{"question": "q", "answer": ""}], "train")
    with pytest.raises(ValueError, match="must contain {question}"):
        vd.hotpotqa_rows(vd.hotpotqa_toy_sample(2), "train", template="no slot")
    with pytest.raises(ValueError, match="not a number"):
        vd.gsm8k_answer("#### twelve")
    with pytest.raises(ValueError, match="no rows"):
        vd.write_rows([], "/tmp/never.parquet")
    with pytest.raises(ValueError, match="non-negative int"):
        vd.seeded_sample(5, 2, seed=-1)


def test_parquet_round_trip_and_manifest(tmp_path):
    paths = vd.prepare_gsm8k(tmp_path, vd.gsm8k_toy_sample(20), vd.gsm8k_toy_sample(8, seed=1), n_train=10, n_val=3,
                             seed=4)
    back = vd.read_rows(paths["train"])
    assert back == vd.gsm8k_rows(vd.gsm8k_toy_sample(20), "train", 10, 4)
    man = json.loads((tmp_path / "manifest.json").read_text())
    assert man["n_train"] == 10 and man["n_validation"] == 3 and man["seed"] == 4
    bad = tmp_path / "bad.json"
    bad.write_text('{"not": "a list"}')
    with pytest.raises(ValueError, match="not a HotpotQA file"):
        vd.load_hotpotqa(bad)


@needs_verl
def test_verls_dataset_reads_our_parquet(tmp_path):
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from agent_r1_tutorial.tinylm import build_tiny_lm

    tok, _ = build_tiny_lm()
    paths = vd.prepare_hotpotqa(tmp_path, vd.hotpotqa_toy_sample(12), vd.hotpotqa_toy_sample(4, seed=1), 8, 2)
    ds = RLHFDataset(str(paths["train"]), tok, OmegaConf.create({"max_prompt_length": 512, "cache_dir": str(tmp_path),
                                                                 "filter_overlong_prompts_workers": 1}))
    rows = vd.read_rows(paths["train"])
    assert len(ds) == 8
    for i in (0, 7):
        item = ds[i]
        assert item["raw_prompt"] == rows[i]["prompt"] and item["agent_name"] == vb.AGENT_NAME
        assert item["tools_kwargs"] == rows[i]["extra_info"]["tools_kwargs"] and item["index"] == i


def test_download_is_cached_and_names_failures(tmp_path):
    src = tmp_path / "a.bin"
    src.write_bytes(b"x" * 5000)
    dst = vd.download(src.as_uri(), tmp_path / "d" / "a.bin", progress=False)
    assert dst.read_bytes() == src.read_bytes() and not (tmp_path / "d" / "a.bin.part").exists()
    src.write_bytes(b"changed")
    assert vd.download(src.as_uri(), dst, progress=False).read_bytes() == b"x" * 5000  # not fetched again
    with pytest.raises(RuntimeError, match="failed"):
        vd.download((tmp_path / "missing").as_uri(), tmp_path / "m.bin", progress=False)


# ---------------------------------------------------------------- index


class CountingEncoder:
    "A stand-in encoder (hash features) that counts its calls and can fail on a chosen call."
    name, dim = "counting", 16

    def __init__(self, fail_on=None):
        self.calls, self.fail_on = 0, fail_on

    def _emb(self, texts):
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, t in enumerate(texts):
            for w in t.lower().split():
                out[i, hash(w) % self.dim] += 1
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-6)

    def encode_docs(self, texts):
        self.calls += 1
        if self.calls == self.fail_on:
            raise KeyboardInterrupt("interrupted")
        return self._emb(texts)

    def encode_queries(self, queries):
        return self._emb(queries)


def test_index_build_resumes_after_an_interruption_and_is_cached(tmp_path):
    passages = vd.hotpotqa_passages(vd.hotpotqa_toy_sample(20))
    enc = CountingEncoder(fail_on=3)
    with pytest.raises(KeyboardInterrupt):
        vd.build_corpus_index(passages, tmp_path, encoder=enc, shard_size=10, progress=False)
    assert len(list((tmp_path / "shards").glob("emb-*.npy"))) == 2 and not (tmp_path / "config.json").exists()
    enc2 = CountingEncoder()
    vd.build_corpus_index(passages, tmp_path, encoder=enc2, shard_size=10, progress=False)
    n_shards = -(-len(passages) // 10)
    assert enc2.calls == n_shards - 2, "finished shards must not be recomputed"
    assert json.loads((tmp_path / "config.json").read_text())["n_docs"] == len(passages)
    enc3 = CountingEncoder()
    vd.build_corpus_index(passages, tmp_path, encoder=enc3, shard_size=10, progress=False)
    assert enc3.calls == 0  # cached
    with pytest.raises(ValueError, match="shard_size"):
        vd.build_corpus_index(passages, tmp_path / "x", encoder=enc3, shard_size=0)


def test_beir_corpus_reads_zip_gz_and_jsonl(tmp_path):
    import gzip
    import zipfile

    lines = [json.dumps({"_id": f"d{i}", "title": f"T{i}", "text": "" if i == 1 else f"text {i}"}) for i in range(3)]
    (tmp_path / "c.jsonl").write_text("\n".join(lines) + "\n")
    with gzip.open(tmp_path / "c.jsonl.gz", "wt") as f:
        f.write("\n".join(lines) + "\n")
    with zipfile.ZipFile(tmp_path / "hotpotqa.zip", "w") as z:
        z.writestr("hotpotqa/corpus.jsonl", "\n".join(lines) + "\n")
    for p in ("c.jsonl", "c.jsonl.gz", "hotpotqa.zip"):
        assert [d["id"] for d in vd.beir_corpus(tmp_path / p)] == ["d0", "d2"]  # the empty passage is skipped


def test_index_build_gives_its_encoder_back(tmp_path):
    "After build_corpus_index nothing holds the encoder: on a GPU box its memory is free before training starts."
    code = f"""
import gc, weakref
from agent_r1_tutorial import search, verl_data as vd
ref = weakref.ref(search._load_model("all-MiniLM-L6-v2", "cpu"))  # what the build's encoder will be (cached)
vd.build_corpus_index(vd.hotpotqa_passages(vd.hotpotqa_toy_sample(4)), {str(tmp_path / 'idx')!r}, progress=False)
gc.collect()
print("released" if ref() is None else "held")
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.stdout.strip().endswith("released"), res.stdout + res.stderr
