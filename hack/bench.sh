#!/usr/bin/env bash
# Benchmarks of the lease API, quoted in docs/benchmarks.md.
#
# 1. The embedded store against its target: berth-leaseapi on a scratch SQLite
#    file driven by test/load open loop (500 holders, 5,000 renews/s) and
#    closed loop, each RUNS times; the median run is reported.
# 2. The three stores side by side with the path a user would otherwise take:
#    the same closed-loop load (COMPARE_HOLDERS holders) against berth-leaseapi
#    on SQLite, on PostgreSQL and on a kube-apiserver's Leases, and directly
#    against Lease objects on that kube-apiserver (client-go compare-and-swap
#    updates, the baseline); ratios are to the baseline.
# 3. The embedded store alone (go test -bench), before the other servers start.
# 4. Batched renewals (POST /v1alpha1/renewals, test/load --batch): closed loop
#    (BATCH_HOLDERS holders of BATCH leases each) and open loop (HOLDERS holders
#    of OPEN_BATCH leases each, OPEN_BATCH_RATE batches/s) on the embedded store,
#    each RUNS times; and in the side-by-side run, batches on SQLite and on
#    PostgreSQL next to the single renews and the baseline.
# 5. Confirmations (in-Pod fencing) through the handler chain with a token-file
#    bearer and with service account tokens (RS256, ES256), before the other
#    servers start.
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=${RUNS:-3}
HOLDERS=${HOLDERS:-500}
RATE=${RATE:-5000}
DURATION=${DURATION:-10s}
COMPARE_HOLDERS=${COMPARE_HOLDERS:-200}
BATCH=${BATCH:-1000}
BATCH_HOLDERS=${BATCH_HOLDERS:-20}
OPEN_BATCH=${OPEN_BATCH:-100}
OPEN_BATCH_RATE=${OPEN_BATCH_RATE:-100}
# Batch holders acquire their leases one by one before they renew; the TTL
# outlasts that.
BATCH_TTL=${BATCH_TTL:-5m}
BIN=${BIN:-bin}

go build -o "$BIN/load" ./test/load
work=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true # the sandbox stops its clusters before it exits
	rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# start_leaseapi NAME ARGS... starts berth-leaseapi and sets $url.
start_leaseapi() {
	local name=$1 port
	shift
	port=$(free_port)
	"$BIN/berth-leaseapi" --listen "127.0.0.1:$port" --metrics-listen "" "$@" 2>"$work/$name.log" &
	pids+=($!)
	url="http://127.0.0.1:$port"
	for _ in $(seq 200); do
		curl -sf "$url/readyz" >/dev/null && return
		sleep 0.1
	done
	echo "bench: berth-leaseapi ($name) did not become ready"; cat "$work/$name.log"; exit 1
}

echo "bench: $(nproc) cores, $(go version | cut -d' ' -f3); logs in $work"
start_leaseapi sqlite --sqlite-path "$work/leases.db"

run_series() { # name rate
	local name=$1 rate=$2 i
	: >"$work/$name"
	for i in $(seq "$RUNS"); do
		echo "bench: $name run $i/$RUNS" >&2
		"$BIN/load" --url "$url" --holders "$HOLDERS" --rate "$rate" --duration "$DURATION" \
			--namespace "$name-$i" --json 2>>"$work/load.log" >>"$work/$name"
	done
}
run_series open "$RATE"
run_series closed 0

run_batches() { # name holders batch rate
	local name=$1 holders=$2 batch=$3 rate=$4 i
	: >"$work/$name"
	for i in $(seq "$RUNS"); do
		echo "bench: $name run $i/$RUNS" >&2
		# One namespace for every run: a holder's acquire of its own lease renews it.
		"$BIN/load" --url "$url" --holders "$holders" --batch "$batch" --rate "$rate" --duration "$DURATION" \
			--ttl "$BATCH_TTL" --namespace "$name" --json 2>>"$work/load.log" >>"$work/$name"
	done
}
run_batches batch-open "$HOLDERS" "$OPEN_BATCH" "$OPEN_BATCH_RATE"
run_batches batch-closed "$BATCH_HOLDERS" "$BATCH" 0

