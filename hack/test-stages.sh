#!/usr/bin/env bash
# Runs `make test`'s stages in order (each a make target given as an argument), stops at
# the first that fails, and prints at the end, failed or not, how long each stage took:
# every Go package or fuzz target within a stage that took 30 s or more gets a line of its
# own. The whole output goes to the terminal and to $TEST_LOG; the table also goes to
# $TEST_TIMES, as Markdown, which is what docs/testing.md quotes.
set -uo pipefail
cd "$(dirname "$0")/.."

MAKE=${MAKE:-make}
bin=${BIN:-bin}
log=${TEST_LOG:-$bin/test.log}
times=${TEST_TIMES:-$bin/test-times.md}
slow=${SLOW_SECONDS:-30}
mkdir -p "$bin" "$(dirname "$log")" "$(dirname "$times")"
: >"$log"

rows=()     # "stage<TAB>seconds<TAB>result"
failed=""
started=$SECONDS

# packages FILE prints "name<TAB>seconds" for every Go package or fuzz target in a stage's
# output that took at least $slow seconds. `go test` ends each package with
# "ok|FAIL<TAB>path<TAB>12.345s"; `make fuzz` announces each target with "fuzz path Name".
packages() {
	awk -v slow="$slow" -F'\t' '
		/^fuzz [^ ]+ [^ ]+/ { split($0, f, " "); target = f[2] ":" f[3]; next }
		/^(ok|FAIL) *\t/ && $3 ~ /^[0-9.]+s/ {
			s = $3; sub(/s.*/, "", s)
			name = (target != "") ? target : $2
			if (s + 0 >= slow) printf "%s\t%d\n", name, s + 0.5
			target = ""
		}' "$1"
}

report() {
	local total=$((SECONDS - started)) row stage secs result
	echo
	echo "make test: where the time went (also in $times; the whole log in $log)"
	{
		echo "| stage | time | result |"
		echo "|---|--:|---|"
	} >"$times"
	for row in "${rows[@]}" "total"$'\t'"$total"$'\t'"${failed:+failed in $failed}"; do
		IFS=$'\t' read -r stage secs result <<<"$row"
		printf '  %-44s %3dm%02ds  %s\n' "$stage" $((secs / 60)) $((secs % 60)) "$result"
		printf '| %s | %dm%02ds | %s |\n' "$stage" $((secs / 60)) $((secs % 60)) "$result" >>"$times"
	done
}
trap report EXIT

for stage in "$@"; do
	out=$(mktemp)
	start=$SECONDS
	echo "==> $stage" | tee -a "$log"
	$MAKE --no-print-directory "$stage" 2>&1 | tee "$out" | tee -a "$log"
	rc=${PIPESTATUS[0]}
	result=ok
	((rc == 0)) || result="FAILED (exit $rc)"
	rows+=("$stage"$'\t'$((SECONDS - start))$'\t'"$result")
	while IFS=$'\t' read -r name secs; do
		rows+=("  $name"$'\t'"$secs"$'\t'"")
	done < <(packages "$out")
	rm -f "$out"
	if ((rc != 0)); then
		failed=$stage
		exit "$rc"
	fi
done
