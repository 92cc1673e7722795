(* Random traces from the model extracted from Coq, written as conformance
   fixtures: every operation (stale generations included), values near
   u64::MAX, a clock, retry-after hints, and after every step the exact
   return, the whole state and every change flag. The Rust runner replays
   them on the core and the three cells, so any difference between the
   model and the code on any of these steps fails.

   usage:
     gen [--seed S] [--traces N] [--steps K] OUT_DIR
         N traces of up to K steps (default 1000 of 80) from seed S
         (default 1) into OUT_DIR/trace-S-I.json; the same seed writes the
         same traces
     gen annotate IN.json OUT.json
         re-derives every return and expected state of IN's ops from the
         model (a shrunk trace stays a valid fixture)
     gen drop IN.json OUT.json FROM COUNT
         the same without COUNT ops from index FROM (used by formal/shrink.sh)
     gen steps IN.json
         prints how many steps IN has

   Each step is also checked for exact change sets: a reader's flag is set
   if and only if its value changed. Exit status 0 when every step is
   exact, 1 otherwise, 2 for bad usage. *)

open Model
open Fixture

let u64_max = Big.of_string "18446744073709551615"
let u32_max = Big.of_string "4294967295"
let n i = n_of_z (Big.of_int i)

type gen = { rng : Random.State.t; mutable now : Big.t }

let int g k = Random.State.int g.rng k
let chance g pct = int g 100 < pct
let pick g l = List.nth l (int g (List.length l))

(* u64::MAX less 0, 1 or 2. *)
let near_max g = n_of_z (Big.sub u64_max (Big.of_int (int g 3)))

let policy g =
  let base = pick g [ 0; 1; 2; 3; 5 ] in
  let ceiling = if chance g 10 then n_of_z u64_max else n (base + int g 20) in
  let budget = if chance g 5 then n_of_z u32_max else n (int g 4) in
  let rlimit = if chance g 5 then n_of_z u32_max else n (int g 4) in
  { limit = n (1 + int g 4); budget; rlimit; base = n base; ceiling;
    ordering_of = (if chance g 50 then Strict else Pipelined); hold = chance g 50 }

let first_generation g =
  match int g 10 with
  | 0 -> n 0
  | 1 | 2 -> near_max g
  | _ -> n (1 + int g 1000)

let z = z_of_n

(* The op's generation: mostly the current one, sometimes stale (one
   below, one above, or anywhere). *)
let generation_for g st =
  if chance g 88 then st.gen
  else
    let cur = z st.gen in
    match int g 3 with
    | 0 when Big.sign cur > 0 -> n_of_z (Big.pred cur)
    | 1 when Big.lt cur u64_max -> n_of_z (Big.succ cur)
    | _ -> n (int g 5)

(* A reconnect's generation: mostly higher (capped at u64::MAX), sometimes
   the same or lower. *)
let reconnect_generation g st =
  let cur = z st.gen in
  match int g 10 with
  | 0 -> st.gen
  | 1 -> n_of_z (Big.max Big.zero (Big.sub cur (Big.of_int (1 + int g 2))))
  | _ -> n_of_z (Big.min u64_max (Big.add cur (Big.of_int (1 + int g 2))))

(* A sequence in [lo, hi], or [lo] when the range is empty. *)
let between g lo hi =
  if Big.leq hi lo then n_of_z lo
  else n_of_z (Big.add lo (Big.of_int (int g (Big.to_int (Big.min (Big.of_int 1000) (Big.sub hi lo)) + 1))))

(* An ack's or a receipt's `through`: mostly within what was sent, at
   times just beyond it, below the watermark, or near u64::MAX. *)
let through g st =
  let next = z st.next in
  match (st.sent, int g 20) with
  | _, 0 -> near_max g
  | Some s, k when k < 3 -> n_of_z (Big.succ (z s))
  | Some s, k when k < 16 ->
      let lo = match st.acked with Some a -> Big.succ (z a) | None -> Big.zero in
      between g lo (z s)
  | _ -> between g Big.zero next

let seq_from g l st = if l <> [] && chance g 85 then pick g l else between g Big.zero (Big.succ (z st.next))

let tick g =
  if chance g 2 then g.now <- z (near_max g)
  else if chance g 40 then g.now <- Big.min u64_max (Big.add g.now (Big.of_int (int g 16)))

(* Mostly an op that can act: a failure, a retry or a requeue of nothing
   is usually a claim instead (unknown sequences still come, less often). *)
