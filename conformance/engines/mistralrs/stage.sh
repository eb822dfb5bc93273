# The mistral.rs stage (sourced by scripts/stage.sh: REPO, OUT, PY, step, timed): mistral.rs 0.9.5 (prebuilt wheel,
# CPU), and 0.6.0 (the last release with draft-model speculation) as it behaves here.
#  1. .venv-mistralrs (0.9.5) and .venv-mistralrs-060 (0.6.0);
#  2. the engine's reported log-probabilities against the tables (the model folders are prepared per session from
#     the shipped checkpoints: a ByteLevel decoder, a verbatim chat template, a plain variant);
#  3. engine tests (engine_tests/test_mistralrs.py): the findings and top-k;
#  4. the matrix of 0.9.5 against conformance/engines/expected/mistralrs-0.9.5.json;
#  5. 0.6.0's draft-model configuration against conformance/engines/expected/mistralrs-0.6.0.json, the entry for
#     this CPU (without GFNI: SIGILL at load; with GFNI: one token more than asked, the greedy completion).
env_step mistralrs
VPY="$REPO/.venv-mistralrs/bin/python"
export_step mistralrs logprob-check.txt "the engine's log-probabilities against the tables"

step "engine tests (findings, top-k)"
"$VPY" -m pytest engine_tests/test_mistralrs.py -q -p no:cacheprovider

matrix_step mistralrs matrix "the black-box matrix (0.9.5)"

step "the penalty departure against a model of mistral.rs's penalty order"
"$PY" -m conformance.engines.mistralrs penalty-model "$OUT/matrix/raw/penalty-order/order1/penalty.jsonl"

matrix_step conformance.engines.mistralrs:ADAPTER_060 matrix-060 "0.6.0's draft-model speculation (recorded)"

step "verdict tables"
cat "$OUT/matrix/verdicts.md" "$OUT/matrix-060/verdicts.md"
