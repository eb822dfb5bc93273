"""OpenVINO IR of the exactly-known checkpoints (``optimum-cli export openvino``) and its logit check.

    python -m conformance.engines export openvino [--no-check]     # the IR (cached), its logits against the tables

Export (``--export``, run with any python; it calls the exporter venv's ``optimum-cli``, built by
``scripts/env.sh openvino``): ``optimum-cli export openvino --model <checkpoint> --task text-generation-with-past
--weight-format fp32 <dir>``, once per checkpoint, into a cache outside the clone keyed by the engine and exporter
versions (:func:`ir_root`: ``${SPECDEC_CACHE:-~/.cache/specdec-ref}/openvino-<genai>-optimum-intel-<v>/``). A
directory is re-exported only when its source checkpoint changed (a digest of the checkpoint's files in
``specdec-export.json``). Why a cache and not assets in the clone: the IR is ~0.3 MB a checkpoint but is a build
product of two pinned tools; shipping it would need a test that it still equals what the exporter makes, i.e. the
exporter in the stage anyway, and the export costs 10-14 s a checkpoint once per machine.

Check (``--check``, run in the runtime venv ``.venv-openvino``: it needs ``openvino``): every cell's shortest
context (``ExactModel.row_contexts``) through the IR with the runtime, (a) each context as one prompt (no KV cache
reuse) and (b) token by token through the stateful KV cache, the last position's logits compared with
``exact_model(name).next_logits`` (float64 tables). Invariant: both agree with the tables within float32 rounding
(max |difference| <= 1e-5; observed 0) for every model of :data:`MODELS`, else the stage fails.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from pathlib import Path

__all__ = ["MODELS", "GENAI_VERSION", "OPTIMUM_INTEL_VERSION", "PRECISION", "ir_root", "ir_dir", "export", "check_logits"]

GENAI_VERSION = "2026.4.1.0"
OPTIMUM_INTEL_VERSION = "2.2.0"
#: Targets and drafts of the pairs the adapter uses (order1-close, order2-order1, and order1-same: an identical draft).
MODELS = ("order1-target", "order1-draft-close", "order1-draft-same", "order2-target", "order2-draft")
EXPORTER_VENV = ".venv-ov-export"
TOLERANCE = 1e-5
#: The CPU plugin's properties wherever this project compiles an exactly-known model (the check below, every pipeline
#: of the adapter): float32 inference. The plugin's default is bf16 on CPUs with bf16 instructions (AVX512-BF16, AMX),
#: where the logits would not be the tables' and what is certified would depend on the machine.
PRECISION = {"INFERENCE_PRECISION_HINT": "f32"}
_IR_FILES = ("openvino_model.xml", "openvino_model.bin", "openvino_tokenizer.xml", "openvino_detokenizer.xml")


def ir_root() -> Path:
    root = os.environ.get("SPECDEC_CACHE") or str(Path.home() / ".cache" / "specdec-ref")
    return Path(root) / f"openvino-{GENAI_VERSION}-optimum-intel-{OPTIMUM_INTEL_VERSION}"


def ir_dir(name: str, root: Path | None = None) -> Path:
    return Path(root or ir_root()) / name


def _source_digest(name: str) -> tuple[Path, str]:
    from specdec_ref.exact import exact_model

    src = Path(exact_model(name).path)
    h = hashlib.sha256()
    for f in sorted(src.iterdir()):
        if f.is_file():
            h.update(f.name.encode())
            h.update(f.read_bytes())
    return src, h.hexdigest()[:16]


def is_current(name: str, root: Path | None = None) -> bool:
    d = ir_dir(name, root)
    stamp = d / "specdec-export.json"
    if not stamp.exists() or not all((d / f).exists() for f in _IR_FILES):
        return False
    return json.loads(stamp.read_text()).get("source_digest") == _source_digest(name)[1]


def exporter_cli() -> Path:
    from ..adapter import REPO, EngineMissingError

    cli = REPO / EXPORTER_VENV / "bin" / "optimum-cli"
    if not cli.exists():
        raise EngineMissingError(f"{cli} is missing: build it with `bash scripts/env.sh openvino`")
    return cli


def export(names=MODELS, root: Path | None = None, *, force: bool = False) -> dict:
    """Export every missing or stale model; returns ``{name: seconds}`` (0.0: already current)."""
    times = {}
    for name in names:
        if not force and is_current(name, root):
            times[name] = 0.0
            continue
        src, digest = _source_digest(name)
        out = ir_dir(name, root)
        out.mkdir(parents=True, exist_ok=True)
        for f in out.iterdir():
            if f.is_file():
                f.unlink()
        cmd = ["nice", "-n", "10", str(exporter_cli()), "export", "openvino", "--model", str(src), "--task",
               "text-generation-with-past", "--weight-format", "fp32", str(out)]
        t0 = time.time()
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
        times[name] = round(time.time() - t0, 1)
        missing = [f for f in _IR_FILES if not (out / f).exists()]
        if proc.returncode != 0 or missing:
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-8:]
            raise RuntimeError(f"optimum-cli export of {name} failed (exit {proc.returncode}, missing {missing}):\n"
                               + "\n".join(tail))
        (out / "specdec-export.json").write_text(json.dumps(
            {"model": name, "source": str(src), "source_digest": digest, "optimum_intel": OPTIMUM_INTEL_VERSION,
             "genai": GENAI_VERSION, "command": " ".join(cmd[3:]), "seconds": times[name]}, indent=1))
    return times


def _infer(compiled, tokens: list[int], *, cached: bool):
    """Last-position logits of ``tokens`` through the stateful IR: one prompt, or token by token (KV cache)."""
    import numpy as np

    req = compiled.create_infer_request()
    req.reset_state()
    names = {p.get_any_name() for p in compiled.inputs}
    chunks = [list(range(len(tokens)))] if not cached else [[i] for i in range(len(tokens))]
    out = None
    for chunk in chunks:
        ids = np.array([[tokens[i] for i in chunk]], dtype=np.int64)
        feed = {"input_ids": ids}
        if "attention_mask" in names:
            feed["attention_mask"] = np.ones((1, chunk[-1] + 1), dtype=np.int64)
        if "position_ids" in names:
            feed["position_ids"] = np.array([chunk], dtype=np.int64)
        if "beam_idx" in names:
            feed["beam_idx"] = np.zeros((1,), dtype=np.int32)
        res = req.infer(feed)
        out = np.asarray(res[compiled.output("logits")])[0, -1].astype(np.float64)
    return out


def check_logits(names=MODELS, root: Path | None = None) -> dict:
    """Max |IR logits - table logits| per model, without and with the KV cache; raises past :data:`TOLERANCE`."""
    import numpy as np
    import openvino as ov

    from specdec_ref.exact import exact_model

    core = ov.Core()
    report = {}
    for name in names:
        em = exact_model(name)
        compiled = core.compile_model(str(ir_dir(name, root) / "openvino_model.xml"), "CPU",
                                      PRECISION)
        contexts = [list(c) for c in em.row_contexts()]
        # longer contexts too: position dependence and the KV cache over several steps
        contexts += [c + [t] for c in contexts[:8] for t in (0, 3)]
        want = em.next_logits(contexts).numpy()
        worst = {"prompt": 0.0, "kv_cache": 0.0}
        for c, w in zip(contexts, want):
            for mode, cached in (("prompt", False), ("kv_cache", True)):
                got = _infer(compiled, c, cached=cached)
                worst[mode] = max(worst[mode], float(np.abs(got - w).max()))
        report[name] = {"contexts": len(contexts), **worst}
        if max(worst.values()) > TOLERANCE:
            raise AssertionError(f"{name}: IR logits differ from the tables by {worst} (> {TOLERANCE})")
    return report
