"""vLLM (CPU, 0.32) runs the exactly-known checkpoints and reproduces their tables.

Run in the vLLM stage only (``.venv-vllm/bin/python -m pytest engine_tests/test_vllm_exact_models.py``).
Every shipped checkpoint is loaded with ``vllm.LLM(model=folder, dtype=...)`` in float32 and in
bfloat16, once per test module per (model, dtype, logprobs mode), and is fed token-id prompts:

* next-token logprobs (``SamplingParams(max_tokens=1, logprobs=8)``, the default ``raw_logprobs``
  mode) equal the table's float64 log-softmax within :data:`LOGPROB_BOUND` on a batch of contexts
  of many lengths (order2: both parities, every previous token, up to the 127-token limit);
* prompt logprobs of a 127-token prompt: every prefix, so every position and parity goes through
  vLLM's prefill attention and RoPE;
* decode steps (``max_tokens`` up to the 128-position limit, ``ignore_eos``): the logprobs at every
  generated position follow the table for the context extended by the sampled tokens (vLLM's paged
  KV cache and single-token decode);
* ``logprobs_mode="raw_logits"``: vLLM's logits equal the table bit for bit (bound 0), ``<bos>``'s
  -65536 included;
* ``logprobs_mode="processed_logprobs"`` at temperature 0.5 (the targets only): log-softmax of table / 0.5
  (bounds doubled: the logprobs' range, hence their ulp, doubles).

The bounds hold in both dtypes because the checkpoints' logits are exact in float32 and bfloat16
(``docs/exact-models.md``) and vLLM computes logprobs from float32 logits: what remains is the float32
rounding of log_softmax over values in [-19, 0] (half an ulp of 16 is 9.5e-7, plus the log-sum-exp
rounding). ``<bos>`` (logit -65536, probability 0) is checked to 1/64 (an ulp of 65536 in float32 is
1/128). vLLM cannot score a 128-token context (prompt + 1 output token must fit ``max_model_len`` =
``max_position_embeddings`` = 128), so the longest context checked is 127 tokens.

The engine runs in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: a load takes ~2 s instead of ~25 s)
with a 1 GiB CPU KV cache (``VLLM_CPU_KVCACHE_SPACE=1``), ``enforce_eager``, ``max_model_len=128``.
"""

from __future__ import annotations

import os
import random

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from vllm import SamplingParams  # noqa: E402  (a missing engine fails the stage, never skips)

from specdec_ref.exact import BOS_LOGIT, EXACT_MODELS, MAX_POSITIONS, ExactModel  # noqa: E402

from .vllm_engines import Engines  # noqa: E402

#: Stated bound on |vLLM logprob - table log-softmax| for real tokens, float32 and bfloat16 checkpoints.
LOGPROB_BOUND = 2e-6
#: Bound for the <bos> column (logprob ~ -65538: float32 ulp 1/128).
BOS_LOGPROB_BOUND = 2.0**-6
#: vLLM scores contexts of at most max_model_len - 1 tokens.
MAX_CONTEXT = MAX_POSITIONS - 1
ORDER2_REAL = (0, 1, 2, 3, 4, 5, 7)
DTYPES = ("float32", "bfloat16")
#: the models of 128 positions (the long family: engine_tests/test_vllm_long_models.py)
PARAMS = [(name, dtype) for dtype in DTYPES for name, m in EXACT_MODELS.items() if m.family != "long"]
#: Worst errors seen, by (model, dtype, check): printed at the end of each model's tests (``-s``).
MEASURED: dict[tuple[str, str, str], float] = {}


def _grouped(params):
    """One xdist group per dtype (``--dist loadgroup``): each worker loads a model's engines once, for its dtype."""
    return [pytest.param(p, marks=pytest.mark.xdist_group(f"vllm_exact_{p[1]}")) for p in params]


def _module_engines(request):
    name, dtype = request.param
    eng = Engines(EXACT_MODELS[name], dtype, max_model_len=MAX_POSITIONS)
    yield eng
    eng.close()
    for (n, d, check), err in sorted(MEASURED.items()):
        if (n, d) == (name, dtype):
            print(f"\nvLLM {name} {dtype} {check}: max |error| = {err:.3g}")


@pytest.fixture(scope="module", params=_grouped(PARAMS), ids=lambda p: f"{p[0]}-{p[1]}")
def engines(request):
    yield from _module_engines(request)


def _contexts(m: ExactModel, seed: int) -> list[list[int]]:
    """Short contexts covering every table row, plus random ones of many lengths up to MAX_CONTEXT."""
    rng = random.Random(seed)
    out = m.row_contexts()
    lengths = list(range(2, 12)) + [31, 32, 33, 64, 100, MAX_CONTEXT - 1, MAX_CONTEXT]
    for n in lengths:
        if m.bos_id is None:
            out.append([rng.randrange(m.vocab) for _ in range(n)])
        else:
            out.append([m.bos_id] + [rng.choice(ORDER2_REAL) for _ in range(n - 1)])
    return out


def _as_vector(logprobs: dict) -> torch.Tensor:
    return torch.tensor([logprobs[v].logprob for v in range(len(logprobs))], dtype=torch.float64)


def _table(m: ExactModel, contexts, dtype: str) -> torch.Tensor:
    """The logits the checkpoint computes: the table, rounded to bf16 for a bf16 run of an offset model (the
    offset models exist to be inexact in bf16: ``specdec_ref.exact.offset``, bound ``m.bf16_logit_bound``)."""
    z = m.next_logits(contexts)
    if dtype == "bfloat16" and getattr(m, "logit_offset", 0):
        from specdec_ref.exact.offset import bf16_table

        rounded = torch.from_numpy(bf16_table(z.numpy()))
        assert float((rounded - z).abs().max()) <= m.bf16_logit_bound
        return rounded
    return z


