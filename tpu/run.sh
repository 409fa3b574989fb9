#!/usr/bin/env bash
# Ship the current git commit and a config to every worker of a TPU VM, install, and start `jaxrl train`.
# The manual twin of `jaxrl launch` without the preemption loop; run it from the repository root.
#   usage: tpu/run.sh NAME ZONE CONFIG [RUN_DIR]      (RUN_DIR: use gs://BUCKET/PATH to survive re-creation)
#   env:   PROJECT (optional), DRY_RUN=1 (print only)
set -euo pipefail
if [[ $# -lt 3 ]]; then
  echo "usage: $0 NAME ZONE CONFIG [RUN_DIR]" >&2
  exit 2
fi
name=$1 zone=$2 config=$3 run_dir=${4:-'~/jaxrl-run/run'}
where=(--zone "$zone")
[[ -n "${PROJECT:-}" ]] && where+=(--project "$PROJECT")
sha=$(git rev-parse HEAD)
tarball=/tmp/jaxrl-${sha:0:12}.tar.gz
cfg_name=$(basename "$config")
install="rm -rf ~/jaxrl && mkdir -p ~/jaxrl ~/jaxrl-run && tar -xzf ~/$(basename "$tarball") -C ~/jaxrl"
install+=" && cp ~/$cfg_name ~/jaxrl-run/config.yaml && python3 -m pip install -q --user uv==0.13.8"
install+=" && ~/.local/bin/uv venv -q --allow-existing --python 3.11 ~/jaxrl-venv"
install+=" && ~/.local/bin/uv pip install -q --python ~/jaxrl-venv/bin/python -e ~/jaxrl 'jax[tpu]==0.10.2'"
train="~/jaxrl-venv/bin/python -m jaxrl.cli train ~/jaxrl-run/config.yaml --run-dir $run_dir"
start="cd ~/jaxrl-run && (kill \$(cat train.pid 2>/dev/null) 2>/dev/null; true) && rm -f train.rc"
start+=" && nohup sh -c '$train; echo \$? > ~/jaxrl-run/train.rc' > ~/jaxrl-run/train.log 2>&1 < /dev/null &"
start+=" echo \$! > ~/jaxrl-run/train.pid"
cmds=(
  "git archive --format=tar.gz -o $tarball $sha"
  "gcloud compute tpus tpu-vm scp $tarball $config $name:~/ --worker=all ${where[*]}"
  "gcloud compute tpus tpu-vm ssh $name --worker=all --command=$(printf '%q' "$install") ${where[*]}"
  "gcloud compute tpus tpu-vm ssh $name --worker=all --command=$(printf '%q' "$start") ${where[*]}"
  "gcloud compute tpus tpu-vm ssh $name --worker=0 --command='tail -n +1 -F ~/jaxrl-run/train.log' ${where[*]}"
)
for c in "${cmds[@]}"; do
  if [[ "${DRY_RUN:-0}" == 1 ]]; then echo "$c"; else eval "$c"; fi
done
