#!/usr/bin/env bash
# The scale benchmark of issue 13, quoted in docs/benchmarks.md: for each
# cell of CLUSTERS × N it starts a local fleet (clusters without workload
# Pods, the lease API, one berth-agent per cluster), creates N BerthLeases in
# every cluster, and measures convergence, the steady state, the holder's
# agent killed and a cordon (see test/scale). Each cell starts its own
# clusters; a cell takes a few minutes, one whose agents do not converge up
# to PHASE_TIMEOUT more.
#
# CLUSTERS and N are comma-separated lists; AGENT_ARGS is passed to every
# berth-agent (space-separated), JSON names a file for the figures as JSON,
# KEEP=1 keeps each cell's folder with every process's log.
set -euo pipefail
cd "$(dirname "$0")/.."

CLUSTERS=${CLUSTERS:-2,3}
N=${N:-1000,10000}
TTL=${TTL:-30s}
HEARTBEAT=${HEARTBEAT:-10s}
WINDOW=${WINDOW:-60s}
PHASE_TIMEOUT=${PHASE_TIMEOUT:-5m}
AGENT_ARGS=${AGENT_ARGS:-}
JSON=${JSON:-}
KEEP=${KEEP:-}
BIN=${BIN:-bin}

export KUBEBUILDER_ASSETS=${KUBEBUILDER_ASSETS:-$PWD/$BIN/k8s}
go build -o "$BIN/bench-scale" ./test/scale
args=(--bin "$BIN" --clusters "$CLUSTERS" --n "$N" --ttl "$TTL" --heartbeat "$HEARTBEAT"
	--window "$WINDOW" --phase-timeout "$PHASE_TIMEOUT" --agent-args "$AGENT_ARGS")
[[ -n $JSON ]] && args+=(--json "$JSON")
[[ -n $KEEP ]] && args+=(--keep)
echo "bench-scale: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg), $(go version | cut -d' ' -f3), $(git rev-parse --short HEAD)"
exec "$BIN/bench-scale" "${args[@]}"
