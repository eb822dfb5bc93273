"""ONNX Runtime GenAI 0.18.0 (in ``.venv-onnxgenai``, built by ``scripts/env.sh onnxgenai``) on the exactly-known
checkpoints.

Run by the ORT GenAI stage (``.venv-onnxgenai/bin/python -m pytest engine_tests/test_onnxgenai.py``). A missing
engine is an error at collection (``import onnxruntime_genai``), never a skip. Checked here:

* the builder's exports return the tables' logits bit for bit (whole context and token by token, both variants);
* findings: the wheel does not declare what its builder imports (onnx, onnx_ir, torch, transformers); the
  builder's ``--help`` crashes (``ValueError`` in an argparse format string); ``get_sequence()`` drops a sampled EOS
  (``get_next_tokens()`` has it); there is no ``ignore_eos`` (``eos_token_id: []`` falls back to ``pad_token_id``,
  an id outside the vocabulary is refused);
* top-k: the kept set is ``std::partial_sort``'s heap selection (:func:`onnxgenai.partial_sort_top_k`) on every
  tied (row, k) of ``order1-target``; it is the lowest ids at k = 2 (the matrix), not at five other pairs;
* the ``ties`` case under speculation (8 000 completions): it fits the declared lowest-ids rule, and is NOT
  CERTIFIED under the keep-all rule with the tool's line naming the rule it fits;
* the multi-token-prediction generator cannot be built from these checkpoints (the exact error).
"""
from __future__ import annotations

import importlib.metadata as md
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import onnxruntime_genai as og  # ImportError at collection when the engine is missing: never a skip
import pytest

from conformance.engines.onnxgenai import adapter as ad
from conformance.engines.adapter import Request
from conformance.engines.matrix import case
from specdec_ref.exact import exact_model


@pytest.fixture(scope="module")
def paths():
    return ad.export()


