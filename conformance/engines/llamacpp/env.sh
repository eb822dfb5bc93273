#!/usr/bin/env bash
# Build llama.cpp's `llama-server` (and the `llama-speculative` example) from the source vendored in the
# llama-cpp-python sdist, into a cache outside the clone keyed by version, and install the GGUF writer.
#
#   bash scripts/env.sh llamacpp            # prints nothing but progress; the binaries are in $LLAMACPP_HOME/bin
#
# Cache: ${SPECDEC_CACHE:-$HOME/.cache/specdec-ref}/llama.cpp-$VERSION/ holding src/ (the vendored llama.cpp),
# build/, bin/llama-server, bin/llama-speculative and a stamp file. When the stamp matches, nothing is rebuilt
# (idempotent: only a new machine pays the ~6 minute build on 2 cores). The GGUF writer (`gguf`, from the
# vendored gguf-py, so writer and reader are the same version; numpy) is installed into the project's python
# (`python3`, the interpreter `pip install -e .` used). Any failure exits non-zero with a named message:
# a missing or unbuildable engine fails the stage, it is never skipped.
#
# Environment: SPECDEC_CACHE (cache root), LLAMACPP_JOBS (default 2), LLAMACPP_NICE (default 10),
# PYTHON (default python3).
set -euo pipefail

VERSION=0.3.36                      # llama-cpp-python sdist; its vendor/llama.cpp is what we build
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
CACHE_ROOT="${SPECDEC_CACHE:-$HOME/.cache/specdec-ref}"
HOME_DIR="$CACHE_ROOT/llama.cpp-$VERSION"
STAMP="$HOME_DIR/.specdec-llamacpp-stamp"
JOBS="${LLAMACPP_JOBS:-2}"
NICE="${LLAMACPP_NICE:-10}"
PY="${PYTHON:-python3}"
WANT="llama-cpp-python=$VERSION targets=llama-server,llama-speculative cpu curl=off"

ENV_NAME=llamacpp
ENV_INCOMPLETE="the cache at $HOME_DIR is incomplete"
source "$REPO/scripts/env_lib.sh"

for tool in cmake c++ cc "$PY"; do
    command -v "$tool" >/dev/null || die "'$tool' not found (needed to build llama.cpp / write GGUF files)"
done

check() {
    [ -x "$HOME_DIR/bin/llama-server" ] || die "$HOME_DIR/bin/llama-server missing"
    "$HOME_DIR/bin/llama-server" --version > "$HOME_DIR/server-version.txt" 2>&1 \
        || die "llama-server --version failed: $(tail -n 3 "$HOME_DIR/server-version.txt")"
    "$HOME_DIR/bin/llama-server" --help 2>&1 | grep -q -- "--spec-type" \
        || die "this llama-server has no --spec-type option"
    "$PY" - "$HOME_DIR" <<'EOF' || die "the GGUF writer (gguf, numpy) does not import in $PY"
import sys
import gguf, numpy  # noqa: F401
print("gguf", getattr(gguf, "__version__", "?"), "from", gguf.__file__.rsplit("/", 2)[0], "| numpy", numpy.__version__)
EOF
    echo "env.sh llamacpp: llama-server $(grep -m1 -i version "$HOME_DIR/server-version.txt" || true) in $HOME_DIR/bin"
}

install_gguf() {
    # the vendored gguf-py: the writer matches the reader that was built
    "$PY" -c "import gguf" 2>/dev/null && "$PY" -c "import numpy" 2>/dev/null && return 0
    "$PY" -m pip --disable-pip-version-check install "$HOME_DIR/src/gguf-py" numpy \
        || die "pip install of the vendored gguf-py failed"
}

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && [ -x "$HOME_DIR/bin/llama-server" ]; then
    echo "env.sh llamacpp: $HOME_DIR is built ($WANT); skipping the build"
    install_gguf
    check
    exit 0
fi

start=$(date +%s)
mkdir -p "$HOME_DIR" || die "cannot create $HOME_DIR"
rm -f "$STAMP"
exec 9> "$HOME_DIR/.lock"
command -v flock >/dev/null && { flock -n 9 || die "another llama.cpp build (scripts/env.sh llamacpp) is running in $HOME_DIR"; }

if [ ! -f "$HOME_DIR/src/CMakeLists.txt" ]; then
    echo "env.sh llamacpp: downloading the llama-cpp-python==$VERSION sdist"
    DL="$HOME_DIR/download"
    rm -rf "$DL" "$HOME_DIR/src"
    mkdir -p "$DL"
    "$PY" -m pip --disable-pip-version-check download --no-deps --no-binary llama-cpp-python \
        "llama-cpp-python==$VERSION" -d "$DL" || die "pip download llama-cpp-python==$VERSION failed"
    SDIST="$(ls "$DL"/llama_cpp_python-"$VERSION".tar.gz 2>/dev/null || ls "$DL"/*.tar.gz | head -n 1)"
    [ -f "$SDIST" ] || die "no sdist in $DL"
    tar -xzf "$SDIST" -C "$DL" || die "cannot unpack $SDIST"
    VENDOR="$(ls -d "$DL"/*/vendor/llama.cpp)" || die "the sdist holds no vendor/llama.cpp"
    mv "$VENDOR" "$HOME_DIR/src" || die "cannot move $VENDOR"
    rm -rf "$DL"
fi
[ -f "$HOME_DIR/src/CMakeLists.txt" ] || die "$HOME_DIR/src is not a llama.cpp source tree"

echo "env.sh llamacpp: building llama-server, llama-speculative (CPU, no CURL, -j$JOBS, nice $NICE)"
nice -n "$NICE" cmake -S "$HOME_DIR/src" -B "$HOME_DIR/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
    -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DLLAMA_BUILD_TESTS=OFF -DBUILD_SHARED_LIBS=OFF \
    > "$HOME_DIR/cmake-configure.log" 2>&1 || { tail -n 30 "$HOME_DIR/cmake-configure.log" >&2; die "cmake configure failed"; }
nice -n "$NICE" cmake --build "$HOME_DIR/build" -j "$JOBS" --target llama-server llama-speculative \
    > "$HOME_DIR/cmake-build.log" 2>&1 || { tail -n 30 "$HOME_DIR/cmake-build.log" >&2; die "cmake build failed"; }
mkdir -p "$HOME_DIR/bin"
for b in llama-server llama-speculative; do
    cp "$HOME_DIR/build/bin/$b" "$HOME_DIR/bin/$b" || die "the build produced no $b"
done

install_gguf
check
echo "$WANT" > "$STAMP"
echo "env.sh llamacpp: built in $(( $(date +%s) - start )) s"
