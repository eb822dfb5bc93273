"""Tiny seeded causal language models for tests, properties and bug-reproduction fixtures.

Everything here is built from a transformers config class (no model hub) with weights drawn
from a *local* ``torch.Generator`` seeded by ``seed``: the global RNG is neither read for the
weights nor left changed, so a model is a pure function of its arguments. Every model carries
``model.specdec_recipe`` (a JSON-serialisable dict) and :func:`build_from_recipe` rebuilds it
bit for bit, so a failing case can be stored as data.

Knobs:

* ``init_scale`` multiplies the output projection (``lm_head``). Larger ``init_scale`` means larger
  logits and therefore *more peaked* next-token distributions (mean max-probability closer to 1,
  lower entropy); ``init_scale -> 0`` tends to the uniform distribution. :func:`peakedness` and
  :func:`distribution_stats` measure it.
* :func:`make_draft` derives draft models with controllable agreement with a target:
  ``"identical"`` (exact copy, every draft token accepted), ``"noisy"`` (copy plus Gaussian noise,
  ``noise`` tunes the acceptance rate) and ``"independent"`` (a fresh model with another seed).
  :func:`acceptance_rate` measures the agreement (expected speculative-sampling acceptance
  ``sum_x min(p(x), q(x))`` and greedy top-1 agreement).

Attention is ``"eager"``: on CPU it is deterministic and gives the same numbers (to ~1e-6) for a
block forward and a one-token forward with a cache; see ``specdec_ref.cache`` for the tolerances.
"""

from __future__ import annotations

import copy
import json
import math
from typing import Any

import torch
from torch import nn

from .dims import model_dims  # noqa: F401  (re-exported: importable from here as before)
from .forward import reference_logits

__all__ = [
    "ARCHS",
    "DRAFT_FAMILIES",
    "tiny_lm",
    "make_draft",
    "build_from_recipe",
    "recipe_json",
    "next_token_logits",
    "peakedness",
    "distribution_stats",
    "acceptance_rate",
    "model_dims",
]

ARCHS = ("llama", "qwen2", "gpt2")
DRAFT_FAMILIES = ("identical", "noisy", "independent")

_DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}


def _dtype_name(dtype: torch.dtype) -> str:
    for name, d in _DTYPES.items():
        if d == dtype:
            return name
    raise ValueError(f"unsupported dtype {dtype!r}; expected one of {sorted(_DTYPES)}")


def _as_dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, str):
        name = dtype.removeprefix("torch.")
        if name not in _DTYPES:
            raise ValueError(f"unsupported dtype {dtype!r}; expected one of {sorted(_DTYPES)}")
        return _DTYPES[name]
    _dtype_name(dtype)  # validates
    return dtype


def _make_config(arch, *, vocab_size, hidden_size, num_layers, num_heads, num_kv_heads, max_positions):
    import transformers

    if arch in ("llama", "qwen2"):
        cls = transformers.LlamaConfig if arch == "llama" else transformers.Qwen2Config
        extra: dict[str, Any] = {}
        if arch == "qwen2":
            extra = {"use_sliding_window": False, "layer_types": ["full_attention"] * num_layers}
        return cls(
            vocab_size=vocab_size,
            hidden_size=hidden_size,
            intermediate_size=2 * hidden_size,
            num_hidden_layers=num_layers,
            num_attention_heads=num_heads,
            num_key_value_heads=num_kv_heads,
            max_position_embeddings=max_positions,
            attention_dropout=0.0,
            tie_word_embeddings=False,
            bos_token_id=None,
            eos_token_id=None,
            pad_token_id=None,
            **extra,
        )
    if arch == "gpt2":
        # GPT-2 has no grouped-query attention: num_kv_heads is ignored (kv heads == num_heads).
        return transformers.GPT2Config(
            vocab_size=vocab_size,
            n_embd=hidden_size,
            n_layer=num_layers,
            n_head=num_heads,
            n_positions=max_positions,
            n_inner=2 * hidden_size,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            tie_word_embeddings=False,
            bos_token_id=None,
            eos_token_id=None,
            pad_token_id=None,
        )
    raise ValueError(f"unknown arch {arch!r}; expected one of {ARCHS}")


