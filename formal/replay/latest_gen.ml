(* Random traces of the latest-value projection from its model extracted
   from Coq (Latest.v), written as conformance fixtures of kind
   LatestDurableProjection (conformance/README.md): every operation, stale
   generations, versions and times near u64::MAX, retry-after hints, a
   bound on keys; after every step the exact return, every key's state and
   every key's change flags. The Rust runner replays them on the core and
   the latest cell of every flavour, so any difference between the model
   and the code on any of these steps fails.

   usage: latest_gen [--seed S] [--traces N] [--steps K] OUT_DIR

   Each step is also checked for exact change sets: a key's flag is set if
   and only if that projection of the key changed. Exit status 0 when every
   step is exact, 1 otherwise, 2 for bad usage. *)

open Model
open Fixture

let u64_max = Big.of_string "18446744073709551615"
let n i = n_of_z (Big.of_int i)
let z = z_of_n

type gen = { rng : Random.State.t; mutable now : Big.t }

let int g k = Random.State.int g.rng k
let chance g pct = int g 100 < pct
let pick g l = List.nth l (int g (List.length l))
let near_max g = n_of_z (Big.sub u64_max (Big.of_int (int g 3)))

(* Keys 0..3 are "a".."d": key order is their order. *)
let key_count = 4
let key_name k = String.make 1 (Char.chr (Char.code 'a' + Big.to_int (z k)))
let value_json x : Yojson.Safe.t = `String (Printf.sprintf "v%d" x)

let policy g =
  let base = pick g [ 0; 1; 2; 3; 5; 10 ] in
  let ceiling = if chance g 10 then n_of_z u64_max else n (base + int g 50) in
  { lbase = n base; lceiling = ceiling; lmax_keys = n (1 + int g key_count) }

let first_generation g = match int g 10 with 0 -> n 0 | 1 -> near_max g | _ -> n (1 + int g 1000)

let generation_for g st =
  if chance g 88 then st.lgen
  else
    let cur = z st.lgen in
    match int g 3 with
    | 0 when Big.sign cur > 0 -> n_of_z (Big.pred cur)
    | 1 when Big.lt cur u64_max -> n_of_z (Big.succ cur)
    | _ -> n (int g 5)

let reconnect_generation g st =
  let cur = z st.lgen in
  match int g 10 with
  | 0 -> st.lgen
  | 1 -> n_of_z (Big.max Big.zero (Big.sub cur (Big.of_int (1 + int g 2))))
  | 9 -> near_max g
  | _ -> n_of_z (Big.min u64_max (Big.add cur (Big.of_int (1 + int g 2))))

let slot_of st k = lookup k st.keys

(* A version for an upsert of [k]: mostly newer than its newest, at times
   the same (with the same value or another), older, at or below the
   frontier, or near u64::MAX. *)
let upsert_version g st k =
  let top =
    match slot_of st k with
    | Some s -> (
        match newest s with
        | Some (v, _) -> z v
        | None -> ( match s.durable with Some d -> z d | None -> Big.zero))
    | None -> Big.zero
  in
  match int g 20 with
  | 0 -> near_max g
  | 1 | 2 -> n_of_z top
  | 3 -> n_of_z (Big.max Big.zero (Big.pred top))
  | _ -> n_of_z (Big.min u64_max (Big.add top (Big.of_int (1 + int g 3))))

let flight_version g st k =
  match slot_of st k with
  | Some { in_flight = Some f; _ } when chance g 80 -> f.fver
  | Some { durable = Some d; _ } when chance g 30 -> d
  | _ -> if chance g 5 then near_max g else n (int g 6)

let tick g =
  if chance g 2 then g.now <- z (near_max g)
  else if chance g 50 then g.now <- Big.min u64_max (Big.add g.now (Big.of_int (int g 60)))

(* A key, mostly one [p] holds of, when one does. *)
let key_where g st p =
  let ks = List.filter (fun (_, s) -> p s) st.keys in
  if ks <> [] && chance g 75 then fst (pick g ks) else n (int g key_count)

let op g st =
  tick g;
  let any = n (int g key_count) in
  let flying = key_where g st (fun s -> s.in_flight <> None) in
  match int g 100 with
  | r when r < 30 -> LUpsert (any, upsert_version g st any, int g 3)
  | r when r < 55 -> LClaim (generation_for g st, key_where g st (fun s -> s.desired <> None))
  | r when r < 70 -> LAck (generation_for g st, flying, flight_version g st flying)
  | r when r < 82 ->
      let k = flying in
      let hint = match int g 10 with 0 -> Some (near_max g) | 1 | 2 -> Some (n (int g 200)) | _ -> None in
      LFail (generation_for g st, k, flight_version g st k, n_of_z g.now, hint)
  | r when r < 92 -> LTimeout (n_of_z (if chance g 20 then u64_max else g.now))
  | _ -> LReconnect (reconnect_generation g st)

(* ----- JSON ----- *)

let opt f = function Some x -> f x | None -> `Null

