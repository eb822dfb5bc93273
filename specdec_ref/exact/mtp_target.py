"""The order-1 table as a MiMo checkpoint (``MiMoForCausalLM``: Qwen2 layers) with one exactly-known MTP layer, for
vLLM's ``speculative_config={"method": "mtp"}``.

    python -m specdec_ref.exact.mtp_target [--root DIR] [--read-token]   # write the folder, print its path

vLLM (0.32) runs ``method="mtp"`` only on architectures with next-token-prediction layers; it refuses a Llama
(``Unsupported speculative method: 'mtp'``). MiMo is the dense one with standard attention: its target is Qwen2
(``vllm/model_executor/models/mimo.py``), its MTP layer (``mimo_mtp.py``, ``MiMoMultiTokenPredictorLayer``) computes,
at drafter position ``p`` (vLLM pairs the target's hidden state of position ``p`` with the embedding of the token at
``p + 1``, the pending token at the last position)::

    e = token_layernorm(embed(x) masked to 0 at position 0),  f = hidden_layernorm(hidden)
    out = final_layernorm(block(input_proj(cat(f, e))))        # block: a Qwen2DecoderLayer plus its residual
    logits = lm_head(out)                                       # the target's own lm_head (the checkpoint's)

and a later draft step reads its own ``out`` as ``hidden`` (``MiMoModel`` hands the drafter the target's residual
stream before the final norm; here that is the embedding, so either would do). The one layer is reused for every
draft step (k = 3 > ``num_nextn_predict_layers`` = 1).

What is written (float32, config key ``num_nextn_predict_layers`` 1, ``model_type`` ``qwen2`` with ``architectures``
``["MiMoForCausalLM"]``: vLLM maps it to ``MiMoMTPModel`` by the architecture; transformers has no MiMo config):

* **the target**: hidden 64 (Qwen2's head size is ``hidden / heads``; vLLM's CPU attention needs 32: 2 heads of 32),
  token ``t`` embeds as ``8 e_t`` (mean square exactly 1), one layer whose attention and MLP run on dyadic weights
  and add exactly zero (``o_proj``, ``down_proj`` = 0; q/k/v biases 0), so the final hidden state is ``8 e_t`` before
  and after the norm, and ``lm_head[v, t] = T[t, v] / 8`` on channels 0..7: the logits are the order-1 table bit for
  bit. ``rms_norm_eps`` 2^-40 (``1 + 2^-40`` is 1 in float32; a masked zero row normalises to 0, not NaN).
* **channels 8..15 of the lm_head**, which the target never sets: ``lm_head[v, 8 + y] = R[y, v] / 8`` with ``R`` the
  EAGLE-3 head's rows: ``M_2`` (:func:`specdec_ref.exact.heads.medusa_table` at offset 2, the log of the target's
  2-step law in eighths) on the draft vocabulary ``EAGLE3_VOCAB`` (0, 1, 2, 3, 5, 7), -64 on ids 4 and 6.
* **the MTP layer** (``model.mtp_layers.0.*``, the names MiMo checkpoints use; vLLM's loader maps them onto
  ``mtp_block``): norms of weight 1, ``input_proj [64, 128]`` maps the feature's channel ``j`` and channel ``8 + j``
  to channel ``8 + j`` (j < 8) and reads nothing of the token, a Qwen2 decoder layer adding exactly zero
  (``o_proj``, ``down_proj`` = 0). So from the target's feature ``8 e_y`` (``y`` the token before the pending one)
  ``out = 8 e_(8+y)`` (mean square 1: every norm is exact) and the logits are ``R[y]`` exactly; the next step reads
  ``8 e_(8+y)`` and gives it again. Every draft of a round is ``argmax R[y]``, whatever the token: exactly
  :class:`specdec_properties.proposals.Eagle3FeatureLaw` (proposer ``exact-eagle3``), the law of vLLM's EAGLE-3 head and of
  llama.cpp's ``draft-mtp`` block. The tie of row ``y = 2`` (ids 2 and 7, equal floats) goes to id 2 in
  ``torch.argmax`` as in the law's first-index argmax.
* ``read_token=True`` (a deliberately wrong layer, for the engine test): ``input_proj`` reads the token's embedding
  in place of the feature, so the first draft is ``argmax R[x]`` (``x`` the pending token; 0 at position 0).

Every float weight but the lm_head (the table divided by 8) is a multiple of 1/64 of magnitude at most 8, so float32
computes the table expressions exactly.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

__all__ = ["MTP_WRITER_VERSION", "HIDDEN", "SCALE", "mtp_rows", "mtp_target_weights", "mtp_target_files",
           "mtp_target_folder", "main"]

MTP_WRITER_VERSION = "1"
HIDDEN, SCALE = 64, 8.0
_V, _HEADS, _HEAD_DIM, _INTER = 8, 2, 32, 32
#: Logit of the ids outside the draft vocabulary (below every ``M_2`` entry, which lies in [-8, 8]).
_OUTSIDE = -64.0
_TARGET_FILES = ("generation_config.json", "tokenizer.json", "tokenizer_config.json")


def _pattern(rows: int, cols: int, salt: int) -> np.ndarray:
    """Deterministic dyadic weights in [-1/4, 1/4] (multiples of 1/32) for attention and MLP inputs."""
    i, j = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    return (((i * 7 + j * 3 + salt) % 17) - 8) / 32.0


def mtp_rows(target_name: str = "order1-target") -> np.ndarray:
    """``R [8, 8]``: row ``y`` is the MTP layer's logits from the feature of ``y`` (``M_2[y]`` on the draft
    vocabulary, :data:`_OUTSIDE` elsewhere): what ``Eagle3FeatureLaw`` proposes from."""
    from .heads import EAGLE3_VOCAB, medusa_table

    rows = np.full((_V, _V), _OUTSIDE)
    vocab = list(EAGLE3_VOCAB)
    rows[:, vocab] = medusa_table(target_name, 2)[:, vocab]
    return rows


def _qwen2_layer(prefix: str, salt: int) -> dict:
    """A Qwen2 decoder layer whose attention and MLP outputs are exactly zero (they run on dyadic weights)."""
    qkv = _HEADS * _HEAD_DIM
    w = {prefix + "input_layernorm.weight": np.ones(HIDDEN),
         prefix + "post_attention_layernorm.weight": np.ones(HIDDEN),
         prefix + "self_attn.o_proj.weight": np.zeros((HIDDEN, qkv)),
         prefix + "mlp.gate_proj.weight": _pattern(_INTER, HIDDEN, salt + 4),
         prefix + "mlp.up_proj.weight": _pattern(_INTER, HIDDEN, salt + 5),
         prefix + "mlp.down_proj.weight": np.zeros((HIDDEN, _INTER))}
    for i, p in enumerate(("q", "k", "v")):
        w[prefix + f"self_attn.{p}_proj.weight"] = _pattern(qkv, HIDDEN, salt + i + 1)
        w[prefix + f"self_attn.{p}_proj.bias"] = np.zeros(qkv)
    return w


def mtp_target_weights(target_name: str = "order1-target", *, read_token: bool = False) -> dict[str, np.ndarray]:
    """The checkpoint's tensors (module docstring), float64 arrays of dyadic values."""
    from .heads import order1_table

    table = order1_table(target_name)  # raises unless a plain order-1 target
    embed = np.zeros((_V, HIDDEN))
    embed[np.arange(_V), np.arange(_V)] = SCALE
    head = np.zeros((_V, HIDDEN))
    head[:, :_V] = table.T / SCALE
    head[:, _V:2 * _V] = mtp_rows(target_name).T / SCALE
    proj = np.zeros((HIDDEN, 2 * HIDDEN))  # over cat(hidden_layernorm(feature), token_layernorm(embedding))
    for j in range(_V):
        proj[_V + j, (HIDDEN + j) if read_token else j] = 1.0
        proj[_V + j, _V + j] = 1.0  # a draft step's own output (channels 8..15) passes to the next step
    mtp = "model.mtp_layers.0."
    weights = {"model.embed_tokens.weight": embed, "model.norm.weight": np.ones(HIDDEN), "lm_head.weight": head,
               **_qwen2_layer("model.layers.0.", 0),
               mtp + "token_layernorm.weight": np.ones(HIDDEN), mtp + "hidden_layernorm.weight": np.ones(HIDDEN),
               mtp + "final_layernorm.weight": np.ones(HIDDEN), mtp + "input_proj.weight": proj,
               **_qwen2_layer(mtp, 10)}
    for name, w in weights.items():  # the lm_head holds the table / 8 (exact in float32: the writer checks)
        if name != "lm_head.weight" and (not np.all(np.abs(w) <= 8) or not np.all(w * 64 == np.round(w * 64))):
            raise AssertionError(f"{name} is not dyadic within 1/64")
    return weights


