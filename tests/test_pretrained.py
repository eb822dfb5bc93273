"""Fast checks of the shipped trained target/draft pair (specdec_ref.pretrained)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from transformers import DynamicCache

from specdec_ref.forward import cache_arg
from specdec_ref.pretrained import (
    ASSET_DIR,
    CONTEXT_LENGTH,
    PretrainedAssetError,
    decode,
    encode,
    greedy_agreement,
    load_model,
    load_trained_pair,
    sample_prompts,
    state_dict_checksum,
    training_metadata,
)

ASSET_FILES = [
    "target.safetensors",
    "draft.safetensors",
    "target_config.json",
    "draft_config.json",
    "training.json",
    "prompts.json",
]


@pytest.fixture(scope="module")
def pair():
    return load_trained_pair()


@pytest.fixture(scope="module")
def meta():
    return training_metadata()


# --------------------------------------------------------------------------- tokenizer


def test_encode_decode_roundtrip():
    text = "def f(x):\n    return x  # é ✓\n"
    ids = encode(text)
    assert ids.dtype == torch.long and ids.shape == (1, len(text.encode("utf-8")))
    assert ids.min() >= 0 and ids.max() < 256
    assert decode(ids) == text
    assert decode(ids[0].tolist()) == text
    assert encode("").shape == (1, 0)


def test_decode_replaces_invalid_utf8_and_rejects_out_of_vocab():
    assert decode([0xFF, ord("a")]) == "\ufffda"
    with pytest.raises(ValueError):
        decode([256])


# --------------------------------------------------------------------------- assets and loading


def test_assets_present_and_small(meta):
    for name in ASSET_FILES:
        assert (ASSET_DIR / name).is_file(), name
    total = sum((ASSET_DIR / n).stat().st_size for n in ("target.safetensors", "draft.safetensors"))
    assert total <= 5 * 1024 * 1024
    assert meta["total_weight_bytes"] == total
    assert meta["context_length"] == CONTEXT_LENGTH == 256
    assert meta["tokenizer"]["vocab_size"] == 256
    for key in ("corpus_sha256", "modules", "files"):
        assert meta["data"][key]
    for model in ("target", "draft"):
        assert meta[model]["training"]["steps"] > 0
        assert 0 < meta["eval"][f"{model}_heldout_bits_per_byte"] < 8
    assert 0 < meta["eval"]["greedy_agreement"] < 1


def test_pair_shapes_and_architectures(pair):
    target, draft = pair
    assert type(target).__name__ == "LlamaForCausalLM"
    assert type(draft).__name__ != type(target).__name__  # a different architecture on purpose
    tc, dc = target.config, draft.config
    assert tc.vocab_size == dc.vocab_size == 256
    assert (tc.num_hidden_layers, tc.hidden_size, tc.num_attention_heads) == (2, 128, 4)
    assert (dc.num_hidden_layers, dc.hidden_size) == (1, 64)
    assert tc.max_position_embeddings >= CONTEXT_LENGTH and dc.max_position_embeddings >= CONTEXT_LENGTH
    n_t = sum(p.numel() for p in target.parameters())
    n_d = sum(p.numel() for p in draft.parameters())
    assert n_d * 4 < n_t
    for model in pair:
        assert not model.training
        assert all(p.dtype == torch.float32 and not p.requires_grad for p in model.parameters())
    ids = encode("import os\n")
    with torch.no_grad():
        for model in pair:
            assert model(input_ids=ids).logits.shape == (1, ids.shape[1], 256)


def test_weights_match_recorded_checksums(pair, meta):
    target, draft = pair
    assert state_dict_checksum(target) == meta["files"]["target.safetensors"]["state_dict_checksum"]
    assert state_dict_checksum(draft) == meta["files"]["draft.safetensors"]["state_dict_checksum"]
    # Tied embeddings: stored once, shared after loading.
    for model in pair:
        if model.config.tie_word_embeddings:
            assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_reload_gives_identical_logits(pair):
    ids = sample_prompts(2, 96, seed=3)
    ids = torch.cat(ids, dim=0)
    target2, draft2 = load_trained_pair()
    with torch.no_grad():
        for a, b in zip(pair, (target2, draft2)):
            assert torch.equal(a(input_ids=ids).logits, b(input_ids=ids).logits)


def test_incremental_decode_with_cache_matches_full_forward(pair):
    ids = sample_prompts(1, 48, seed=11)[0]
    with torch.no_grad():
        for model in pair:
            full = model(input_ids=ids).logits
            cache = DynamicCache(config=model.config)
            first = model(input_ids=ids[:, :40], **cache_arg(model, cache)).logits
            steps = [model(input_ids=ids[:, i : i + 1], **cache_arg(model, cache)).logits for i in range(40, 48)]
            assert cache.get_seq_length() == 48
            inc = torch.cat([first] + steps, dim=1)
            torch.testing.assert_close(inc, full, rtol=1e-4, atol=1e-4)


def test_sample_prompts_deterministic():
    a = sample_prompts(4, 64, seed=7)
    b = sample_prompts(4, 64, seed=7)
    c = sample_prompts(4, 64, seed=8)
    assert len(a) == 4 and all(p.shape == (1, 64) and p.dtype == torch.long for p in a)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not all(torch.equal(x, y) for x, y in zip(a, c))
    assert sample_prompts(1, CONTEXT_LENGTH)[0].shape == (1, CONTEXT_LENGTH)
    with pytest.raises(ValueError):
        sample_prompts(1, CONTEXT_LENGTH + 1)


def test_greedy_agreement_in_sane_band(pair):
    target, draft = pair
    ids = torch.cat(sample_prompts(8, 128, seed=0), dim=0)
    agreement = greedy_agreement(target, draft, ids)
    assert 0.5 <= agreement < 0.99, agreement


def test_target_generates_mostly_printable_ascii(pair):
    target, _ = pair
    prompt = encode("class Parser:\n    def __init__(self, name, value=None):\n        self.")
    out = []
    with torch.no_grad():
        cache = DynamicCache(config=target.config)
        logits = target(input_ids=prompt, **cache_arg(target, cache)).logits
        for _ in range(96):
            nxt = logits[:, -1].argmax(-1, keepdim=True)
            out.append(int(nxt))
            logits = target(input_ids=nxt, **cache_arg(target, cache)).logits
    printable = sum(32 <= b < 127 or b in (9, 10) for b in out)
    assert printable / len(out) >= 0.95, decode(out)
    assert len(set(out)) > 4, decode(out)  # not a single repeated byte


# --------------------------------------------------------------------------- failure modes


@pytest.fixture
def asset_copy(tmp_path):
    dst = tmp_path / "pair"
    shutil.copytree(ASSET_DIR, dst)
    return dst


def test_missing_file_is_rejected(asset_copy):
    (asset_copy / "draft.safetensors").unlink()
    with pytest.raises(PretrainedAssetError, match="missing"):
        load_trained_pair(asset_dir=asset_copy)


def test_missing_config_is_rejected(asset_copy):
    (asset_copy / "target_config.json").unlink()
    with pytest.raises(PretrainedAssetError, match="missing"):
        load_model("target", asset_dir=asset_copy)


def test_corrupt_weights_rejected_by_checksum(asset_copy):
    path = asset_copy / "target.safetensors"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01  # one flipped bit inside a tensor
    path.write_bytes(bytes(data))
    with pytest.raises(PretrainedAssetError, match="sha256"):
        load_model("target", asset_dir=asset_copy)


def test_truncated_weights_rejected_without_checksum(asset_copy):
    path = asset_copy / "draft.safetensors"
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(PretrainedAssetError, match="corrupt"):
        load_model("draft", asset_dir=asset_copy, verify_checksum=False)


def test_corrupt_config_rejected(asset_copy):
    (asset_copy / "draft_config.json").write_text("{not json")
    with pytest.raises(PretrainedAssetError, match="corrupt"):
        load_model("draft", asset_dir=asset_copy)


def test_mismatched_config_rejected(asset_copy):
    cfg = json.loads((asset_copy / "draft_config.json").read_text())
    cfg["intermediate_size"] += 8
    (asset_copy / "draft_config.json").write_text(json.dumps(cfg))
    with pytest.raises(PretrainedAssetError, match="does not match"):
        load_model("draft", asset_dir=asset_copy)


def test_untied_head_in_file_also_loads(asset_copy, pair):
    """A file that stores lm_head.weight explicitly (untied save) loads and gives the same logits."""
    from safetensors.torch import load_file, save_file

    path = asset_copy / "draft.safetensors"
    state = load_file(str(path))
    state["lm_head.weight"] = state["model.embed_tokens.weight"].clone()
    save_file(state, str(path), metadata={"format": "pt"})
    draft2 = load_model("draft", asset_dir=asset_copy, verify_checksum=False)
    ids = encode("for i in range(10):\n")
    with torch.no_grad():
        assert torch.equal(draft2(input_ids=ids).logits, pair[1](input_ids=ids).logits)
