"""Engines behind their HTTP servers, without the engines: the server life cycle (conformance.engines.serving), and the
request and response mapping of vLLM's OpenAI-compatible server and llama-server with stop strings and streaming."""
from __future__ import annotations

import json
import sys

import pytest

from conformance.engines.adapter import Request
from conformance.engines.llamacpp.adapter import completion_payload, merged_stream
from conformance.engines.serving import HttpServer, sse_events
from conformance.engines.vllm.adapter import vllm_sampling_kwargs
from conformance.engines.vllm.server import merged_chunks, parse_spec_metrics, request_body
from specdec_ref.warp import SamplingConfig

#: A server that answers 200 on /health, echoes a POST's JSON body and starts a child process that outlives nothing.
ECHO = r'''
import http.server, json, subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404); self.end_headers(); self.wfile.write(b"ok")
    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200); self.end_headers(); self.wfile.write(json.dumps({"got": json.loads(body), "child": child.pid}).encode())
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
'''


def test_a_server_is_started_on_localhost_called_and_stopped_with_its_children(tmp_path):
    srv = HttpServer("echo", [sys.executable, "-c", ECHO, "{port}"], log_dir=str(tmp_path), start_timeout_s=30)
    srv.start()
    try:
        out = json.loads(srv.call("POST", "/x", {"a": 1}))
        assert out["got"] == {"a": 1}
        with pytest.raises(RuntimeError, match="HTTP 404"):
            srv.call("GET", "/nothing")
    finally:
        srv.stop()
    assert srv.proc.poll() is not None
    assert _gone(out["child"]), "the server's child outlived it"
    srv.stop()  # twice is fine


def _gone(pid: int) -> bool:
    """No such process, or a zombie (killed, not yet reaped by its new parent)."""
    import time
    from pathlib import Path

    for _ in range(50):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.1)
    return False


def test_a_server_that_exits_at_start_is_a_named_failure_with_its_log(tmp_path):
    srv = HttpServer("broken", [sys.executable, "-c", "import sys; print('no such model'); sys.exit(3)"],
                     log_dir=str(tmp_path), start_timeout_s=30)
    with pytest.raises(RuntimeError, match=r"broken server exited with 3: .*no such model"):
        srv.start()


def test_a_server_removes_the_log_folder_it_made_after_a_stop_and_after_a_failed_start():
    """Bug class: every server start leaving its log folder behind (hundreds of megabytes of llama-server logs per
    stage in the temporary folder); the failure's text is read before its folder goes."""
    srv = HttpServer("echo", [sys.executable, "-c", ECHO, "{port}"], start_timeout_s=30)
    folder = srv.log_path.parent
    srv.start()
    srv.stop()
    assert not folder.exists()
    broken = HttpServer("broken", [sys.executable, "-c", "import sys; print('no such model'); sys.exit(3)"],
                        start_timeout_s=30)
    with pytest.raises(RuntimeError, match=r"broken server exited with 3: .*no such model"):
        broken.start()
    assert not broken.log_path.parent.exists()


def _request(**kw):
    base = dict(case="stop-strings", prompt=(0,), sampling=SamplingConfig(temperature=1.0), max_new_tokens=5, eos=True,
                eos_id=7, seed=11, stop=("t6 t4", "t5"), stream=False)
    return Request(**{**base, **kw})


def test_vllm_requests_carry_the_stops_and_ask_for_token_ids():
    body = request_body("m", _request(), vllm_sampling_kwargs)
    assert body["stop"] == ["t6 t4", "t5"] and body["return_token_ids"] is True and body["stream"] is False
    assert body["prompt"] == [0] and body["stop_token_ids"] == [7] and body["seed"] == 11 and "detokenize" not in body
    assert request_body("m", _request(seed=None, stream=True), vllm_sampling_kwargs)["stream"] is True
    assert "seed" not in request_body("m", _request(seed=None), vllm_sampling_kwargs)
    with pytest.raises(ValueError, match="text cases only"):
        request_body("m", _request(logprobs=3), vllm_sampling_kwargs)


def test_vllm_chunks_are_put_together_and_a_stream_without_its_end_is_an_error():
    raw = (b'data: {"choices":[{"index":0,"text":"","token_ids":[0],"finish_reason":null}]}\n\n'
           b'data: {"choices":[{"index":0,"text":" t0 ","token_ids":[6],"finish_reason":"stop","stop_reason":"t6"}]}\n\n'
           b'data: [DONE]\n\n')
    merged = merged_chunks(sse_events(raw))
    assert merged == {"text": " t0 ", "token_ids": [0, 6], "finish_reason": "stop", "stop_reason": "t6", "chunks": 2}
    with pytest.raises(RuntimeError, match="without a finish_reason"):
        merged_chunks(sse_events(raw.split(b"\n\n")[0]))
    with pytest.raises(RuntimeError, match="not JSON"):
        sse_events(b"data: {oops\n\n", "vLLM's server")


def test_vllm_metrics_are_read_from_the_prometheus_text():
    text = "\n".join([
        "# HELP vllm:spec_decode_num_drafts_total drafts", 'vllm:spec_decode_num_drafts_total{engine="0"} 10.0',
        'vllm:spec_decode_num_draft_tokens_total{engine="0"} 30.0',
        'vllm:spec_decode_num_accepted_tokens_total{engine="0"} 17.0',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="1"} 7.0',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="0"} 9.0',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="2"} 1.0'])
    assert parse_spec_metrics(text) == {"drafts": 10, "draft_tokens": 30, "accepted": 17, "accepted_per_pos": [9, 7, 1]}


def test_llama_server_streams_are_put_together_and_stops_asked():
    body = completion_payload(_request(stop=("t6t4", "2t1"), stream=True))
    assert body["stop"] == ["t6t4", "2t1"] and body["stream"] is True and "response_fields" not in body
    assert "content" in completion_payload(_request(stop=("t5",)))["response_fields"]
    raw = (b'data: {"content":"t0","tokens":[0],"stop":false}\n\n'
           b'data: {"content":"","tokens":[2],"stop":false}\n\n'
           b'data: {"content":"","tokens":[],"stop":true,"stop_type":"limit","timings":{"draft_n":3}}\n\n')
    merged = merged_stream(raw)
    assert merged["tokens"] == [0, 2] and merged["content"] == "t0" and merged["stop_type"] == "limit"
    with pytest.raises(RuntimeError, match="without its final event"):
        merged_stream(raw.rsplit(b"data:", 1)[0])
