#!/bin/bash
# GPU side: follow the proof's progress for up to $1 seconds (returns early when it is DONE), then copy results to $OUT.
W=${1:-500}
END=$(( $(date +%s) + W ))
while [ "$(date +%s)" -lt "$END" ]; do
  grep -q "^.* DONE$" /root/proof/progress.log 2>/dev/null && break
  sleep 5
done
tail -c 6000 /root/proof/progress.log
S=$(cat /root/proof/session_path.txt 2>/dev/null)
mkdir -p /tmp/misc && rm -rf /tmp/misc/*
cp /root/proof/*.json /root/proof/*.csv /root/proof/*.txt /tmp/misc/ 2>/dev/null
tail -c 4000000 /root/proof/stdout.log > /tmp/misc/proof_stdout.log
[ -n "$S" ] && for f in "$S"/logs/*.log; do tail -c 3000000 "$f" > /tmp/misc/$(basename "$f"); done
tar czf $OUT/misc.tar.gz -C /tmp misc
cp /root/proof/progress.log $OUT/ 2>/dev/null
[ -f /root/proof/recording.tar.gz ] && cp /root/proof/recording.tar.gz $OUT/
nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader
echo "== state: $(ls $S 2>/dev/null | tr '\n' ' ')"
