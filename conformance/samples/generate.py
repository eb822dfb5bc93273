"""Producing a completions file with transformers: ``target.generate(..., assistant_model=draft)`` on a shipped pair.

Invariant: one ``generate`` call per sample, the i-th of a run drawn with the global torch RNG seeded
``seed + i`` inside ``fork_rng`` (the caller's RNG state is untouched), and every record names its seed and
the engine; nothing here depends on how the file is certified.
"""
from __future__ import annotations

from typing import Sequence

import torch

from specdec_ref.warp import SamplingConfig


def _hf_sampling_kwargs(sampling: SamplingConfig) -> dict:
    """transformers' options for ``sampling`` (:func:`specdec_ref.adapters.hf_backends.hf_sampling_options`: top-k and top-p off
    explicitly, since unset transformers adds its default top_k=50; a top-k tie rule other than ``"all"`` raises)."""
    from specdec_ref.adapters.hf_backends import hf_sampling_options

    return hf_sampling_options(sampling)


def generate_with_transformers(
    pair_name: str,
    prompts: Sequence[Sequence[int]],
    n: int,
    sampling: SamplingConfig,
    max_new_tokens: int,
    seed: int,
    *,
    eos: bool = True,
    assisted: bool = True,
    num_assistant_tokens: int | None = None,
    progress=None,
) -> list[dict]:
    """``n`` completions per prompt from transformers' own ``target.generate(..., assistant_model=draft)`` on a shipped pair.

    One ``generate`` call per sample (assisted generation is batch 1), the global torch RNG
    seeded with ``seed + i`` for the i-th sample (inside ``fork_rng``; the seed is recorded).
    ``eos``: stop at the model's EOS (else ``eos_token_id=[]``: ``None`` would fall back to the checkpoint's
    own ``generation_config``, which stops at EOS). ``assisted=False`` runs plain
    ``generate`` (no draft). ``num_assistant_tokens``: pin the draft length (default: transformers'
    own schedule). Returns records for :func:`certify_samples` / :func:`write_jsonl`.
    """
    import transformers
    from transformers import GenerationConfig

    from specdec_ref.exact import exact_pair

    pair = exact_pair(pair_name)
    target, draft = pair.target.load(), pair.draft.load() if assisted else None
    eos_id = int(pair.target.eos_id) if eos else None
    # eos_token_id=None would fall back to the checkpoint's generation_config (EOS 7); [] turns stopping off
    config = GenerationConfig(
        max_new_tokens=max_new_tokens, eos_token_id=eos_id if eos_id is not None else [],
        pad_token_id=eos_id if eos_id is not None else 0, **_hf_sampling_kwargs(sampling),
    )
    saved = None
    if assisted and num_assistant_tokens is not None:
        gc = draft.generation_config
        saved = {k: getattr(gc, k, None) for k in ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")}
        gc.num_assistant_tokens, gc.num_assistant_tokens_schedule, gc.assistant_confidence_threshold = num_assistant_tokens, "constant", 0.0
    engine = f"transformers {transformers.__version__} generate({'assistant_model=' + pair.draft.name if assisted else 'no draft'})"
    out_records = []
    count = 0
    try:
        for prompt in prompts:
            ids = torch.tensor([list(prompt)], dtype=torch.long)
            for _ in range(n):
                s = seed + count
                count += 1
                with torch.random.fork_rng(devices=[]), torch.no_grad():
                    torch.manual_seed(s)
                    kwargs = dict(assistant_model=draft) if assisted else {}
                    out = target.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config, **kwargs)
                completion = out[0, ids.shape[1]:].tolist()
                if eos_id is not None and eos_id in completion:
                    completion = completion[: completion.index(eos_id) + 1]
                ended = eos_id is not None and completion and completion[-1] == eos_id
                out_records.append({
                    "prompt_ids": list(prompt), "completion_ids": completion, "seed": s,
                    "finish_reason": "stop" if ended else "length", "engine": engine,
                })
                if progress is not None:
                    progress(count)
    finally:
        if saved is not None:
            for k, v in saved.items():
                setattr(draft.generation_config, k, v)
    return out_records
