(** * The egress core as a Coq model.

    A transcription of the rules of [EgressCore] (crates/egress-core):
    every transition returns the new state, an outcome, and the set of
    projections it changed. Numbers are [N] (unbounded); where the Rust
    core saturates at [u64::MAX] the model does so explicitly ([sat]). A
    payload is an opaque [nat] (the replay maps JSON payloads to indices).
    Jitter is outside the model: it is a float spread added after the
    backoff, and every fixture runs with jitter 0. *)

From Coq Require Import NArith List Bool.
Import ListNotations.
Open Scope N_scope.

Definition u64_max : N := 18446744073709551615.
Definition sat (n : N) : N := N.min n u64_max.

Inductive ordering := Pipelined | Strict.

Record policy := mkPolicy {
  limit : N; budget : N; base : N; ceiling : N; ordering_of : ordering }.

Record record := mkRec { seq : N; att : N; bstart : N; payload : nat }.
Record parked_rec := mkPark { prec : record; pbackoff : N; pdue : N }.
Record retry := mkRetry { rseq : N; ratt : N; rbackoff : N; rexh : bool }.

(** Pending, in-flight and parked records carry the current generation;
    dead letters keep the one they failed under. *)
Record state := mkState {
  gen : N; next : N;
  pending : list record; inflight : list record;
  parked : list parked_rec; exhausted : list (N * record);
  acked : option N; retry_st : option retry }.

Record changes := mkCh {
  c_pending : bool; c_inflight : bool; c_acked : bool; c_retry : bool;
  c_parked : bool; c_exhausted : bool; c_gen : bool }.

Definition nochange := mkCh false false false false false false false.

Inductive kind := Transient | Permanent | RetryAfter (d : N).

Inductive op :=
| Enqueue (p : nat)
| Claim (g : N)
| Ack (g t : N)
| Fail (g s : N) (k : kind) (now : N)
| RetryNow (g s : N)
| Timeout (now : N)
| Requeue (g s : N)
| Reconnect (g : N).

Inductive outcome :=
| OSeq (s : N)
| OClaimed (g s a : N) (p : nat)
| OEmpty | OWindowFull
| OBlocked (s : N)
| OStale (g : N)
| OAdvanced (t : N)
| OAckUnchanged (t : option N)
| OUnassigned (n : N)
| ORetrying (r : retry)
| OExhausted (r : retry)
| OUnknown
| OScheduled (s : N)
| OTimeout (l : list N)
| OReconnected (g : N) (replayed : nat)
| OReconnectUnchanged.

Definition init (g : N) : state := mkState g 0 [] [] [] [] None None.

(** ** Helpers *)

(** Inserts [x] in order of [key], after any element of equal key. *)
Fixpoint insert_by {A} (key : A -> N) (x : A) (l : list A) : list A :=
  match l with
  | [] => [x]
  | y :: t => if key x <? key y then x :: y :: t else y :: insert_by key x t
  end.

Notation insert := (insert_by seq).
Notation insert_parked := (insert_by (fun p => seq (prec p))).
Notation insert_ex := (insert_by (fun e : N * record => seq (snd e))).

(** Removes the first element whose sequence is [s]. *)
Fixpoint take {A} (key : A -> N) (s : N) (l : list A) : option (A * list A) :=
  match l with
  | [] => None
  | x :: t =>
      if key x =? s then Some (x, t)
      else match take key s t with
           | Some (y, t') => Some (y, x :: t')
           | None => None
           end
  end.

Definition min_opt (a b : option N) : option N :=
  match a, b with
  | Some x, Some y => Some (N.min x y)
  | Some x, None => Some x
  | None, y => y
  end.

Definition lowest (l : list N) : option N :=
  fold_right (fun x acc => min_opt (Some x) acc) None l.

Definition stale (st : state) := (st, OStale (gen st), nochange).

