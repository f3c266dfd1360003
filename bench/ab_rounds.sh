#!/usr/bin/env bash
# bench/ab_rounds.sh - the host-side speed figures of two builds, alternated on one machine.
#
# usage: bench/ab_rounds.sh BIN_A BIN_B ROUNDS OUTDIR TRACE...
#
# CPU timings on a shared host drift by tens of percent between minutes (docs/performance.md),
# so a change's effect is only visible when the builds take turns: each round runs the sim
# replay against its hash-table baseline (`replay --baseline --repeat 10`), `bench scale` and
# `bench pair` on sim with A, then with B. One JSON line per result goes to
# OUTDIR/ab_replay.jsonl, OUTDIR/ab_scale.jsonl and OUTDIR/ab_pair.jsonl, each tagged with
# the build ("a" or "b") and the round.
set -uo pipefail
if [ $# -lt 5 ]; then
  echo "usage: $0 BIN_A BIN_B ROUNDS OUTDIR TRACE..." >&2
  exit 2
fi
A=$1 B=$2 ROUNDS=$3 OUTDIR=$4
shift 4
mkdir -p "$OUTDIR"
: > "$OUTDIR/ab_replay.jsonl"
: > "$OUTDIR/ab_scale.jsonl"
: > "$OUTDIR/ab_pair.jsonl"
tag() { sed "s/^{/{\"build\": \"$1\", \"round\": $2, /"; }
for round in $(seq "$ROUNDS"); do
  for build in a b; do
    bin=$A
    [ "$build" = b ] && bin=$B
    "$bin" replay --json --baseline --repeat 10 --source sim "$@" | tag "$build" "$round" \
      >> "$OUTDIR/ab_replay.jsonl"
    "$bin" bench scale --json | tag "$build" "$round" >> "$OUTDIR/ab_scale.jsonl"
    "$bin" bench pair --json --source sim | tag "$build" "$round" >> "$OUTDIR/ab_pair.jsonl"
  done
done