let op g st =
  tick g;
  let now = n_of_z g.now in
  let k = int g 100 in
  let idle = function
    | k when k >= 62 && k < 74 -> st.inflight = []
    | k when k >= 74 && k < 78 -> st.parked = []
    | k when k >= 87 && k < 92 -> st.exhausted = []
    | _ -> false
  in
  let k = if idle k && chance g 75 then 20 + int g 26 else k in
  match k with
  | k when k < 18 -> (Enqueue (payload_index (`String (Printf.sprintf "p%d" (List.length !payloads)))), 0.)
  | k when k < 46 -> (Claim (generation_for g st), 0.)
  | k when k < 56 -> (Ack (generation_for g st, through g st), 0.)
  | k when k < 62 -> (Received (generation_for g st, through g st), 0.)
  | k when k < 74 ->
      let s = seq_from g (List.map (fun r -> r.seq) st.inflight) st in
      let kind =
        match int g 20 with
        | k when k < 12 -> Transient
        | k when k < 15 -> Permanent
        | 15 -> RetryAfter (near_max g)
        | _ -> RetryAfter (n (int g 30))
      in
      let sample = if !jitter = 0. || chance g 20 then 0. else float_of_int (int g 1025) /. 1024. in
      (Fail (generation_for g st, s, kind, now, spread sample), sample)
  | k when k < 78 -> (RetryNow (generation_for g st, seq_from g (List.map (fun p -> p.prec.seq) st.parked) st), 0.)
  | k when k < 87 -> (Timeout now, 0.)
  | k when k < 92 -> (Requeue (generation_for g st, seq_from g (List.map (fun (_, r) -> r.seq) st.exhausted) st), 0.)
  | _ -> (Reconnect (reconnect_generation g st), 0.)

let inexact_steps = ref 0

let note_inexact file i (o, sample) inexact =
  if inexact <> [] then begin
    incr inexact_steps;
    Printf.printf "INEXACT %s step %d %s: flag and change differ for %s\n" file i (show (op_json ~sample o))
      (String.concat ", " inexact)
  end

let fixture description g0 pol steps : Yojson.Safe.t =
  `Assoc
    [ ("description", `String description); ("kind", `String "Egress"); ("model", `String "EgressCore");
      ("generation", json_n g0); ("policy", policy_json pol); ("steps", `List steps) ]

(* Runs [ops] from [init g0] through the model, annotating each step. *)
let annotate file pol g0 ops =
  let st = ref (init g0) in
  List.mapi
    (fun i o ->
      let st', step, inexact = annotate_step pol !st o in
      note_inexact file i o inexact;
      st := st';
      step)
    ops

let trace seed i steps out =
  payloads := [];
  let g = { rng = Random.State.make [| seed; i |]; now = Big.zero } in
  let pol = policy g and g0 = first_generation g in
  (* A third of the traces spread their backoffs by a jitter. *)
  jitter := if chance g 67 then 0. else pick g [ 0.1; 0.25; 0.5; 1.0 ];
  let file = Filename.concat out (Printf.sprintf "trace-%d-%d.json" seed i) in
  let st = ref (init g0) and ops = ref [] in
  for _ = 1 to 1 + int g steps do
    let o = op g !st in
    st := st_of (Model.step pol !st (fst o));
    ops := o :: !ops
  done;
  let steps = annotate file pol g0 (List.rev !ops) in
  let doc = fixture (Printf.sprintf "Random trace %d of seed %d, from the extracted Coq model (formal/replay/gen.ml)" i seed) g0 pol steps in
  Yojson.Safe.to_file file doc

(* Re-derives IN's returns and states from the model into OUT, without
   the [count] ops from index [from] (a shrinking step). *)
let reannotate ?(from = 0) ?(count = 0) inp outp =
  payloads := [];
  let doc = Yojson.Safe.from_file inp in
  let pol = policy_of doc and g0 = num "generation" doc in
  let steps = match member "steps" doc with Some (`List l) -> l | _ -> raise (Bad "no steps") in
  let steps = List.filteri (fun i _ -> i < from || i >= from + count) steps in
  let ops =
    List.map
      (fun s ->
        match member "op" s with
        | Some o -> let _, op, sample = parse_op o in (op, sample)
        | None -> raise (Bad "step without op"))
      steps
  in
  let description = match member "description" doc with Some (`String d) -> d | _ -> "" in
  let out = fixture description g0 pol (annotate outp pol g0 ops) in
  let oc = open_out outp in
  Yojson.Safe.pretty_to_channel oc out;
  output_char oc '\n';
  close_out oc

let usage () =
  prerr_endline
    "usage: gen [--seed S] [--traces N] [--steps K] OUT_DIR | gen annotate IN.json OUT.json\n\
    \       | gen drop IN.json OUT.json FROM COUNT | gen steps IN.json";
  exit 2

let () =
  match List.tl (Array.to_list Sys.argv) with
  | [ "annotate"; inp; outp ] -> reannotate inp outp; exit (if !inexact_steps = 0 then 0 else 1)
  | [ "drop"; inp; outp; from; count ] ->
      (try reannotate ~from:(int_of_string from) ~count:(int_of_string count) inp outp with Failure _ -> usage ());
      exit 0
  | [ "steps"; inp ] -> (
      match member "steps" (Yojson.Safe.from_file inp) with
      | Some (`List l) -> print_int (List.length l); print_newline (); exit 0
      | _ -> raise (Bad "no steps"))
  | args ->
      let seed = ref 1 and traces = ref 1000 and steps = ref 80 and out = ref None in
      let rec parse = function
        | "--seed" :: v :: rest -> seed := int_of_string v; parse rest
        | "--traces" :: v :: rest -> traces := int_of_string v; parse rest
        | "--steps" :: v :: rest -> steps := int_of_string v; parse rest
        | [ dir ] when String.length dir > 0 && dir.[0] <> '-' -> out := Some dir
        | _ -> usage ()
      in
      (try parse args with Failure _ -> usage ());
      let out = match !out with Some d -> d | None -> usage () in
      if not (Sys.file_exists out) then Sys.mkdir out 0o755;
      for i = 0 to !traces - 1 do
        trace !seed i !steps out
      done;
      Printf.printf "gen: %d traces of seed %d in %s; %d steps with inexact change sets\n" !traces !seed out
        !inexact_steps;
      exit (if !inexact_steps = 0 then 0 else 1)