(** The retry state without [s], and whether it was [s]'s. *)
Definition clear_retry (s : N) (rt : option retry) : option retry * bool :=
  match rt with
  | Some x => if rseq x =? s then (None, true) else (rt, false)
  | None => (None, false)
  end.

Definition retry_eqb (a b : retry) : bool :=
  (rseq a =? rseq b) && (ratt a =? ratt b) && (rbackoff a =? rbackoff b) && Bool.eqb (rexh a) (rexh b).

Definition opt_retry_eqb (a b : option retry) : bool :=
  match a, b with
  | Some x, Some y => retry_eqb x y
  | None, None => true
  | _, _ => false
  end.

(** [min(ceiling, base * 2^(k-1))], raised to the hint. *)
Definition backoff (pol : policy) (k : N) (hint : option N) : N :=
  let b := N.min (ceiling pol) (base pol * 2 ^ (k - 1)) in
  match hint with Some h => N.max b h | None => b end.

(** ** Transitions *)

Definition enqueue (st : state) (p : nat) :=
  (mkState (gen st) (next st + 1) (pending st ++ [mkRec (next st) 0 0 p]) (inflight st)
           (parked st) (exhausted st) (acked st) (retry_st st),
   OSeq (next st),
   mkCh true false false false false false false).

Definition do_claim (st : state) (r : record) (rest : list record) :=
  let r' := mkRec (seq r) (att r + 1) (bstart r) (payload r) in
  (mkState (gen st) (next st) rest (inflight st ++ [r']) (parked st) (exhausted st) (acked st) (retry_st st),
   OClaimed (gen st) (seq r) (att r + 1) (payload r),
   mkCh true true false false false false false).

Definition claim (pol : policy) (st : state) (g : N) :=
  if negb (g =? gen st) then stale st else
  match pending st with
  | [] => (st, OEmpty, nochange)
  | r :: rest =>
      if limit pol <=? N.of_nat (length (inflight st)) then (st, OWindowFull, nochange) else
      let blocking :=
        match ordering_of pol with
        | Strict => lowest (map (fun p => seq (prec p)) (parked st) ++ map (fun e => seq (snd e)) (exhausted st))
        | Pipelined => None
        end in
      match blocking with
      | Some b => if b <? seq r then (st, OBlocked b, nochange) else do_claim st r rest
      | None => do_claim st r rest
      end
  end.

Definition above (t : N) (s : N) : bool := t <? s.

(** The watermark moves to [t]: everything at or below it leaves. *)
Definition advance (st : state) (t : N) :=
  let rt_cleared := match retry_st st with Some x => rseq x <=? t | None => false end in
  (mkState (gen st) (next st)
           (filter (fun r => above t (seq r)) (pending st))
           (filter (fun r => above t (seq r)) (inflight st))
           (filter (fun p => above t (seq (prec p))) (parked st))
           (filter (fun e => above t (seq (snd e))) (exhausted st))
           (Some t) (if rt_cleared then None else retry_st st),
   OAdvanced t,
   mkCh (existsb (fun r => negb (above t (seq r))) (pending st))
        (existsb (fun r => negb (above t (seq r))) (inflight st))
        true rt_cleared
        (existsb (fun p => negb (above t (seq (prec p)))) (parked st))
        (existsb (fun e => negb (above t (seq (snd e)))) (exhausted st))
        false).

Definition ack (st : state) (g t : N) :=
  if negb (g =? gen st) then stale st else
  if next st <=? t then (st, OUnassigned (next st), nochange) else
  match acked st with
  | Some w => if t <=? w then (st, OAckUnchanged (Some w), nochange) else advance st t
  | None => advance st t
  end.

Definition fail (pol : policy) (st : state) (g s : N) (kd : kind) (now : N) :=
  if negb (g =? gen st) then stale st else
  match take seq s (inflight st) with
  | None => (st, OUnknown, nochange)
  | Some (r, rest) =>
      let k := att r - bstart r in
      let hint := match kd with RetryAfter d => Some d | _ => None end in
      let b := backoff pol k hint in
      let exh := match kd with Permanent => true | _ => budget pol <? k end in
      let rt := mkRetry s (att r) b exh in
      let ch_retry := negb (opt_retry_eqb (retry_st st) (Some rt)) in
      if exh then
        (mkState (gen st) (next st) (pending st) rest (parked st)
                 (insert_ex (gen st, r) (exhausted st)) (acked st) (Some rt),
         OExhausted rt, mkCh false true false ch_retry false true false)
      else
        (mkState (gen st) (next st) (pending st) rest
                 (insert_parked (mkPark r b (sat (now + b))) (parked st))
                 (exhausted st) (acked st) (Some rt),
         ORetrying rt, mkCh false true false ch_retry true false false)
  end.

Definition retry_now (st : state) (g s : N) :=
  if negb (g =? gen st) then stale st else
  match take (fun p => seq (prec p)) s (parked st) with
  | None => (st, OUnknown, nochange)
  | Some (p, rest) =>
      let (rt, cleared) := clear_retry s (retry_st st) in
      (mkState (gen st) (next st) (insert (prec p) (pending st)) (inflight st) rest
               (exhausted st) (acked st) rt,
       OScheduled s, mkCh true false false cleared true false false)
  end.

Definition is_due (now : N) (p : parked_rec) : bool := pdue p <=? now.

Definition timeout (st : state) (now : N) :=
  let due := filter (is_due now) (parked st) in
  let rest := filter (fun p => negb (is_due now p)) (parked st) in
  let cleared :=
    match retry_st st with
    | Some x => existsb (fun p => rseq x =? seq (prec p)) due
    | None => false
    end in
  let any := negb (match due with [] => true | _ => false end) in
  (mkState (gen st) (next st) (fold_left (fun acc p => insert (prec p) acc) due (pending st))
           (inflight st) rest (exhausted st) (acked st) (if cleared then None else retry_st st),
   OTimeout (map (fun p => seq (prec p)) due),
   mkCh any false false cleared any false false).

Definition requeue (st : state) (g s : N) :=
  if negb (g =? gen st) then stale st else
  match take (fun e => seq (snd e)) s (exhausted st) with
  | None => (st, OUnknown, nochange)
  | Some ((_, r), rest) =>
      let (rt, cleared) := clear_retry s (retry_st st) in
      (mkState (gen st) (next st) (insert (mkRec (seq r) (att r) (att r) (payload r)) (pending st))
               (inflight st) (parked st) rest (acked st) rt,
       OScheduled s, mkCh true false false cleared false true false)
  end.

Definition reconnect (st : state) (g : N) :=
  if g <? gen st then stale st else
  if g =? gen st then (st, OReconnectUnchanged, nochange) else
  let moved := inflight st ++ map prec (parked st) in
  let pend := fold_left (fun acc r => insert r acc) moved (pending st) in
  let cleared :=
    match retry_st st with
    | Some x => existsb (fun p => rseq x =? seq (prec p)) (parked st)
    | None => false
    end in
  let nonempty {A} (l : list A) := match l with [] => false | _ => true end in
  (mkState g (next st) pend [] [] (exhausted st) (acked st) (if cleared then None else retry_st st),
   OReconnected g (length moved),
   mkCh (nonempty pend) (nonempty (inflight st)) false cleared (nonempty (parked st)) false true).

Definition step (pol : policy) (st : state) (o : op) : state * outcome * changes :=
  match o with
  | Enqueue p => enqueue st p
  | Claim g => claim pol st g
  | Ack g t => ack st g t
  | Fail g s k now => fail pol st g s k now
  | RetryNow g s => retry_now st g s
  | Timeout now => timeout st now
  | Requeue g s => requeue st g s
  | Reconnect g => reconnect st g
  end.

Definition st_of (x : state * outcome * changes) : state := fst (fst x).
Definition out_of (x : state * outcome * changes) : outcome := snd (fst x).
Definition ch_of (x : state * outcome * changes) : changes := snd x.
