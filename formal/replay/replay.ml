(* Replays the conformance fixtures against the model extracted from Coq
   (model.ml) and checks every outcome and every expected key, so the model
   and the corpus cannot drift apart.

   usage: replay PATH...   (fixture files or folders of *.json)
   Exit status 0 when every fixture agrees with the model, 1 otherwise. *)

(* Zarith, under a name the extracted model does not shadow. *)
module Big = Z

open Model

exception Bad of string

(* A fixture the model cannot judge, with the reason. *)
exception Skip of string

let rec z_of_pos = function
  | XH -> Big.one
  | XO p -> Big.shift_left (z_of_pos p) 1
  | XI p -> Big.succ (Big.shift_left (z_of_pos p) 1)

let z_of_n = function N0 -> Big.zero | Npos p -> z_of_pos p

let rec pos_of_z z =
  if Big.equal z Big.one then XH
  else
    let p = pos_of_z (Big.shift_right z 1) in
    if Big.is_even z then XO p else XI p

let n_of_z z =
  if Big.sign z < 0 then raise (Bad "negative number")
  else if Big.equal z Big.zero then N0
  else Npos (pos_of_z z)

(* Numbers as canonical decimal literals, so 5 and "5" beyond 2^62 compare. *)
let json_n n : Yojson.Safe.t = `Intlit (Big.to_string (z_of_n n))
let json_int i : Yojson.Safe.t = `Intlit (string_of_int i)

let rec normalize (j : Yojson.Safe.t) : Yojson.Safe.t =
  match j with
  | `Int i -> `Intlit (string_of_int i)
  | `Intlit s -> `Intlit (Big.to_string (Big.of_string s))
  | `List l -> `List (List.map normalize l)
  | `Assoc kv ->
      `Assoc (List.sort compare (List.map (fun (k, v) -> (k, normalize v)) kv))
  | other -> other

let member k (j : Yojson.Safe.t) =
  match j with
  | `Assoc kv -> List.assoc_opt k kv
  | _ -> None

let num k j =
  match member k j with
  | Some (`Int i) -> n_of_z (Big.of_int i)
  | Some (`Intlit s) -> n_of_z (Big.of_string s)
  | _ -> raise (Bad ("missing or non-integer " ^ k))

let num_or k default j = match member k j with None -> default | Some _ -> num k j

let str k j = match member k j with Some (`String s) -> s | _ -> raise (Bad ("missing string " ^ k))

(* Payloads: the model carries indices into this table. *)
let payloads : Yojson.Safe.t list ref = ref []

let payload_index (p : Yojson.Safe.t) =
  let i = List.length !payloads in
  payloads := !payloads @ [ p ];
  i

let payload_of i = List.nth !payloads i

let reason_json = function
  | DPermanent -> `String "permanent"
  | DRetries -> `String "retries"
  | DReplays -> `String "replays"

(* The envelope of a record; [dead] is only present for a tombstone or a
   held dead letter, as in the Rust core's JSON. *)
let envelope_with g sq a p dead : Yojson.Safe.t =
  `Assoc
    ([ ("generation", json_n g); ("sequence", json_n sq); ("attempt", json_n a); ("payload", payload_of p) ]
    @ match dead with None -> [] | Some d -> [ ("dead", reason_json d) ])

let envelope g r = envelope_with g r.seq r.att r.payload r.dead

let opt_n = function None -> `Null | Some t -> json_n t

let retry_json = function
  | None -> `Null
  | Some r ->
      `Assoc
        [ ("sequence", json_n r.rseq); ("attempt", json_n r.ratt); ("backoff", json_n r.rbackoff);
          ("exhausted", `Bool r.rexh) ]

