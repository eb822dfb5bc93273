"""Exactly-known models shipped as transformers checkpoints (specdec_ref.exact).

The checkpoints must reproduce their tables bit for bit in float32 (full forward and incremental
forward over a DynamicCache), stay within the stated bound in bfloat16, load with the plain
transformers auto classes, and the tables must have the designed ties, EOS masses and acceptances.
"""

from __future__ import annotations

import itertools
import json
import random
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache, GenerationConfig

from specdec_ref.exact import (
    ASSET_ROOT,
    BF16_LOGIT_BOUND,
    BF16_PROB_BOUND,
    BOS_LOGIT,
    EXACT_MODELS,
    EXACT_PAIRS,
    MAX_POSITIONS,
    MIN_SCORE_GAP,
    ExactModel,
    build,
    build_files,
    check,
    exact_model,
    exact_pair,
    prev_head_scores,
)
from specdec_ref.exact.long import LONG_MARKERS, LONG_MAX_POSITIONS, LONG_SHAPES
from specdec_ref.exact.offset import LOGIT_OFFSET, OFFSET_MODELS, bf16_table
from specdec_ref.forward import cache_arg, reference_logits
from specdec_ref.warp import scale_temperature, top_k_filter, top_p_filter

NAMES = list(EXACT_MODELS)
#: the models of 128 positions (the long family has its own long-context tests: tests/test_exact_long.py)
SHORT_NAMES = [n for n in NAMES if EXACT_MODELS[n].family != "long"]
ORDER2_REAL = (0, 1, 2, 3, 4, 5, 7)
#: Mean token-wise acceptance of each pair over the target's table rows, as stated in the docs.
STATED_ACCEPTANCE = {
    "order1-close": 0.8987,
    "order1-far": 0.6023,
    "order1-same": 1.0,
    "order2-order1": 0.7005,
    "order2-close": 0.9053,
    "order1-close-offset": 0.8987,  # order1-close + 80 on every logit: the same law
    "long-close": 0.9104,
}


def _short_contexts(m: ExactModel) -> list[list[int]]:
    """order1: every context of length 1..3; order2: <bos> followed by 0..3 tokens (lengths 1..4); long: those of
    order2 and every marker followed by two tokens."""
    if m.family == "order1":
        return [list(c) for n in (1, 2, 3) for c in itertools.product(range(m.vocab), repeat=n)]
    out = [[m.bos_id] + list(c) for n in (0, 1, 2, 3) for c in itertools.product(ORDER2_REAL, repeat=n)]
    if m.family == "long":
        out += [[m.bos_id, k] + list(c) for k in LONG_MARKERS for c in itertools.product(ORDER2_REAL, repeat=2)]
    return out


def _random_contexts(m: ExactModel, num: int, length: int, seed: int) -> torch.Tensor:
    rng = random.Random(seed)
    if m.family == "order1":
        rows = [[rng.randrange(m.vocab) for _ in range(length)] for _ in range(num)]
    else:
        rows = [[m.bos_id] + [rng.choice(ORDER2_REAL) for _ in range(length - 1)] for _ in range(num)]
    if m.family == "long":  # one marker anywhere (or none) in each row
        for row in rows:
            spot = rng.randrange(length + 2)
            if spot < length:
                row[max(spot, 1)] = rng.choice(LONG_MARKERS)
    return torch.tensor(rows)


def _by_length(contexts):
    groups: dict[int, list[list[int]]] = {}
    for c in contexts:
        groups.setdefault(len(c), []).append(c)
    return groups


def _table_rows(m: ExactModel, ids: torch.Tensor) -> torch.Tensor:
    """``[B, n, V]`` table logits after every prefix of every row of ``ids`` (NaN where a prefix is no context)."""
    return torch.stack([m.prefix_logits(r) for r in ids.tolist()])


def _equal_where_defined(got: torch.Tensor, expected: torch.Tensor) -> bool:
    """``got == expected`` bit for bit wherever the table defines the law (``expected`` not NaN)."""
    defined = ~torch.isnan(expected)
    return bool(defined.any()) and torch.equal(got[defined], expected[defined])


