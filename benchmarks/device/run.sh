#!/usr/bin/env bash
# The accelerator suite in one command (benchmarks/device/README.md), from the repository root:
#   bash benchmarks/device/run.sh [--out DIR]        on a lent GPU: <= 8 minutes, wheels carried in .whl/
#   bash benchmarks/device/run.sh --cpu-dry-run      the same code at tiny shapes on CPU (CI: about a minute)
#   bash benchmarks/device/run.sh --attention [--out DIR]   attention.py instead of the suite (~3 minutes)
# DIR defaults to $OUT if set, else benchmarks/device/out. PYTHON picks the interpreter (default python3).
set -euo pipefail
START=$(date +%s)
cd "$(dirname "$0")/../.."
DRY=0
MAIN=benchmarks/device/suite.py
OUT_DIR="${OUT:-benchmarks/device/out}"
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu-dry-run) DRY=1 ;;
    --attention) MAIN=benchmarks/device/attention.py ;;
    --out) OUT_DIR="$2"; shift ;;
    --out=*) OUT_DIR="${1#--out=}" ;;
    -h|--help) sed -n 2,6p "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
PY="${PYTHON:-python3}"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false

if [ "$DRY" = 1 ]; then
  # jaxrl comes from the caller's environment (the test venv). One CPU device whatever the caller's XLA_FLAGS
  # say, and a cheaper LLVM pipeline: the dry run checks the code paths, its timings mean nothing.
  export JAX_PLATFORMS=cpu CUDA_VISIBLE_DEVICES=""
  export XLA_FLAGS="--xla_force_host_platform_device_count=1 --xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
  exec "$PY" benchmarks/device/suite.py --cpu-dry-run --out "$OUT_DIR" --started "$START"
fi

# The machine's own jax / flax / optax / orbax / torch / transformers stay; jaxrl itself and the pure-Python
# packages it needs that the image lacks (wheels in .whl/, README) go to a private folder on PYTHONPATH.
SITE=/tmp/jaxrl-device-site
rm -rf "$SITE"
mkdir -p "$SITE"
if compgen -G ".whl/*.whl" >/dev/null; then  # a failure here costs only train_cli (grain): go on
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
    .whl/*.whl || echo "run.sh: installing the wheels in .whl/ failed; train_cli will fail" >&2
else
  echo "run.sh: no wheels in .whl/ (benchmarks/device/README.md says which); jaxrl train may fail" >&2
fi
if ! "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --no-cache-dir \
    --target "$SITE" . 2>/tmp/jaxrl-device-pip.log; then  # (setuptools' package-data warnings go there)
  # No usable setuptools: lay the package out by hand as pyproject's package-dir does.
  tail -5 /tmp/jaxrl-device-pip.log >&2
  echo "run.sh: pip could not build jaxrl; linking its folders into $SITE instead" >&2
  rm -rf "$SITE/jaxrl" && cp -r jaxrl "$SITE/jaxrl"
  for sub in models losses sharding configs; do ln -sfn "$PWD/$sub" "$SITE/jaxrl/$sub"; done
fi
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
# A second run on the same machine reuses the compiled programs; JAX may use 90% of the GPU's memory.
export JAX_COMPILATION_CACHE_DIR="${JAX_COMPILATION_CACHE_DIR:-/tmp/jaxrl-device-jax-cache}"
export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.90}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
echo "run.sh: installed in $(( $(date +%s) - START )) s; $("$PY" -c 'import jax; print(jax.__version__, jax.devices())')"
if [ "$MAIN" = benchmarks/device/attention.py ]; then exec "$PY" "$MAIN" --out "$OUT_DIR"; fi
exec "$PY" benchmarks/device/suite.py --out "$OUT_DIR" --started "$START"
