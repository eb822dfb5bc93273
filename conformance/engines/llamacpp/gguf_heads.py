"""GGUF files of the exactly-known EAGLE-3 head and of the deep target it reads, for llama.cpp's ``draft-eagle3``,
and of the order-1 target with an exactly-known MTP block, for its ``draft-mtp``.

    python -m conformance.engines export llamacpp     # write them (the GGUF cache) with the other files, and check them

Rules: the head is :mod:`specdec_ref.exact.head_files`'s ``eagle3`` written by the rules of llama.cpp's own converter
(``Eagle3LlamaForCausalLM``, which refuses our tokenizer): ``eagle3.target_layers`` [0, 1, 2] read as the residual
streams entering those layers, its decoder layer adding exactly zero, ``d2t`` the absolute ids of its draft
vocabulary; so in llama.cpp it proposes exactly what :class:`specdec_properties.proposals.Eagle3FeatureLaw` states. The MTP
target is the order-1 table as a dense ``qwen35`` whose last block is an MTP block proposing the same law. Files are
named by this writer's version and rewritten when their source bytes change. Every metadata key and tensor written,
and why: docs/llamacpp-verdict.md, "The exactly-known heads in GGUF".
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

__all__ = ["HEAD", "DEEP", "MTP", "TARGET_LAYERS", "head_path", "deep_path", "write_head_gguf", "write_mtp_gguf",
           "export_eagle3", "export_mtp"]

WRITER_VERSION = "1"  # bump when the layout written here changes
#: The GGUF names (``<name>-<variant>.gguf`` in :func:`conformance.engines.llamacpp.gguf_export.gguf_dir`).
HEAD = "eagle3-order1-target"
DEEP = "deep3-order1-target"
MTP = "mtp-order1-target"
#: llama.cpp's ``eagle3.target_layers``: the aux ids of the vLLM head (vLLM's default ``(2, N // 2, N - 3)`` for
#: N = 3, stored as 0, 1, 2), each the residual stream entering that target layer.
TARGET_LAYERS = (0, 1, 2)


def head_path(variant: str = "plain", root: Path | None = None) -> Path:
    from .gguf_export import gguf_path

    return gguf_path(HEAD, variant, root)


def deep_path(variant: str = "plain", root: Path | None = None) -> Path:
    from .gguf_export import gguf_path

    return gguf_path(DEEP, variant, root)


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    from .gguf_export import _permute as permute

    return np.ascontiguousarray(permute(w, n_head))


def _head_source(target_name: str) -> tuple[dict, dict, dict, str]:
    """``(head config, head tensors, target tokenizer, digest)`` of the vLLM-layout head (``exact_head_files``)."""
    from safetensors.numpy import load

    from specdec_ref.exact.head_files import head_files
    from specdec_ref.exact import exact_model

    files = head_files("eagle3", target_name)
    tok_bytes = (Path(exact_model(target_name).path) / "tokenizer.json").read_bytes()
    digest = hashlib.sha256(WRITER_VERSION.encode() + files["config.json"] + files["model.safetensors"]
                            + tok_bytes).hexdigest()[:16]
    return json.loads(files["config.json"]), load(files["model.safetensors"]), json.loads(tok_bytes), digest


def write_head_gguf(path: Path, variant: str = "plain", target_name: str = "order1-target", *,
                    target_layers: tuple[int, ...] | None = None) -> Path:
    """Write the EAGLE-3 head in llama.cpp's ``eagle3`` layout (module docstring); returns the path.
    ``target_layers``: other ids than the head's :data:`TARGET_LAYERS` (a wrong head, for the engine test that
    must see it)."""
    import gguf

    from specdec_ref.exact.heads import EAGLE3_AUX, EAGLE3_VOCAB
    from specdec_ref.exact import exact_model

    from .gguf_export import add_tokenizer, attention_header, finish

    cfg, t, tok, digest = _head_source(target_name)
    if tuple(EAGLE3_AUX) != TARGET_LAYERS:
        raise ValueError(f"the head fuses aux layers {EAGLE3_AUX}, the GGUF would say {TARGET_LAYERS}")
    n_head, n_kv, hidden = int(cfg["num_attention_heads"]), int(cfg["num_key_value_heads"]), int(cfg["hidden_size"])
    head_dim = int(cfg.get("head_dim") or hidden // n_head)
    d2t = np.asarray(t["d2t"], dtype=np.int64) + np.arange(len(t["d2t"]), dtype=np.int64)  # offsets -> target ids
    if tuple(int(x) for x in d2t) != tuple(EAGLE3_VOCAB):
        raise AssertionError(f"d2t gives target ids {d2t.tolist()}, not the draft vocabulary {EAGLE3_VOCAB}")
    # the target's embeddings (4 e_t): vLLM's head shares them; written here so llama.cpp needs no ctx_other
    from safetensors.numpy import load_file

    embed = load_file(str(Path(exact_model(target_name).path) / "model.safetensors"))["model.embed_tokens.weight"]

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    w = gguf.GGUFWriter(str(tmp), arch="eagle3")
    w.add_name(f"specdec-ref exact EAGLE-3 head on {target_name} ({variant})")
    w.add_string("specdec.source_digest", digest)
    attention_header(w, cfg, blocks=1)
    w.add_vocab_size(int(cfg["vocab_size"]))
    w.add_target_layers(list(TARGET_LAYERS if target_layers is None else target_layers))
    w.add_target_hidden_size(hidden)
    w.add_norm_before_residual(False)
    add_tokenizer(w, cfg, tok, variant)

    f32 = lambda a: np.ascontiguousarray(np.asarray(a, dtype=np.float32))  # noqa: E731
    m = "midlayer."
    w.add_tensor("token_embd.weight", f32(embed))
    w.add_tensor("fc.weight", f32(t["fc.weight"]))
    w.add_tensor("blk.0.attn_norm.weight", f32(t[m + "input_layernorm.weight"]))
    w.add_tensor("blk.0.attn_norm_2.weight", f32(t[m + "hidden_norm.weight"]))
    w.add_tensor("blk.0.attn_q.weight", _permute(f32(t[m + "self_attn.q_proj.weight"]), n_head))
    w.add_tensor("blk.0.attn_k.weight", _permute(f32(t[m + "self_attn.k_proj.weight"]), n_kv))
    w.add_tensor("blk.0.attn_v.weight", f32(t[m + "self_attn.v_proj.weight"]))
    w.add_tensor("blk.0.attn_output.weight", f32(t[m + "self_attn.o_proj.weight"]))
    w.add_tensor("blk.0.ffn_norm.weight", f32(t[m + "post_attention_layernorm.weight"]))
    w.add_tensor("blk.0.ffn_gate.weight", f32(t[m + "mlp.gate_proj.weight"]))
    w.add_tensor("blk.0.ffn_up.weight", f32(t[m + "mlp.up_proj.weight"]))
    w.add_tensor("blk.0.ffn_down.weight", f32(t[m + "mlp.down_proj.weight"]))
    w.add_tensor("output_norm.weight", f32(t["norm.weight"]))
    w.add_tensor("output.weight", f32(t["lm_head.weight"]))
    w.add_tensor("d2t", d2t, raw_dtype=gguf.GGMLQuantizationType.I64)
    return finish(w, tmp, path)


def _pattern(rows: int, cols: int, salt: int) -> np.ndarray:
    """Dyadic weights in [-1/4, 1/4] for the layers whose outputs are multiplied by zero (as the heads' files)."""
    i, j = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    return (((i * 7 + j * 3 + salt) % 17) - 8) / 32.0


_SSM_D, _SSM_K, _SSM_V = 16, 32, 32  # the gated delta net's head size, key and value widths (2 heads each)


def write_mtp_gguf(path: Path, variant: str = "plain", target_name: str = "order1-target", *,
                   read_token: bool = False) -> Path:
    """Write the order-1 target with an exactly-known MTP block in llama.cpp's ``qwen35`` layout (module docstring,
    ``draft-mtp``); returns the path. ``read_token``: the block reads the token's embedding instead of the feature
    (a wrong block, for the engine test that must see it)."""
    import gguf
    from safetensors.numpy import load_file

    from specdec_ref.exact.heads import EAGLE3_VOCAB, medusa_table

    from .gguf_export import _source, add_tokenizer, attention_header, finish

    folder, cfg, tok, digest = _source(target_name)
    t = load_file(str(folder / "model.safetensors"))
    n_head, n_kv, hidden = int(cfg["num_attention_heads"]), int(cfg["num_key_value_heads"]), int(cfg["hidden_size"])
    head_dim, n_ff, vocab = int(cfg.get("head_dim") or hidden // n_head), int(cfg["intermediate_size"]), int(cfg["vocab_size"])
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    w = gguf.GGUFWriter(str(tmp), arch="qwen35")
    w.add_name(f"specdec-ref {target_name} with an exact MTP block ({variant})")
    w.add_string("specdec.source_digest", hashlib.sha256(f"mtp{WRITER_VERSION}{digest}".encode()).hexdigest()[:16])
    attention_header(w, cfg, blocks=3,  # two trunk layers (gated delta net, full attention) and the MTP block
                     rms_eps=2.0**-40)  # 1 + 2^-40 == 1 in float32: mean-square-1 rows stay exact, no 0/0
    w.add_uint32("qwen35.nextn_predict_layers", 1)
    w.add_uint32("qwen35.full_attention_interval", 2)  # layer 0 gated delta net, layer 1 full attention (a hybrid
    # memory needs both kinds: with no recurrent layer llama.cpp 0.3.36 aborts, GGML_ASSERT(buffer) in
    # llm_graph_input_mem_hybrid::set_input)
    w.add_array("qwen35.rope.dimension_sections", [head_dim // 2, 0, 0, 0])
    for key, value in (("conv_kernel", 4), ("inner_size", _SSM_V), ("state_size", _SSM_D),
                       ("time_step_rank", _SSM_V // _SSM_D), ("group_count", _SSM_K // _SSM_D)):
        w.add_uint32(f"qwen35.ssm.{key}", value)
    w.add_vocab_size(vocab)
    add_tokenizer(w, cfg, tok, variant)

    f32 = lambda a: np.ascontiguousarray(np.asarray(a, dtype=np.float32))  # noqa: E731
    m = "model.layers.0."
    q = _pattern(2 * n_head * head_dim, hidden, 1)  # per head: query rows, then gate rows (output multiplied by 0)
    head = np.zeros((vocab, hidden))
    head[:, :vocab] = -16.0  # -64 on every id outside the draft vocabulary: never the argmax (vocab rows >= -3.5)
    m2 = medusa_table(target_name, 2)
    for d in EAGLE3_VOCAB:
        head[d, :vocab] = m2[:, d] / 4
    w.add_tensor("token_embd.weight", f32(t["model.embed_tokens.weight"]))
    w.add_tensor("output_norm.weight", f32(t["model.norm.weight"]))
    w.add_tensor("output.weight", f32(t["lm_head.weight"]))
    conv = 2 * _SSM_K + _SSM_V  # the gated delta net of layer 0: finite weights, its output projection zero
    for name, a in (("attn_qkv.weight", _pattern(conv, hidden, 4)), ("attn_gate.weight", _pattern(_SSM_V, hidden, 5)),
                    ("ssm_conv1d.weight", _pattern(conv, 4, 6)), ("ssm_dt.bias", np.zeros(_SSM_V // _SSM_D)),
                    ("ssm_a", -np.ones(_SSM_V // _SSM_D)), ("ssm_beta.weight", _pattern(_SSM_V // _SSM_D, hidden, 7)),
                    ("ssm_alpha.weight", _pattern(_SSM_V // _SSM_D, hidden, 8)), ("ssm_norm.weight", np.ones(_SSM_D)),
                    ("ssm_out.weight", np.zeros((hidden, _SSM_V))),
                    ("attn_norm.weight", t[m + "input_layernorm.weight"]),
                    ("post_attention_norm.weight", t[m + "post_attention_layernorm.weight"]),
                    ("ffn_gate.weight", t[m + "mlp.gate_proj.weight"]), ("ffn_up.weight", t[m + "mlp.up_proj.weight"]),
                    ("ffn_down.weight", np.zeros((hidden, n_ff)))):
        w.add_tensor(f"blk.0.{name}", f32(a))
    for b in (1, 2):
        w.add_tensor(f"blk.{b}.attn_norm.weight", f32(t[m + "input_layernorm.weight"]))
        w.add_tensor(f"blk.{b}.post_attention_norm.weight", f32(t[m + "post_attention_layernorm.weight"]))
        w.add_tensor(f"blk.{b}.attn_q.weight", f32(q))
        w.add_tensor(f"blk.{b}.attn_k.weight", f32(_pattern(n_kv * head_dim, hidden, 2)))
        w.add_tensor(f"blk.{b}.attn_v.weight", f32(_pattern(n_kv * head_dim, hidden, 3)))
        w.add_tensor(f"blk.{b}.attn_output.weight", f32(np.zeros((hidden, n_head * head_dim))))
        w.add_tensor(f"blk.{b}.attn_q_norm.weight", f32(np.ones(head_dim)))
        w.add_tensor(f"blk.{b}.attn_k_norm.weight", f32(np.ones(head_dim)))
        w.add_tensor(f"blk.{b}.ffn_gate.weight", f32(t[m + "mlp.gate_proj.weight"]))
        w.add_tensor(f"blk.{b}.ffn_up.weight", f32(t[m + "mlp.up_proj.weight"]))
        w.add_tensor(f"blk.{b}.ffn_down.weight", f32(np.zeros((hidden, n_ff))))
    eh = np.zeros((hidden, 2 * hidden))
    eh[:, (0 if read_token else hidden):][:, :hidden] = np.eye(hidden)  # u = hnorm(h): the feature alone
    w.add_tensor("blk.2.nextn.eh_proj.weight", f32(eh))
    w.add_tensor("blk.2.nextn.enorm.weight", f32(np.ones(hidden)))
    w.add_tensor("blk.2.nextn.hnorm.weight", f32(np.ones(hidden)))
    w.add_tensor("blk.2.nextn.shared_head_norm.weight", f32(np.ones(hidden)))
    w.add_tensor("blk.2.nextn.shared_head_head.weight", f32(head))
    return finish(w, tmp, path)


def export_eagle3(root: Path | None = None, *, force: bool = False,
                  target_name: str = "order1-target") -> dict[tuple[str, str], Path]:
    """The deep target's and the head's files, both variants, written where missing or stale:
    ``{(DEEP | HEAD, variant): path}``."""
    from specdec_ref.exact.head_files import deep_target_folder

    from .gguf_export import VARIANTS, _digest_of, _source, write_gguf

    if target_name != "order1-target":
        raise ValueError("the EAGLE-3 head files are written for order1-target only")
    folder = deep_target_folder(target_name)
    deep_digest, head_digest = _source(DEEP, folder)[3], _head_source(target_name)[3]
    out = {}
    for variant in VARIANTS:
        p = deep_path(variant, root)
        if force or not p.exists() or _digest_of(p) != deep_digest:
            write_gguf(DEEP, p, variant, folder=folder)
        out[(DEEP, variant)] = p
        p = head_path(variant, root)
        if force or not p.exists() or _digest_of(p) != head_digest:
            write_head_gguf(p, variant, target_name)
        out[(HEAD, variant)] = p
    return out


def export_mtp(root: Path | None = None, *, force: bool = False) -> dict[tuple[str, str], Path]:
    """The ``qwen35`` target with its MTP block, both variants, written where missing or stale: ``{(MTP, variant):
    path}``."""
    from .gguf_export import VARIANTS, _digest_of, _source, gguf_path

    digest = hashlib.sha256(f"mtp{WRITER_VERSION}{_source('order1-target')[3]}".encode()).hexdigest()[:16]
    out = {}
    for variant in VARIANTS:
        p = gguf_path(MTP, variant, root)
        if force or not p.exists() or _digest_of(p) != digest:
            write_mtp_gguf(p, variant)
        out[(MTP, variant)] = p
    return out
