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

# The latest-value projection's model (Latest.v): each mutant changes one
# rule; its differential traces (replayed on the Rust core and the latest
# cell of every flavour) must catch it.
latest_mutants=(
  "an ack does not reset the failure count#(Some v) 0 (waiting s)#(Some v) (failures s) (waiting s)"
  "a claim ignores the backoff#| Some u => (st, CBackoff u, [])#| Some u => (st, CEmpty, [])"
  "a reconnect requeues a superseded flight#(match desired s with Some d => Some d | None => Some (fver f, fval f) end)#(Some (fver f, fval f))"
  "a failure waits one tick less#sat (now + N.max (lsched pol n hint) 1)#sat (now + N.max (lsched pol n hint) 1 - 1)"
  "an upsert at the frontier is accepted#if v <=? d then (st, UAlreadyDurable d, [])#if v <? d then (st, UAlreadyDurable d, [])"
  "a key is freed a tick early#match waiting (snd e) with Some u => u <=? now | None => false end.#match waiting (snd e) with Some u => u <=? now + 1 | None => false end."
  "a pending failure does not flag the desire#FPending t, [(k, kone true true false true)]#FPending t, [(k, kone false true false true)]"
  "one key more than the bound#if lmax_keys pol <=? N.of_nat (length (keys st))#if lmax_keys pol <? N.of_nat (length (keys st))"
)

# Runs the corpus replay and the differential traces in $1 (a copy of
# formal/), those of the model $2 (egress, or latest: its traces only);
# prints "corpus: pass|FAIL|-, differential: pass|FAIL".
judge() {
  local dir="$1" which="${2:-egress}" corpus=- differential
  if [ "$which" = egress ]; then
    if make -s -C "$dir" replay CORPUS="$repo/conformance/egress" >"$dir/corpus.log" 2>&1; then corpus=pass; else corpus=FAIL; fi
  fi
  if make -s -C "$dir" "differential-$which" TRACES="${TRACES:-500}" REPO="$repo" >"$dir/differential.log" 2>&1; then
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
verdict="$(judge "$scratch/formal" egress)"
echo "unmutated: $verdict"
latest="$(judge "$scratch/formal" latest)"
echo "unmutated latest: $latest"
if [ "$verdict" != "corpus: pass, differential: pass" ] || [ "$latest" != "corpus: -, differential: pass" ]; then
  cat "$scratch/formal/corpus.log" "$scratch/formal/differential.log" | tail -20
  echo "mutants.sh: the unmutated model does not pass"; exit 1
fi

survived=0
# mutate FILE WHICH MUTANT...: each mutant of FILE, judged by WHICH's checks.
mutate() {
  local file="$1" which="$2" m name old new model rest
  shift 2
  for m in "$@"; do
    IFS='#' read -r name old new <<<"$m"
    copy
    model="$(cat "$scratch/formal/$file")"
    rest="${model#*"$old"}"
    if [ "$rest" = "$model" ] || [ "${rest#*"$old"}" != "$rest" ]; then
      echo "mutants.sh: \"$old\" is not in $file exactly once (mutant: $name)"; exit 1
    fi
    printf '%s\n' "${model/"$old"/"$new"}" >"$scratch/formal/$file"
    verdict="$(judge "$scratch/formal" "$which")"
    case "$verdict" in
      *"differential: FAIL") echo "caught   $name ($verdict)" ;;
      *) echo "SURVIVED $name ($verdict)"; survived=$((survived + 1)) ;;
    esac
  done
}
mutate Model.v egress "${mutants[@]}"
mutate Latest.v latest "${latest_mutants[@]}"
echo "model mutants: $((${#mutants[@]} + ${#latest_mutants[@]})), survived: $survived"
[ "$survived" = 0 ]
