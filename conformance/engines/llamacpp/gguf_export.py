"""GGUF files of the exactly-known checkpoints for llama.cpp, written from the tensors, and their logit check.

    python -m conformance.engines export llamacpp [--no-check]    # write the files and check them through llama-server

llama.cpp's ``convert_hf_to_gguf.py`` refuses our checkpoints (their WordLevel tokenizer), so the files are written
here with the ``gguf`` package (the copy vendored with the llama.cpp that :mod:`conformance.engines.llamacpp` builds;
``scripts/env.sh llamacpp`` installs it): architecture ``llama``, the tensors as float32 (``q_proj`` / ``k_proj``
permuted from Hugging Face's rotate-half layout to GGUF's interleaved rope pairs, as ``convert_hf_to_gguf.py``
does), the hyper-parameters including ``head_dim`` (``attention.key_length`` / ``value_length`` = 32, which
differs from hidden / heads), ``rope.dimension_count`` = head_dim, ``rope.freq_base``, ``rms_norm_eps`` = 0, and
a minimal vocabulary (tokenizer model ``gpt2`` with one inert merge, the ids' names from ``tokenizer.json``,
``<bos>`` / ``<eos>`` as control tokens, BOS / EOS ids from ``config.json``, no BOS added to prompts).

Two variants of every model, because llama.cpp cannot sample EOS as an ordinary token: its ``ignore_eos`` adds a
logit bias of -inf to every end-of-generation token (EOS is then never sampled, a different law). ``eos``: token
7 is ``<eos>``, the EOS id, end of generation; ``plain``: the same tensors, token 7 is an ordinary token ``e7`` and
the file declares no EOS (the gpt2 default EOS id 11 is outside the vocabulary, so llama.cpp disables it). Cases
whose EOS stops run on ``eos``; cases where EOS is an ordinary token (and the efficiency set) run on ``plain``.

Invariant (checked by :func:`check_logits` through a running ``llama-server`` that the adapter passes in:
``conformance.engines.llamacpp.check_gguf``, ``engine_tests/test_llamacpp.py``; this module imports no engine):
the server's next-token probabilities (``n_probs`` = 8, before sampling) equal ``softmax`` of the tables at every
position of every context tried, within float32 rounding, in both variants. Files are rewritten only when their
source checkpoint or this writer changed (a digest in the file's metadata).
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

__all__ = ["MODELS", "VARIANTS", "CHECKED", "cache_root", "gguf_dir", "gguf_path", "write_gguf", "add_tokenizer",
           "export", "check_logits"]

#: The checkpoints llama.cpp loads (targets and drafts of the pairs the adapter uses, and the others cheaply too).
MODELS = ("order1-target", "order1-draft-close", "order1-draft-far", "order1-draft-same", "order2-target",
          "order2-draft", "order2-draft-close", "long-target", "long-draft")
VARIANTS = ("eos", "plain")
#: The models whose files are checked against the tables (the two pairs' targets and drafts).
CHECKED = ("order1-target", "order1-draft-close", "order2-target", "order2-draft", "long-target", "long-draft")
#: the context a server needs for a model's checks: its positions (the long family: 4 096)
def context_size(name_or_path) -> int:
    return 4096 if Path(str(name_or_path)).name.startswith("long-") else 128
WRITER_VERSION = "1"  # bump when the layout written here changes


def cache_root() -> Path:
    """``$SPECDEC_CACHE`` or ``~/.cache/specdec-ref``: outside the clone (engine builds and these files)."""
    return Path(os.environ.get("SPECDEC_CACHE") or str(Path.home() / ".cache" / "specdec-ref"))


def gguf_dir() -> Path:
    """Where the files go: the cache, keyed by this writer's version (each file also records its source digest)."""
    return cache_root() / f"gguf-w{WRITER_VERSION}"


def gguf_path(name: str, variant: str = "eos", root: Path | None = None) -> Path:
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    return Path(root or gguf_dir()) / f"{name}-{variant}.gguf"


def _source(name: str, folder: Path | None = None) -> tuple[Path, dict, dict, str]:
    """``(folder, config, tokenizer, digest)`` of a shipped checkpoint, or of the checkpoint ``folder`` (a model
    written at run time, e.g. :func:`specdec_ref.exact.head_files.deep_target_folder`)."""
    from specdec_ref.exact import exact_model

    folder = Path(folder) if folder is not None else Path(exact_model(name).path)
    cfg = json.loads((folder / "config.json").read_text())
    tok = json.loads((folder / "tokenizer.json").read_text())
    h = hashlib.sha256(WRITER_VERSION.encode())
    for f in ("config.json", "tokenizer.json", "model.safetensors"):
        h.update((folder / f).read_bytes())
    return folder, cfg, tok, h.hexdigest()[:16]


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Hugging Face rotate-half rows -> GGUF interleaved pairs (``convert_hf_to_gguf.LlamaModel.permute``)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _digest_of(path: Path) -> str | None:
    try:
        from gguf import GGUFReader

        field = GGUFReader(str(path)).fields.get("specdec.source_digest")
        return bytes(field.parts[field.data[0]]).decode() if field is not None else None
    except Exception:  # noqa: BLE001 - unreadable: rewrite it
        return None


