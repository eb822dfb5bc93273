"""A small trained target/draft pair shipped with the package, plus a byte tokenizer.

The pair is produced by ``scripts/train_pair.py`` (deterministic, ~2-3 minutes on
two CPU cores) from a fixed list of Python standard-library sources and lives in
``specdec_ref/assets/pair/``:

* ``target.safetensors`` / ``target_config.json`` -- ``LlamaForCausalLM``,
  2 layers, hidden 128.
* ``draft.safetensors`` / ``draft_config.json`` -- ``Qwen2ForCausalLM``,
  1 layer, hidden 64 (a different architecture on purpose).
* ``training.json`` -- provenance: corpus files and sha256, seeds, steps, final
  held-out losses (bits per byte), measured greedy agreement, sha256 of each
  weight file (checked by the loader).
* ``prompts.json`` -- held-out text segments from which :func:`sample_prompts`
  cuts deterministic prompts, so prompts do not depend on the local stdlib.

Tokenizer: byte level, ``vocab_size == 256``, token id == byte value, no special
tokens (any id may be used as an "EOS" by a test).

Weights are stored in float32 with input/output embeddings tied; only one copy
(``model.embed_tokens.weight``) is stored and the loader re-creates
``lm_head.weight`` from it (files with an explicit ``lm_head.weight`` load too).

Forward API (transformers 5.x): ``model(input_ids=..., **cache_arg(model, DynamicCache(...)))`` (``cache=`` in 5.24, ``past_key_values=`` in 5.19)
returns an object with ``.logits`` of shape ``[batch, seq, 256]``.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import torch

from .forward import reference_logits, token_list

__all__ = [
    "ASSET_DIR",
    "CONTEXT_LENGTH",
    "VOCAB_SIZE",
    "PretrainedAssetError",
    "encode",
    "greedy_agreement",
    "decode",
    "load_model",
    "load_trained_pair",
    "training_metadata",
    "sample_prompts",
    "state_dict_checksum",
]

#: Directory holding the shipped pair (package data, located relative to this module).
ASSET_DIR: Path = Path(__file__).resolve().parent / "assets" / "pair"
#: The window the pair was trained at; prompt + generated tokens should stay <= this.
CONTEXT_LENGTH: int = 256
#: Byte-level vocabulary.
VOCAB_SIZE: int = 256

_EMBED_KEY = "model.embed_tokens.weight"
_HEAD_KEY = "lm_head.weight"


class PretrainedAssetError(RuntimeError):
    """A shipped asset is missing, corrupt, or does not match its metadata."""


# --------------------------------------------------------------------------- tokenizer


def encode(text: str) -> torch.LongTensor:
    """UTF-8 bytes of ``text`` as token ids, shape ``[1, n]`` (dtype long)."""
    data = text.encode("utf-8")
    return torch.tensor(list(data), dtype=torch.long).reshape(1, len(data))


def decode(ids) -> str:
    """Inverse of :func:`encode` (``errors="replace"``); accepts a tensor of any shape or a sequence of ints."""
    return bytes(token_list(ids, vocab=VOCAB_SIZE, what="byte")).decode("utf-8", errors="replace")


# --------------------------------------------------------------------------- loading


def _asset_dir(asset_dir: str | Path | None) -> Path:
    return ASSET_DIR if asset_dir is None else Path(asset_dir)


def _require(path: Path) -> Path:
    if not path.is_file():
        raise PretrainedAssetError(
            f"missing pretrained asset {path}; regenerate it with `python scripts/train_pair.py`"
        )
    return path


def _read_json(path: Path) -> dict:
    _require(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PretrainedAssetError(f"corrupt pretrained asset {path}: not valid JSON ({exc})") from exc


def _sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def training_metadata(asset_dir: str | Path | None = None) -> dict:
    """The parsed ``training.json`` of the pair."""
    return _read_json(_asset_dir(asset_dir) / "training.json")


def state_dict_checksum(model: torch.nn.Module) -> str:
    """sha256 over (name, dtype, shape, raw bytes) of every tensor in ``model.state_dict()``, sorted by name.

    Tied parameters appear under each of their names, so the value is the same
    whether or not the weights are tied.
    """
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().to("cpu").contiguous()
        h.update(name.encode())
        h.update(str(t.dtype).encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def _build_from_config(config_path: Path):
    # Imported lazily so `encode`/`decode`/`sample_prompts` stay cheap.
    from transformers import CONFIG_MAPPING, AutoModelForCausalLM

    cfg_dict = _read_json(config_path)
    model_type = cfg_dict.get("model_type")
    if model_type not in CONFIG_MAPPING:
        raise PretrainedAssetError(f"{config_path}: unknown or missing model_type {model_type!r}")
    config = CONFIG_MAPPING[model_type].from_dict(cfg_dict)
    if config.vocab_size != VOCAB_SIZE:
        raise PretrainedAssetError(f"{config_path}: vocab_size {config.vocab_size} != {VOCAB_SIZE}")
    # Random init is overwritten below; no hub access is involved.
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def load_model(
    name: str,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    asset_dir: str | Path | None = None,
    verify_checksum: bool = True,
):
    """Load one model of the pair (``name`` is ``"target"`` or ``"draft"``) in eval mode."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if name not in ("target", "draft"):
        raise ValueError(f"name must be 'target' or 'draft', not {name!r}")
    root = _asset_dir(asset_dir)
    weights_path = _require(root / f"{name}.safetensors")
    config_path = root / f"{name}_config.json"

    if verify_checksum:
        meta = training_metadata(root)
        expected = meta.get("files", {}).get(f"{name}.safetensors", {}).get("sha256")
        if expected is None:
            raise PretrainedAssetError(f"{root / 'training.json'} records no sha256 for {name}.safetensors")
        actual = _sha256_file(weights_path)
        if actual != expected:
            raise PretrainedAssetError(
                f"corrupt pretrained asset {weights_path}: sha256 {actual} != {expected} recorded in training.json"
            )

    model = _build_from_config(config_path)
    try:
        state = load_file(str(weights_path), device="cpu")
    except (SafetensorError, OSError, ValueError) as exc:
        raise PretrainedAssetError(f"corrupt pretrained asset {weights_path}: {exc}") from exc

    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    if _HEAD_KEY not in state and tied and _EMBED_KEY in state:
        state[_HEAD_KEY] = state[_EMBED_KEY]  # stored once; the module ties them
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise PretrainedAssetError(f"{weights_path} does not match {config_path}: {exc}") from exc
    if tied and model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr():
        raise PretrainedAssetError(f"{name}: tie_word_embeddings is set but the weights are not tied after loading")

    model.eval()
    model.requires_grad_(False)
    return model.to(device=device, dtype=dtype)


