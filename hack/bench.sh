#!/usr/bin/env bash
# Benchmarks of the lease API, quoted in docs/benchmarks.md.
#
# Starts berth-leaseapi on its embedded store in a scratch folder and drives it
# with test/load: open loop at the target rate (500 holders, 5,000 renews/s),
# then closed loop (as fast as it answers). Each is run RUNS times; the median
# run (by p99, resp. throughput) is reported.
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=${RUNS:-3}
HOLDERS=${HOLDERS:-500}
RATE=${RATE:-5000}
DURATION=${DURATION:-10s}
BIN=${BIN:-bin}
ADDR=127.0.0.1:${BENCH_PORT:-18443}

go build -o "$BIN/load" ./test/load
work=$(mktemp -d)
server_pid=
cleanup() {
	[ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null
	rm -rf "$work"
}
trap cleanup EXIT

echo "bench: berth-leaseapi (sqlite) on $ADDR, logs in $work; $(nproc) cores, $(go version | cut -d' ' -f3)"
"$BIN/berth-leaseapi" --listen "$ADDR" --metrics-listen "" --sqlite-path "$work/leases.db" 2>"$work/server.log" &
server_pid=$!
for _ in $(seq 100); do
	curl -sf "http://$ADDR/readyz" >/dev/null && break
	sleep 0.1
done
curl -sf "http://$ADDR/readyz" >/dev/null || { echo "bench: berth-leaseapi did not become ready"; cat "$work/server.log"; exit 1; }

run_series() { # name rate
	local name=$1 rate=$2 i
	: >"$work/$name"
	for i in $(seq "$RUNS"); do
		echo "bench: $name run $i/$RUNS" >&2
		"$BIN/load" --url "http://$ADDR" --holders "$HOLDERS" --rate "$rate" --duration "$DURATION" \
			--namespace "$name-$i" --json 2>>"$work/load.log" >>"$work/$name"
	done
}

run_series open "$RATE"
run_series closed 0

report() { # name sort-field
	local name=$1 field=$2
	python3 - "$work/$name" "$field" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
field = sys.argv[2]
rows.sort(key=lambda r: r[field])
m = rows[len(rows) // 2]
all_ = ", ".join(f"{r[field]:.1f}" for r in rows)
print(f"| {'open loop' if m['targetRate'] else 'closed loop'} | {m['holders']} | {m['targetRate'] or '-'} | {m['throughput']:.0f} | {m['p50Ms']:.2f} | {m['p99Ms']:.2f} | {m['errors']}/{m['lost']} | {field}: {all_} |")
PY
}
echo
echo "| load | holders | target/s | renews/s | p50 ms | p99 ms | errors/lost | runs |"
echo "|---|---|---|---|---|---|---|---|"
report open p99Ms
report closed throughput

echo
echo "bench: the store alone (500 goroutines, group commit), 3 runs:"
go test -run '^$' -bench BenchmarkRenew -benchtime 40000x -count 3 ./leaseapi/store/sqlite | grep '^BenchmarkRenew'
