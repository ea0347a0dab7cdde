#!/bin/bash
# GPU side (after the shared staging, ../shared/gpu/README.md): the benchmark campaign of bench/gpu/campaign.py.
#   bash bench/gpu/campaign.sh start [WATCH_S]   copy the code to /root/campaign/code, start the campaign detached
#                                                (it outlives this command), then watch it up to WATCH_S s (default 500)
#   bash bench/gpu/campaign.sh watch [WATCH_S]   follow it until DONE or WATCH_S s, then copy what exists to $OUT
#   bash bench/gpu/campaign.sh stop              end it (supervisor, verl, Ray) and copy what exists to $OUT
# env: CAMPAIGN_BUDGET_S (1380: the whole campaign; later parts shrink or skip), PLAIN_STEPS (6),
#      CAMPAIGN_WORKLOADS (1.5b,0.5b; e.g. 0.5b: only its autopilot, with the whole budget, then plain verl),
#      CAMPAIGN_PARTS (all; restart: only the control restart on 0.5b from the autopilot's round-1 plan),
#      WORKBENCH_COMPILE_CACHE (1), WORKBENCH_RAY_CLUSTER (1: one Ray cluster per session kept across segments,
#      workbench/ray_cluster.py; 0: each run starts its own).
# $OUT gets at most 5 files: progress.log, results.tar.gz (bench JSON + per-step CSV + advice + overrides),
# recording.tar.gz (the session directory without checkpoints/caches, once packed; else a consistent copy of its
# store), logs.tar.gz (tails of the segment logs and of plain verl's log), status.txt (GPU, processes).
set -u
C=${CAMPAIGN_DIR:-/root/campaign}
PY=${CAMPAIGN_PYTHON:-python3}   # CAMPAIGN_DIR / CAMPAIGN_PYTHON / CAMPAIGN_ARGS=--replay: the CPU dry run of this script
cmd=${1:-watch}
W=${2:-500}
[ -f /root/gpu-env.sh ] && source /root/gpu-env.sh

pack() {
  mkdir -p $C/pack && rm -rf $C/pack/*
  cp $C/progress.log "$OUT/" 2>/dev/null
  (cd $C && tar czf "$OUT/results.tar.gz" --ignore-failed-read results per_step_*.csv advice_*.json \
      quickstart_overrides_*.txt plain_overrides.txt plain/metrics.jsonl session_path.txt 2>/dev/null)
  S=$(cat $C/session_path.txt 2>/dev/null)
  if [ -f $C/recording.tar.gz ]; then cp $C/recording.tar.gz "$OUT/"
  elif [ -n "$S" ] && [ -f "$S/session.sqlite" ]; then
    $PY - "$S" $C/pack <<'PY'
import sqlite3, sys, pathlib
src, dst = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]) / pathlib.Path(sys.argv[1]).name
dst.mkdir(parents=True, exist_ok=True)
a = sqlite3.connect(f"file:{src / 'session.sqlite'}?mode=ro", uri=True); b = sqlite3.connect(dst / "session.sqlite")
a.backup(b); b.close(); a.close()  # a consistent copy while the session still writes
PY
    (cd $C/pack && tar czf "$OUT/recording.tar.gz" "$(basename "$S")")
  fi
  mkdir -p $C/pack/logs
  for D in $(cat $C/sessions.txt 2>/dev/null); do   # every session of the campaign, its logs under its name
    mkdir -p "$C/pack/logs/$(basename "$D")"
    for f in "$D"/logs/*.log; do [ -f "$f" ] && tail -c 4000000 "$f" > "$C/pack/logs/$(basename "$D")/$(basename "$f")"; done
  done
  [ -f $C/plain/log.txt ] && tail -c 4000000 $C/plain/log.txt > $C/pack/logs/plain_verl.log
  tail -c 2000000 $C/stdout.log > $C/pack/logs/campaign_stdout.log 2>/dev/null
  (cd $C/pack && tar czf "$OUT/logs.tar.gz" logs)
  { date -u; nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader
    df -h /dev/shm /root; free -g; du -sh /dev/shm/verl-workbench 2>/dev/null
    ps -eo pid,etimes,pcpu,rss,args --sort=-pcpu | head -25 | cut -c1-200; } > "$OUT/status.txt" 2>&1
}

watch() {
  local end=$(( $(date +%s) + $1 ))
  while [ "$(date +%s)" -lt "$end" ]; do
    grep -q " DONE$" $C/progress.log 2>/dev/null && break
    if [ -f $C/pid ] && ! kill -0 "$(cat $C/pid)" 2>/dev/null; then echo "== campaign process gone"; break; fi
    sleep 5
  done
  echo "== progress (tail)"; tail -c 6000 $C/progress.log 2>/dev/null
  pack
  echo "== $OUT:"; ls -la "$OUT"
}

case "$cmd" in
  start)
    rm -rf $C && mkdir -p $C/code
    cp -r workbench bench pyproject.toml $C/code/   # the campaign runs from its own copy: later calls replace $PWD
    cat > $C/go.sh <<GO
[ -f /root/gpu-env.sh ] && source /root/gpu-env.sh
# The product copes without flash-attn on its own: the staging's sitecustomize fallback stays off its PYTHONPATH
# (campaign.py puts it back for the plain-verl run only).
export PYTHONPATH=/root/site:$C/code VERL_WORKBENCH_HOME=/root/wb WORKBENCH_SAMPLER_HZ=10
export WORKBENCH_COMPILE_CACHE=${WORKBENCH_COMPILE_CACHE:-1} WORKBENCH_RAY_CLUSTER=${WORKBENCH_RAY_CLUSTER:-1}
export CAMPAIGN_BUDGET_S=${CAMPAIGN_BUDGET_S:-1380} PLAIN_STEPS=${PLAIN_STEPS:-6}
export CAMPAIGN_WORKLOADS=${CAMPAIGN_WORKLOADS:-1.5b,0.5b} CAMPAIGN_PARTS=${CAMPAIGN_PARTS:-all}
cd $C/code && exec $PY bench/gpu/campaign.py $C ${CAMPAIGN_ARGS:-}
GO
    setsid nohup bash $C/go.sh > $C/stdout.log 2>&1 < /dev/null &
    echo $! > $C/pid
    sleep 3
    watch "$W"
    ;;
  watch) watch "$W" ;;
  stop)
    S=$(cat $C/session_path.txt 2>/dev/null)
    SP=$($PY - "$S" <<'PY' 2>/dev/null
import json, sqlite3, sys
db = sqlite3.connect(f"file:{sys.argv[1]}/session.sqlite?mode=ro", uri=True)
print(json.loads(dict(db.execute("SELECT key, value FROM meta").fetchall()).get("supervisor_pid", "null")) or "")
PY
)
    [ -f $C/pid ] && kill -TERM -- -"$(cat $C/pid)" 2>/dev/null   # the campaign driver (its own process group)
    [ -n "$SP" ] && kill -TERM "$SP" 2>/dev/null                  # the supervisor ends verl and the sampler
    sleep 20
    $PY -m ray.scripts.scripts stop --force >/dev/null 2>&1
    pack
    ;;
  *) echo "usage: campaign.sh start|watch|stop [WATCH_S]"; exit 2 ;;
esac
