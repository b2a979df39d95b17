"""bench/convergence.py's pieces on the CPU: the byte corpus is deterministic and its train / validation files are
disjoint, the decoder learns over a few steps and te_compile's reference target trains it as eager does, and
the JSON the benchmark writes has its fields. (The convergence run itself needs a GPU:
tests/test_cuda_convergence.py.)"""

from __future__ import annotations

import importlib.util
import json
import os
import sys

import pytest
import torch
import torch.nn.attention.flex_attention  # noqa: F401

HERE = os.path.dirname(__file__)


def _bench():
    spec = importlib.util.spec_from_file_location("bench_convergence",
                                                  os.path.join(HERE, "..", "bench", "convergence.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclass looks its module up there
    spec.loader.exec_module(mod)
    return mod


conv = _bench()


@pytest.fixture(scope="module")
def corpus():
    return conv.load_corpus(conv.smoke_config(max_train_bytes=300_000, seq=64))


def test_corpus_is_deterministic_and_splits_files_disjointly(corpus):
    cfg = conv.smoke_config(max_train_bytes=300_000, seq=64)
    again = conv.load_corpus(cfg)
    for split in ("train", "val"):
        assert torch.equal(corpus[split]["bytes"], again[split]["bytes"])
        assert corpus[split]["files"] == again[split]["files"]
        assert corpus[split]["bytes"].numel() > 4 * cfg.seq
    train, val = set(corpus["train"]["files"]), set(corpus["val"]["files"])
    assert train and val and not train & val
    assert all(conv.is_validation(f, cfg.val_fraction) for f in val)
    assert not any(conv.is_validation(f, cfg.val_fraction) for f in train)
    # a smaller limit reads a prefix of the same training files
    small = conv.load_corpus(conv.smoke_config(max_train_bytes=100_000, seq=64))
    assert corpus["train"]["files"][: len(small["train"]["files"])] == small["train"]["files"]


def test_document_ids_start_after_each_separator(corpus):
    b, d = corpus["train"]["bytes"], corpus["train"]["docs"]
    ends = (b == conv.SEP).nonzero().flatten()
    assert len(ends) == len(corpus["train"]["files"]) and ends[-1] == b.numel() - 1
    assert torch.equal(d[ends[:-1] + 1], torch.arange(1, len(ends), dtype=torch.int32))
    assert torch.equal(d[ends], torch.arange(len(ends), dtype=torch.int32))  # the separator ends its document
    x, y, docs = conv.batch(corpus["train"], torch.tensor([0, int(ends[0]) - 3]), 64)
    assert torch.equal(x[:, 1:], y[:, :-1]) and (docs[:, 0] == 0).all()
    assert docs[1, 3] == 0 and docs[1, 4] == 1  # the window crosses the first file's end


def test_validation_windows_are_the_same_for_every_seed(corpus):
    cfg = conv.smoke_config(seq=64)
    a, b = conv.val_offsets(corpus["val"], cfg), conv.val_offsets(corpus["val"], cfg)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    ta, tb = conv.train_offsets(corpus["train"], cfg, 0), conv.train_offsets(corpus["train"], cfg, 1)
    assert not torch.equal(next(ta), next(tb))


def test_document_mask_is_causal_within_documents():
    docs = torch.tensor([[0, 0, 1, 1, 1]])
    m = conv.document_mask(docs)
    q, kv = torch.arange(5)[:, None], torch.arange(5)[None, :]
    got = m(torch.tensor(0), torch.tensor(0), q, kv)
    want = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 1, 1, 1]])
    assert torch.equal(got, want.bool())


@pytest.mark.parametrize("attention", ["sdpa", "flex", "flex-bias"])
def test_decoder_learns_and_the_reference_target_trains_as_eager_does(corpus, attention):
    cfg = conv.smoke_config(attention=attention, seq=64, steps=10, warmup=2, train_every=1, val_every=100,
                            val_batches=1, max_train_bytes=300_000)
    check = torch.nn.attention.flex_attention._validate_device
    eager = conv.train(cfg, "eager", corpus)
    te = conv.train(cfg, "te_compile", corpus)
    losses = [v for _, v in eager["train"]]
    assert len(losses) == 10 and sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.2, losses
    assert te["sites"] and all(runs_on == "reference" for runs_on, _ in te["sites"]), te["sites"]
    te_losses = [v for _, v in te["train"]]
    assert te_losses == pytest.approx(losses, abs=2e-3, rel=0)
    assert te["final_val"] == pytest.approx(eager["final_val"], abs=2e-3)
    assert torch.nn.attention.flex_attention._validate_device is check  # the CPU lift is put back


