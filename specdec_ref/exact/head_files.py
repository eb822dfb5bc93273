"""Checkpoint folders of the exactly-known proposer heads (and the deep target) in the layouts engines load (vLLM 0.32).

    python -m specdec_ref.exact.head_files [--root DIR]      # write them (default: the cache) and print the folders

The heads are :mod:`specdec_ref.exact.heads`'s, written as ``config.json`` + ``model.safetensors`` (float32) at run
time, never committed: the bytes are a function of the tables (:func:`~specdec_ref.exact.heads.eagle_mix`,
:func:`~specdec_ref.exact.heads.medusa_table`) and of this writer, so a folder is named by its digest and written once
(atomically: two workers may ask at the same time).

* ``eagle`` (vLLM ``method="eagle"``, ``EagleLlamaForCausalLM``): the target's ``config.json`` (a one-layer Llama,
  hidden 16) and ``fc.weight [16, 32]`` = ``[alpha I | C^T]`` on dims 0..7 over ``cat(embed(token), feature)`` (vLLM's
  order: the token's embedding first), one decoder layer whose attention and MLP run on deterministic dyadic weights
  and add exactly zero (``o_proj`` and ``down_proj`` zero; layer 0 has no ``input_layernorm`` in vLLM's EAGLE-1),
  no ``embed_tokens`` and no ``lm_head`` (vLLM shares the target's; a checkpoint ``lm_head`` fails to load). So the
  drafter's hidden is ``alpha 4 e_x + C^T f`` and its logits ``hidden / 4 @ T``, as
  :class:`specdec_properties.proposals.EagleLaw` states.
* ``medusa`` (``MedusaModel``): ``heads`` residual blocks of one zero layer (``x + SiLU(0) = x``) and lm_heads
  ``M_{i+2}^T / 4`` on dims 0..7 (:func:`~specdec_ref.exact.heads.medusa_table`); ``medusa_fc_bias`` off. vLLM builds
  exactly ``num_speculative_tokens`` heads, so ``heads`` must be at least the engine's k.
* ``eagle3`` (``Eagle3LlamaForCausalLM``, ``method="eagle3"``) on the deep target of the same table
  (:func:`deep_target_folder`, three layers): vLLM's default auxiliary layers ``(2, N // 2, N - 3)`` = ids 0, 1, 2,
  concatenated in ascending order, each the residual stream entering that layer (pre-norm), ``4 e_c`` with ``c =
  deep_channel(y, j)`` at a position holding ``y``. ``fc [16, 48]`` reads block ``j``'s channel ``deep_channel(y, j)``
  back to channel ``y`` with weight ``EAGLE3_WEIGHTS[j]`` (1/2, 1/4, 1/4: a permuted or wrong layer adds another
  token's feature), so the fused feature is ``g = 4 e_y`` exactly, of mean square 1. The midlayer's attention (over
  ``cat(norm(embed), norm(g))``, 2H inputs) and MLP run on dyadic weights and add exactly zero (``o_proj``,
  ``down_proj`` = 0), so ``pre = g``, ``post = norm(g) = g``, and every later draft step reads the same ``pre``: the
  drafts do not depend on the token, they repeat one draft k times. Its own ``lm_head [6, 16]`` on the draft
  vocabulary ``EAGLE3_VOCAB`` = (0, 1, 2, 3, 5, 7) (row ``d`` = column ``vocab[d]`` of ``M_2^T / 4``,
  :func:`~specdec_ref.exact.heads.medusa_table` at offset 2) and ``d2t[d] = vocab[d] - d`` (int64): from the feature of
  ``y`` (the token before the pending one) it drafts the likeliest token two places after ``y`` within the vocabulary,
  k times, as :class:`specdec_properties.proposals.Eagle3FeatureLaw` states. ``rms_norm_eps`` 2^-40: ``1 + 2^-40`` is 1 in
  float32, so the norms of mean-square-1 rows stay exact, and a zero row (padding) gives 0, not NaN.
* ``eagle3-default-aux``: the same kind of head with a plain ``fc`` on the one-layer target, used only to record that
  a one-layer target cannot feed vLLM's default auxiliary layers (its error), not an exact law.

:func:`deep_target_folder` writes the deep target itself (:func:`specdec_ref.exact.deep.deep_target`: its logits are the
order-1 table bit for bit) as a checkpoint folder an engine loads: the shipped target's ``config.json`` with
``num_hidden_layers`` set, its tokenizer files, and ``model.safetensors`` from
:func:`~specdec_ref.exact.deep.deep_weights`.

Invariant: every float weight is a multiple of 1/64 of magnitude below 8, so the engine's float32 drafter computes
the tables' expressions exactly (no rounding can break or make an argmax tie).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

__all__ = ["KINDS", "WRITER_VERSION", "DEEP_LAYERS", "head_files", "head_folder", "heads_root", "write_head",
           "deep_target_files", "deep_target_folder", "short_positions_folder"]

WRITER_VERSION = "1"
KINDS = ("eagle", "medusa", "eagle3", "eagle3-default-aux")
#: Decoder layers of the deep target the ``eagle3`` head reads (vLLM's default aux ids for N = 3 all exist).
DEEP_LAYERS = 3
#: The files of the shipped target folder an engine needs besides the weights (copied into the deep target's folder).
_TARGET_FILES = ("generation_config.json", "tokenizer.json", "tokenizer_config.json")
_H, _V, _HEADS, _HEAD_DIM, _INTER = 16, 8, 2, 32, 32


def heads_root() -> Path:
    """``$SPECDEC_CACHE/heads`` (default ``~/.cache/specdec-ref/heads``): outside the clone, beside the GGUF files."""
    return Path(os.environ.get("SPECDEC_CACHE") or str(Path.home() / ".cache" / "specdec-ref")) / "heads"


def _pattern(rows: int, cols: int, salt: int) -> np.ndarray:
    """Deterministic dyadic weights in [-1/4, 1/4] (multiples of 1/32): the layer's attention and MLP run on them."""
    i, j = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    return (((i * 7 + j * 3 + salt) % 17) - 8) / 32.0


