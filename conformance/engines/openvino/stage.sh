# The OpenVINO GenAI stage (sourced by scripts/stage.sh: REPO, OUT, PY, step, timed): openvino-genai 2026.4.1.0.
#  1. the runtime venv .venv-openvino and the exporter venv .venv-ov-export (stamped, idempotent);
#  2. the IR of the exactly-known checkpoints (optimum-cli, cached outside the clone by version) and its logits
#     against the tables, as prompts and through the KV cache;
#  3. engine tests (engine_tests/test_openvino.py): conventions, the model of the sampler request for request, the
#     Check error, the silent fall-back, the counters;
#  4. the matrix against conformance/engines/expected/openvino-2026.4.1.0.json;
#  5. the matrix's speculative completions against the mechanism's law (the engine follows the model where it fails
#     the exact law);
#  6. the serving conditions its scheduler exposes (KV block boundaries, chunked prefill, prefix caching, distinct
#     prompts; the evidence read off its own block accounting by probe requests), the cached runs against the same
#     engine with prefix caching off, per seed.
env_step openvino
VPY="$REPO/.venv-openvino/bin/python"
export_step openvino ir-check.txt "IR export (cached by version) and its logits against the tables"

step "engine tests (conventions, the sampler's model, the defects)"
"$VPY" -m pytest engine_tests/test_openvino.py -q -p no:cacheprovider

matrix_step openvino matrix "the black-box matrix" --jobs 2

step "the speculative completions against the mechanism"
"$VPY" -m conformance.engines.openvino.check --check "$OUT/matrix" | tee "$OUT/mechanism.txt"

matrix_step openvino conditions "serving conditions: block boundary, chunked prefill, prefix caching, distinct prompts" \
    --jobs 2 --conditions all

step "verdict tables"
cat "$OUT/matrix/verdicts.md" "$OUT/conditions/verdicts.md"