def _config(target_name: str) -> dict:
    from . import exact_model

    shipped = json.loads((Path(exact_model(target_name).path) / "config.json").read_text())
    drop = ("attention_bias", "mlp_bias", "pretraining_tp", "head_dim")
    config = {k: v for k, v in shipped.items() if k not in drop}
    config.update(architectures=["MiMoForCausalLM"], model_type="qwen2", hidden_size=HIDDEN,
                  intermediate_size=_INTER, num_attention_heads=_HEADS, num_key_value_heads=_HEADS,
                  num_hidden_layers=1, num_nextn_predict_layers=1, rms_norm_eps=2.0**-40, tie_word_embeddings=False,
                  use_sliding_window=False, sliding_window=None, max_window_layers=1)
    return config


def mtp_target_files(target_name: str = "order1-target", *, read_token: bool = False) -> dict[str, bytes]:
    """The folder's files as bytes: ``config.json``, ``model.safetensors`` (float32, sorted keys) and the shipped
    target's tokenizer files; deterministic."""
    from .head_files import _safetensors
    from . import exact_model

    shipped = Path(exact_model(target_name).path)
    kind = "mtp-read-token" if read_token else "mtp"
    meta = {"format": "pt", "specdec_target": f"{kind} {target_name} (MiMo), writer {MTP_WRITER_VERSION}"}
    files = {"config.json": (json.dumps(_config(target_name), indent=2, sort_keys=True) + "\n").encode(),
             "model.safetensors": _safetensors(mtp_target_weights(target_name, read_token=read_token), meta)}
    files.update({n: (shipped / n).read_bytes() for n in _TARGET_FILES})
    return files


def mtp_target_folder(target_name: str = "order1-target", *, read_token: bool = False,
                      root: Path | None = None) -> Path:
    """The folder under ``root`` (default ``targets`` beside :func:`specdec_ref.exact.head_files.heads_root`), written
    if absent, named by the digest of its bytes (atomically: two workers may ask at the same time)."""
    from .head_files import _folder, heads_root

    base = Path(root) if root is not None else heads_root().parent / "targets"
    stem = ("mimo-mtp-read-token-" if read_token else "mimo-mtp-") + target_name
    return _folder(base, stem, mtp_target_files(target_name, read_token=read_token))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specdec_ref.exact.mtp_target", description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=None, help="parent folder (default: the cache's targets)")
    ap.add_argument("--target", default="order1-target")
    ap.add_argument("--read-token", action="store_true", help="the deliberately wrong layer (reads the token)")
    args = ap.parse_args(argv)
    print(mtp_target_folder(args.target, read_token=args.read_token, root=Path(args.root) if args.root else None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