def test_summary_compares_with_the_seed_spread():
    res = {"torch.compile": {"final_val": 1.00}, "torch.compile-B": {"final_val": 1.02},
           "te_compile": {"final_val": 1.035}, "always": {"final_val": 1.05}}
    s = conv.summary(res)
    assert s["seed_gap"] == pytest.approx(0.02) and s["torch.compile_mean"] == pytest.approx(1.01)
    assert s["te_compile"]["inside_spread"] and not s["always"]["inside_spread"]
    assert s["te_compile"]["gap_to_mean"] == pytest.approx(0.025)
    assert "gap 0.0200" in conv.summary_line(s)
    assert "seed_gap" not in conv.summary({"torch.compile": {"final_val": 1.0}})


def test_the_same_seed_gap_is_the_mean_absolute_difference_of_the_training_curves():
    a = {"final_val": 1.0, "train": [[10, 2.0], [20, 1.5], [30, 1.2]]}
    te = {"final_val": 1.0, "train": [[10, 2.0], [20, 1.53], [30, 1.14]]}
    b = {"final_val": 1.02, "train": [[10, 2.1], [20, 1.4], [30, 1.3]]}
    assert conv.same_seed_gap(te, a) == pytest.approx(0.03)
    assert conv.same_seed_gap({"train": [[10, 2.0], [20, 1.5]]}, a) is None  # other steps: no comparison
    s = conv.summary({"torch.compile": a, "torch.compile-B": b, "te_compile": te})
    assert s["te_compile"]["same_seed_gap"] == pytest.approx(0.03) and s["seed_curve_gap"] == pytest.approx(0.1)
    line = conv.summary_line(s)
    assert "curve 0.0300 from torch.compile's" in line and "curve 0.1000 from torch.compile's" in line, line


