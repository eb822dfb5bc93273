"""The exact models' checkpoint folders under ``specdec_ref/assets/exact/``: write, verify, command line.

Invariant: a folder's files are a pure function of its model (:func:`build_files`: JSON with sorted keys, a
safetensors file written by hand), so :func:`build` is byte-deterministic and :func:`check` demands that the
shipped folders equal what it would write, byte for byte. The command line is that of
:mod:`specdec_ref.exact` (``python -m specdec_ref.exact build|check``).
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from .registry import ASSET_ROOT, EXACT_MODELS, EXACT_PAIRS, ExactModel, exact_model
from .weights import llama_config, llama_weights

__all__ = ["build", "build_files", "check", "main"]

_CLI_DESCRIPTION = "Exactly-known target/draft models, shipped as real transformers checkpoints."
_TOKENIZER_UNK = "<unk>"  # not in any vocabulary: unknown words are an encoding error


def _json_bytes(obj) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=True) + "\n").encode("ascii")



def _tokenizer_json(model: ExactModel) -> dict:
    names = model.token_names()
    specials = [i for i, n in enumerate(names) if n.startswith("<")]
    post = None
    if model.bos_id is not None:
        bos = names[model.bos_id]
        post = {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [
                {"SpecialToken": {"id": bos, "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
                {"Sequence": {"id": "B", "type_id": 1}},
            ],
            "special_tokens": {bos: {"id": bos, "ids": [model.bos_id], "tokens": [bos]}},
        }
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": i,
                "content": names[i],
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
            for i in specials
        ],
        "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": post,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": {n: i for i, n in enumerate(names)}, "unk_token": _TOKENIZER_UNK},
    }


def _tokenizer_config(model: ExactModel) -> dict:
    names = model.token_names()
    out = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": names[model.eos_id],
        "pad_token": names[model.eos_id],
        "model_max_length": model.max_positions,
        "clean_up_tokenization_spaces": False,
        "model_input_names": ["input_ids", "attention_mask"],
    }
    if model.bos_id is not None:
        out["bos_token"] = names[model.bos_id]
    return out


def _generation_config(model: ExactModel) -> dict:
    out = {"eos_token_id": model.eos_id, "pad_token_id": model.eos_id}
    if model.bos_id is not None:
        out["bos_token_id"] = model.bos_id
    return out


def _safetensors_bytes(tensors: dict[str, np.ndarray], metadata: dict[str, str]) -> bytes:
    """A safetensors file (float32, little endian), written by hand so the bytes depend on nothing
    but the tensors: header keys sorted, data in key order, header padded with spaces to 8 bytes."""
    header: dict = {"__metadata__": dict(sorted(metadata.items()))}
    chunks = []
    offset = 0
    for name in sorted(tensors):
        arr = np.ascontiguousarray(tensors[name], dtype="<f4")
        data = arr.tobytes()
        header[name] = {"dtype": "F32", "shape": list(arr.shape), "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    head = json.dumps(header, separators=(",", ":"), sort_keys=True).encode("ascii")
    head += b" " * (-len(head) % 8)
    return struct.pack("<Q", len(head)) + head + b"".join(chunks)



def build_files(model: ExactModel) -> dict[str, bytes]:
    """Every file of ``model``'s checkpoint folder, as bytes (deterministic)."""
    # "exact_models": the public module's name when the checkpoints were written (now specdec_ref.exact); the shipped
    # bytes carry it, kept so that they stay byte-identical
    meta = {"format": "pt", "specdec_ref": "exact_models", "model": model.name}
    return {
        "config.json": _json_bytes(llama_config(model)),
        "generation_config.json": _json_bytes(_generation_config(model)),
        "model.safetensors": _safetensors_bytes(llama_weights(model), meta),
        "tokenizer.json": _json_bytes(_tokenizer_json(model)),
        "tokenizer_config.json": _json_bytes(_tokenizer_config(model)),
    }


def build(root: str | Path | None = None, names: Iterable[str] | None = None) -> dict[str, Path]:
    """(Re)write the checkpoint folder of every model (or of ``names``) under ``root``."""
    root = Path(root) if root is not None else ASSET_ROOT
    out = {}
    for name in names if names is not None else EXACT_MODELS:
        model = exact_model(name)
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        for fname, data in build_files(model).items():
            (folder / fname).write_bytes(data)
        out[name] = folder
    return out


def _folder_kb(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file()) / 1024.0


def check(root: str | Path | None = None, *, verbose: bool = True) -> list[dict]:
    """Verify that every shipped folder holds exactly what :func:`build` writes; return one row per
    model (name, arch, V, size in KB, acceptance of its pair against the target, problems) and print
    them as a table when ``verbose``. Raises ``AssertionError`` listing every mismatch."""
    root = Path(root) if root is not None else ASSET_ROOT
    draft_acc = {p.draft.name: (p.name, p.mean_acceptance()) for p in EXACT_PAIRS.values()}
    rows, problems = [], []
    for name, model in EXACT_MODELS.items():
        folder = root / name
        expected = build_files(model)
        bad = []
        for fname, data in expected.items():
            path = folder / fname
            if not path.is_file():
                bad.append(f"{fname} missing")
            elif path.read_bytes() != data:
                bad.append(f"{fname} differs")
        if folder.is_dir():
            extra = sorted(p.name for p in folder.iterdir() if p.name not in expected)
            bad += [f"unexpected {e}" for e in extra]
        pair, acc = draft_acc.get(name, ("-", None))
        rows.append(
            {
                "name": name,
                "arch": model.arch,
                "V": model.vocab,
                "size_kb": _folder_kb(folder) if folder.is_dir() else 0.0,
                "pair": pair,
                "acceptance": acc,
                "problems": bad,
            }
        )
        problems += [f"{name}: {b}" for b in bad]
    if verbose:
        print(f"{'name':<25} {'arch':<17} {'V':>2} {'size KB':>8}  {'pair':<19} {'acceptance':>10}  status")
        for r in rows:
            acc = "-" if r["acceptance"] is None else f"{r['acceptance']:.4f}"
            status = "ok" if not r["problems"] else "; ".join(r["problems"])
            print(f"{r['name']:<25} {r['arch']:<17} {r['V']:>2} {r['size_kb']:>8.1f}  {r['pair']:<19} {acc:>10}  {status}")
        print(f"total {sum(r['size_kb'] for r in rows):.1f} KB in {root}")
    if problems:
        raise AssertionError("exact-model checkpoints differ from the builder (run `python -m specdec_ref.exact build`): " + "; ".join(problems))
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specdec_ref.exact", description=_CLI_DESCRIPTION)
    parser.add_argument("command", choices=("build", "check"))
    parser.add_argument("--root", default=None, help=f"checkpoint root (default {ASSET_ROOT})")
    args = parser.parse_args(argv)
    if args.command == "build":
        for name, folder in build(args.root).items():
            print(f"wrote {folder} ({_folder_kb(folder):.1f} KB)")
        return 0
    try:
        check(args.root)
    except AssertionError as exc:
        print(f"FAILED: {exc}", file=sys.stderr)
        return 1
    return 0
