"""A lean static-KV-cache forward for Llama / Qwen2 and GPT-2 models (gpt-fast style), ``ModelCache``'s interface.

``StaticModelCache`` runs the *same weights* as the transformers model through a hand-written
forward (embedding -> [RMSNorm -> fused QKV -> RoPE -> SDPA over the cache -> o_proj -> RMSNorm ->
fused gate/up -> SiLU -> down] x layers -> RMSNorm -> lm_head; for GPT-2: token + learned position
embeddings -> [LayerNorm -> c_attn -> SDPA -> c_proj -> LayerNorm -> c_fc -> tanh GELU -> c_proj] x
layers -> LayerNorm -> lm_head, the ``Conv1D`` projections as ``addmm`` like transformers) with K/V written into
preallocated buffers ``(B, kv_heads, max_length, head_dim)`` per layer. Rollback (``trim`` /
``commit``) only moves the Python-int length: entries past it are stale and never read, because
attention reads ``[:, :, :tentative_length]`` only. On a CPU with tiny models the transformers
forward is almost all Python/dispatch overhead; this one issues far fewer ops.

Semantics, validation messages and lengths are :class:`specdec_ref.cache.ModelCache`'s (it is a
subclass; only the forward, the storage, ``layer_kv`` and ``reset`` differ). The numerical
guarantee is the same: keys, values and logits equal a fresh transformers prefill within
``ATOL=1e-5, RTOL=1e-4`` in float32 (tested in ``tests/test_static_cache.py``). The arithmetic
mirrors transformers op for op (RMSNorm in float32 then cast, ``q*cos + rotate_half(q)*sin``
with transformers' own cos/sin tables, scale ``head_dim**-0.5``); the differences are reduction
orders only (fused QKV / gate-up GEMMs, SDPA kernel vs eager attention).

Differences from ``ModelCache``:

* Supported: ``model.config.model_type in {"llama", "qwen2"}`` with full attention only (no
  sliding-window layers), SiLU MLP, non-dynamic RoPE; ``"gpt2"`` with the tanh GELU
  (``gelu_new``), no cross-attention and no reordered upcast attention. Anything else raises
  ``ValueError`` (check with :func:`supports` first).
* Weights are *snapshotted* at construction (fused QKV and gate/up copies; norms, embedding and
  lm_head by reference; GPT-2's weights all by reference). If you change the model's weights afterwards, call
  :meth:`StaticModelCache.refresh_weights`.
* ``max_length`` (default: the model's ``max_position_embeddings``) bounds the positions;
  ``feed`` raises the same ``ValueError`` as ``ModelCache`` beyond it (``max_positions`` is
  set to ``max_length``).
* ``layer_kv()`` returns views of the static buffers: valid until the next ``feed`` (a later feed
  after a trim overwrites positions in place). ``hf_cache`` is a :class:`StaticKV` holder, not a
  transformers cache.
* Trees (:meth:`~specdec_ref.cache.ModelCache.feed_tree` / :meth:`~specdec_ref.cache.ModelCache.compact`):
  the same lean forward with RoPE rows gathered at the nodes' depth positions and a boolean SDPA mask;
  compaction copies the kept slots' buffer entries down (``index_select``, then a slice write).
"""

from __future__ import annotations

import math
import operator
import weakref

import torch
import torch.nn.functional as F
from torch import nn

from specdec_ref.cache import ATOL, RTOL, ModelCache
from specdec_ref.dims import instance_dict
from specdec_ref.forward import WeightsWatch
from specdec_ref.row_products import linear
from specdec_ref.static_rows import RaggedRows

__all__ = ["StaticModelCache", "StaticKV", "supports", "fastest_cache", "SUPPORTED_MODEL_TYPES", "FINAL", "ATOL", "RTOL"]

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "gpt2")
#: GPT-2 activations the lean forward runs: both are the tanh approximation of GELU (transformers' ``NewGELU``).
GPT2_ACTIVATIONS = ("gelu_new", "gelu_pytorch_tanh")
#: The :attr:`StaticModelCache.capture` key of the last hidden state after the model's final norm.
FINAL = "final"


def _text_config(model):
    cfg = model.config
    return cfg.get_text_config(decoder=True) if hasattr(cfg, "get_text_config") else cfg


