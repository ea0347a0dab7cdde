#!/bin/bash
# Here (not on the GPU): put what a campaign call brought back where it belongs.
#   bash bench/gpu/collect.sh FILES_AT [FOLDER]
# FILES_AT: the folder the device tool copied $OUT to. Results go to bench/results/FOLDER/ (default: the machine named
# in the JSON; a second lease of the same day needs a folder of its own: nothing already there is overwritten)
# (with the campaign's progress log, per-step CSV, advice and overrides beside them); the recording is unpacked to
# /tmp/campaign-recording/ (move it under workbench/assets/recordings/<name>/ if it is worth replaying: session.sqlite
# only); the table in bench/README.md is regenerated.
set -eu
F=${1:?usage: collect.sh FILES_AT}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
T=$(mktemp -d)
tar xzf "$F/results.tar.gz" -C "$T"
M=$(python3 -c "import json,glob; m=[json.load(open(f)).get('machine') for f in sorted(glob.glob('$T/results/*.json'))]; print(next((x for x in m if x), ''))")
[ -n "$M" ] || { echo "no result JSON in $F/results.tar.gz"; exit 1; }
D=$ROOT/bench/results/${2:-$M}
mkdir -p "$D"
cp -n "$T"/results/*.json "$D/"
for f in "$T"/per_step_*.csv "$T"/advice_*.json "$T"/quickstart_overrides_*.txt "$T"/plain_overrides.txt; do
  [ -f "$f" ] && cp -n "$f" "$D/campaign_$(basename "$f")"
done
[ -f "$F/progress.log" ] && cp -n "$F/progress.log" "$D/campaign_progress.log"
[ -f "$F/logs.tar.gz" ] && cp -n "$F/logs.tar.gz" "$D/campaign_logs.tar.gz"
if [ -f "$F/recording.tar.gz" ]; then
  rm -rf /tmp/campaign-recording && mkdir -p /tmp/campaign-recording && tar xzf "$F/recording.tar.gz" -C /tmp/campaign-recording
  echo "recording: $(ls -d /tmp/campaign-recording/*)"
fi
cd "$ROOT" && .venv/bin/python -m bench.table
echo "results in $D:"; ls "$D"
rm -rf "$T"
