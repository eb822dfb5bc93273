# The ONNX Runtime GenAI stage (sourced by scripts/stage.sh: REPO, OUT, PY, step, timed): onnxruntime-genai 0.18.0.
#  1. the venv .venv-onnxgenai (the wheel plus what its builder needs and the wheel does not declare);
#  2. the exactly-known checkpoints converted by ORT GenAI's own builder (fp32, cached outside the clone by version
#     and checkpoint hash) and the engine's logits against the tables (bit for bit, whole context and token by token);
#  3. engine tests (engine_tests/test_onnxgenai.py): the findings, the top-k heap model, the ties case under both
#     tie rules, MTP, n-gram identity;
#  4. the matrix against conformance/engines/expected/onnxgenai-0.18.0.json;
#  5. the serving condition it has a knob for: the context edge (its enforced context read from its own refusal).
env_step onnxgenai
VPY="$REPO/.venv-onnxgenai/bin/python"
export_step onnxgenai logit-check.txt "conversion (ORT GenAI's builder) and the logits against the tables"

step "engine tests (findings, top-k heap, ties under both rules, MTP, n-gram identity)"
"$VPY" -m pytest engine_tests/test_onnxgenai.py -q -p no:cacheprovider

matrix_step onnxgenai matrix "the black-box matrix"

matrix_step onnxgenai conditions "serving conditions: the context edge" --jobs 2 --conditions all

step "verdict tables"
cat "$OUT/matrix/verdicts.md" "$OUT/conditions/verdicts.md"