def _incremental_logits(model, ids: torch.Tensor, schedule=(1,)) -> torch.Tensor:
    """The model's own incremental forward over a DynamicCache: ``ids`` fed in chunks whose sizes cycle
    through ``schedule`` (positions from the cache length); logits ``[B, n, V]`` as float64."""
    cache = DynamicCache(config=model.config)
    out, start, k = [], 0, 0
    with torch.no_grad():
        while start < ids.shape[1]:
            step = schedule[k % len(schedule)]
            chunk = ids[:, start : start + step]
            out.append(model(input_ids=chunk, **cache_arg(model, cache), use_cache=True).logits)
            start += chunk.shape[1]
            k += 1
    assert cache.get_seq_length() == ids.shape[1]
    return torch.cat(out, dim=1).double()


def _probs_from(logits: torch.Tensor) -> torch.Tensor:
    return torch.softmax(logits.double(), dim=-1)


# --------------------------------------------------------------------------- loading and files


@pytest.mark.parametrize("name", NAMES)
def test_checkpoint_loads_with_the_auto_classes(name):
    m = exact_model(name)
    model = AutoModelForCausalLM.from_pretrained(str(m.path))  # plain defaults: sdpa, dtype from config
    assert type(model).__name__ == m.arch == "LlamaForCausalLM"
    assert model.dtype == torch.float32
    cfg = model.config
    assert cfg.vocab_size == m.vocab and cfg.eos_token_id == m.eos_id and cfg.bos_token_id == m.bos_id
    assert cfg.max_position_embeddings == m.max_positions == (LONG_MAX_POSITIONS if m.family == "long" else MAX_POSITIONS)
    gen = GenerationConfig.from_pretrained(str(m.path))
    assert gen.eos_token_id == m.eos_id and gen.pad_token_id == m.eos_id
    tok = AutoTokenizer.from_pretrained(str(m.path))
    assert len(tok) == m.vocab and tok.eos_token_id == m.eos_id and tok.eos_token == "<eos>"
    assert tok.convert_ids_to_tokens(list(range(m.vocab))) == m.token_names()
    if m.bos_id is None:
        assert tok("t3 t0 <eos>").input_ids == [3, 0, m.eos_id]
    else:
        assert tok.bos_token_id == m.bos_id == 6
        assert tok("t3 t0 <eos>").input_ids == [m.bos_id, 3, 0, m.eos_id]  # <bos> is prepended
    assert tok.decode([1, 2, m.eos_id], skip_special_tokens=True) == "t1 t2"
    # the default (sdpa) implementation is exact too
    ids = _random_contexts(m, 4, 40, seed=7)
    with torch.no_grad():
        got = model(input_ids=ids).logits.double()
    assert _equal_where_defined(got, _table_rows(m, ids))


def test_sizes_and_loader_cache():
    sizes = {}
    for name, m in EXACT_MODELS.items():
        files = sorted(p.name for p in m.path.iterdir())
        assert files == sorted(build_files(m))
        sizes[name] = sum(p.stat().st_size for p in m.path.iterdir())
        assert sizes[name] <= (800 if m.family == "long" else 150) * 1024, (name, sizes[name])
    assert sum(sizes.values()) <= 2 * 1024 * 1024
    m = exact_model("order1-target")
    model = m.load()
    assert m.load() is model and m.load(torch.float32) is model
    assert m.load(torch.bfloat16) is not model and m.load(torch.bfloat16).dtype == torch.bfloat16
    assert not model.training and not any(p.requires_grad for p in model.parameters())
    assert m.tokenizer() is m.tokenizer()


def test_check_passes_and_detects_a_changed_file(tmp_path, capsys):
    rows = check(verbose=True)
    out = capsys.readouterr().out
    assert [r["name"] for r in rows] == NAMES and all(not r["problems"] for r in rows)
    assert "order2-target" in out and "LlamaForCausalLM" in out
    by_name = {r["name"]: r for r in rows}
    assert by_name["order1-draft-same"]["acceptance"] == pytest.approx(1.0, abs=1e-12)
    # the builder is deterministic: a fresh build equals the shipped bytes
    build(tmp_path)
    for name in NAMES:
        for fname, data in build_files(exact_model(name)).items():
            assert (tmp_path / name / fname).read_bytes() == data == (ASSET_ROOT / name / fname).read_bytes()
    check(tmp_path, verbose=False)
    target = tmp_path / "order2-target" / "model.safetensors"
    data = bytearray(target.read_bytes())
    data[-1] ^= 1
    target.write_bytes(bytes(data))
    (tmp_path / "order1-draft-far" / "tokenizer.json").unlink()
    (tmp_path / "order1-target" / "extra.bin").write_bytes(b"x")
    with pytest.raises(AssertionError, match=r"order1-target: unexpected extra.bin.*order1-draft-far: tokenizer.json missing.*order2-target: model.safetensors differs"):
        check(tmp_path, verbose=False)
    shutil.rmtree(tmp_path / "order1-draft-far")
    with pytest.raises(AssertionError, match="order1-draft-far: config.json missing"):
        check(tmp_path, verbose=False)