def test_smoke_run_writes_the_json(tmp_path):
    out = tmp_path / "conv.json"
    rc = conv.main(["--smoke", "--columns", "eager", "--steps", "2", "--val-every", "1", "--val-batches", "1",
                    "--max-train-bytes", "100000", "--json", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    for key in ("date", "command", "card", "torch", "cudnn", "precision", "config", "columns", "summary"):
        assert key in doc, key
    col = doc["columns"]["eager"]
    for key in ("train", "val", "final_val", "step_ms_median", "params", "seed", "graphs", "corpus"):
        assert key in col, key
    assert doc["config"]["steps"] == 2 and doc["config"]["device"] == "cpu"
    assert [s for s, _ in col["val"]] == [1, 2] and col["val"][-1][1] == col["final_val"]
    # --append keeps the columns already there and adds the new one
    rc = conv.main(["--smoke", "--columns", "torch.compile", "--steps", "2", "--val-every", "1", "--val-batches",
                    "1", "--max-train-bytes", "100000", "--json", str(out), "--append"])
    doc2 = json.loads(out.read_text())
    assert rc == 0 and set(doc2["columns"]) == {"eager", "torch.compile"} and len(doc2["commands"]) == 2
    assert doc2["columns"]["eager"] == col
    assert doc2["columns"]["torch.compile"]["final_val"] == pytest.approx(col["final_val"], abs=1e-5)


def test_each_column_compiles_with_caches_of_its_own(monkeypatch):
    """A column's process gets Inductor's and Triton's caches in a fresh folder of its own: a cache another column or
    an earlier run warmed would hand back a graph compiled from other code (AOTAutograd's key does not cover the
    bodies of te_compile's ops), so a column would not measure the code it names."""
    seen = []

    def fake_run(cmd, env, **kw):
        seen.append((env["TORCHINDUCTOR_CACHE_DIR"], env["TRITON_CACHE_DIR"]))
        assert not os.path.exists(env["TORCHINDUCTOR_CACHE_DIR"])  # cold: nothing compiled there yet
        return type("P", (), {"returncode": 1, "stderr": "stop", "stdout": ""})()

    monkeypatch.setattr(conv.subprocess, "run", fake_run)
    cfg = conv.smoke_config()
    for col in ("te_compile", "torch.compile"):
        assert conv.run_column(cfg, col)["error"] == "stop"
    (a_ind, a_tri), (b_ind, b_tri) = seen
    assert a_ind != b_ind and a_tri != b_tri and os.environ.get("TORCHINDUCTOR_CACHE_DIR") not in (a_ind, b_ind)


def test_parallel_columns_keep_their_losses_and_drop_their_step_times(tmp_path):
    """--parallel trains the columns at once (one shared device): each column's curve and final loss are written,
    its step times are not (they would measure the sharing), and the JSON says the columns ran at once."""
    out = tmp_path / "conv.json"
    rc = conv.main(["--smoke", "--columns", "eager,torch.compile", "--steps", "2", "--val-every", "1",
                    "--val-batches", "1", "--max-train-bytes", "100000", "--json", str(out), "--parallel"])
    doc = json.loads(out.read_text())
    assert rc == 0 and doc["parallel"] is True and set(doc["columns"]) == {"eager", "torch.compile"}
    for col in doc["columns"].values():
        assert [s for s, _ in col["val"]] == [1, 2] and "step_ms_median" not in col and "first_step_s" not in col


def test_the_learned_bias_gets_its_gradient_through_te_compile():
    """flex-bias: the table's gradient through te_compile (reference target: the materialized bias and its dBias)
    is eager's, and it is not zero (the bias is learned, so a dBias error would change the training)."""
    cfg = conv.smoke_config(attention="flex-bias", seq=32, layers=1)
    torch.manual_seed(0)
    x = torch.randint(0, 256, (2, 32))
    grads = []
    with conv._cpu_flex_with_grad(True):
        for column in ("eager", "te_compile"):
            model = conv.make_model(cfg, 0)
            with torch.no_grad():
                model.blocks[0].rel.normal_(std=0.5)  # a bias that shapes the attention
            fn = conv.compiled(model, column, cfg)
            fn(x, x.roll(-1, 1), conv.block_mask_for(cfg, None, "cpu")).backward()
            grads.append(model.blocks[0].rel.grad.clone())
    torch._dynamo.reset()
    assert grads[0].abs().sum() > 0
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-4, atol=1e-6)


def test_a_repeat_column_trains_its_column_again_on_the_same_seed(tmp_path):
    """``torch.compile#2`` is torch.compile once more (seed A; its own process): the summary counts it among the
    torch.compile runs whose spread te_compile's loss is judged against, and reports the repeat's own spread."""
    out = tmp_path / "conv.json"
    rc = conv.main(["--smoke", "--columns", "torch.compile,torch.compile#2", "--steps", "2", "--val-every", "1",
                    "--val-batches", "1", "--max-train-bytes", "100000", "--json", str(out)])
    doc = json.loads(out.read_text())
    a, b = doc["columns"]["torch.compile"], doc["columns"]["torch.compile#2"]
    assert rc == 0 and a["seed"] == b["seed"] == conv.SEED_A
    assert b["final_val"] == pytest.approx(a["final_val"], abs=1e-5)  # the CPU's kernels are deterministic
    assert conv.main(["--smoke", "--columns", "torch.compile#1", "--json", str(tmp_path / "x.json")]) == 2
    assert conv.main(["--smoke", "--columns", "nope#2", "--json", str(tmp_path / "x.json")]) == 2


def test_the_spread_counts_every_torch_compile_run():
    res = {"torch.compile": {"final_val": 1.00}, "torch.compile#2": {"final_val": 1.06},
           "torch.compile-B": {"final_val": 1.02}, "always": {"final_val": 1.10}, "always#2": {"final_val": 1.13}}
    s = conv.summary(res)
    assert s["torch.compile_columns"] == ["torch.compile", "torch.compile#2", "torch.compile-B"]
    assert s["seed_gap"] == pytest.approx(0.06) and s["repeat_spread"] == pytest.approx(0.06)
    assert s["torch.compile_mean"] == pytest.approx(3.08 / 3)
    assert s["always"]["inside_spread"] and not s["always#2"]["inside_spread"]  # band [0.94, 1.12]
    line = conv.summary_line(s)
    assert "runs 1.0000 / 1.0600 / 1.0200" in line and "one seed again 0.0600" in line and "always#2 1.1300" in line
