#!/usr/bin/env bash
# Create a Cloud TPU VM (or a queued resource with QUEUED=1). The manual twin of `jaxrl launch`'s create step.
#   usage: tpu/create.sh NAME ZONE ACCELERATOR_TYPE [--spot]
#   env:   PROJECT (optional), RUNTIME (default by generation), QUEUED=1, DRY_RUN=1 (print only)
set -euo pipefail
if [[ $# -lt 3 ]]; then
  echo "usage: $0 NAME ZONE ACCELERATOR_TYPE [--spot]" >&2
  exit 2
fi
name=$1 zone=$2 accel=$3
shift 3
case "${accel%%-*}" in
  v4) default_runtime=tpu-ubuntu2204-base ;;
  v5litepod) default_runtime=v2-alpha-tpuv5-lite ;;
  v5p) default_runtime=v2-alpha-tpuv5 ;;
  v6e) default_runtime=v2-alpha-tpuv6e ;;
  *) echo "$0: accelerator type '$accel' must start with v4-, v5p-, v5litepod- or v6e-" >&2; exit 2 ;;
esac
runtime=${RUNTIME:-$default_runtime}
where=(--zone "$zone")
[[ -n "${PROJECT:-}" ]] && where+=(--project "$PROJECT")
if [[ "${QUEUED:-0}" == 1 ]]; then
  cmd=(gcloud compute tpus queued-resources create "$name" --node-id "$name" --accelerator-type "$accel"
       --runtime-version "$runtime" "$@" "${where[@]}")
else
  cmd=(gcloud compute tpus tpu-vm create "$name" --accelerator-type "$accel" --version "$runtime" "$@"
       "${where[@]}")
fi
if [[ "${DRY_RUN:-0}" == 1 ]]; then printf '%q ' "${cmd[@]}"; echo; else "${cmd[@]}"; fi
