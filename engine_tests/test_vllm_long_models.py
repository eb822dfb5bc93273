"""vLLM (CPU, 0.32) runs the long-context exactly-known checkpoints (``long-target``, ``long-draft``) and reproduces
their tables over 4 096 positions.

Run in the vLLM stage only. Each model is loaded once (float32, ``max_model_len`` 4 096, vLLM's default KV block
of 128 on CPU, in-process) and checked on token-id prompts holding one marker token in a middle KV block:

* prompt logprobs of 4 095-token prompts: every prefix the law defines, so every position, both parities and the
  marker read across 32 KV blocks go through vLLM's prefill attention and RoPE;
* decode steps from long prompts of mixed lengths batched together, up to the 4 096-position limit (paged KV cache,
  one-token decode across block boundaries);
* ``raw_logits``: the logits equal the table bit for bit after contexts whose last token sits at either side of
  every kind of block boundary.

Bound as in ``test_vllm_exact_models.py``: |logprob - table log-softmax| <= 2e-6 for the tokens the law can
generate; ``<bos>`` and the markers (logit -65536) to 1/64.
"""

from __future__ import annotations

import os
import random

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from vllm import SamplingParams  # noqa: E402  (a missing engine fails the stage, never skips)

from specdec_ref.exact.long import LONG_BOS, LONG_MARKERS, LONG_MAX_POSITIONS, LONG_REAL  # noqa: E402
from specdec_ref.exact import BOS_LOGIT, ExactModel, exact_model  # noqa: E402

from .vllm_engines import Engines  # noqa: E402

LOGPROB_BOUND = 2e-6
NEVER_BOUND = 2.0**-6  # <bos> and the markers: logprob ~ -65538, float32 ulp 1/128
BLOCK = 128


def _row(length: int, marker_at: int | None, seed: int) -> list[int]:
    rng = random.Random(seed)
    row = [LONG_BOS] + [rng.choice(LONG_REAL) for _ in range(length - 1)]
    if marker_at is not None:
        row[marker_at] = LONG_MARKERS[seed % 4]
    return row


@pytest.fixture(scope="module", params=[pytest.param(n, marks=pytest.mark.xdist_group("vllm_long")) for n in
                                        ("long-target", "long-draft")])
def engines(request):
    eng = Engines(exact_model(request.param), "float32", max_model_len=LONG_MAX_POSITIONS, max_num_seqs=8)
    yield eng
    eng.close()


def _vector(logprobs: dict, vocab: int) -> torch.Tensor:
    return torch.tensor([logprobs[v].logprob for v in range(vocab)], dtype=torch.float64)


def _assert_logprobs(m: ExactModel, context: list[int], got: torch.Tensor, where: str) -> None:
    want = torch.log_softmax(m.next_logits([context])[0], dim=-1)
    real = list(LONG_REAL)
    never = [LONG_BOS, *LONG_MARKERS]
    err = float((got[real] - want[real]).abs().max())
    assert err <= LOGPROB_BOUND, f"{m.name} {where}: position {len(context) - 1}, |error| {err:.3g}"
    assert float((got[never] - want[never]).abs().max()) <= NEVER_BOUND, (where, len(context))


def _defined(m: ExactModel, row: list[int]) -> list[int]:
    """The prefix lengths the law defines (a marker not among the last two tokens)."""
    rows = m.prefix_logits(row)
    return [i + 1 for i in range(len(row)) if not torch.isnan(rows[i, 0])]


def test_prompt_logprobs_of_every_prefix_of_4095_tokens(engines):
    m = engines.model
    prompts = [_row(LONG_MAX_POSITIONS - 1, BLOCK + 5, seed=1), _row(LONG_MAX_POSITIONS - 1, 17 * BLOCK - 1, seed=2)]
    params = SamplingParams(max_tokens=1, logprobs=m.vocab, prompt_logprobs=m.vocab, temperature=1.0)
    outs = engines().generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    for prompt, out in zip(prompts, outs):
        per_position = out.prompt_logprobs
        assert len(per_position) == len(prompt) and per_position[0] is None
        for n in _defined(m, prompt)[1:]:  # logprobs at position n are those after the prefix of n tokens
            if n < len(prompt):
                _assert_logprobs(m, prompt[:n], _vector(per_position[n], m.vocab), "prompt logprob")
        _assert_logprobs(m, prompt, _vector(out.outputs[0].logprobs[0], m.vocab), "next-token logprob")


def test_decode_steps_of_long_prompts_batched_follow_the_law(engines):
    m = engines.model
    lengths = (4000, 2 * BLOCK - 2, 1500, 3 * BLOCK + 1)
    prompts = [_row(n, n // 3, seed=10 + i) for i, n in enumerate(lengths)]
    steps = [LONG_MAX_POSITIONS - 4000, 40, 64, 40]
    # no per-request seed: a seeded request whose prefill is chunked crashes vLLM-CPU (defect F, docs/vllm-verdict.md)
    params = [SamplingParams(max_tokens=n, logprobs=m.vocab, temperature=1.0, ignore_eos=True) for n in steps]
    outs = engines().generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    for prompt, n, out in zip(prompts, steps, outs):
        gen = out.outputs[0]
        assert len(gen.token_ids) == len(gen.logprobs) == n
        seq = list(prompt)
        for tok, step in zip(gen.token_ids, gen.logprobs):
            _assert_logprobs(m, seq, _vector(step, m.vocab), "decode logprob")
            assert tok in LONG_REAL
            seq.append(tok)
    assert len(prompts[0]) + steps[0] == LONG_MAX_POSITIONS


def test_raw_logits_are_bit_exact_at_block_boundaries(engines):
    m = engines.model
    lengths = [1, 2, 3, 127, 128, 129, 130, 255, 256, 257, 1024, 2049, LONG_MAX_POSITIONS - 1]
    contexts = [_row(n, 1 if n > 3 else None, seed=20 + n) for n in lengths]
    outs = engines("raw_logits").generate([{"prompt_token_ids": c} for c in contexts],
                                          SamplingParams(max_tokens=1, logprobs=m.vocab, temperature=1.0), use_tqdm=False)
    for ctx, out in zip(contexts, outs):
        got = _vector(out.outputs[0].logprobs[0], m.vocab)
        assert torch.equal(got, m.next_logits([ctx])[0]), (m.name, len(ctx))
        assert float(got[LONG_BOS]) == BOS_LOGIT
