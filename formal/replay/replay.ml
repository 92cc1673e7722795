(* Replays the conformance fixtures against the model extracted from Coq
   (model.ml) and checks every outcome and every expected key, so the model
   and the corpus cannot drift apart.

   usage: replay PATH...   (fixture files or folders of *.json)
   Exit status 0 when every fixture agrees with the model, 1 otherwise. *)

open Model
open Fixture

(* Runs one fixture; returns None when it agrees with the model, or the
   first disagreement. *)
let run_fixture file =
  payloads := [];
  let doc = Yojson.Safe.from_file file in
  let pol = policy_of doc in
  let steps = match member "steps" doc with Some (`List l) -> l | _ -> raise (Bad "no steps") in
  let st = ref (init (num "generation" doc)) in
  let failure = ref None in
  List.iteri
    (fun i step_j ->
      if !failure = None then begin
        let op_j = match member "op" step_j with Some o -> o | None -> raise (Bad "step without op") in
        let ty, op, _ = parse_op op_j in
        let result = Model.step pol !st op in
        st := st_of result;
        let fail_at what want got =
          failure := Some (Printf.sprintf "step %d %s: %s: fixture says %s, model gives %s" i (show op_j) what (show want) (show got))
        in
        let want = match member "returns" step_j with Some r -> normalize r | None -> `Null in
        (* An extension field of the return (reconnect's dead) is asserted
           only where the fixture names it, as the Rust runner reads it. *)
        let got =
          match (want, normalize (returns_json ty (out_of result))) with
          | `Assoc w, `Assoc g when ty = "reconnect" && not (List.mem_assoc "dead" w) ->
              `Assoc (List.remove_assoc "dead" g)
          | _, g -> g
        in
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
