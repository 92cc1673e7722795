#!/usr/bin/env bash
# Shrinks a trace that fails on a Rust target to a short fixture that still
# fails: it drops runs of steps (halves, then quarters, down to single
# steps) while the Rust runner still fails on the rest, re-deriving every
# return and state from the extracted model after each drop (gen drop), so
# the result is a valid fixture the model agrees with.
#
# usage: formal/shrink.sh TRACE.json OUT.json [--target NAME]
#   e.g. formal/shrink.sh formal/traces/trace-3-412.json conformance/egress/new_case.json
# Then give OUT a description saying what it checks, and commit it.
# Exit status 0 when OUT was written, 1 when TRACE does not fail, 2 for bad usage.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/.." && pwd)"
[ $# -ge 2 ] || { sed -n '2,11p' "$0"; exit 2; }
trace="$1" out="$2"; shift 2
targets=("$@")

make -s -C "$here" replay/gen >/dev/null
(cd "$repo" && cargo build --quiet --locked --release -p egress-conformance)
runner="${CARGO_TARGET_DIR:-$repo/target}/release/egress-conformance"
gen="$here/replay/gen"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

fails() { ! "$runner" --quiet "${targets[@]}" "$1" >/dev/null 2>&1; }

cp "$trace" "$work/current.json"
if ! fails "$work/current.json"; then
  echo "shrink.sh: $trace passes on every target asked; nothing to shrink"; exit 1
fi
n="$("$gen" steps "$work/current.json")"
chunk=$(( (n + 1) / 2 ))
while [ "$chunk" -ge 1 ]; do
  from=0
  while [ "$from" -lt "$n" ]; do
    "$gen" drop "$work/current.json" "$work/candidate.json" "$from" "$chunk" >/dev/null
    if fails "$work/candidate.json"; then
      mv "$work/candidate.json" "$work/current.json"
      n="$("$gen" steps "$work/current.json")"
    else
      from=$((from + chunk))
    fi
  done
  chunk=$((chunk / 2))
done
cp "$work/current.json" "$out"
echo "shrink.sh: $n steps in $out"
"$runner" "${targets[@]}" "$out" | grep -v '^ok' || true