def _unsupported_reason(model) -> str | None:
    """``None`` when :class:`StaticModelCache` can run ``model``, else why not."""
    cfg = getattr(model, "config", None)
    if cfg is None:
        return "the model has no config"
    cfg = _text_config(model)
    model_type = getattr(cfg, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        return f"StaticModelCache supports llama, qwen2 and gpt2 configs, got model_type={model_type!r}"
    if model_type == "gpt2":
        return _gpt2_unsupported_reason(model, cfg)
    layer_types = getattr(cfg, "layer_types", None) or []
    odd = sorted({t for t in layer_types if t != "full_attention"})
    if odd:
        return f"StaticModelCache supports full-attention layers only; this config has {odd}"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"StaticModelCache supports the SiLU MLP only, got hidden_act={cfg.hidden_act!r}"
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers") or not hasattr(model, "lm_head"):
        return "StaticModelCache needs model.model.layers and model.lm_head (a *ForCausalLM module tree)"
    rotary = getattr(inner, "rotary_emb", None)
    rope_type = getattr(rotary, "rope_type", "default") if rotary is not None else None
    if rotary is None:
        return "StaticModelCache needs model.model.rotary_emb"
    if "dynamic" in str(rope_type) or rope_type == "longrope":
        return f"StaticModelCache supports static RoPE tables only, got rope_type={rope_type!r}"
    return None


def _gpt2_unsupported_reason(model, cfg) -> str | None:
    act = getattr(cfg, "activation_function", None)
    if act not in GPT2_ACTIVATIONS:
        return f"StaticModelCache runs GPT-2 with the tanh GELU only ({', '.join(GPT2_ACTIVATIONS)}), got {act!r}"
    for flag in ("add_cross_attention", "reorder_and_upcast_attn"):
        if getattr(cfg, flag, False):
            return f"StaticModelCache does not run GPT-2 with {flag}=True"
    inner = getattr(model, "transformer", None)
    if inner is None or not all(hasattr(inner, name) for name in ("h", "wte", "wpe", "ln_f")) or not hasattr(model, "lm_head"):
        return "StaticModelCache needs model.transformer.{h, wte, wpe, ln_f} and model.lm_head (a GPT2LMHeadModel module tree)"
    return None


#: ``model -> (stamp, reason)``: the support verdict per model, re-decided when its config object or the config fields
#: it reads change, or its inner model, rotary module or lm_head is replaced (each cache a decode opens asks;
#: transformers' config lookups are slow).
_SUPPORT: "weakref.WeakKeyDictionary[nn.Module, tuple]" = weakref.WeakKeyDictionary()


def _support_stamp(model) -> tuple:
    inner = getattr(model, "model", None)
    cfg = getattr(model, "config", None)
    raw = instance_dict(cfg) or {}  # the config fields the verdict reads, past transformers' slow attribute lookup
    fields = tuple(repr(raw.get(name)) for name in ("model_type", "layer_types", "hidden_act", "text_config",
                                                    "activation_function", "add_cross_attention", "reorder_and_upcast_attn"))
    return (id(cfg), type(cfg), fields, id(inner), id(getattr(inner, "rotary_emb", None)), id(getattr(model, "lm_head", None)),
            id(getattr(model, "transformer", None)))


def _support_reason(model) -> str | None:
    """:func:`_unsupported_reason`, memoised per model (see ``_SUPPORT``)."""
    try:
        hit = _SUPPORT.get(model)
    except TypeError:  # not weak-referenceable: decide every time
        return _unsupported_reason(model)
    stamp = _support_stamp(model)
    if hit is not None and hit[0] == stamp:
        return hit[1]
    reason = _unsupported_reason(model)
    _SUPPORT[model] = (stamp, reason)
    return reason


def supports(model) -> bool:
    """True when :class:`StaticModelCache` can run ``model`` (Llama / Qwen2: full attention, SiLU, static RoPE; GPT-2:
    tanh GELU, no cross-attention)."""
    return _support_reason(model) is None


class StaticKV:
    """The preallocated storage: ``keys[i]`` / ``values[i]`` are ``(B, kv_heads, max_length, head_dim)``.

    ``layers`` is empty (it is not a transformers cache; the attribute only exists so that code
    inspecting ``hf_cache.layers`` sees no transformers layers).
    """

    layers: tuple = ()

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor]):
        self.keys = keys
        self.values = values

    @property
    def max_length(self) -> int:
        return self.keys[0].shape[2] if self.keys else 0


