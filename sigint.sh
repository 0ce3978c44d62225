#!/bin/bash
# sigint.sh NAME MODE DELAY NSIG [args]  -- run against slow site, send SIGINT NSIG times after DELAY
name=$1; mode=$2; delay=$3; nsig=$4; shift 4
cd /tmp/probeG/proj
MODE=$mode SITE=http://127.0.0.1:25481 /work/venv/bin/scrapy crawl site "$@" > /tmp/probeG/logs/$name.log 2>&1 &
pid=$!
sleep $delay
for i in $(seq 1 $nsig); do kill -INT $pid; sleep 0.5; done
wait $pid; echo rc=$?
grep -E "scrapy_redis_bloom|ERROR|Traceback|Error|finish_reason|'dupefilter/|response_received_count|bloomfilter/(added|filtered|total_added|errors|batch_unsch)|shutdown|Received" /tmp/probeG/logs/$name.log | grep -v "py.warnings" | cut -c1-300
python3 /tmp/probeG/hits.py 25481 300
