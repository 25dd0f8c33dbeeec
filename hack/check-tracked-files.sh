#!/usr/bin/env bash
# Fails when a file git tracks is a build output: an executable binary, or
# anything larger than 1 MiB. Build outputs belong under bin/ (ignored).
set -euo pipefail
cd "$(dirname "$0")/.."

limit=$((1024 * 1024))
bad=0
while IFS= read -r -d '' entry; do
	mode=${entry%% *}
	path=${entry#*$'\t'}
	[[ -f $path ]] || continue # deleted in the work tree, or a submodule
	size=$(stat -c %s -- "$path")
	if ((size > limit)); then
		echo "tracked file larger than 1 MiB: $path ($size bytes)"
		bad=1
		continue
	fi
	magic=$(head -c 4 -- "$path" | od -An -tx1 | tr -d ' \n')
	case $magic in
	7f454c46 | cffaedfe | cefaedfe | feedfacf | feedface | cafebabe | 4d5a*)
		echo "tracked file is an executable binary: $path"
		bad=1
		continue
		;;
	esac
	if [[ $mode == 100755 && $(head -c 2 -- "$path") != '#!' ]]; then
		echo "tracked file is executable but not a script: $path"
		bad=1
	fi
done < <(git ls-files -s -z)

if ((bad)); then
	echo "build outputs go under bin/ (ignored); remove these with git rm --cached"
	exit 1
fi