def _init_weights_(model: nn.Module, generator: torch.Generator, init_scale: float) -> None:
    """Overwrite every parameter from ``generator`` in a fixed (name-sorted) order.

    embeddings ~ N(0, 1); 2-D weights ~ N(0, 1/fan_in) (GPT-2 Conv1D stores (in, out), handled);
    norm weights = 1, norm biases = 0; other biases ~ N(0, 0.1^2); lm_head additionally * init_scale.
    """
    norm_types = (nn.LayerNorm,)
    norm_param_names = set()
    for mod_name, mod in model.named_modules():
        if isinstance(mod, norm_types) or "RMSNorm" in type(mod).__name__ or "LayerNorm" in type(mod).__name__:
            for p_name, _ in mod.named_parameters(recurse=False):
                norm_param_names.add(f"{mod_name}.{p_name}" if mod_name else p_name)
    conv1d_names = set()
    for mod_name, mod in model.named_modules():
        if type(mod).__name__ == "Conv1D":
            conv1d_names.add(f"{mod_name}.weight")
    embedding_names = set()
    for mod_name, mod in model.named_modules():
        if isinstance(mod, nn.Embedding):
            embedding_names.add(f"{mod_name}.weight")

    seen: set[int] = set()
    with torch.no_grad():
        for name, param in sorted(model.named_parameters(remove_duplicate=False), key=lambda kv: kv[0]):
            if id(param) in seen:
                continue
            seen.add(id(param))
            shape = param.shape
            if name in norm_param_names:
                value = torch.ones(shape) if name.endswith("weight") else torch.zeros(shape)
            elif name in embedding_names:
                value = torch.randn(shape, generator=generator, dtype=torch.float64)
            elif param.dim() >= 2:
                fan_in = shape[0] if name in conv1d_names else shape[1]
                value = torch.randn(shape, generator=generator, dtype=torch.float64) / math.sqrt(fan_in)
            else:
                value = 0.1 * torch.randn(shape, generator=generator, dtype=torch.float64)
            if name.startswith("lm_head."):
                value = value * init_scale
            param.copy_(value.to(param.dtype))


def tiny_lm(
    arch: str = "llama",
    *,
    vocab_size: int = 16,
    hidden_size: int = 32,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    seed: int = 0,
    init_scale: float = 1.0,
    max_positions: int = 256,
    dtype: torch.dtype | str = torch.float32,
    device: str | torch.device = "cpu",
) -> nn.Module:
    """A tiny causal LM (``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` / ``GPT2LMHeadModel``).

    Deterministic in ``seed`` (local generator; the global RNG state is preserved), dropout 0,
    ``.eval()``, eager attention, untied ``lm_head``. ``init_scale`` scales ``lm_head``: larger is
    more peaked. ``num_kv_heads`` is ignored for ``gpt2`` (no GQA). ``max_positions`` is the
    model's position limit (GPT-2's learned position table size; enforced by
    ``specdec_ref.cache.ModelCache`` for every arch).
    """
    import transformers

    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}; expected one of {ARCHS}")
    if hidden_size % num_heads:
        raise ValueError(f"hidden_size={hidden_size} is not divisible by num_heads={num_heads}")
    if arch != "gpt2" and num_heads % num_kv_heads:
        raise ValueError(f"num_heads={num_heads} is not divisible by num_kv_heads={num_kv_heads}")
    if vocab_size < 2:
        raise ValueError(f"vocab_size must be >= 2, got {vocab_size}")
    dtype = _as_dtype(dtype)
    recipe = {
        "kind": "tiny_lm",
        "arch": arch,
        "vocab_size": int(vocab_size),
        "hidden_size": int(hidden_size),
        "num_layers": int(num_layers),
        "num_heads": int(num_heads),
        "num_kv_heads": int(num_heads if arch == "gpt2" else num_kv_heads),
        "seed": int(seed),
        "init_scale": float(init_scale),
        "max_positions": int(max_positions),
        "dtype": _dtype_name(dtype),
    }
    config = _make_config(
        arch,
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        max_positions=max_positions,
    )
    config._attn_implementation = "eager"
    cls = {
        "llama": transformers.LlamaForCausalLM,
        "qwen2": transformers.Qwen2ForCausalLM,
        "gpt2": transformers.GPT2LMHeadModel,
    }[arch]
    # Construction runs transformers' own initialisation on the global RNG: fork it so that
    # callers' random streams are untouched; every parameter is then overwritten below.
    with torch.random.fork_rng(devices=[]):
        model = cls(config)
    if model.get_output_embeddings() is model.get_input_embeddings():  # pragma: no cover - guarded by config
        raise RuntimeError("tiny_lm expects untied embeddings")
    generator = torch.Generator().manual_seed(int(seed))
    _init_weights_(model, generator, float(init_scale))
    model.to(device=device, dtype=dtype)
    model.eval()
    model.requires_grad_(False)
    model.specdec_recipe = recipe
    return model