def _target_config(target_name: str) -> dict:
    from . import exact_model

    return json.loads((Path(exact_model(target_name).path) / "config.json").read_text())


def _llama_layer(prefix: str, qkv_in: int, *, input_norm: bool) -> dict:
    qkv = _HEADS * _HEAD_DIM
    w = {prefix + "self_attn.q_proj.weight": _pattern(qkv, qkv_in, 1),
         prefix + "self_attn.k_proj.weight": _pattern(qkv, qkv_in, 2),
         prefix + "self_attn.v_proj.weight": _pattern(qkv, qkv_in, 3),
         prefix + "self_attn.o_proj.weight": np.zeros((_H, qkv)),
         prefix + "post_attention_layernorm.weight": np.ones(_H),
         prefix + "mlp.gate_proj.weight": _pattern(_INTER, _H, 4),
         prefix + "mlp.up_proj.weight": _pattern(_INTER, _H, 5),
         prefix + "mlp.down_proj.weight": np.zeros((_H, _INTER))}
    if input_norm:
        w[prefix + "input_layernorm.weight"] = np.ones(_H)
    return w


def head_files(kind: str, target_name: str = "order1-target", *, heads: int = 3) -> dict[str, bytes]:
    """The folder's files as bytes (``config.json``, ``model.safetensors``): deterministic."""
    from .heads import EAGLE_ALPHA, eagle_mix, medusa_table, order1_table

    order1_table(target_name)  # raises unless a plain order-1 target
    if kind == "eagle":
        config = _target_config(target_name)
        fc = np.zeros((_H, 2 * _H))
        fc[:_V, :_V] = EAGLE_ALPHA * np.eye(_V)
        fc[:_V, _H:_H + _V] = eagle_mix(target_name).T
        weights = {"fc.weight": fc, **_llama_layer("layers.0.", _H, input_norm=False)}
    elif kind == "medusa":
        config = {"architectures": ["MedusaModel"], "model_type": "medusa", "hidden_size": _H, "vocab_size": _V,
                  "num_heads": heads, "num_hidden_layers": 1, "medusa_fc_bias": False}
        weights = {}
        for i in range(heads):
            lm = np.zeros((_V, _H))
            lm[:, :_V] = medusa_table(target_name, i + 2).T / 4
            weights[f"blocks.{i}.layers.0.weight"] = np.zeros((_H, _H))
            weights[f"lm_heads.{i}.weight"] = lm
    elif kind == "eagle3":
        from .deep import deep_channel
        from .heads import EAGLE3_AUX, EAGLE3_VOCAB, EAGLE3_WEIGHTS

        vocab = list(EAGLE3_VOCAB)
        config = dict(_target_config(target_name), draft_vocab_size=len(vocab), rms_norm_eps=2.0**-40)
        fc = np.zeros((_H, len(EAGLE3_AUX) * _H))
        for j, (aux, w) in enumerate(zip(EAGLE3_AUX, EAGLE3_WEIGHTS)):
            for y in range(_V):
                fc[y, j * _H + deep_channel(y, aux)] = w
        head = np.zeros((len(vocab), _H))
        head[:, :_V] = medusa_table(target_name, 2)[:, vocab].T / 4
        weights = {"fc.weight": fc, "norm.weight": np.ones(_H), "lm_head.weight": head,
                   "d2t": np.array([t - d for d, t in enumerate(vocab)], dtype=np.int64),
                   "midlayer.input_layernorm.weight": np.ones(_H), "midlayer.hidden_norm.weight": np.ones(_H),
                   **_llama_layer("midlayer.", 2 * _H, input_norm=False)}
    elif kind == "eagle3-default-aux":
        config = dict(_target_config(target_name), draft_vocab_size=_V)
        head = np.zeros((_V, _H))
        head[:, :_V] = order1_table(target_name).T / 4
        fc = np.zeros((_H, 3 * _H))
        fc[:, :_H] = np.eye(_H)
        weights = {"fc.weight": fc, "norm.weight": np.ones(_H), "lm_head.weight": head,
                   "midlayer.input_layernorm.weight": np.ones(_H), "midlayer.hidden_norm.weight": np.ones(_H),
                   **_llama_layer("midlayer.", 2 * _H, input_norm=False)}
    else:
        raise ValueError(f"unknown head kind {kind!r}; known: {KINDS}")
    for name, w in weights.items():
        if w.dtype.kind == "f" and (not np.all(np.abs(w) < 8) or not np.all(w * 64 == np.round(w * 64))):
            raise AssertionError(f"{kind}: {name} is not dyadic within 1/64")
    meta = {"format": "pt", "specdec_head": f"{kind} on {target_name}, writer {WRITER_VERSION}"}
    return {"config.json": (json.dumps(config, indent=2, sort_keys=True) + "\n").encode(),
            "model.safetensors": _safetensors(weights, meta)}