def add_tokenizer(w, cfg: dict, tok: dict, variant: str) -> None:
    """The minimal vocabulary of the module docstring (``variant`` ``eos`` or ``plain``) into GGUF writer ``w``:
    shared by the targets, the drafts and the heads (:mod:`conformance.engines.llamacpp.gguf_heads`), whose vocabularies
    llama.cpp compares."""
    import gguf

    vocab = int(cfg["vocab_size"])
    eos, bos = cfg.get("eos_token_id"), cfg.get("bos_token_id")
    names = {i: t for t, i in tok["model"]["vocab"].items()}
    special = {a["id"] for a in tok.get("added_tokens", []) if a.get("special")} | {x for x in (bos, eos) if x is not None}
    tokens, types = [], []
    for i in range(vocab):
        t = names.get(i, f"[{i}]")
        if variant == "plain" and i == eos:
            t, ctl = f"e{i}", False  # an ordinary token: not end of generation
        else:
            ctl = i in special
        tokens.append(t)
        types.append(gguf.TokenType.CONTROL if ctl else gguf.TokenType.NORMAL)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(["\u0120 \u0120"])  # one inert merge: llama.cpp's BPE loader needs the key, prompts are ids
    if bos is not None:
        w.add_bos_token_id(int(bos))
    if eos is not None and variant == "eos":
        w.add_eos_token_id(int(eos))
    w.add_add_bos_token(False)
    w.add_add_eos_token(False)


def attention_header(w, cfg: dict, *, blocks: int, rms_eps: float | None = None) -> tuple[int, int, int]:
    """The keys every attention model of ours shares (f32 tensors, context, widths, heads, RoPE, RMS eps) from a
    checkpoint config, written to the GGUFWriter ``w``; returns ``(heads, kv heads, head dim)``."""
    import gguf

    n_head, n_kv = int(cfg["num_attention_heads"]), int(cfg["num_key_value_heads"])
    head_dim = int(cfg.get("head_dim") or cfg["hidden_size"] // n_head)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_context_length(int(cfg["max_position_embeddings"]))
    w.add_embedding_length(int(cfg["hidden_size"]))
    w.add_block_count(blocks)
    w.add_feed_forward_length(int(cfg["intermediate_size"]))
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    rope = (cfg.get("rope_parameters") or {}).get("rope_theta", cfg.get("rope_theta", 10000.0))
    w.add_rope_freq_base(float(rope))
    w.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]) if rms_eps is None else rms_eps)
    return n_head, n_kv, head_dim


def finish(w, tmp: Path, path: Path) -> Path:
    """Write the GGUFWriter ``w`` (opened on ``tmp``) out and move it to ``path`` (a reader never sees half a file)."""
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, path)
    return path


def write_gguf(name: str, path: Path, variant: str = "eos", *, folder: Path | None = None) -> Path:
    """Write one model's GGUF file (see the module docstring); returns the path. ``folder``: a checkpoint folder
    written at run time instead of the shipped ``name`` (``name`` then only names it)."""
    import gguf
    from safetensors.numpy import load_file

    folder, cfg, tok, digest = _source(name, folder)
    if cfg.get("model_type") != "llama" or cfg.get("tie_word_embeddings"):
        raise ValueError(f"{name}: only untied Llama checkpoints are exported (got {cfg.get('model_type')})")
    vocab = int(cfg["vocab_size"])

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    w = gguf.GGUFWriter(str(tmp), arch="llama")
    w.add_name(f"specdec-ref {name} ({variant})")
    w.add_string("specdec.source_digest", digest)
    n_head, n_kv, _ = attention_header(w, cfg, blocks=int(cfg["num_hidden_layers"]))
    w.add_vocab_size(vocab)
    add_tokenizer(w, cfg, tok, variant)

    t = load_file(str(folder / "model.safetensors"))
    f32 = lambda k: np.ascontiguousarray(t[k].astype(np.float32))  # noqa: E731
    w.add_tensor("token_embd.weight", f32("model.embed_tokens.weight"))
    for layer in range(int(cfg["num_hidden_layers"])):
        p, b = f"model.layers.{layer}.", f"blk.{layer}."
        w.add_tensor(b + "attn_norm.weight", f32(p + "input_layernorm.weight"))
        w.add_tensor(b + "attn_q.weight", np.ascontiguousarray(_permute(f32(p + "self_attn.q_proj.weight"), n_head)))
        w.add_tensor(b + "attn_k.weight", np.ascontiguousarray(_permute(f32(p + "self_attn.k_proj.weight"), n_kv)))
        w.add_tensor(b + "attn_v.weight", f32(p + "self_attn.v_proj.weight"))
        w.add_tensor(b + "attn_output.weight", f32(p + "self_attn.o_proj.weight"))
        w.add_tensor(b + "ffn_norm.weight", f32(p + "post_attention_layernorm.weight"))
        w.add_tensor(b + "ffn_gate.weight", f32(p + "mlp.gate_proj.weight"))
        w.add_tensor(b + "ffn_up.weight", f32(p + "mlp.up_proj.weight"))
        w.add_tensor(b + "ffn_down.weight", f32(p + "mlp.down_proj.weight"))
    w.add_tensor("output_norm.weight", f32("model.norm.weight"))
    w.add_tensor("output.weight", f32("lm_head.weight"))
    return finish(w, tmp, path)