def _tiny_lm_from_recipe(recipe: dict, device) -> nn.Module:
    kwargs = {k: v for k, v in recipe.items() if k not in ("kind", "arch")}
    return tiny_lm(recipe["arch"], device=device, **kwargs)


def make_draft(
    target: nn.Module,
    family: str,
    *,
    noise: float = 0.1,
    seed: int = 1,
    **overrides: Any,
) -> nn.Module:
    """A draft model for ``target`` with controllable agreement.

    * ``"identical"``: an exact deep copy (greedy and sampling verification accept everything).
    * ``"noisy"``: a copy with ``N(0, (noise * std(P))^2)`` added to every parameter tensor ``P``
      (std over that tensor's elements; constant tensors such as norm weights therefore stay
      unchanged). Noise is drawn from a local generator seeded by ``seed``. ``noise=0`` is
      identical; acceptance decreases as ``noise`` grows.
    * ``"independent"``: ``tiny_lm`` with the target's recipe but ``seed`` (and any ``overrides``,
      e.g. ``hidden_size=16, num_layers=1`` for a smaller draft); the vocabulary must match.

    The result carries ``specdec_recipe = {"kind": "draft", "family", "noise", "seed",
    "overrides", "target": <target recipe>}``; :func:`build_from_recipe` rebuilds it.
    """
    if family not in DRAFT_FAMILIES:
        raise ValueError(f"unknown draft family {family!r}; expected one of {DRAFT_FAMILIES}")
    target_recipe = getattr(target, "specdec_recipe", None)
    if family == "independent":
        if target_recipe is None or target_recipe.get("kind") != "tiny_lm":
            raise ValueError("the 'independent' draft needs a target built by tiny_lm (with a specdec_recipe)")
        kwargs = {k: v for k, v in target_recipe.items() if k not in ("kind", "arch")}
        arch = overrides.pop("arch", target_recipe["arch"])
        if "vocab_size" in overrides and overrides["vocab_size"] != target_recipe["vocab_size"]:
            raise ValueError("an independent draft must share the target's vocab_size")
        kwargs.update(overrides)
        kwargs["seed"] = int(seed)
        device = next(target.parameters()).device
        draft = tiny_lm(arch, device=device, **kwargs)
        overrides = dict(overrides, arch=arch)
    else:
        if overrides:
            raise ValueError(f"overrides {sorted(overrides)} only apply to the 'independent' family")
        draft = copy.deepcopy(target)
        if family == "noisy" and noise != 0:
            generator = torch.Generator().manual_seed(int(seed))
            with torch.no_grad():
                for _, param in sorted(draft.named_parameters(), key=lambda kv: kv[0]):
                    p64 = param.detach().to("cpu", torch.float64)
                    scale = float(p64.std()) if p64.numel() > 1 else float(p64.abs().mean())
                    eps = torch.randn(param.shape, generator=generator, dtype=torch.float64)
                    param.add_((noise * scale * eps).to(device=param.device, dtype=param.dtype))
        draft.eval()
    draft.specdec_recipe = {
        "kind": "draft",
        "family": family,
        "noise": float(noise) if family == "noisy" else 0.0,
        "seed": int(seed),
        "overrides": dict(overrides),
        "target": copy.deepcopy(target_recipe),
    }
    return draft


