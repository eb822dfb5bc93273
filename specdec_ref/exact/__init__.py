"""Exactly-known target/draft models, shipped as real transformers checkpoints.

Each model's next-token law is an explicit small table (vocabulary V = 8) written in
:mod:`specdec_ref.exact.tables` (the single source of truth); :func:`build` turns every table into a
``LlamaForCausalLM`` checkpoint (``config.json``, ``model.safetensors``, a WordLevel ``tokenizer.json``,
``tokenizer_config.json``, ``generation_config.json``) under ``specdec_ref/assets/exact/<name>/``, loadable
from the local folder with ``AutoModelForCausalLM.from_pretrained`` / ``AutoTokenizer.from_pretrained``.
The law of a model is ``softmax(next_logits(context))`` computed in float64 from the table;
:meth:`ExactModel.next_logits` never runs the checkpoint.

Two families (see ``docs/exact-models.md`` for the weight constructions and the proofs of exactness):

* **order1** (``order1-target``, ``order1-draft-close`` / ``-far`` / ``-same``): ``logits = T[last token]``,
  an 8 x 8 table. One-hot embeddings, attention and MLP outputs exactly zero (``o_proj`` and
  ``down_proj`` are zero), ``lm_head`` holds the table.
* **order2** (``order2-target``, ``order2-draft``, ``order2-draft-close``): the logits depend on the
  last two tokens *and* on the parity of the last token's position, through attention over the KV
  cache and rotary position embeddings: one head attends exactly to the previous position (a
  stale or misplaced K/V entry, or a wrong position id, changes what it copies), one head reads the
  parity of the position relative to the ``<bos>`` token at position 0, and a gated MLP with one unit
  per (previous token, last token, parity) cell writes that cell's logits. Contexts must start with
  ``<bos>`` (id 6) and contain it nowhere else; ``<bos>`` itself has logit :data:`BOS_LOGIT` (-2**16)
  everywhere, so its probability is exactly 0 in float64 and float32 and it is never generated.
* **offset variants** (``order1-target-offset``, ``order1-draft-close-offset``; pair ``order1-close-offset``;
  :mod:`specdec_ref.exact.offset`): an order1 table plus 80 on every logit, carried by constant channels
  through ``lm_head``. The same law, float32-exact logits that bfloat16 cannot represent (it rounds them by up
  to 1/4), so a decoder sampling in lower precision than it reports changes the law (the other models'
  logits are exact in bf16 and hide it).

Exactness: every weight is a dyadic number with at most 8 significant bits (exact in bfloat16), RMS
norms see a mean square of exactly 1 (``rms_norm_eps = 0``), attention scores separate the attended
key from every other one by more than 150 after scaling (so the float32 softmax is exactly one-hot,
whatever rounding RoPE introduces), and the MLP gates are exactly 32 ("on", SiLU(32) == 32 in float32)
or <= -112 ("off", SiLU == -0). So the float32 forward returns the table logits bit for bit, with or
without a KV cache; in bfloat16 the same holds (stated and tested bound: 0), except for the offset variants,
whose bf16 logits are the table rounded to bf16 (``ExactModel.bf16_logit_bound`` = 1/4, attained).

Both families are Llama: GPT-2's LayerNorm subtracts a mean that torch computes with a Welford
recurrence (rounded ``1/k`` factors), which is inexact even for inputs of constant mean and variance,
whereas RMSNorm only needs a sum of squares, exact in any order for these values. Absolute position
comes from RoPE relative to ``<bos>`` at position 0. Shapes: 1 layer, 2 heads of size 32 (the
smallest head size vLLM's CPU attention supports, so engines such as vLLM load the checkpoints; the
nonzero rotary pairs are those whose frequencies are 1, pi, pi^2, pi^3), hidden 16 (order1) / 32
(order2), which Llama allows to differ from heads * head_dim (64).

Layout (this package's ``__init__`` is the public entry: it re-exports every public name; ``__main__`` is the
command line); each module imports only the ones above it:

* :mod:`specdec_ref.exact.tables`: the tables (the laws, in eighths), the vocabularies;
* :mod:`specdec_ref.exact.registry`: :class:`ExactModel`, :class:`ExactPair`, :data:`EXACT_MODELS`,
  :data:`EXACT_PAIRS` (a name, a table, a checkpoint folder);
* :mod:`specdec_ref.exact.weights`: the Llama config and weights whose forward returns a table (the long-context
  family's tables, config and weights: :mod:`specdec_ref.exact.long`);
* :mod:`specdec_ref.exact.checkpoints`: the checkpoint files, :func:`build`, :func:`check`, :func:`main`.

Command line::

    python -m specdec_ref.exact build   # (re)write every checkpoint folder, byte-deterministic
    python -m specdec_ref.exact check   # verify the shipped files, print a summary table
"""

from __future__ import annotations

from . import checkpoints, registry
from .checkpoints import build, build_files, check, main
from .registry import (
    ASSET_ROOT,
    BF16_LOGIT_BOUND,
    BF16_PROB_BOUND,
    EXACT_MODELS,
    EXACT_PAIRS,
    MAX_POSITIONS,
    SHIFTED,
    ExactModel,
    ExactPair,
    UnknownExactModelError,
    exact_model,
    exact_pair,
)
# ORDER*: public attributes as before, though not in __all__
from .tables import BOS_LOGIT, ORDER1_EOS, ORDER1_VOCAB, ORDER2_BOS, ORDER2_EOS, ORDER2_VOCAB  # noqa: F401
from .weights import MIN_SCORE_GAP, prev_head_scores

__all__ = ["BOS_LOGIT", "MIN_SCORE_GAP", "prev_head_scores"]
__all__ += registry.__all__
__all__ += checkpoints.__all__
