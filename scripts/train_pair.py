#!/usr/bin/env python
"""Train the small byte-level target/draft pair shipped in specdec_ref/assets/pair/.

Deterministic: fixed module list, fixed seeds, fixed step counts, AdamW,
``torch.use_deterministic_algorithms(True)``, 2 CPU threads. Running it twice on
the same Python/torch/transformers versions reproduces the weight files byte for
byte (the corpus sha256 in training.json says which stdlib sources were used).

Data: the sources of a fixed, sorted list of standard-library modules, each
split into a training head and a held-out tail (last ``HOLDOUT_FRACTION`` of
the file, cut at a line boundary). Training sees only the heads; losses,
greedy agreement and the shipped prompts (prompts.json) come from the tails.

Usage::

    python scripts/train_pair.py                     # writes specdec_ref/assets/pair/
    python scripts/train_pair.py --out /tmp/pair --target-steps 20 --draft-steps 20   # smoke run
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import inspect
import json
import math
import os
import platform
import sys
import sysconfig
import time
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import transformers  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM  # noqa: E402

from specdec_ref.pretrained import ASSET_DIR, CONTEXT_LENGTH, VOCAB_SIZE, state_dict_checksum  # noqa: E402

# Fixed, sorted module list. Located with inspect.getsourcefile so packages
# (e.g. collections -> collections/__init__.py) resolve on any layout.
MODULES = sorted(
    [
        "argparse",
        "ast",
        "base64",
        "bisect",
        "calendar",
        "collections",
        "configparser",
        "contextlib",
        "copy",
        "csv",
        "dataclasses",
        "difflib",
        "enum",
        "fractions",
        "functools",
        "heapq",
        "inspect",
        "json.decoder",
        "json.encoder",
        "logging",
        "os",
        "pprint",
        "queue",
        "random",
        "shutil",
        "statistics",
        "string",
        "tempfile",
        "textwrap",
        "threading",
        "typing",
        "uuid",
        "warnings",
    ]
)
HOLDOUT_FRACTION = 0.1
FILE_SEPARATOR = b"\n\n"

DATA_SEED = 1234
TARGET_SEED = 1
DRAFT_SEED = 2
BATCH_SIZE = 16

TARGET_CONFIG = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=128,
    intermediate_size=344,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)
DRAFT_CONFIG = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=64,
    intermediate_size=172,
    num_hidden_layers=1,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    use_sliding_window=False,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)


# --------------------------------------------------------------------------- data


def corpus_files() -> list[tuple[str, Path]]:
    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    out = []
    for name in MODULES:
        src = inspect.getsourcefile(importlib.import_module(name))
        if src is None:
            raise SystemExit(f"no source file for stdlib module {name}")
        path = Path(src).resolve()
        try:
            rel = path.relative_to(stdlib).as_posix()
        except ValueError:
            rel = str(path)
        out.append((rel, path))
    return out


def split_file(data: bytes) -> tuple[bytes, bytes]:
    """Training head and held-out tail; the tail starts at a line boundary."""
    cut = int(len(data) * (1.0 - HOLDOUT_FRACTION))
    nl = data.find(b"\n", cut)
    cut = len(data) if nl < 0 else nl + 1
    return data[:cut], data[cut:]


def build_corpus():
    files = corpus_files()
    raw = [(rel, path.read_bytes()) for rel, path in files]
    corpus = FILE_SEPARATOR.join(data for _, data in raw)
    heads, tails = zip(*(split_file(data) for _, data in raw))
    train = FILE_SEPARATOR.join(heads)
    heldout = FILE_SEPARATOR.join(tails)
    info = {
        "stdlib_dir": sysconfig.get_paths()["stdlib"],
        "modules": MODULES,
        "files": [{"module": m, "path": rel, "bytes": len(d)} for m, (rel, d) in zip(MODULES, raw)],
        "separator": FILE_SEPARATOR.decode(),
        "corpus_bytes": len(corpus),
        "corpus_sha256": hashlib.sha256(corpus).hexdigest(),
        "holdout": f"last {HOLDOUT_FRACTION:.0%} of each file, starting at a line boundary",
        "holdout_fraction": HOLDOUT_FRACTION,
        "train_bytes": len(train),
        "train_sha256": hashlib.sha256(train).hexdigest(),
        "heldout_bytes": len(heldout),
        "heldout_sha256": hashlib.sha256(heldout).hexdigest(),
    }
    return torch.tensor(list(train), dtype=torch.long), list(tails), torch.tensor(list(heldout), dtype=torch.long), info


def eval_windows(heldout: torch.Tensor) -> torch.Tensor:
    """Non-overlapping CONTEXT_LENGTH windows covering the held-out stream, [N, CONTEXT_LENGTH]."""
    n = heldout.numel() // CONTEXT_LENGTH
    return heldout[: n * CONTEXT_LENGTH].reshape(n, CONTEXT_LENGTH)


# --------------------------------------------------------------------------- training


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


def train(model, train_ids: torch.Tensor, steps: int, peak_lr: float, data_seed: int, label: str) -> dict:
    gen = torch.Generator().manual_seed(data_seed)
    opt = torch.optim.AdamW(model.parameters(), lr=peak_lr, betas=(0.9, 0.95), weight_decay=0.01)
    warmup = max(1, steps // 20)
    model.train()
    span = CONTEXT_LENGTH + 1
    offsets_all = torch.arange(span)
    t0 = time.perf_counter()
    ema = None
    for step in range(steps):
        starts = torch.randint(0, train_ids.numel() - span, (BATCH_SIZE,), generator=gen)
        batch = train_ids[starts[:, None] + offsets_all]
        x, y = batch[:, :-1], batch[:, 1:]
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, peak_lr, warmup)
        logits = model(input_ids=x, use_cache=False).logits
        loss = F.cross_entropy(logits.reshape(-1, VOCAB_SIZE), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        ema = loss.item() if ema is None else 0.98 * ema + 0.02 * loss.item()
        if step % 100 == 0 or step == steps - 1:
            print(
                f"[{label}] step {step:5d}/{steps} loss {loss.item():.4f} (ema {ema:.4f}) "
                f"{ema / math.log(2):.3f} bits/byte  {time.perf_counter() - t0:6.1f}s",
                flush=True,
            )
    model.eval()
    return {
        "steps": steps,
        "peak_lr": peak_lr,
        "warmup_steps": warmup,
        "schedule": "linear warmup, cosine decay to 10% of peak",
        "optimizer": "AdamW(betas=(0.9, 0.95), weight_decay=0.01), grad clip 1.0",
        "batch_size": BATCH_SIZE,
        "context_length": CONTEXT_LENGTH,
        "data_seed": data_seed,
        "final_train_loss_ema_bits_per_byte": ema / math.log(2),
        "train_seconds": time.perf_counter() - t0,
    }


@torch.no_grad()
def evaluate(target, draft, windows: torch.Tensor) -> dict:
    tot = {"target": 0.0, "draft": 0.0}
    agree = 0
    count = 0
    for chunk in windows.split(32):
        x, y = chunk[:, :-1], chunk[:, 1:]
        t_logits = target(input_ids=x).logits
        d_logits = draft(input_ids=x).logits
        tot["target"] += F.cross_entropy(t_logits.reshape(-1, VOCAB_SIZE), y.reshape(-1), reduction="sum").item()
        tot["draft"] += F.cross_entropy(d_logits.reshape(-1, VOCAB_SIZE), y.reshape(-1), reduction="sum").item()
        agree += (t_logits.argmax(-1) == d_logits.argmax(-1)).sum().item()
        count += y.numel()
    return {
        "heldout_windows": int(windows.shape[0]),
        "heldout_positions": count,
        "target_heldout_bits_per_byte": tot["target"] / count / math.log(2),
        "draft_heldout_bits_per_byte": tot["draft"] / count / math.log(2),
        "greedy_agreement": agree / count,
    }


# --------------------------------------------------------------------------- saving


def save_model(model, out: Path, name: str) -> dict:
    state = {k: v.detach().to(torch.float32).contiguous() for k, v in model.state_dict().items()}
    tied = model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    if tied:
        del state["lm_head.weight"]  # safetensors refuses shared storage; the loader re-ties
    path = out / f"{name}.safetensors"
    # A single metadata key: safetensors writes metadata keys in arbitrary order,
    # which would make the file bytes (and their sha256) differ between runs.
    save_file(state, str(path), metadata={"format": "pt"})
    cfg = model.config.to_dict()
    cfg.pop("dtype", None)
    cfg.pop("torch_dtype", None)
    (out / f"{name}_config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    data = path.read_bytes()
    return {
        "architecture": type(model).__name__,
        "parameters": sum(p.numel() for p in model.parameters()),
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "tied_embeddings_stored_once": tied,
        "state_dict_checksum": state_dict_checksum(model),
    }


def write_prompts(out: Path, tails: list[bytes], info: dict) -> None:
    segments = []
    for (entry, tail) in zip(info["files"], tails):
        text = tail.decode("utf-8")  # stdlib sources are utf-8
        if len(tail) >= CONTEXT_LENGTH:
            segments.append({"path": entry["path"], "text": text[:4096]})
    payload = {
        "description": "Held-out tails of the training files (never trained on); "
        "specdec_ref.pretrained.sample_prompts cuts prompts from these segments.",
        "corpus_sha256": info["corpus_sha256"],
        "sources": [s["path"] for s in segments],
        "segments": [s["text"] for s in segments],
    }
    (out / "prompts.json").write_text(json.dumps(payload, indent=1) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ASSET_DIR)
    ap.add_argument("--target-steps", type=int, default=900)
    ap.add_argument("--draft-steps", type=int, default=1200)
    ap.add_argument("--target-lr", type=float, default=3e-3)
    ap.add_argument("--draft-lr", type=float, default=4e-3)
    args = ap.parse_args(argv)

    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(True)
    t_start = time.perf_counter()

    train_ids, tails, heldout, data_info = build_corpus()
    print(
        f"corpus {data_info['corpus_bytes']} bytes sha256 {data_info['corpus_sha256'][:16]}..., "
        f"train {data_info['train_bytes']}, held-out {data_info['heldout_bytes']}",
        flush=True,
    )

    torch.manual_seed(TARGET_SEED)
    target = LlamaForCausalLM(LlamaConfig(**TARGET_CONFIG))
    target_train = train(target, train_ids, args.target_steps, args.target_lr, DATA_SEED, "target")

    torch.manual_seed(DRAFT_SEED)
    draft = Qwen2ForCausalLM(Qwen2Config(**DRAFT_CONFIG))
    draft_train = train(draft, train_ids, args.draft_steps, args.draft_lr, DATA_SEED + 1, "draft")
    train_seconds = time.perf_counter() - t_start

    metrics = evaluate(target, draft, eval_windows(heldout))
    print(json.dumps(metrics, indent=2), flush=True)

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    files = {
        "target.safetensors": save_model(target, out, "target"),
        "draft.safetensors": save_model(draft, out, "draft"),
    }
    write_prompts(out, tails, data_info)

    meta = {
        "description": "Byte-level (vocab 256, id == byte) target/draft pair for specdec_ref; "
        "produced by scripts/train_pair.py",
        "tokenizer": {"type": "bytes", "vocab_size": VOCAB_SIZE, "special_tokens": None},
        "context_length": CONTEXT_LENGTH,
        "data": data_info,
        "seeds": {"target_init": TARGET_SEED, "draft_init": DRAFT_SEED, "target_data": DATA_SEED, "draft_data": DATA_SEED + 1},
        "target": {"config": TARGET_CONFIG, "training": target_train},
        "draft": {"config": DRAFT_CONFIG, "training": draft_train},
        "eval": metrics,
        "files": files,
        "total_weight_bytes": sum(f["bytes"] for f in files.values()),
        "train_wall_seconds": train_seconds,
        # Wall time is only meaningful on an idle machine; weights do not depend on it.
        "load_average_1_5_15_at_end": [round(x, 2) for x in os.getloadavg()],
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "num_threads": torch.get_num_threads(),
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "platform": platform.platform(),
        },
    }
    (out / "training.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(
        f"wrote {out}: target {files['target.safetensors']['bytes']} B, draft {files['draft.safetensors']['bytes']} B; "
        f"train {train_seconds:.1f}s; agreement {metrics['greedy_agreement']:.3f}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