def _assert_logprobs(m: ExactModel, context: list[int], got: torch.Tensor, key, temperature: float = 1.0):
    want = torch.log_softmax(_table(m, [context], key[1])[0] / temperature, dim=-1)
    scale = max(1.0, 1.0 / temperature)  # the logprobs' range, hence their float32 ulp, grows as 1/T
    real = torch.ones(m.vocab, dtype=torch.bool)
    if m.bos_id is not None:
        real[m.bos_id] = False
        assert abs(float(got[m.bos_id] - want[m.bos_id])) <= BOS_LOGPROB_BOUND * scale, (context, got, want)
    err = float((got[real] - want[real]).abs().max())
    MEASURED[key] = max(MEASURED.get(key, 0.0), err)
    assert err <= LOGPROB_BOUND * scale, (m.name, len(context), context[-4:], err)


def _prompts(contexts):
    return [{"prompt_token_ids": c} for c in contexts]


def test_next_token_logprobs_equal_the_table(engines):
    m = engines.model
    contexts = _contexts(m, seed=1)
    outs = engines().generate(_prompts(contexts), SamplingParams(max_tokens=1, logprobs=m.vocab, temperature=1.0), use_tqdm=False)
    assert len(outs) == len(contexts)
    for ctx, out in zip(contexts, outs):
        assert list(out.prompt_token_ids) == ctx
        (step,) = out.outputs[0].logprobs
        assert len(step) == m.vocab
        _assert_logprobs(m, ctx, _as_vector(step), (m.name, engines.dtype, "next-token logprob"))


def test_prompt_logprobs_of_every_prefix(engines):
    m = engines.model
    rng = random.Random(2)
    first = m.bos_id if m.bos_id is not None else 5
    prompts = [_contexts(m, seed=3)[-1], [first] + [rng.choice(ORDER2_REAL) for _ in range(MAX_CONTEXT - 1)]]
    params = SamplingParams(max_tokens=1, logprobs=m.vocab, prompt_logprobs=m.vocab, temperature=1.0)
    outs = engines().generate(_prompts(prompts), params, use_tqdm=False)
    for prompt, out in zip(prompts, outs):
        per_position = out.prompt_logprobs
        assert len(per_position) == len(prompt) == MAX_CONTEXT and per_position[0] is None
        for i in range(1, len(prompt)):
            _assert_logprobs(m, prompt[:i], _as_vector(per_position[i]), (m.name, engines.dtype, "prompt logprob"))


def test_decode_steps_follow_the_law(engines):
    """Generated tokens extend the context: each step's logprobs are the table's for the extended
    context (paged KV cache, one-token decode), up to the 128-position limit."""
    m = engines.model
    contexts = [c for c in _contexts(m, seed=4) if len(c) <= 100][-6:] + [m.row_contexts()[0]]
    steps = [min(28, MAX_POSITIONS - len(c)) for c in contexts]  # the 100-token context reaches 128
    params = [
        SamplingParams(max_tokens=n, logprobs=m.vocab, temperature=1.0, seed=k, ignore_eos=True)
        for k, n in enumerate(steps)
    ]
    outs = engines().generate(_prompts(contexts), params, use_tqdm=False)
    reached = 0
    for ctx, n, out in zip(contexts, steps, outs):
        gen = out.outputs[0]
        assert len(gen.token_ids) == len(gen.logprobs) == n
        seq = list(ctx)
        for tok, step in zip(gen.token_ids, gen.logprobs):
            _assert_logprobs(m, seq, _as_vector(step), (m.name, engines.dtype, "decode logprob"))
            assert tok != m.bos_id  # probability exactly 0
            seq.append(tok)
        reached = max(reached, len(seq))
    assert reached == MAX_POSITIONS


def test_raw_logits_are_bit_exact(engines):
    m = engines.model
    contexts = _contexts(m, seed=5)
    llm = engines("raw_logits")
    outs = llm.generate(_prompts(contexts), SamplingParams(max_tokens=1, logprobs=m.vocab, temperature=1.0), use_tqdm=False)
    for ctx, out in zip(contexts, outs):
        got = _as_vector(out.outputs[0].logprobs[0])
        want = _table(m, [ctx], engines.dtype)[0]
        assert torch.equal(got, want), (m.name, engines.dtype, ctx, got, want)
        if m.bos_id is not None:
            assert float(got[m.bos_id]) == BOS_LOGIT
    MEASURED[(m.name, engines.dtype, "raw logits")] = 0.0


#: the processed path is vLLM's transform of the logits, the same code for every checkpoint, and every checkpoint's
#: logits are checked bit for bit above: it is checked on the targets (order-1; order-2 with its <bos> column; the
#: bf16-inexact offset target), not once more per draft checkpoint (an engine each)
TARGET_PARAMS = [(name, dtype) for name, dtype in PARAMS if name.startswith(("order1-target", "order2-target"))]


@pytest.fixture(scope="module", params=_grouped(TARGET_PARAMS), ids=lambda p: f"{p[0]}-{p[1]}")
def target_engines(request):
    yield from _module_engines(request)


def test_processed_logprobs_at_temperature(target_engines):
    engines = target_engines
    m = engines.model
    contexts = _contexts(m, seed=6)
    llm = engines("processed_logprobs")
    outs = llm.generate(_prompts(contexts), SamplingParams(max_tokens=1, logprobs=m.vocab, temperature=0.5), use_tqdm=False)
    for ctx, out in zip(contexts, outs):
        _assert_logprobs(m, ctx, _as_vector(out.outputs[0].logprobs[0]), (m.name, engines.dtype, "logprob at T=0.5"), temperature=0.5)
