#!/usr/bin/env bash
# The model's mutation gate: each mutant below changes one rule of Model.v
# in a scratch copy of formal/; the corpus replay and the differential
# traces then run against the mutated model (extracted to OCaml) and the
# Rust targets. A mutant must be caught: the differential run (traces from
# the mutant, replayed on the Rust code, with the generator's exactness
# check) must fail. The corpus replay's verdict is printed beside it: the
# first two mutants are the ones the hand-written corpus let through when
# they were found (its fixtures for the delivery rules catch them now too);
# the two isolation mutants still pass the corpus. The differential traces
# catch every one of them on their own.
#
# usage: formal/mutants.sh   (from anywhere; REPO defaults to this checkout)
# Exit status 0 when every mutant is caught and the unmutated copy passes.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="${REPO:-$(cd "$here/.." && pwd)}"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT

# name # text in Model.v (exactly once) # its replacement
mutants=(
  "reconnect does not flag the generation#(nonempty kept) true false).#(nonempty kept) false false)."
  "a replay refunds the interrupted attempt#mkRec (seq r) (att r) (fails r) (reps r + 1) true#mkRec (seq r) (att r - 1) (fails r) (reps r + 1) true"
  "an ack one above what was sent is taken#Some s => s <? t | None => true end.#Some s => s + 1 <? t | None => true end."
  "the window admits one more#if window_end pol st <=? seq r#if window_end pol st <? seq r"
  "a record is due one tick late#pdue p <=? now.#pdue p <? now."
  "a receipt does not refund the replay#(inflight st ++ map refunded moved)#(inflight st ++ moved)"
  "the budget allows one more failure#if budget pol <? k then#if budget pol <=? k then"
  "the replay limit allows one more#rlimit pol <? reps r.#rlimit pol + 1 <? reps r."
  "a receipt never flags received#false false false false false rose).#false false false false false false)."
  "a quiet reconnect isolates#IOff => IOff | _ => IReady end),#IOff => IReady | _ => IReady end),"
  "a receipt does not end isolation#(progressed st || rose) (if rose then IOff else isol st),#(progressed st || rose) (isol st),"
  "a due time not saturated#(mkPark r2 b (sat (now + b)))#(mkPark r2 b (now + b))"
  "a requeue keeps the spent budget#(insert (fresh r) (pending st))#(insert r (pending st))"
  "retry_now does not flag parked#OScheduled s, mkCh true false false cleared true false false false)#OScheduled s, mkCh true false false cleared false false false false)"
  "a reconnect keeps the retry state#(sent st) (if cleared then None else retry_st st)#(sent st) (retry_st st)"
  "the jitter is not added#sat (backoff pol k hint + spread (backoff pol k hint))#sat (backoff pol k hint)"
  "a reconnect's count omits parked#OReconnected g (length (inflight st) + length (parked st))#OReconnected g (length (inflight st))"
)

# Runs the corpus replay and the differential traces in $1 (a copy of
# formal/); prints "corpus: pass|FAIL, differential: pass|FAIL".
judge() {
  local dir="$1" corpus differential
  if make -s -C "$dir" replay CORPUS="$repo/conformance/egress" >"$dir/corpus.log" 2>&1; then corpus=pass; else corpus=FAIL; fi
  if make -s -C "$dir" differential TRACES="${TRACES:-500}" REPO="$repo" >"$dir/differential.log" 2>&1; then
    differential=pass
  else
    differential=FAIL
  fi
  echo "corpus: $corpus, differential: $differential"
}

copy() {
  rm -rf "$scratch/formal"
  mkdir -p "$scratch/formal"
  (cd "$here" && cp -r Makefile ./*.v replay "$scratch/formal/")
  make -s -C "$scratch/formal" clean >/dev/null
}

copy
verdict="$(judge "$scratch/formal")"
echo "unmutated: $verdict"
if [ "$verdict" != "corpus: pass, differential: pass" ]; then
  cat "$scratch/formal/corpus.log" "$scratch/formal/differential.log" | tail -20
  echo "mutants.sh: the unmutated model does not pass"; exit 1
fi

survived=0
for m in "${mutants[@]}"; do
  IFS='#' read -r name old new <<<"$m"
  copy
  model="$(cat "$scratch/formal/Model.v")"
  rest="${model#*"$old"}"
  if [ "$rest" = "$model" ] || [ "${rest#*"$old"}" != "$rest" ]; then
    echo "mutants.sh: \"$old\" is not in Model.v exactly once (mutant: $name)"; exit 1
  fi
  printf '%s\n' "${model/"$old"/"$new"}" >"$scratch/formal/Model.v"
  verdict="$(judge "$scratch/formal")"
  case "$verdict" in
    *"differential: FAIL") echo "caught   $name ($verdict)" ;;
    *) echo "SURVIVED $name ($verdict)"; survived=$((survived + 1)) ;;
  esac
done
echo "model mutants: ${#mutants[@]}, survived: $survived"
[ "$survived" = 0 ]