def export(names=MODELS, root: Path | None = None, *, force: bool = False) -> dict[tuple[str, str], Path]:
    """Every (model, variant) file, written where missing or stale; ``{(name, variant): path}``."""
    out = {}
    for name in names:
        digest = _source(name)[3]
        for variant in VARIANTS:
            path = gguf_path(name, variant, root)
            if force or not path.exists() or _digest_of(path) != digest:
                write_gguf(name, path, variant)
            out[(name, variant)] = path
    return out


def _contexts(name: str) -> list[list[int]]:
    """Prompts whose continuations visit every row of the table (order1: every last token; order2: ``<bos>`` and
    every one- and two-token continuation of it); the long family: those of order2 and long prompts holding a
    marker in a middle KV block, the longest ending three positions before the 4 096-position limit."""
    from specdec_ref.exact import exact_model

    m = exact_model(name)
    if name.startswith("order1"):
        return [[a] for a in range(m.vocab)] + [[3, 1, 4], [0, 0]]
    bos = 6
    toks = [t for t in (0, 1, 2, 3, 4, 5, 7)]
    out = [[bos]] + [[bos, a] for a in toks] + [[bos, a, b] for a in toks for b in toks]
    if name.startswith("long"):
        for i, (n, at) in enumerate(((300, 130), (2100, 1030), (4093, 2000), (513, None))):
            row = [bos] + [toks[(7 * j + i) % 7] for j in range(1, n)]
            if at is not None:
                row[at] = 8 + i % 4
            out.append(row)
    return out


def check_logits(start_server, names=CHECKED, *, variants=VARIANTS, n_predict: int = 3, tol: float = 2e-6) -> list[dict]:
    """Load each file in a server (``start_server(path)``: a context manager whose ``complete(body)`` posts to
    llama-server's ``/completion``) and compare its pre-sampling probabilities (``n_probs`` = vocabulary) with
    ``softmax`` of the tables at every generated position of :func:`_contexts` (sampled continuations, so the KV
    cache and positions are exercised). One row per file: worst absolute difference, positions, ``passed``."""
    from specdec_ref.exact import exact_model

    paths = export(tuple(names))
    rows = []
    for name in names:
        m = exact_model(name)
        for variant in variants:
            worst, compared, bad = 0.0, 0, []
            with start_server(paths[(name, variant)]) as srv:
                for i, ctx in enumerate(_contexts(name)):
                    r = srv.complete({"prompt": ctx, "n_predict": n_predict, "n_probs": m.vocab, "seed": 1000 + i,
                                      "temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0,
                                      "samplers": ["temperature"], "return_tokens": True, "cache_prompt": False,
                                      "ignore_eos": False})
                    seq = list(ctx)
                    for step in r.get("completion_probabilities") or []:
                        got = np.zeros(m.vocab)
                        for c in step.get("top_logprobs") or step.get("top_probs") or []:
                            got[int(c["id"])] = float(np.exp(c["logprob"])) if "logprob" in c else float(c["prob"])
                        z = np.asarray(m.next_logits([seq]), dtype=np.float64)[0]
                        want = np.exp(z - z.max())
                        want /= want.sum()
                        d = float(np.abs(got - want).max())
                        compared += 1
                        worst = max(worst, d)
                        if d > tol:
                            bad.append({"context": list(seq), "got": got.round(6).tolist(), "want": want.round(6).tolist()})
                        seq.append(int(step["id"]))
            rows.append({"model": name, "variant": variant, "positions": compared, "max_abs_diff": worst,
                         "passed": compared > 0 and not bad, "first_bad": bad[:1]})
    return rows


def report(rows) -> str:
    return "\n".join(f"logits {r['model']:20s} {r['variant']:5s}: {r['positions']} positions, max |p - table| "
                     f"{r['max_abs_diff']:.2e}: "
                     + ("equal to the tables" if r["passed"] else "DIFFER: " + json.dumps(r["first_bad"]))
                     for r in rows)