def _safetensors(weights: dict, metadata: dict) -> bytes:
    """The safetensors serialisation of ``weights`` (float arrays as float32, integer arrays as int64) with keys in
    sorted order (the library's own writer orders the metadata by a hash map: bytes would differ run to run)."""
    header, blobs, offset = {"__metadata__": metadata}, [], 0
    for name in sorted(weights):
        w = np.asarray(weights[name])
        if w.dtype.kind in "iu":
            blob, dtype = np.ascontiguousarray(w, dtype="<i8").tobytes(), "I64"
        else:
            blob, dtype = np.ascontiguousarray(w, dtype="<f4").tobytes(), "F32"
            if not np.array_equal(np.asarray(w, dtype=np.float32).astype(np.float64), np.asarray(w, dtype=np.float64)):
                raise AssertionError(f"{name} is not exact in float32")
        header[name] = {"dtype": dtype, "shape": list(np.shape(w)), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text + b"".join(blobs)


def head_folder(kind: str, target_name: str = "order1-target", *, heads: int = 3, root: Path | None = None) -> Path:
    """The head's folder under ``root`` (default :func:`heads_root`), written if absent; its name carries the digest
    of its bytes, so a changed table or writer gives a new folder."""
    files = head_files(kind, target_name, heads=heads)
    stem = f"{kind}-{target_name}" + (f"-{heads}h" if kind == "medusa" else "")
    return _folder(Path(root) if root is not None else heads_root(), stem, files)


def deep_target_files(target_name: str = "order1-target", layers: int = DEEP_LAYERS) -> dict[str, bytes]:
    """The deep target's checkpoint folder as bytes (module docstring): deterministic."""
    from .deep import deep_weights
    from . import exact_model

    shipped = Path(exact_model(target_name).path)
    config = dict(json.loads((shipped / "config.json").read_text()), num_hidden_layers=layers)
    meta = {"format": "pt", "specdec_target": f"deep {target_name}, {layers} layers, writer {WRITER_VERSION}"}
    files = {"config.json": (json.dumps(config, indent=2, sort_keys=True) + "\n").encode(),
             "model.safetensors": _safetensors(deep_weights(target_name, layers), meta)}
    files.update({n: (shipped / n).read_bytes() for n in _TARGET_FILES})
    return files


def deep_target_folder(target_name: str = "order1-target", layers: int = DEEP_LAYERS, *,
                       root: Path | None = None) -> Path:
    """The deep target's folder under ``root`` (default ``targets`` beside :func:`heads_root`), written if absent,
    named by the digest of its bytes."""
    base = Path(root) if root is not None else heads_root().parent / "targets"
    return _folder(base, f"deep{layers}-{target_name}", deep_target_files(target_name, layers))


def short_positions_folder(model_name: str, positions: int, *, root: Path | None = None) -> Path:
    """A copy of the exactly-known checkpoint ``model_name`` whose config states ``positions`` positions (fewer than
    its 128): the same weights, so the same law on every context that fits; an engine must not run it past them (a
    draft with fewer positions than its target). Written under ``root`` (default ``targets`` beside
    :func:`heads_root`) if absent, named by the digest of its bytes."""
    import json

    from . import exact_model

    model = exact_model(model_name)
    if not 0 < positions < model.max_positions:
        raise ValueError(f"{model_name}: a shorter copy needs 0 < positions < {model.max_positions}, got {positions}")
    files = {f.name: f.read_bytes() for f in model.path.iterdir() if f.is_file()}
    config = json.loads(files["config.json"])
    config["max_position_embeddings"] = int(positions)
    files["config.json"] = (json.dumps(config, indent=2, sort_keys=True) + "\n").encode()
    base = Path(root) if root is not None else heads_root().parent / "targets"
    return _folder(base, f"{model_name}-{positions}pos", files)


def _folder(base: Path, stem: str, files: dict[str, bytes]) -> Path:
    """``base / <stem>-<digest>`` holding ``files``, written once (atomically: two workers may ask at the same time)."""
    digest = hashlib.sha256(b"".join(files[n] for n in sorted(files))).hexdigest()[:12]
    folder = base / f"{stem}-{digest}"
    if all((folder / n).is_file() and (folder / n).read_bytes() == b for n, b in files.items()):
        return folder
    base.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=base))
    for n, b in files.items():
        (tmp / n).write_bytes(b)
    try:
        os.rename(tmp, folder)
    except OSError:  # written meanwhile by another process (same bytes: same digest), or a stale partial folder
        shutil.rmtree(tmp, ignore_errors=True)
        if not all((folder / n).is_file() and (folder / n).read_bytes() == b for n, b in files.items()):
            shutil.rmtree(folder, ignore_errors=True)
            return _folder(base, stem, files)
    return folder


def write_head(kind: str, folder: Path, target_name: str = "order1-target", *, heads: int = 3) -> Path:
    """Write the head into ``folder`` (created; files overwritten)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for n, b in head_files(kind, target_name, heads=heads).items():
        (folder / n).write_bytes(b)
    return folder


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specdec_ref.exact.head_files", description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=None, help="parent folder (default: the cache)")
    ap.add_argument("--target", default="order1-target")
    args = ap.parse_args(argv)
    for kind in KINDS:
        print(kind, head_folder(kind, args.target, root=Path(args.root) if args.root else None))
    print(f"deep{DEEP_LAYERS}-target", deep_target_folder(args.target, root=Path(args.root) if args.root else None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
