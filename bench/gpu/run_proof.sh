#!/bin/bash
# GPU side (after ../shared/gpu staging): start bench/gpu/session_proof.py detached, then watch it.
# The product must cope without flash-attn on its own, so the staging's sitecustomize fallback is left off PYTHONPATH.
set -u
source /root/gpu-env.sh
export PYTHONPATH=/root/site:$PWD VERL_WORKBENCH_HOME=/root/wb
mkdir -p /root/proof
setsid nohup python3 bench/gpu/session_proof.py /root/proof > /root/proof/stdout.log 2>&1 < /dev/null &
sleep 2
bash bench/gpu/watch.sh "${1:-500}"