let state_key st = function
  | "generation" -> json_n st.gen
  | "next_sequence" -> json_n st.next
  | "pending" -> `List (List.map (envelope st.gen) st.pending)
  | "inflight" -> `List (List.map (envelope st.gen) st.inflight)
  | "acked_through" -> opt_n st.acked
  | "received_through" -> opt_n st.recvd
  | "retry" -> retry_json st.retry_st
  | "parked" ->
      `List
        (List.map
           (fun p ->
             `Assoc
               ([ ("sequence", json_n p.prec.seq); ("attempt", json_n p.prec.att);
                  ("backoff", json_n p.pbackoff); ("due", json_n p.pdue) ]
               @ match p.prec.dead with None -> [] | Some d -> [ ("dead", reason_json d) ]))
           st.parked)
  | "exhausted" ->
      `List (List.map (fun ((g, why), r) -> envelope_with g r.seq r.att r.payload (Some why)) st.exhausted)
  | k -> raise (Bad ("unknown expected key " ^ k))

let change_key ch = function
  | "pending" -> ch.c_pending
  | "inflight" -> ch.c_inflight
  | "acked_through" -> ch.c_acked
  | "retry" -> ch.c_retry
  | "parked" -> ch.c_parked
  | "exhausted" -> ch.c_exhausted
  | "generation" -> ch.c_gen
  | "received_through" -> ch.c_recv
  | k -> raise (Bad ("unknown invalidates key " ^ k))

let parse_op (j : Yojson.Safe.t) =
  let ty = str "type" j in
  let g () = num "generation" j and s () = num "sequence" j in
  let op =
    match ty with
    | "enqueue" -> (
        match member "payload" j with
        | Some p -> Enqueue (payload_index p)
        | None -> raise (Bad "enqueue without payload"))
    | "claim" -> Claim (g ())
    | "ack" -> Ack (g (), num "through" j)
    | "received" -> Received (g (), num "through" j)
    | "fail" ->
        let kind =
          match (member "kind" j, member "retry_after" j) with
          | Some (`String "permanent"), _ -> Permanent
          | _, Some _ -> RetryAfter (num "retry_after" j)
          | _ -> Transient
        in
        Fail (g (), s (), kind, num_or "now" N0 j)
    | "retry_now" -> RetryNow (g (), s ())
    | "handle_timeout" -> Timeout (num_or "now" N0 j)
    | "requeue" -> Requeue (g (), s ())
    | "reconnect" -> Reconnect (g ())
    | other -> raise (Bad ("unknown op " ^ other))
  in
  (ty, op)

