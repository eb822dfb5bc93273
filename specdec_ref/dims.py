"""A model's dimensions, read from its transformers config (either spelling of each field), memoised per model.

The one place every module asks for ``vocab_size``, ``num_layers``, ``num_kv_heads``, ``head_dim`` and
``max_positions`` (``specdec_ref.models`` re-exports :func:`model_dims`).
"""
from __future__ import annotations

import weakref

from torch import nn

__all__ = ["model_dims"]

#: The raw config fields :func:`model_dims` reads (either spelling): a memo entry is valid while they are unchanged.
_DIM_FIELDS = (
    "vocab_size", "num_attention_heads", "n_head", "hidden_size", "n_embd", "num_key_value_heads", "head_dim",
    "max_position_embeddings", "n_positions", "num_hidden_layers", "n_layer",
)
#: ``model -> ((id(config), values of _DIM_FIELDS), dims)`` for configs without sub-configs (transformers' attribute lookup is
#: slow, and every decode asks several times).
_DIMS: "weakref.WeakKeyDictionary[nn.Module, tuple]" = weakref.WeakKeyDictionary()


def model_dims(model: nn.Module) -> dict[str, int]:
    """``vocab_size``, ``num_layers``, ``num_kv_heads``, ``head_dim``, ``max_positions`` from the config."""
    config = model.config
    # The instance dict read past the config class's own ``__getattribute__`` (transformers' is slow), so a memo hit
    # costs a dict lookup per field.
    raw = instance_dict(config)
    plain = raw is not None and not getattr(type(config), "sub_configs", None)
    if plain:
        stamp = (id(config),) + tuple(raw.get(name) for name in _DIM_FIELDS)
        hit = _DIMS.get(model)
        if hit is not None and hit[0] == stamp:
            return dict(hit[1])
    dims = _read_dims(config)
    if plain:
        _DIMS[model] = (stamp, dims)
    return dict(dims)


def instance_dict(config) -> dict | None:
    """``config.__dict__`` read past the class's own ``__getattribute__`` (None without one)."""
    try:
        return object.__getattribute__(config, "__dict__")
    except AttributeError:
        return None


def _read_dims(config) -> dict[str, int]:
    cfg = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    num_heads = getattr(cfg, "num_attention_heads", None) or cfg.n_head
    hidden = getattr(cfg, "hidden_size", None) or cfg.n_embd
    kv_heads = getattr(cfg, "num_key_value_heads", None) or num_heads
    head_dim = getattr(cfg, "head_dim", None) or hidden // num_heads
    max_positions = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)
    num_layers = getattr(cfg, "num_hidden_layers", None) or cfg.n_layer
    return {
        "vocab_size": int(cfg.vocab_size),
        "num_layers": int(num_layers),
        "num_kv_heads": int(kv_heads),
        "head_dim": int(head_dim),
        "max_positions": int(max_positions) if max_positions else 0,
    }
