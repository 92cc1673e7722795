(* Fixtures and the extracted model (model.ml): numbers, payloads, ops,
   outcomes and state in the conformance corpus's JSON shapes, shared by
   the replay (replay.ml) and the trace generator (gen.ml). *)

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

(* The fixture's policy.jitter (set by [policy_of]): the model takes the
   spread it adds to a backoff as a function, computed here as the Rust core
   computes it, [b * jitter * sample] in floats, truncated. *)
let jitter = ref 0.

let spread sample : n -> n =
  if !jitter = 0. || sample = 0. then fun _ -> N0
  else
    let j = !jitter in
    fun b -> n_of_z (Big.of_float (Big.to_float (z_of_n b) *. j *. sample))

let float_of k j =
  match member k j with
  | None -> 0.
  | Some (`Float f) -> f
  | Some (`Int i) -> float_of_int i
  | Some (`Intlit s) -> float_of_string s
  | Some _ -> raise (Bad ("non-numeric " ^ k))

(* An op of a fixture: its type, the op, and its jitter sample (0 but for
   a fail that carries one). *)
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
        Fail (g (), s (), kind, num_or "now" N0 j, spread (float_of "jitter_sample" j))
    | "retry_now" -> RetryNow (g (), s ())
    | "handle_timeout" -> Timeout (num_or "now" N0 j)
    | "requeue" -> Requeue (g (), s ())
    | "reconnect" -> Reconnect (g ())
    | other -> raise (Bad ("unknown op " ^ other))
  in
  (ty, op, float_of "jitter_sample" j)

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


(* The fixture's policy, as the model has it; its jitter goes to [jitter]. *)
let policy_of doc =
  let pol_j = match member "policy" doc with Some p -> p | None -> raise (Bad "no policy") in
  let ordering =
    match member "ordering" pol_j with Some (`String "strict") -> Strict | _ -> Pipelined
  in
  jitter := float_of "jitter" pol_j;
  (* Absent extensions read as the design has them, as the Rust fixture
     loader does: dead letters held (an exhausted record is terminal), no
     replay limit (u32::MAX). *)
  let hold =
    match member "dead_letters" pol_j with
    | None | Some (`String "hold") -> true
    | Some (`String "skip") -> false
    | Some _ -> raise (Bad "dead_letters is neither skip nor hold")
  in
  let rlimit = num_or "replay_limit" (n_of_z (Big.of_string "4294967295")) pol_j in
  { limit = num "inflight_limit" pol_j; budget = num "retry_budget" pol_j; rlimit; base = num "retry_base" pol_j;
    ceiling = num "retry_ceiling" pol_j; ordering_of = ordering; hold }

let policy_json pol : Yojson.Safe.t =
  `Assoc
    ([ ("inflight_limit", json_n pol.limit); ("retry_budget", json_n pol.budget); ("replay_limit", json_n pol.rlimit);
      ("retry_base", json_n pol.base); ("retry_ceiling", json_n pol.ceiling);
      ("ordering", `String (match pol.ordering_of with Strict -> "strict" | Pipelined -> "pipelined"));
      ("dead_letters", `String (if pol.hold then "hold" else "skip")) ]
    @ if !jitter = 0. then [] else [ ("jitter", `Float !jitter) ])

(* An op in the corpus's JSON, with its jitter sample; the inverse of
   [parse_op]. *)
let op_json ?(sample = 0.) (o : op) : Yojson.Safe.t =
  let g x = ("generation", json_n x) and s x = ("sequence", json_n x) in
  let ty t = ("type", `String t) in
  match o with
  | Enqueue p -> `Assoc [ ty "enqueue"; ("payload", payload_of p) ]
  | Claim x -> `Assoc [ ty "claim"; g x ]
  | Ack (x, t) -> `Assoc [ ty "ack"; g x; ("through", json_n t) ]
  | Received (x, t) -> `Assoc [ ty "received"; g x; ("through", json_n t) ]
  | Fail (x, q, k, now, _) ->
      let kind =
        match k with
        | Transient -> [ ("kind", `String "transient") ]
        | Permanent -> [ ("kind", `String "permanent") ]
        | RetryAfter d -> [ ("retry_after", json_n d) ]
      in
      let sample = if sample = 0. then [] else [ ("jitter_sample", `Float sample) ] in
      `Assoc ([ ty "fail"; g x; s q ] @ kind @ [ ("now", json_n now) ] @ sample)
  | RetryNow (x, q) -> `Assoc [ ty "retry_now"; g x; s q ]
  | Timeout now -> `Assoc [ ty "handle_timeout"; ("now", json_n now) ]
  | Requeue (x, q) -> `Assoc [ ty "requeue"; g x; s q ]
  | Reconnect x -> `Assoc [ ty "reconnect"; g x ]

let op_type (o : op) =
  match o with
  | Enqueue _ -> "enqueue" | Claim _ -> "claim" | Ack _ -> "ack" | Received _ -> "received" | Fail _ -> "fail"
  | RetryNow _ -> "retry_now" | Timeout _ -> "handle_timeout" | Requeue _ -> "requeue" | Reconnect _ -> "reconnect"

(* Every state key and every reader a step can invalidate. *)
let state_keys =
  [ "generation"; "next_sequence"; "pending"; "inflight"; "acked_through"; "received_through"; "retry"; "parked";
    "exhausted" ]

let change_keys =
  [ "pending"; "inflight"; "acked_through"; "retry"; "parked"; "exhausted"; "generation"; "received_through" ]

(* A step as the model takes it: the op, its exact return, the whole state
   after it and every change flag; and, for each reader whose flag differs
   from whether its value changed, that reader's name (the change sets are
   meant to be exact). *)
let annotate_step pol st (o, sample) =
  let result = Model.step pol st o in
  let st' = st_of result and ch = ch_of result in
  let inexact =
    List.filter (fun k -> change_key ch k <> (state_key st k <> state_key st' k)) change_keys
  in
  let expected =
    List.map (fun k -> (k, state_key st' k)) state_keys
    @ [ ("invalidates", `Assoc (List.map (fun k -> (k, `Bool (change_key ch k))) change_keys)) ]
  in
  let step =
    `Assoc
      [ ("op", op_json ~sample o); ("returns", returns_json (op_type o) (out_of result));
        ("expected", `Assoc expected) ]
  in
  (st', step, inexact)