def _gen(model, prompt, n, seed, **opts):
    p = og.GeneratorParams(model)
    o = {"max_length": len(prompt) + n, "do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0}
    o.update(opts)
    if seed is not None:
        o["random_seed"] = seed
    p.set_search_options(**o)
    g = og.Generator(model, p)
    g.append_tokens(np.asarray(prompt, dtype=np.int32))
    toks = []
    while not g.is_done():
        g.generate_next_token()
        toks.append(int(g.get_next_tokens()[0]))
    return toks, [int(t) for t in g.get_sequence(0)][len(prompt):]


def test_version():
    assert og.__version__ == ad.VERSION


def test_exports_return_the_tables_logits_bit_for_bit(paths):
    rows = ad.check_logits(paths)
    assert {(r["model"], r["variant"]) for r in rows} == {(m, v) for m in ad.MODELS for v in ("eos", "plain")}
    for r in rows:
        assert r["passed"] and r["max_abs_diff"] == 0.0 and r["bit_exact_positions"] == r["positions"] >= 40, r


def test_finding_the_wheel_does_not_declare_what_its_builder_imports():
    declared = " ".join(md.requires("onnxruntime-genai") or []).lower()
    source = (Path(og.__file__).parent / "models" / "builder.py").read_text()
    for module in ("onnx_ir", "torch", "transformers"):
        assert f"import {module}" in source or f"from {module} import" in source, module
        assert module.replace("_", "-") not in declared and module not in declared, declared
    assert "onnx" not in declared.replace("onnxruntime", "")


def test_finding_builder_help_crashes():
    r = subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "--help"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode != 0
    assert "ValueError: unsupported format character" in r.stderr


def test_finding_get_sequence_drops_a_sampled_eos(paths):
    model = og.Model(str(paths[("order1-target", "eos")]))
    for seed in range(200):
        toks, seq = _gen(model, [3, 1], 4, seed, temperature=0.7, top_k=2)
        if 7 in toks:
            assert toks[-1] == 7 and seq == toks[:-1]  # the EOS that stopped it is not in the sequence
            return
    raise AssertionError("no EOS sampled in 200 seeds")


def test_finding_no_ignore_eos(paths, tmp_path):
    import json
    import shutil

    src = paths[("order1-target", "eos")]
    for eos, expect in (([], "stops"), (8, "refused")):
        d = tmp_path / f"eos-{eos}"
        shutil.copytree(src, d)
        cfg = json.loads((d / "genai_config.json").read_text())
        cfg["model"]["eos_token_id"] = eos
        (d / "genai_config.json").write_text(json.dumps(cfg))
        if expect == "refused":
            with pytest.raises(Exception, match="must be in range"):
                _gen(og.Model(str(d)), [3, 1], 6, 0)
        else:  # [] falls back to pad_token_id (7): EOS still stops
            outs = [_gen(og.Model(str(d)), [3, 1], 6, s)[0] for s in range(100)]
            assert any(o[-1] == 7 and len(o) < 6 for o in outs)
    plain = og.Model(str(paths[("order1-target", "plain")]))  # the adapter's way: token 7 is ordinary there
    outs = [_gen(plain, [3, 1], 6, s)[0] for s in range(100)]
    assert all(len(o) == 6 for o in outs) and any(7 in o for o in outs)


def test_top_k_keeps_the_heap_selection(paths):
    """Every (row, k) of order1-target whose k-th logit is tied with the (k+1)-th: the engine's support (T 3, one
    token, 600 seeds) is the model's set; five of them are not the lowest ids."""
    model = og.Model(str(paths[("order1-target", "eos")]))
    L = np.asarray(exact_model("order1-target").next_logits([[a] for a in range(8)]), dtype=np.float64)
    not_lowest = []
    for a in range(8):
        order = sorted(range(8), key=lambda i: (-L[a][i], i))
        for k in range(2, 8):
            if L[a][order[k - 1]] != L[a][order[k]]:
                continue  # no tie at the boundary: every rule agrees
            got = Counter(_gen(model, [a], 1, s, top_k=k, temperature=3.0)[0][0] for s in range(600))
            assert set(got) == ad.partial_sort_top_k(list(L[a]), k), (a, k, got)
            if set(got) != set(order[:k]):
                not_lowest.append((a, k))
    assert sorted(not_lowest) == [(2, 3), (2, 4), (3, 4), (4, 5), (6, 3)]
    assert all(k != 2 for _, k in not_lowest)  # the matrix's top-k through a tie is k = 2


def test_ties_case_fits_the_lowest_ids_rule_only():
    from conformance.samples import certify_samples

    c = case("ties")
    cfg = ad.ADAPTER.config("draft-k3")
    session = ad.ADAPTER.open(cfg, "order1")
    try:
        lowest = ad.ADAPTER.conventions.sampling(c.sampling)
        reqs = [Request(c.name, c.prompt, lowest, c.max_new_tokens, True, 7, c.seed(i)) for i in range(8000)]
        outs = session.generate(reqs)
    finally:
        session.close()
    records = [{"prompt_ids": list(c.prompt), "completion_ids": o["completion_ids"], "seed": r.seed}
               for r, o in zip(reqs, outs)]
    declared = certify_samples(records, model=c.model, sampling=lowest, max_new_tokens=c.max_new_tokens, eos_id=True)
    assert declared.level in ("certified", "reduced"), declared.headline  # 8 000 here; the matrix has 20 000
    keep_all = certify_samples(records, model=c.model, sampling=c.sampling, max_new_tokens=c.max_new_tokens,
                               eos_id=True)
    assert keep_all.level == "not_certified" and "fits --top-k-ties lowest-ids" in (keep_all.explained or ""), \
        (keep_all.headline, keep_all.explained)


def test_mtp_generator_cannot_be_built_from_these_checkpoints(paths):
    """ORT GenAI's MTP generator (greedy, batch 1) runs a Qwen3.5/3.6-style MTP head exported by the builder only
    from a checkpoint declaring ``mtp_num_hidden_layers > 0``; the exactly-known Llama checkpoints declare none, and
    the generator refuses a main model without a hidden-states output."""
    builders = Path(og.__file__).parent / "models" / "builders"
    assert "mtp" not in (builders / "llama.py").read_text().lower()
    assert "mtp_num_hidden_layers" in (builders / "qwen.py").read_text()
    target = og.Model(str(paths[("order1-target", "eos")]))
    draft = og.Model(str(paths[("order1-draft-close", "eos")]))
    params = og.GeneratorParams(target)
    params.set_search_options(max_length=8, do_sample=False)
    with pytest.raises(RuntimeError, match="main_hidden_states must name a main-model output"):
        og.MtpGenerator(target, draft, params)


def test_ngram_is_sample_and_match_identical_per_seed(paths, tmp_path):
    cfg = ad.ADAPTER.config("ngram")
    folder = ad.compose_config(paths[("order1-target", "eos")], None, cfg.options, tmp_path / "ng")
    ngram, plain = og.Model(str(folder)), og.Model(str(paths[("order1-target", "eos")]))
    kw = {"temperature": 1.5, "top_k": 4, "top_p": 0.6}
    same = sum(_gen(ngram, [2, 6], 8, s, **kw)[0] == _gen(plain, [2, 6], 8, s, **kw)[0] for s in range(300))
    assert same == 300


def test_the_engine_states_the_context_it_enforces_and_ends_a_request_at_it(paths, tmp_path):
    """The context edge's evidence: the engine refuses ``max_length`` past its model's ``context_length`` and says
    which (128 for every export); a request that ends exactly there (prompt 120 + 8) runs to its last position with the
    draft model, having drafted."""
    cfg = ad.ADAPTER.config("draft-k3")
    folder = ad.compose_config(paths[("order2-target", "plain")], paths[("order2-draft", "plain")], cfg.options,
                               tmp_path / "edge")
    model = og.Model(str(folder))
    assert ad.stated_context(model) == ad.EXPORTED_CONTEXT == 128
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=128, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, random_seed=1)
    g = og.Generator(model, params)
    g.append_tokens(np.asarray([6] + [0] * 119, dtype=np.int32))
    toks = []
    while not g.is_done():
        g.generate_next_token()
        toks.append(int(g.get_next_tokens()[0]))
    stats = g.get_speculative_stats()
    assert len(toks) == 8 and stats["draft_tokens_proposed"] > 0, (toks, stats)