report() { # file sort-field
	python3 - "$1" "$2" <<'PY'
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
echo "## Embedded store"
echo
echo "| load | holders | target/s | renews/s | p50 ms | p99 ms | errors/lost | runs |"
echo "|---|---|---|---|---|---|---|---|"
report "$work/open" p99Ms
report "$work/closed" throughput

echo
echo "## Batched renewals, embedded store"
echo
echo "| load | holders × leases | target batches/s | renewals/s | batches/s | p50 ms | p99 ms | errors/lost | runs |"
echo "|---|---|---|---|---|---|---|---|---|"
report_batches() { # file sort-field
	python3 - "$1" "$2" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
field = sys.argv[2]
rows.sort(key=lambda r: r[field])
m = rows[len(rows) // 2]
all_ = ", ".join(f"{r[field]:.1f}" for r in rows)
print(f"| {'open loop' if m['targetRate'] else 'closed loop'} | {m['holders']} × {m['batch']} | {m['targetRate'] or '-'} | {m['throughput']:.0f} | {m['requests']/m['seconds']:.0f} | {m['p50Ms']:.2f} | {m['p99Ms']:.2f} | {m['errors']}/{m['lost']} | {field}: {all_} |")
PY
}
report_batches "$work/batch-open" p99Ms
report_batches "$work/batch-closed" throughput

echo
echo "## The store alone (500 goroutines, group commit), 3 runs"
echo
go test -run '^$' -bench BenchmarkRenew -benchtime 40000x -count 3 ./leaseapi/store/sqlite | grep '^BenchmarkRenew'

echo
echo "## Confirmations for in-Pod fencing, by credential (every core, no network), 3 runs"
echo
go test -run '^$' -bench BenchmarkConfirm -benchtime 2s -count 3 ./leaseapi/server | grep '^BenchmarkConfirm'

# The other stores need a PostgreSQL and a kube-apiserver.
echo >&2
echo "bench: starting a kube-apiserver (test/sandbox) and a PostgreSQL" >&2
# The binary itself, not `go run`: its SIGTERM must reach the sandbox, which
# then stops every process it started.
go build -o "$BIN/sandbox" ./test/sandbox
"$BIN/sandbox" --clusters 1 --workdir "$work/k8s" >"$work/sandbox.out" 2>"$work/sandbox.log" &
pids+=($!)
pgbin=$(dirname "$(ls /usr/lib/postgresql/*/bin/initdb | tail -1)")
pgport=$(free_port)
mkdir -p "$work/pg"
as_pg=()
if [ "$(id -u)" = 0 ]; then chown postgres "$work/pg"; chmod 755 "$work"; as_pg=(runuser -u postgres --); fi
"${as_pg[@]}" "$pgbin/initdb" -D "$work/pg/data" -U postgres --auth=trust -E UTF8 >"$work/initdb.log"
"${as_pg[@]}" "$pgbin/postgres" -D "$work/pg/data" -p "$pgport" -k "$work/pg" -c listen_addresses=127.0.0.1 \
	-c max_connections=300 2>"$work/postgres.log" &
pids+=($!)
for _ in $(seq 600); do grep -q "ready" "$work/sandbox.out" 2>/dev/null && break; sleep 0.1; done
grep -q "ready" "$work/sandbox.out" || { echo "bench: the sandbox cluster did not start"; tail "$work/sandbox.log"; exit 1; }
kubeconfig="$work/k8s/cluster-1.kubeconfig"

start_leaseapi postgres --store postgres --postgres-dsn "postgres://postgres@127.0.0.1:$pgport/postgres?sslmode=disable"
pg_url=$url
start_leaseapi kubernetes --store kubernetes --kubeconfig "$kubeconfig"
kube_url=$url
start_leaseapi sqlite2 --sqlite-path "$work/leases2.db"
sqlite_url=$url

compare() { # label args...
	local label=$1
	shift
	echo "bench: compare $label" >&2
	# The arguments last, so that they may override --holders.
	"$BIN/load" --holders "$COMPARE_HOLDERS" --rate 0 --duration "$DURATION" --json "$@" 2>>"$work/load.log" |
		python3 -c 'import json,sys; r=json.load(sys.stdin); r["label"]=sys.argv[1]; print(json.dumps(r))' "$label" >>"$work/compare"
}
: >"$work/compare"
compare "client-go CAS on Lease objects (baseline)" --kubeconfig "$kubeconfig" --namespace bench-baseline
compare "berth-leaseapi, embedded SQLite" --url "$sqlite_url" --namespace cmp
compare "berth-leaseapi, PostgreSQL" --url "$pg_url" --namespace cmp
compare "berth-leaseapi, Kubernetes Leases" --url "$kube_url" --namespace cmp
compare "berth-leaseapi, embedded SQLite, batches of $BATCH" --url "$sqlite_url" --namespace cmpb \
	--holders "$BATCH_HOLDERS" --batch "$BATCH" --ttl "$BATCH_TTL"
compare "berth-leaseapi, PostgreSQL, batches of $BATCH" --url "$pg_url" --namespace cmpb \
	--holders "$BATCH_HOLDERS" --batch "$BATCH" --ttl "$BATCH_TTL"

echo
echo "## The stores side by side (closed loop, $DURATION each; latency is per request)"
echo
python3 - "$work/compare" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
base = rows[0]
print("| target | holders | renews/s | × baseline | p50 ms | p99 ms | errors/lost |")
print("|---|---|---|---|---|---|---|")
for r in rows:
    holders = f"{r['holders']} × {r['batch']}" if r.get('batch') else f"{r['holders']}"
    print(f"| {r['label']} | {holders} | {r['throughput']:.0f} | {r['throughput']/base['throughput']:.2f} | {r['p50Ms']:.2f} | {r['p99Ms']:.2f} | {r['errors']}/{r['lost']} |")
PY