class _Layer:
    __slots__ = ("in_norm", "wqkv", "bqkv", "wo", "bo", "post_norm", "wgu", "bgu", "wd", "bd", "in_bias", "post_bias", "scale")


def _cat_bias(linears, device, dtype):
    biases = [lin.bias for lin in linears]
    if all(b is None for b in biases):
        return None
    return torch.cat(
        [b.detach() if b is not None else torch.zeros(lin.out_features, device=device, dtype=dtype)
         for b, lin in zip(biases, linears)]
    )


#: Fused weights per model, valid while its :class:`~specdec_ref.forward.WeightsWatch` sees no change (see
#: :meth:`StaticModelCache.refresh_weights`).
_FUSED: "weakref.WeakKeyDictionary[nn.Module, tuple]" = weakref.WeakKeyDictionary()
#: ``model -> {(max_length, device, dtype): (inv_freq stamp, (cos, sin, causal))}`` (see ``StaticModelCache._tables``).
_TABLES: "weakref.WeakKeyDictionary[nn.Module, dict]" = weakref.WeakKeyDictionary()


class StaticModelCache(RaggedRows, ModelCache):
    """``ModelCache`` semantics on a lean forward with a preallocated K/V cache (Llama / Qwen2 / GPT-2 only).

    Args:
        model: a ``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` (full attention, float32 or bfloat16).
        batch_size: rows of every ``ids`` passed to :meth:`feed`; all rows share the same positions.
        check_ids: validate ids are in ``[0, vocab_size)`` (one read-back per feed; see ``ModelCache``).
        max_length: positions to preallocate (``1 <= max_length <= max_position_embeddings``;
            default ``max_position_embeddings``).

    Raises:
        ValueError: unsupported architecture (``"StaticModelCache supports llama and qwen2 configs, got ..."``)
            or bad ``max_length``.
    """

    #: Hidden states every forward keeps in :attr:`captured` (layer numbers, :data:`FINAL`); empty: none.
    capture: tuple = ()
    captured: dict = {}

    def __init__(self, model: nn.Module, *, batch_size: int = 1, check_ids: bool = True, max_length: int | None = None):
        reason = _support_reason(model)
        if reason is not None:
            raise ValueError(reason)
        if max_length is not None:
            if isinstance(max_length, bool) or isinstance(max_length, torch.Tensor):
                raise TypeError(f"max_length must be a Python int, got {type(max_length).__name__}")
            max_length = operator.index(max_length)
        self._max_length_arg = max_length
        super().__init__(model, batch_size=batch_size, check_ids=check_ids)

    # ------------------------------------------------------------------ set-up
    def _setup(self) -> None:
        model = self.model
        cfg = _text_config(model)
        limit = self.max_positions
        max_length = self._max_length_arg if self._max_length_arg is not None else limit
        if max_length < 1 or (limit and max_length > limit):
            raise ValueError(f"max_length must be in [1, max_position_embeddings={limit}], got {max_length}")
        self.max_length: int = int(max_length)
        self.max_positions = self.max_length  # ModelCache._validate_ids rejects feeds beyond the buffers
        self.num_heads: int = int(cfg.num_attention_heads)
        self.gpt2: bool = cfg.model_type == "gpt2"  # learned positions and LayerNorm (else RoPE and RMSNorm)
        if self.dtype not in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
            raise ValueError(f"StaticModelCache supports floating-point models, got dtype {self.dtype}")
        self._load_weights()
        self._cos, self._sin, self._causal = self._tables()

    def _tables(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """RoPE cos / signed sin and the causal mask for ``max_length`` positions, shared by the caches of a model
        (read-only) while its rotary module's ``inv_freq`` buffer is the same tensor, unmodified."""
        inv = None if self.gpt2 else getattr(self.model.model.rotary_emb, "inv_freq", None)
        key = (self.max_length, self.device, self.dtype)
        stamp = "gpt2" if self.gpt2 else None if inv is None else (inv.data_ptr(), inv._version)
        per_model = _TABLES.setdefault(self.model, {})
        hit = per_model.get(key)
        if hit is not None and stamp is not None and hit[0] == stamp:
            return hit[1]
        tables = self._build_tables()
        per_model[key] = (stamp, tables)
        return tables

    def _build_tables(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        model = self.model
        causal = torch.ones(self.max_length, self.max_length, dtype=torch.bool, device=self.device).tril_()
        if self.gpt2:  # learned positions: no RoPE tables (cos and sin None)
            return None, None, causal
        # RoPE tables from the model's own rotary module (transformers' exact cos/sin, cast to the
        # model dtype as transformers does), for positions 0..max_length-1.
        with torch.no_grad():
            positions = torch.arange(self.max_length, device=self.device).unsqueeze(0)
            probe = torch.zeros((), dtype=self.dtype, device=self.device)
            cos, sin = model.model.rotary_emb(probe, positions)
        cos, sin = cos[0], sin[0]  # (max_length, head_dim)
        half = self.head_dim // 2
        # rotate_half(x) * sin == roll(x, half) * [-sin[:half], sin[half:]] exactly (sign flips are exact).
        signed_sin = torch.cat([-sin[:, :half], sin[:, half:]], dim=-1)
        cos_t = cos[None, :, None, :].contiguous()  # (1, L, 1, D) for the (B, n, heads, D) layout
        sin_t = signed_sin[None, :, None, :].contiguous()
        return cos_t, sin_t, causal

    def refresh_weights(self) -> None:
        """Re-read the weights from the transformers module tree (after changing the model's parameters)."""
        self._fuse_weights()
        names = ("_layers", "_embed", "_pos_embed", "_final_norm", "_final_bias", "_lm_w", "_lm_b", "_eps", "_final_eps")
        _FUSED[self.model] = (WeightsWatch(self.model), {name: self.__dict__[name] for name in names})

    def _load_weights(self) -> None:
        """Fused weights shared by every cache of a model whose parameters were not replaced or modified
        in place since (:class:`~specdec_ref.forward.WeightsWatch`), so a cache per decode
        call does not re-fuse.
        Writes through ``.data`` bypass version counters: call :meth:`refresh_weights` after those."""
        cached = _FUSED.get(self.model)
        if cached is not None and cached[0].unchanged():
            self.__dict__.update(cached[1])
        else:
            self.refresh_weights()

    def _fuse_weights(self) -> None:
        if self.gpt2:
            return self._gpt2_weights()
        model = self.model
        inner = model.model
        dev, dt = self.device, self.dtype
        layers = []
        with torch.no_grad():
            for block in inner.layers:
                attn, mlp = block.self_attn, block.mlp
                lay = _Layer()
                lay.in_norm = block.input_layernorm.weight.detach()
                lay.wqkv = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]).detach().contiguous()
                lay.bqkv = _cat_bias([attn.q_proj, attn.k_proj, attn.v_proj], dev, dt)
                lay.wo = attn.o_proj.weight.detach()
                lay.bo = attn.o_proj.bias.detach() if attn.o_proj.bias is not None else None
                lay.post_norm = block.post_attention_layernorm.weight.detach()
                lay.wgu = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).detach().contiguous()
                lay.bgu = _cat_bias([mlp.gate_proj, mlp.up_proj], dev, dt)
                lay.wd = mlp.down_proj.weight.detach()
                lay.bd = mlp.down_proj.bias.detach() if mlp.down_proj.bias is not None else None
                layers.append(lay)
        self._layers = layers
        self._embed = inner.embed_tokens.weight.detach()
        self._pos_embed = self._final_bias = None
        self._final_norm = inner.norm.weight.detach()
        self._lm_w = model.lm_head.weight.detach()
        self._lm_b = model.lm_head.bias.detach() if model.lm_head.bias is not None else None
        self._eps = [
            (float(b.input_layernorm.variance_epsilon), float(b.post_attention_layernorm.variance_epsilon))
            for b in inner.layers
        ]
        self._final_eps = float(inner.norm.variance_epsilon)

    def _gpt2_weights(self) -> None:
        """GPT-2's weights by reference: its ``Conv1D`` projections keep their ``(in, out)`` layout (``torch.addmm``, as
        transformers computes them), LayerNorm weights and biases, the attention scale of each layer."""
        model = self.model
        inner = model.transformer
        layers = []
        for block in inner.h:
            attn, mlp = block.attn, block.mlp
            lay = _Layer()
            lay.in_norm, lay.in_bias = block.ln_1.weight.detach(), block.ln_1.bias.detach()
            lay.wqkv, lay.bqkv = attn.c_attn.weight.detach(), attn.c_attn.bias.detach()
            lay.wo, lay.bo = attn.c_proj.weight.detach(), attn.c_proj.bias.detach()
            lay.post_norm, lay.post_bias = block.ln_2.weight.detach(), block.ln_2.bias.detach()
            lay.wgu, lay.bgu = mlp.c_fc.weight.detach(), mlp.c_fc.bias.detach()
            lay.wd, lay.bd = mlp.c_proj.weight.detach(), mlp.c_proj.bias.detach()
            lay.scale = float(attn.scaling)
            layers.append(lay)
        self._layers = layers
        self._embed = inner.wte.weight.detach()
        self._pos_embed = inner.wpe.weight.detach()
        self._final_norm, self._final_bias = inner.ln_f.weight.detach(), inner.ln_f.bias.detach()
        self._lm_w = model.lm_head.weight.detach()
        self._lm_b = model.lm_head.bias.detach() if model.lm_head.bias is not None else None
        self._eps = [(float(b.ln_1.eps), float(b.ln_2.eps)) for b in inner.h]
        self._final_eps = float(inner.ln_f.eps)

    # ------------------------------------------------------------------ ModelCache hooks
    def _new_cache(self) -> StaticKV:
        if not hasattr(self, "_layers"):
            self._setup()
        shape = (self.batch_size, self.num_kv_heads, self.max_length, self.head_dim)
        keys = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.num_layers)]
        values = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.num_layers)]
        return StaticKV(keys, values)

    def _crop_to(self, n: int) -> None:
        """Nothing to do: ``trim`` sets the length and attention never reads past it."""

    def reset(self) -> None:
        """Drop everything: both lengths become 0 (the buffers are kept; stale entries are never read)."""
        self._tentative = 0
        self._committed = 0

    def layer_kv(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per-layer ``(keys, values)`` views ``(B, kv_heads, tentative_length, head_dim)`` of the buffers.

        Read-only, and only valid until the next :meth:`feed` (which may overwrite trimmed positions).
        """
        end = self._tentative
        return [(k[:, :, :end], v[:, :, :end]) for k, v in zip(self._cache.keys, self._cache.values)]

    def _forward(self, ids: torch.Tensor, start: int) -> torch.Tensor:
        # inference_mode skips autograd/version-counter bookkeeping (~10% of a one-token forward on
        # CPU); in-place writes into the (normal) K/V buffers are allowed inside it. The logits leave
        # as a normal tensor (cast or clone outside inference mode) so callers may modify them.
        with torch.inference_mode():
            logits = self._lean_forward(ids, start)
        return logits.float() if logits.dtype != torch.float32 else logits.clone()

    # ------------------------------------------------------------------ trees (ModelCache.feed_tree / compact)
    def _tree_forward(self, ids: torch.Tensor, start: int, positions: torch.Tensor, mask: torch.Tensor, *,
                      embeds: torch.Tensor | None = None, head: bool = True) -> torch.Tensor:
        with torch.inference_mode():
            logits = self._lean_tree_forward(ids, start, positions, mask, embeds=embeds, head=head)
        return logits.float() if logits.dtype != torch.float32 else logits.clone()

    def _compact_slots(self, committed: int, keep: list[int]) -> None:
        """Buffer copies: the entries of slots ``keep`` move to ``committed ..`` (stale entries past it are never read)."""
        index = torch.tensor(keep, dtype=torch.long, device=self.device)
        end = committed + len(keep)
        with torch.inference_mode():
            for kbuf, vbuf in zip(self._cache.keys, self._cache.values):
                kbuf[:, :, committed:end] = kbuf.index_select(2, index)
                vbuf[:, :, committed:end] = vbuf.index_select(2, index)

    def _lean_tree_forward(self, ids: torch.Tensor, start: int, positions: torch.Tensor, mask: torch.Tensor, *,
                           embeds: torch.Tensor | None = None, head: bool = True) -> torch.Tensor:
        """:meth:`_lean_forward` with explicit position ids (``positions[n]``) and a boolean mask ``[n, start + n]``
        (``embeds`` / ``head``: see :meth:`_lean_layers`)."""
        if self.gpt2:
            self._llama_only(embeds, head)
            return self._gpt2_layers(ids, start, self._pos_embed.index_select(0, positions), mask, causal=False)
        cos = self._cos.index_select(1, positions)
        sin = self._sin.index_select(1, positions)
        return self._lean_layers(ids, start, cos, sin, mask, causal=False,
                                 embeds=None if embeds is None else embeds.to(self.dtype), head=head)

    def feed_embeds(self, ids: torch.Tensor, embeds: torch.Tensor, *, head: bool = False) -> torch.Tensor:
        """:meth:`feed` with the inputs ``embeds [B, n, H]`` in place of the token embeddings (``ids [B, n]`` gives the
        shape; a drafter's decoder layers fed their own inputs); ``head=False`` returns the residual stream after the
        last layer (float32), else the logits."""
        if self.gpt2:
            self._llama_only(embeds, head)
        ids = self._validate_ids(ids)
        n = ids.shape[1]
        start = self._feed_start()
        cos, sin = self._cos[:, start:start + n], self._sin[:, start:start + n]
        mask = None if n == 1 or start == 0 else self._causal[start:start + n, :start + n]
        with torch.inference_mode():
            out = self._lean_layers(ids, start, cos, sin, mask, causal=n > 1 and start == 0,
                                    embeds=embeds.to(self.dtype), head=head)
        self._after_feed(n)
        return out.float() if out.dtype != torch.float32 else out.clone()

    # ------------------------------------------------------------------ the forward
    def _rms(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        # transformers' LlamaRMSNorm / Qwen2RMSNorm, op for op. In float32 the fused F.rms_norm
        # gives the same values (float32 compute, weight multiply in float32) in one dispatch.
        dtype = x.dtype
        if dtype == torch.float32:
            return F.rms_norm(x, (x.shape[-1],), weight, eps)
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        return weight * h.to(dtype)

    def _lean_forward(self, ids: torch.Tensor, start: int) -> torch.Tensor:
        n = ids.shape[1]
        end = start + n
        if n == 1 or start == 0:
            mask = None  # one query sees everything; a block from 0 is plain causal
        else:
            mask = self._causal[start:end, :end]
        causal = n > 1 and start == 0
        if self.gpt2:
            self._llama_only(None, True)
            return self._gpt2_layers(ids, start, self._pos_embed[start:end], mask, causal=causal)
        cos = self._cos[:, start:end]
        sin = self._sin[:, start:end]
        return self._lean_layers(ids, start, cos, sin, mask, causal=causal)

    def _lean_layers(self, ids: torch.Tensor, start: int, cos, sin, mask, *, causal: bool, slots=None, end=None,
                     embeds: torch.Tensor | None = None, head: bool = True) -> torch.Tensor:
        """The layer stack: writes K/V at slots ``start .. start + n - 1`` (or per row at ``slots [B, n]``), attends
        over ``[:end]`` (default ``start + n``) with ``mask``. ``embeds [B, n, H]`` replaces the token embedding (a
        drafter's stack fed its own inputs, ``ids`` then only gives the shape); ``head=False`` returns the residual
        stream after the last layer instead of the logits. The hidden states named in :attr:`capture` are kept in
        :attr:`captured` (see :meth:`features`)."""
        b, n = ids.shape
        end = start + n if end is None else end
        rows = None if slots is None else torch.arange(b, device=ids.device).unsqueeze(1)
        nh, nkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        nqk = nh + nkv
        half = d // 2
        keys, values = self._cache.keys, self._cache.values
        capture = self.capture
        x = F.embedding(ids, self._embed) if embeds is None else embeds
        captured = {0: x} if 0 in capture else {}
        for i, lay in enumerate(self._layers):
            eps_in, eps_post = self._eps[i]
            h = self._rms(x, lay.in_norm, eps_in)
            qkv = linear(h, lay.wqkv, lay.bqkv).view(b, n, nqk + nkv, d)
            qk = qkv[:, :, :nqk]
            qk = qk * cos + qk.roll(half, -1) * sin
            q = qk[:, :, :nh].transpose(1, 2)
            kbuf, vbuf = keys[i], values[i]
            if slots is None:
                kbuf[:, :, start:end] = qk[:, :, nh:].transpose(1, 2)
                vbuf[:, :, start:end] = qkv[:, :, nqk:].transpose(1, 2)
            else:  # advanced indices first: the target view is [B, n, kv_heads, D], the layout of qkv
                kbuf[rows, :, slots] = qk[:, :, nh:]
                vbuf[rows, :, slots] = qkv[:, :, nqk:]
            o = F.scaled_dot_product_attention(
                q, kbuf[:, :, :end], vbuf[:, :, :end], attn_mask=mask, is_causal=causal, enable_gqa=nh != nkv
            )
            x = x + linear(o.transpose(1, 2).reshape(b, n, nh * d), lay.wo, lay.bo)
            h = self._rms(x, lay.post_norm, eps_post)
            gate, up = linear(h, lay.wgu, lay.bgu).chunk(2, -1)
            x = x + linear(F.silu(gate) * up, lay.wd, lay.bd)
            if i + 1 in capture:
                captured[i + 1] = x
        if not head:
            self.captured = captured
            return x
        x = self._rms(x, self._final_norm, self._final_eps)
        if FINAL in capture:
            captured[FINAL] = x
        self.captured = captured
        return linear(x, self._lm_w, self._lm_b)

    def features(self) -> dict:
        """The hidden states named in :attr:`capture` from the last forward, ``{layer: Float[B, n, H]}`` (float32
        copies): ``0`` the token embeddings, ``l`` the residual stream after layer ``l``, :data:`FINAL` the last one
        after the final norm (what the lm_head reads)."""
        return {layer: x.float() if x.dtype != torch.float32 else x.clone() for layer, x in self.captured.items()}

    def _llama_only(self, embeds, head: bool) -> None:
        """The drafter inputs and hidden-state capture run on the Llama / Qwen2 forward only (NotSupportedError)."""
        if embeds is not None or not head or self.capture:
            from specdec_ref.contract import NotSupportedError

            raise NotSupportedError("drafter inputs (embeds), head=False and hidden-state capture need a Llama / Qwen2 "
                                    "model; the lean GPT-2 forward has neither")

    def _gpt2_layers(self, ids: torch.Tensor, start: int, pe, mask, *, causal: bool, slots=None, end=None) -> torch.Tensor:
        """:meth:`_lean_layers` for GPT-2: token plus learned position embeddings ``pe`` (``[n, H]`` or ``[B, n, H]``),
        LayerNorm, the ``Conv1D`` projections as ``addmm`` (transformers' own op), SDPA at each layer's scale, the tanh
        GELU (fused in float32; op for op as transformers' ``NewGELU`` in other dtypes)."""
        b, n = ids.shape
        end = start + n if end is None else end
        rows = None if slots is None else torch.arange(b, device=ids.device).unsqueeze(1)
        nh, d = self.num_heads, self.head_dim
        hidden = nh * d
        keys, values = self._cache.keys, self._cache.values
        x = F.embedding(ids, self._embed) + pe
        for i, lay in enumerate(self._layers):
            eps_in, eps_post = self._eps[i]
            h = F.layer_norm(x, (hidden,), lay.in_norm, lay.in_bias, eps_in)
            qkv = torch.addmm(lay.bqkv, h.view(b * n, hidden), lay.wqkv).view(b, n, 3 * nh, d)
            kbuf, vbuf = keys[i], values[i]
            if slots is None:
                kbuf[:, :, start:end] = qkv[:, :, nh : 2 * nh].transpose(1, 2)
                vbuf[:, :, start:end] = qkv[:, :, 2 * nh :].transpose(1, 2)
            else:
                kbuf[rows, :, slots] = qkv[:, :, nh : 2 * nh]
                vbuf[rows, :, slots] = qkv[:, :, 2 * nh :]
            o = F.scaled_dot_product_attention(
                qkv[:, :, :nh].transpose(1, 2), kbuf[:, :, :end], vbuf[:, :, :end], attn_mask=mask, is_causal=causal,
                scale=lay.scale,
            )
            x = x + torch.addmm(lay.bo, o.transpose(1, 2).reshape(b * n, hidden), lay.wo).view(b, n, hidden)
            h = F.layer_norm(x, (hidden,), lay.post_norm, lay.post_bias, eps_post)
            h = torch.addmm(lay.bgu, h.view(b * n, hidden), lay.wgu)
            if h.dtype == torch.float32:
                h = F.gelu(h, approximate="tanh")
            else:
                h = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * torch.pow(h, 3.0))))
            x = x + torch.addmm(lay.bd, h, lay.wd).view(b, n, hidden)
        x = F.layer_norm(x, (hidden,), self._final_norm, self._final_bias, self._final_eps)
        return linear(x, self._lm_w, self._lm_b)


def fastest_cache(model: nn.Module, **kwargs) -> ModelCache:
    """:class:`StaticModelCache` where :func:`supports` says so, else the transformers-backed :class:`ModelCache`."""
    return StaticModelCache(model, **kwargs) if supports(model) else ModelCache(model, **kwargs)