def build_from_recipe(recipe: dict | str, *, device: str | torch.device = "cpu") -> nn.Module:
    """Rebuild a model from ``model.specdec_recipe`` (a dict or its JSON text)."""
    if isinstance(recipe, str):
        recipe = json.loads(recipe)
    kind = recipe.get("kind")
    if kind == "tiny_lm":
        return _tiny_lm_from_recipe(recipe, device)
    if kind == "draft":
        if recipe.get("target") is None:
            raise ValueError("draft recipe has no target recipe; it cannot be rebuilt")
        target = build_from_recipe(recipe["target"], device=device)
        return make_draft(
            target,
            recipe["family"],
            noise=recipe.get("noise", 0.0),
            seed=recipe["seed"],
            **recipe.get("overrides", {}),
        )
    raise ValueError(f"unknown recipe kind {kind!r}")


def recipe_json(model: nn.Module) -> str:
    """``model.specdec_recipe`` as canonical JSON (sorted keys)."""
    return json.dumps(model.specdec_recipe, sort_keys=True)


def next_token_logits(model: nn.Module, ids, *, high_precision: bool = False) -> torch.Tensor:
    """The "fresh prefill" oracle: :func:`specdec_ref.forward.reference_logits`.

    ``ids``: ``[B, n]`` or ``[n]`` token ids. Returns ``[B, n, V]`` where row ``i`` is the
    next-token logits after ``ids[:, : i + 1]``; float32, or float64 computed by the cached float64
    copy of the model when ``high_precision=True`` (use it to classify near-tie flips).
    """
    return reference_logits(model, ids, dtype=torch.float64 if high_precision else None)


def _default_prompt(model: nn.Module, length: int = 32, seed: int = 1234) -> torch.Tensor:
    vocab = model_dims(model)["vocab_size"]
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (1, length), generator=g)


def distribution_stats(model: nn.Module, prompt=None) -> dict[str, float]:
    """Cheap diagnostics of the next-token distributions along ``prompt`` (default: 32 seeded random ids).

    ``mean_max_prob`` (peakedness), ``mean_entropy`` (nats), ``mean_top1_top2_gap`` (logit units).
    """
    prompt = _default_prompt(model) if prompt is None else prompt
    logits = next_token_logits(model, prompt).double()
    probs = logits.softmax(-1)
    top2 = logits.topk(2, dim=-1).values
    entropy = -(probs * probs.clamp_min(1e-300).log()).sum(-1)
    return {
        "mean_max_prob": float(probs.max(-1).values.mean()),
        "mean_entropy": float(entropy.mean()),
        "mean_top1_top2_gap": float((top2[..., 0] - top2[..., 1]).mean()),
    }


def peakedness(model: nn.Module, prompt=None) -> float:
    """Mean max next-token probability along ``prompt`` (1/V = uniform, 1 = deterministic)."""
    return distribution_stats(model, prompt)["mean_max_prob"]


def acceptance_rate(target: nn.Module, draft: nn.Module, prompt=None) -> dict[str, float]:
    """Agreement of ``draft`` with ``target`` along ``prompt`` (teacher-forced, temperature 1).

    ``alpha``: mean of ``sum_x min(p(x), q(x))``, the per-token acceptance probability of
    speculative sampling; ``greedy``: fraction of positions where the argmaxes agree.
    """
    prompt = _default_prompt(target) if prompt is None else prompt
    p = next_token_logits(target, prompt).double().softmax(-1)
    q = next_token_logits(draft, prompt).double().softmax(-1)
    if p.shape[-1] != q.shape[-1]:
        raise ValueError(f"vocab mismatch: target {p.shape[-1]} vs draft {q.shape[-1]}")
    return {
        "alpha": float(torch.minimum(p, q).sum(-1).mean()),
        "greedy": float((p.argmax(-1) == q.argmax(-1)).double().mean()),
    }
