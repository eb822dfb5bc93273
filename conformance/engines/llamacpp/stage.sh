# The llama.cpp stage (sourced by scripts/stage.sh: REPO, OUT, PY, step, timed): llama-server built from the source
# vendored in llama-cpp-python 0.3.36.
#  1. llama-server built (or reused) in the versioned cache outside the clone (only a new machine pays the build),
#     and the GGUF writer;
#  2. the GGUF files of the exactly-known checkpoints and heads, and the server's probabilities against the tables;
#  3. engine tests (engine_tests/test_llamacpp.py): conventions, findings, the EAGLE-3 head and MTP block drafting
#     their law's tokens request by request (its reduced matrix run is left to the full matrix below);
#  4. the matrix against conformance/engines/expected/llamacpp-0.3.36.json;
#  5. the serving conditions llama-server can be shown to reach (prefix caching, short, long and distinct prompts: each
#     response's cache_n; the context edge: the slot context read from /props; context shift: the server's log).
# Every llama-server the stage started is stopped at exit, on failure too (the runner also kills each worker's
# process group).
env_step llamacpp
export_step llamacpp gguf-check.txt "GGUF files and their probabilities against the tables"

step "engine tests (the GGUF check, conventions, findings, per-seed identity on long requests)"
"$PY" -m pytest engine_tests/test_llamacpp.py -q -p no:cacheprovider -k "not reduced_matrix"

# --jobs 2: two workers (each one -t 1 server) at a time
matrix_step llamacpp matrix "the black-box matrix" --jobs 2
matrix_step llamacpp conditions "serving conditions: prefix caching, distinct prompts, two turns, context edge and shift" \
    --jobs 2 --conditions prefix-cache,context-edge,context-shift,long-prefix-cache,long-context-edge,distinct-prompts,multi-turn

step "verdict table"
cat "$OUT/matrix/verdicts.md" "$OUT/conditions/verdicts.md"