let returns_json ty (o : outcome) : Yojson.Safe.t =
  let tag =
    match ty with
    | "claim" -> "claim" | "ack" -> "ack" | "received" -> "received" | "fail" -> "failure" | "retry_now" -> "retry_action"
    | "requeue" -> "requeue" | "reconnect" -> "reconnect" | _ -> "?"
  in
  let s x = `String x in
  match o with
  | OSeq n -> `Assoc [ ("sequence", json_n n) ]
  | OClaimed (g, sq, a, p, d) -> `Assoc [ ("claim", s "claimed"); ("envelope", envelope_with g sq a p d) ]
  | OEmpty -> `Assoc [ ("claim", s "empty") ]
  | OWindowFull -> `Assoc [ ("claim", s "window_full") ]
  | OBlocked n -> `Assoc [ ("claim", s "blocked"); ("sequence", json_n n) ]
  | OIsolating n -> `Assoc [ ("claim", s "isolating"); ("probe", json_n n) ]
  | OStale g -> `Assoc [ (tag, s "stale_generation"); ("current", json_n g) ]
  | OAdvanced t -> `Assoc [ ("ack", s "advanced"); ("through", json_n t) ]
  | OAckUnchanged t -> `Assoc [ ("ack", s "unchanged"); ("through", opt_n t) ]
  | OUnsent t -> `Assoc [ (tag, s "unsent"); ("sent_through", opt_n t) ]
  | ORecorded (t, k) -> `Assoc [ ("received", s "recorded"); ("through", json_n t); ("moved", json_int k) ]
  | ORecvUnchanged t -> `Assoc [ ("received", s "unchanged"); ("through", opt_n t) ]
  | ORetrying r -> `Assoc [ ("failure", s "retrying"); ("retry", retry_json (Some r)) ]
  | OExhausted r -> `Assoc [ ("failure", s "exhausted"); ("retry", retry_json (Some r)) ]
  | OUnknown -> `Assoc [ (tag, s "unknown_sequence") ]
  | OScheduled n -> `Assoc [ (tag, s "scheduled"); ("sequence", json_n n) ]
  | OTimeout l -> `Assoc [ ("scheduled", `List (List.map json_n l)) ]
  | OReconnected (g, k, d) ->
      `Assoc [ ("reconnect", s "advanced"); ("generation", json_n g); ("replayed", json_int k); ("dead", json_int d) ]
  | OReconnectUnchanged -> `Assoc [ ("reconnect", s "unchanged") ]

let show j = Yojson.Safe.to_string j

(* Runs one fixture; returns None when it agrees with the model, or the
   first disagreement. *)
let run_fixture file =
  payloads := [];
  let doc = Yojson.Safe.from_file file in
  let pol_j = match member "policy" doc with Some p -> p | None -> raise (Bad "no policy") in
  let ordering =
    match member "ordering" pol_j with Some (`String "strict") -> Strict | _ -> Pipelined
  in
  (match member "jitter" pol_j with
   | Some (`Int 0) | Some (`Float 0.) | None -> ()
   | Some _ -> raise (Skip "non-zero policy.jitter: the model computes backoffs before jitter (a float spread)"));
  let hold =
    match member "dead_letters" pol_j with
    | Some (`String "hold") -> true
    | None | Some (`String "skip") -> false
    | Some _ -> raise (Bad "dead_letters is neither skip nor hold")
  in
  (* The policy's default replay limit, as the Rust fixture loader has it. *)
  let rlimit = num_or "replay_limit" (n_of_z (Big.of_int 8)) pol_j in
  let pol =
    { limit = num "inflight_limit" pol_j; budget = num "retry_budget" pol_j; rlimit; base = num "retry_base" pol_j;
      ceiling = num "retry_ceiling" pol_j; ordering_of = ordering; hold }
  in
  let steps = match member "steps" doc with Some (`List l) -> l | _ -> raise (Bad "no steps") in
  let st = ref (init (num "generation" doc)) in
  let failure = ref None in
  List.iteri
    (fun i step_j ->
      if !failure = None then begin
        let op_j = match member "op" step_j with Some o -> o | None -> raise (Bad "step without op") in
        let ty, op = parse_op op_j in
        let result = Model.step pol !st op in
        st := st_of result;
        let fail_at what want got =
          failure := Some (Printf.sprintf "step %d %s: %s: fixture says %s, model gives %s" i (show op_j) what (show want) (show got))
        in
        let want = match member "returns" step_j with Some r -> normalize r | None -> `Null in
        let got = normalize (returns_json ty (out_of result)) in
        if want <> got then fail_at "returns" want got
        else
          match member "expected" step_j with
          | Some (`Assoc kv) ->
              List.iter
                (fun (k, v) ->
                  if !failure = None then
                    if k = "invalidates" then
                      match v with
                      | `Assoc flags ->
                          List.iter
                            (fun (r, b) ->
                              let got = `Bool (change_key (ch_of result) r) in
                              if !failure = None && b <> got then fail_at ("expected.invalidates." ^ r) b got)
                            flags
                      | _ -> raise (Bad "invalidates is not an object")
                    else
                      let want = normalize v and got = normalize (state_key !st k) in
                      if want <> got then fail_at ("expected." ^ k) want got)
                kv
          | _ -> ()
      end)
    steps;
  !failure

let rec collect path =
  if Sys.is_directory path then
    Sys.readdir path |> Array.to_list |> List.sort compare
    |> List.concat_map (fun f -> collect (Filename.concat path f))
  else if Filename.check_suffix path ".json" then [ path ]
  else []

let () =
  let args = List.tl (Array.to_list Sys.argv) in
  if args = [] then (prerr_endline "usage: replay PATH..."; exit 2);
  let files = List.concat_map collect args in
  let passed = ref 0 and failed = ref 0 and skipped = ref 0 in
  List.iter
    (fun file ->
      match run_fixture file with
      | None -> incr passed; Printf.printf "ok    [model] %s\n" file
      | Some why -> incr failed; Printf.printf "FAIL  [model] %s: %s\n" file why
      | exception Bad why -> incr failed; Printf.printf "ERROR [model] %s: %s\n" file why
      | exception Skip why -> incr skipped; Printf.printf "skip  [model] %s: %s\n" file why)
    files;
  Printf.printf "formal replay: %d passed, %d failed, %d skipped\n" !passed !failed !skipped;
  exit (if !failed = 0 && !passed > 0 then 0 else 1)