def test_check_command_line():
    proc = subprocess.run(
        [sys.executable, "-m", "specdec_ref.exact", "check"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert "order1-draft-close" in proc.stdout and "0.8987" in proc.stdout


def test_config_states_the_construction():
    for m in EXACT_MODELS.values():
        cfg = json.loads((m.path / "config.json").read_text())
        assert cfg["rms_norm_eps"] == 0.0 and cfg["num_hidden_layers"] == 1 and cfg["dtype"] == "float32"
        assert cfg["architectures"] == ["LlamaForCausalLM"] and not cfg["tie_word_embeddings"]
        # a head size engines accept (vLLM's CPU attention: 32, 64, 80, 96, ..., 512), 2 heads; the long family:
        # production's shapes (head size 128 or 64, 4 query heads on 2 KV heads)
        if m.family == "long":
            assert cfg["head_dim"] == LONG_SHAPES[m.name][0] and cfg["num_attention_heads"] == 4
            assert cfg["num_key_value_heads"] == 2 and cfg["hidden_size"] == 64
        else:
            assert cfg["head_dim"] == 32 and cfg["num_attention_heads"] == cfg["num_key_value_heads"] == 2


# --------------------------------------------------------------------------- exactness


@pytest.mark.parametrize("name", NAMES)
def test_float32_is_bit_exact_on_every_short_context(name):
    m = exact_model(name)
    model = m.load()
    for length, contexts in _by_length(_short_contexts(m)).items():
        expected = m.next_logits(contexts)
        full = reference_logits(model, contexts)[:, -1].double()
        assert torch.equal(full, expected), f"{name}: full forward differs at length {length}"
        ids = torch.tensor(contexts)
        inc = _incremental_logits(model, ids)
        assert _equal_where_defined(inc, _table_rows(m, ids)), f"{name}: incremental forward differs at length {length}"


@pytest.mark.parametrize("name", SHORT_NAMES)
def test_float32_is_bit_exact_up_to_max_positions(name):
    m = exact_model(name)
    model = m.load()
    ids = _random_contexts(m, 12, MAX_POSITIONS, seed=NAMES.index(name))
    expected = _table_rows(m, ids)
    assert torch.equal(reference_logits(model, ids).double(), expected)
    # one token at a time, and blocks of mixed sizes (a speculative decoder's verification shapes)
    assert torch.equal(_incremental_logits(model, ids), expected)
    assert torch.equal(_incremental_logits(model, ids, schedule=(5, 1, 3, 4, 2)), expected)


@pytest.mark.parametrize("name", SHORT_NAMES)
def test_bfloat16_within_the_stated_bound(name):
    m = exact_model(name)
    model = m.load(torch.bfloat16)
    short = _short_contexts(m)
    long_ids = _random_contexts(m, 8, MAX_POSITIONS, seed=3)
    worst_logit = worst_prob = 0.0
    for length, contexts in _by_length(short).items():
        expected = m.next_logits(contexts)
        got = reference_logits(model, contexts)[:, -1].double()
        worst_logit = max(worst_logit, float((got - expected).abs().max()))
        worst_prob = max(worst_prob, float((_probs_from(got) - m.next_probs(contexts)).abs().max()))
    expected = _table_rows(m, long_ids)
    for got in (reference_logits(model, long_ids).double(), _incremental_logits(model, long_ids, schedule=(3, 1))):
        worst_logit = max(worst_logit, float((got - expected).abs().max()))
        worst_prob = max(worst_prob, float((_probs_from(got) - _probs_from(expected)).abs().max()))
    assert worst_logit <= m.bf16_logit_bound and worst_prob <= m.bf16_prob_bound, (worst_logit, worst_prob)
    if not m.logit_offset:
        assert m.bf16_logit_bound == BF16_LOGIT_BOUND == 0 and m.bf16_prob_bound == BF16_PROB_BOUND == 0
    else:  # the offset variants: the bound is attained (their logits are not exact in bf16 by design)
        assert worst_logit == m.bf16_logit_bound and worst_prob > m.bf16_prob_bound / 2, (worst_logit, worst_prob)


@pytest.mark.parametrize("name", [name for name, _, _ in OFFSET_MODELS])
def test_offset_variants_have_the_base_law_and_bf16_rounds_exactly_their_table(name):
    """Same law as the base model bit for bit (softmax is shift-invariant and the shift is exact), float32 logits
    the table, bfloat16 logits exactly the table rounded to bf16 (one rounding of an exact two-term sum), which
    differs from the table in many rows."""
    m = exact_model(name)
    base = exact_model(dict((n, b) for n, b, _ in OFFSET_MODELS)[name])
    assert m.logit_offset == LOGIT_OFFSET == 80 and np.array_equal(m.table - LOGIT_OFFSET, base.table)
    contexts = _short_contexts(m)
    assert torch.equal(m.next_probs(contexts), base.next_probs(contexts))
    for t in (0.5, 0.25):
        assert torch.equal(torch.softmax(m.next_logits(contexts) / t, -1), torch.softmax(base.next_logits(contexts) / t, -1))
    rows = m.next_logits(m.row_contexts())
    assert torch.equal(reference_logits(m.load(), m.row_contexts())[:, -1].double(), rows)
    got = reference_logits(m.load(torch.bfloat16), m.row_contexts())[:, -1].double()
    assert torch.equal(got, torch.from_numpy(bf16_table(rows.numpy())))
    assert int((got != rows).sum()) >= 15 and float((got - rows).abs().max()) == 0.25
    assert bool((rows.float().to(torch.bfloat16).double() != rows).any())  # not representable in bf16


def test_previous_token_head_margin():
    scores = prev_head_scores(MAX_POSITIONS)
    assert int(np.argmax(scores)) == 1
    assert scores[1] - np.delete(scores, 1).max() >= MIN_SCORE_GAP
    assert float(torch.exp(torch.tensor(-MIN_SCORE_GAP, dtype=torch.float32))) == 0.0


# --------------------------------------------------------------------------- order2: cache and positions


def _prefill(model, ids: torch.Tensor, positions: torch.Tensor | None = None) -> DynamicCache:
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=ids, **cache_arg(model, cache), use_cache=True, position_ids=positions)
    return cache


def _step(model, cache, token: int, position: int | None) -> torch.Tensor:
    pos = None if position is None else torch.tensor([[position]])
    with torch.no_grad():
        return model(input_ids=torch.tensor([[token]]), **cache_arg(model, cache), use_cache=True, position_ids=pos).logits[0, -1].double()


def _tv(p: torch.Tensor, q: torch.Tensor) -> float:
    return 0.5 * float((p - q).abs().sum())


ORDER2_CASES = [[6, 1, 4, 2, 5], [6, 3, 3, 0, 7, 1], [6, 2, 5, 1], [6, 0, 4, 2, 2, 5, 3, 1]]


@pytest.mark.parametrize("context", ORDER2_CASES, ids=lambda c: "-".join(map(str, c)))
def test_order2_wrong_position_id_changes_the_law(context):
    m = exact_model("order2-target")
    model = m.load()
    mpos = len(context) - 1  # position of the last token
    truth = m.next_logits([context])[0]
    cache = _prefill(model, torch.tensor([context[:-1]]))
    assert torch.equal(_step(model, cache, context[-1], mpos), truth)  # right position: exact
    # the last token at position m - 1: the previous-token head now reads x_{m-2} and the parity
    # flips, exactly the table row of the cell (x_{m-2}, x_m, (m-1) % 2)
    cache = _prefill(model, torch.tensor([context[:-1]]))
    shifted = _step(model, cache, context[-1], mpos - 1)
    wrong_cell = (context[mpos - 2], context[mpos], (mpos - 1) % 2)
    assert torch.equal(shifted, torch.tensor(m.table[wrong_cell]))
    assert _tv(_probs_from(shifted), _probs_from(truth)) > 0.05
    # the last token at position m + 1 (e.g. a stale cache length): no key one step back any more
    cache = _prefill(model, torch.tensor([context[:-1]]))
    ahead = _step(model, cache, context[-1], mpos + 1)
    assert _tv(_probs_from(ahead), _probs_from(truth)) > 0.05
    # a stale (not rolled back) entry: the cache length, hence the default position, is one too large
    cache = _prefill(model, torch.tensor([context[:-1] + [ORDER2_REAL[(context[-1] + 1) % 7]]]))
    stale = _step(model, cache, context[-1], None)
    assert _tv(_probs_from(stale), _probs_from(truth)) > 0.05


@pytest.mark.parametrize("context", ORDER2_CASES, ids=lambda c: "-".join(map(str, c)))
def test_order2_replaced_kv_entry_changes_the_law(context):
    m = exact_model("order2-target")
    model = m.load()
    mpos = len(context) - 1
    prev = context[mpos - 1]
    other = next(t for t in ORDER2_REAL if t != prev and m.table[t, context[-1], mpos % 2].tolist() != m.table[prev, context[-1], mpos % 2].tolist())
    altered = context[: mpos - 1] + [other] + context[mpos:]
    cache = _prefill(model, torch.tensor([context[:-1]]))
    donor = _prefill(model, torch.tensor([altered[:-1]]))
    layer, donor_layer = cache.layers[0], donor.layers[0]
    assert not torch.equal(layer.keys[:, :, mpos - 1], donor_layer.keys[:, :, mpos - 1])
    layer.keys[:, :, mpos - 1] = donor_layer.keys[:, :, mpos - 1]
    layer.values[:, :, mpos - 1] = donor_layer.values[:, :, mpos - 1]
    got = _step(model, cache, context[-1], mpos)
    # the model now follows the law of the altered context, exactly
    assert torch.equal(got, m.next_logits([altered])[0])
    assert not torch.equal(got, m.next_logits([context])[0])
    assert _tv(_probs_from(got), m.next_probs([context])[0]) > 0.01


def test_order2_uniform_position_shift_is_invisible_to_rope():
    """RoPE sees relative offsets only: shifting *every* position id by the same amount keeps the law
    (documented); the parity is that of the distance to <bos>."""
    m = exact_model("order2-target")
    model = m.load()
    ids = _random_contexts(m, 4, 30, seed=11)
    shifted = torch.arange(ids.shape[1]).unsqueeze(0).expand(4, -1) + 3
    with torch.no_grad():
        got = model(input_ids=ids, position_ids=shifted).logits.double()
    assert torch.equal(got, _table_rows(m, ids))


# --------------------------------------------------------------------------- tables


def _sorted_desc(row) -> list[float]:
    return sorted((float(x) for x in row), reverse=True)


def test_order1_ties_and_eos_as_designed():
    t = exact_model("order1-target").table
    # (row, tokens that tie, their rank positions in the sorted row, 1-based)
    designed = [
        (0, (1, 2, 3), (2, 3, 4)),
        (2, (2, 4, 5), (3, 4, 5)),
        (4, (1, 2, 6), (4, 5, 6)),
        (5, (3, 6), (2, 3)),
        (6, (1, 5), (3, 4)),
        (7, (0, 1), (2, 3)),
    ]
    for row, tokens, ranks in designed:
        tied = float(t[row, tokens[0]])
        assert all(float(t[row, v]) == tied for v in tokens), (row, tokens)
        s = _sorted_desc(t[row])
        assert [s[r - 1] for r in ranks] == [tied] * len(ranks), (row, s)
        assert s[ranks[0] - 2] > tied  # strictly below the rank before the tie
        assert ranks[-1] == 8 or s[ranks[-1]] < tied  # strictly above the rank after it
    # top_k = 2 keeps 4 tokens in row 0 and 3 in row 5; top_k = 3 keeps 5 in row 2
    for row, k, kept in [(0, 2, 4), (5, 2, 3), (2, 3, 5), (4, 4, 6)]:
        assert int(torch.isfinite(top_k_filter(torch.tensor(t[row]), k)).sum()) == kept
    p = exact_model("order1-target").next_probs([[r] for r in range(8)])
    eos = p[:, 7]
    assert all(0.1 <= float(eos[r]) <= 0.3 for r in (1, 2, 4, 7))
    assert int(((eos >= 0.1) & (eos <= 0.3)).sum()) >= 4


@pytest.mark.parametrize("name", NAMES)
def test_every_row_has_a_unique_maximum_and_logits_on_the_grid(name):
    m = exact_model(name)
    logits = m.next_logits(m.row_contexts())
    for row in logits:
        s = row.sort(descending=True).values
        assert s[0] > s[1]
    real = logits[logits != BOS_LOGIT] - m.logit_offset  # exact (the offset variants: + 80)
    assert torch.equal(real * 8, (real * 8).round()) and real.abs().max() <= 8
    if m.bos_id is not None:
        assert torch.all(logits[:, m.bos_id] == BOS_LOGIT)
        assert torch.all(m.next_probs(m.row_contexts())[:, m.bos_id] == 0)  # never generated


def test_order2_ties_eos_and_dependence_as_designed():
    m = exact_model("order2-target")
    cells, logits = m.cells(), m.next_logits(m.row_contexts())
    assert len(cells) == 1 + 7 + 98
    for k, row in enumerate(logits):
        s = _sorted_desc(row[list(ORDER2_REAL)])
        if k % 6 == 3:
            assert s[1] == s[2] == s[3] and s[0] > s[1]
        elif k % 6 == 5:
            assert s[2] == s[3]
    eos = m.next_probs(m.row_contexts())[:, m.eos_id]
    assert int(((eos >= 0.1) & (eos <= 0.3)).sum()) >= 20
    # parity and previous token both matter: mean total variation between rows that differ only in them
    p = {cell: m.next_probs([ctx])[0] for cell, ctx in zip(cells, m.row_contexts())}
    by_parity = [_tv(p[(a, b, 0)], p[(a, b, 1)]) for a in ORDER2_REAL for b in ORDER2_REAL]
    by_prev = [_tv(p[(a, b, 0)], p[(a2, b, 0)]) for a in ORDER2_REAL for a2 in ORDER2_REAL if a != a2 for b in ORDER2_REAL]
    assert np.mean(by_parity) > 0.3 and min(by_parity) > 0.05 and np.mean(by_prev) > 0.15


@pytest.mark.parametrize("family", ["order1", "order2"])
def test_temperature_then_top_p_differs_from_top_p_alone(family):
    """Rows whose top-p set at temperature T differs from the set at temperature 1 (the warp order matters)."""
    m = exact_model(f"{family}-target")
    logits = m.next_logits(m.row_contexts())
    for temperature in (0.5, 2.0):
        kept_t = torch.isfinite(top_p_filter(scale_temperature(logits, temperature), 0.8))
        kept_1 = torch.isfinite(top_p_filter(logits, 0.8))
        differ = int((kept_t != kept_1).any(-1).sum())
        assert differ >= 3, (family, temperature, differ)


def test_pairs_acceptance_as_stated():
    assert set(EXACT_PAIRS) == set(STATED_ACCEPTANCE)
    for name, stated in STATED_ACCEPTANCE.items():
        pair = exact_pair(name)
        assert pair.target.vocab == pair.draft.vocab and pair.target.token_names() == pair.draft.token_names()
        assert pair.mean_acceptance() == pytest.approx(stated, abs=5e-5)
        acc = pair.acceptance(pair.target.row_contexts())
        assert acc.dtype == np.float64 and acc.shape == (len(pair.target.cells()),)
        assert np.all((acc > 0) & (acc <= 1 + 1e-12))
    same = exact_pair("order1-same").acceptance([[t] for t in range(8)] + [[3, 1, 4]])
    assert np.allclose(same, 1.0, atol=1e-12)
    # the order-1 draft of order2 ignores the previous token and the position
    d = exact_model("order2-draft")
    assert torch.equal(d.next_logits([[6, 1, 4]]), d.next_logits([[6, 0, 2, 4]]))


# --------------------------------------------------------------------------- API


def test_api_validation():
    with pytest.raises(ValueError, match="unknown exact model 'nope'; known: order1-target"):
        exact_model("nope")
    with pytest.raises(KeyError):
        exact_pair("nope")
    o1, o2 = exact_model("order1-target"), exact_model("order2-target")
    assert o1.min_context == 1 and o2.min_context == 1 and o1.bos_id is None and o2.bos_id == 6
    with pytest.raises(ValueError, match="at least 1"):
        o1.next_logits([[]])
    with pytest.raises(ValueError, match="must start with <bos>"):
        o2.next_logits([[1, 2]])
    with pytest.raises(ValueError, match="only appear at position 0"):
        o2.next_logits([[6, 1, 6, 2]])
    with pytest.raises(ValueError, match="at most 128"):
        o1.next_logits([[0] * 129])
    with pytest.raises(ValueError, match=r"in \[0, 8\)"):
        o1.next_logits([[8]])
    with pytest.raises(ValueError):
        o1.next_logits([[1.5]])
    logits = o2.next_logits(torch.tensor([[6, 1, 4], [6, 2, 4]]))
    assert logits.dtype == torch.float64 and logits.shape == (2, 8)
    assert torch.allclose(o2.next_probs([[6]]).sum(-1), torch.ones(1, dtype=torch.float64))
    assert o2.cell([6]) == (6, 6, 0) and o2.cell([6, 3]) == (6, 3, 1) and o2.cell([6, 3, 5, 2]) == (5, 2, 1)
    assert o1.cell([4, 2]) == (2,)
    assert o1.next_logits([]).shape == (0, 8)