def load_trained_pair(
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    asset_dir: str | Path | None = None,
    verify_checksum: bool = True,
):
    """Return ``(target, draft)`` built from the shipped configs and safetensors weights.

    Raises :class:`PretrainedAssetError` when a file is missing, corrupt, or its
    sha256 differs from the one in ``training.json``.
    """
    target = load_model("target", dtype, device, asset_dir, verify_checksum)
    draft = load_model("draft", dtype, device, asset_dir, verify_checksum)
    return target, draft


# --------------------------------------------------------------------------- prompts


def _prompt_segments(asset_dir: str | Path | None = None) -> list[bytes]:
    path = _asset_dir(asset_dir) / "prompts.json"
    data = _read_json(path)
    segments = [s.encode("utf-8") for s in data.get("segments", [])]
    if not segments:
        raise PretrainedAssetError(f"{path} holds no prompt segments")
    return segments


def sample_prompts(
    n: int,
    length: int = 64,
    seed: int = 0,
    asset_dir: str | Path | None = None,
) -> list[torch.LongTensor]:
    """``n`` deterministic byte prompts, each ``LongTensor[1, length]``, cut from held-out text.

    The text comes from ``prompts.json`` (held-out tails of the training files,
    never trained on), so the prompts depend only on ``(n, length, seed)`` and the
    shipped assets, not on the local Python version. Uses :class:`random.Random`.
    """
    if n < 0:
        raise ValueError("n must be >= 0")
    if not 1 <= length <= CONTEXT_LENGTH:
        raise ValueError(f"length must be in [1, {CONTEXT_LENGTH}], got {length}")
    segments = [s for s in _prompt_segments(asset_dir) if len(s) >= length]
    if not segments:
        raise ValueError(f"no held-out segment is at least {length} bytes long")
    rng = random.Random(seed)
    prompts = []
    for _ in range(n):
        seg = segments[rng.randrange(len(segments))]
        start = rng.randrange(len(seg) - length + 1)
        prompts.append(torch.tensor(list(seg[start : start + length]), dtype=torch.long).reshape(1, length))
    return prompts


def greedy_agreement(target, draft, ids: torch.LongTensor) -> float:
    """Fraction of positions where ``argmax draft == argmax target``, teacher-forced on ``ids`` ([B, T])."""
    t = reference_logits(target, ids).argmax(-1)
    d = reference_logits(draft, ids).argmax(-1)
    return (t == d).float().mean().item()