let op_json = function
  | LUpsert (k, v, x) ->
      `Assoc [ ("type", `String "upsert_desired"); ("key", `String (key_name k)); ("epoch", json_n v); ("value", value_json x) ]
  | LClaim (gn, k) -> `Assoc [ ("type", `String "claim"); ("key", `String (key_name k)); ("generation", json_n gn) ]
  | LAck (gn, k, v) ->
      `Assoc [ ("type", `String "ack_applied"); ("key", `String (key_name k)); ("generation", json_n gn); ("epoch", json_n v) ]
  | LFail (gn, k, v, now, hint) ->
      `Assoc
        ([ ("type", `String "fail_retryable"); ("key", `String (key_name k)); ("generation", json_n gn);
           ("epoch", json_n v); ("now", json_n now) ]
        @ match hint with Some h -> [ ("retry_after", json_n h) ] | None -> [])
  | LTimeout now -> `Assoc [ ("type", `String "handle_timeout"); ("now", json_n now) ]
  | LReconnect gn -> `Assoc [ ("type", `String "reconnect"); ("generation", json_n gn) ]

let out_json = function
  | UAccepted -> `Assoc [ ("upsert", `String "accepted") ]
  | UUnchanged -> `Assoc [ ("upsert", `String "unchanged") ]
  | UAlreadyDurable d -> `Assoc [ ("upsert", `String "already_durable"); ("durable_through", json_n d) ]
  | UStale c -> `Assoc [ ("upsert", `String "stale_epoch"); ("current", json_n c) ]
  | UConflict -> `Assoc [ ("upsert", `String "epoch_conflict") ]
  | UTooMany l -> `Assoc [ ("upsert", `String "too_many_keys"); ("limit", json_n l) ]
  | CClaimed (gn, k, v, x) ->
      `Assoc
        [ ("claim", `String "claimed");
          ("envelope", `Assoc [ ("generation", json_n gn); ("key", `String (key_name k)); ("epoch", json_n v); ("value", value_json x) ]) ]
  | CEmpty -> `Assoc [ ("claim", `String "empty") ]
  | CBusy -> `Assoc [ ("claim", `String "busy") ]
  | CBackoff u -> `Assoc [ ("claim", `String "backoff"); ("until", json_n u) ]
  | CStale gn -> `Assoc [ ("claim", `String "stale_generation"); ("current", json_n gn) ]
  | AAdvanced d -> `Assoc [ ("ack", `String "advanced"); ("durable_through", json_n d) ]
  | AUnchanged -> `Assoc [ ("ack", `String "unchanged") ]
  | AUnknown -> `Assoc [ ("ack", `String "unknown_epoch") ]
  | AStale gn -> `Assoc [ ("ack", `String "stale_generation"); ("current", json_n gn) ]
  | FPending t -> `Assoc [ ("failure", `String "pending"); ("retry_at", json_n t) ]
  | FSuperseded t -> `Assoc [ ("failure", `String "superseded"); ("retry_at", json_n t) ]
  | FUnknown -> `Assoc [ ("failure", `String "unknown_epoch") ]
  | FStale gn -> `Assoc [ ("failure", `String "stale_generation"); ("current", json_n gn) ]
  | TFreed ks -> `Assoc [ ("freed", `List (List.map (fun k -> `String (key_name k)) ks)) ]
  | RAdvanced (gn, rq, sp) ->
      `Assoc [ ("reconnect", `String "advanced"); ("generation", json_n gn); ("requeued", json_int rq); ("superseded", json_int sp) ]
  | RUnchanged -> `Assoc [ ("reconnect", `String "unchanged") ]
  | RStale gn -> `Assoc [ ("reconnect", `String "stale_generation"); ("current", json_n gn) ]

let entry_json (k, s) : Yojson.Safe.t =
  `Assoc
    [ ("key", `String (key_name k));
      ("desired", opt (fun (v, x) -> `Assoc [ ("epoch", json_n v); ("value", value_json x) ]) s.desired);
      ( "inflight",
        opt
          (fun f -> `Assoc [ ("generation", json_n f.fgen); ("key", `String (key_name k)); ("epoch", json_n f.fver); ("value", value_json f.fval) ])
          s.in_flight );
      ("durable_through", opt json_n s.durable);
      ("backoff", opt json_n s.waiting) ]

(* A key's four readings, to check the change flags against. *)
let readings st k =
  match slot_of st k with
  | None -> (None, None, None, None)
  | Some s -> (s.desired, s.in_flight, s.durable, s.waiting)

let inexact = ref 0

let step_json file i pol st o =
  let r = lstep pol st o in
  let st' = lst_of r and ch = lch_of r in
  let flags =
    List.init key_count (fun i ->
        let k = n i in
        let c = match List.assoc_opt k ch with Some c -> c | None -> { k_desired = false; k_inflight = false; k_durable = false; k_backoff = false } in
        let d0, i0, u0, b0 = readings st k and d1, i1, u1, b1 = readings st' k in
        let actual = (d0 <> d1, i0 <> i1, u0 <> u1, b0 <> b1) in
        if actual <> (c.k_desired, c.k_inflight, c.k_durable, c.k_backoff) then begin
          incr inexact;
          Printf.printf "INEXACT %s step %d key %s\n" file i (key_name k)
        end;
        ( key_name k,
          `Assoc
            [ ("desired", `Bool c.k_desired); ("inflight", `Bool c.k_inflight); ("durable_through", `Bool c.k_durable);
              ("backoff", `Bool c.k_backoff) ] ))
  in
  let step =
    `Assoc
      [ ("op", op_json o); ("returns", out_json (lout_of r));
        ( "expected",
          `Assoc
            [ ("generation", json_n st'.lgen); ("entries", `List (List.map entry_json st'.keys)); ("invalidates", `Assoc flags) ] ) ]
  in
  (st', step)

let trace seed i steps out =
  let g = { rng = Random.State.make [| seed; i; 33 |]; now = Big.zero } in
  let pol = policy g and g0 = first_generation g in
  let file = Filename.concat out (Printf.sprintf "latest-%d-%d.json" seed i) in
  let st = ref (linit g0) and json = ref [] in
  for j = 0 to int g steps do
    let o = op g !st in
    let st', step = step_json file j pol !st o in
    st := st';
    json := step :: !json
  done;
  let doc =
    `Assoc
      [ ("description", `String (Printf.sprintf "Random trace %d of seed %d from the extracted Coq model of Latest (formal/replay/latest_gen.ml)" i seed));
        ("kind", `String "LatestDurableProjection"); ("model", `String "LatestDurableProjectionCore");
        ("backoff", `Assoc [ ("base", json_n pol.lbase); ("ceiling", json_n pol.lceiling) ]);
        ("max_keys", json_n pol.lmax_keys);
        ("scenarios", `List [ `Assoc [ ("id", `String (Printf.sprintf "trace-%d-%d" seed i)); ("generation", json_n g0); ("steps", `List (List.rev !json)) ] ]) ]
  in
  Yojson.Safe.to_file file doc

let usage () = prerr_endline "usage: latest_gen [--seed S] [--traces N] [--steps K] OUT_DIR"; exit 2

let () =
  let seed = ref 1 and traces = ref 1000 and steps = ref 80 and out = ref None in
  let rec parse = function
    | "--seed" :: v :: rest -> seed := int_of_string v; parse rest
    | "--traces" :: v :: rest -> traces := int_of_string v; parse rest
    | "--steps" :: v :: rest -> steps := int_of_string v; parse rest
    | [ dir ] when String.length dir > 0 && dir.[0] <> '-' -> out := Some dir
    | _ -> usage ()
  in
  (try parse (List.tl (Array.to_list Sys.argv)) with Failure _ -> usage ());
  let out = match !out with Some d -> d | None -> usage () in
  if not (Sys.file_exists out) then Sys.mkdir out 0o755;
  for i = 0 to !traces - 1 do
    trace !seed i !steps out
  done;
  Printf.printf "latest_gen: %d traces of seed %d in %s; %d steps with inexact change sets\n" !traces !seed out !inexact;
  exit (if !inexact = 0 then 0 else 1)
