(** * The egress core as a Coq model.

    A transcription of the rules of [EgressCore] (crates/egress-core):
    every transition returns the new state, an outcome, and the set of
    projections it changed. Numbers are [N] (unbounded); where the Rust
    core saturates at [u64::MAX] or, for an attempt count, at [u32::MAX]
    the model does so explicitly ([sat], [bump]). A
    payload is an opaque [nat] (the replay maps JSON payloads to indices).
    Jitter enters as a function from the backoff to the spread added to
    it ([Fail]'s last argument): the model proves nothing about its size,
    and the replay computes it as the Rust core does.

    Each record also carries [claims], its claims in the current budget:
    a ghost the Rust core does not keep, there to state the bound on sends
    (Invariants.v). *)

From Coq Require Import NArith List Bool.
Import ListNotations.
Open Scope N_scope.

Definition u64_max : N := 18446744073709551615.
Definition sat (n : N) : N := N.min n u64_max.

(** An attempt count is a [u32] in Rust and saturates there. *)
Definition u32_max : N := 4294967295.
Definition bump (a : N) : N := N.min (a + 1) u32_max.

Inductive ordering := Pipelined | Strict.

(** Why a record became a dead letter. *)
Inductive dreason := DPermanent | DRetries | DReplays.

(** [hold]: dead letters are held (DeadLetters::Hold) rather than turned
    into tombstones (DeadLetters::Skip). *)
Record policy := mkPolicy {
  limit : N; budget : N; rlimit : N; base : N; ceiling : N; ordering_of : ordering; hold : bool }.

(** [fails]: failures in the current budget; [reps]: replays in it;
    [resend]: the last reconnect charged a replay not yet claimed;
    [dead]: the tombstone's reason. *)
Record record := mkRec {
  seq : N; att : N; fails : N; reps : N; resend : bool; dead : option dreason; claims : N; payload : nat }.
Record parked_rec := mkPark { prec : record; pbackoff : N; pdue : N }.
Record retry := mkRetry { rseq : N; ratt : N; rbackoff : N; rexh : bool }.

(** Whether records are sent one at a time: the probe in flight. *)
Inductive iso := IOff | IReady | IProbe (p : N).

(** Pending, in-flight and parked records carry the current generation;
    held dead letters keep the one they failed under, and their reason. *)
Record state := mkState {
  gen : N; next : N;
  pending : list record; inflight : list record;
  parked : list parked_rec; exhausted : list ((N * dreason) * record);
  acked : option N; recvd : option N; sent : option N; retry_st : option retry;
  progressed : bool; isol : iso }.

Record changes := mkCh {
  c_pending : bool; c_inflight : bool; c_acked : bool; c_retry : bool;
  c_parked : bool; c_exhausted : bool; c_gen : bool; c_recv : bool }.

Definition nochange := mkCh false false false false false false false false.

Inductive kind := Transient | Permanent | RetryAfter (d : N).

Inductive op :=
| Enqueue (p : nat)
| Claim (g : N)
| Ack (g t : N)
| Received (g t : N)
| Fail (g s : N) (k : kind) (now : N) (spread : N -> N)
| RetryNow (g s : N)
| Timeout (now : N)
| Requeue (g s : N)
| Reconnect (g : N).

Inductive outcome :=
| OSeq (s : N)
| OClaimed (g s a : N) (p : nat) (d : option dreason)
| OEmpty | OWindowFull
| OBlocked (s : N)
| OIsolating (p : N)
| OStale (g : N)
| OAdvanced (t : N)
| OAckUnchanged (t : option N)
| OUnsent (s : option N)
| ORecorded (t : N) (moved : nat)
| ORecvUnchanged (t : option N)
| ORetrying (r : retry)
| OExhausted (r : retry)
| OUnknown
| OScheduled (s : N)
| OTimeout (l : list N)
| OReconnected (g : N) (replayed dead : nat)
| OReconnectUnchanged.

Definition init (g : N) : state := mkState g 0 [] [] [] [] None None None None false IOff.

(** ** Helpers *)

(** Inserts [x] in order of [key], after any element of equal key. *)
Fixpoint insert_by {A} (key : A -> N) (x : A) (l : list A) : list A :=
  match l with
  | [] => [x]
  | y :: t => if key x <? key y then x :: y :: t else y :: insert_by key x t
  end.

Notation insert := (insert_by seq).
Notation insert_parked := (insert_by (fun p => seq (prec p))).
Notation insert_ex := (insert_by (fun e : (N * dreason) * record => seq (snd e))).

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

Definition nonempty {A} (l : list A) : bool := match l with [] => false | _ => true end.

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

(** The first sequence beyond the window: the watermark plus one, plus
    the limit. *)
Definition window_end (pol : policy) (st : state) : N :=
  match acked st with Some a => a + 1 | None => 0 end + limit pol.

(** Whether [t] lies above everything ever sent. *)
Definition unsent (st : state) (t : N) : bool :=
  match sent st with Some s => s <? t | None => true end.

(** Whether [t] raises the receipt watermark. *)
Definition rises (rc : option N) (t : N) : bool :=
  match rc with Some r => r <? t | None => true end.

(** ** What happens to a record *)

Definition claimed (r : record) : record :=
  mkRec (seq r) (bump (att r)) (fails r) (reps r) false (dead r) (claims r + 1) (payload r).
Definition failed (r : record) : record :=
  mkRec (seq r) (att r) (fails r + 1) (reps r) (resend r) (dead r) (claims r) (payload r).
Definition replayed (r : record) : record :=
  mkRec (seq r) (att r) (fails r) (reps r + 1) true (dead r) (claims r) (payload r).
Definition refunded (r : record) : record :=
  if resend r then mkRec (seq r) (att r) (fails r) (reps r - 1) false (dead r) (claims r) (payload r) else r.
(** A fresh budget: no failures, no replays, no claims. *)
Definition fresh (r : record) : record :=
  mkRec (seq r) (att r) 0 0 false (dead r) 0 (payload r).
Definition entomb (rs : dreason) (r : record) : record :=
  mkRec (seq r) (att r) 0 0 false (Some rs) 0 (payload r).

(** A dead letter under policy [pol]: a tombstone back in pending (skip, a
    live record), or held among the exhausted. A tombstone replayed past
    the limit goes on under a fresh budget, with its first reason: the
    receiver must learn of the gap, or it waits on it for good (one whose
    budget is spent parks instead: see [fail]); only a permanent refusal of
    the tombstone itself holds it. Returns pending, exhausted, and whether
    it was held. *)
Definition bury (pol : policy) (g : N) (rs : dreason) (r : record)
    (pend : list record) (ex : list ((N * dreason) * record)) :=
  match dead r, hold pol, rs with
  | None, false, _ => (insert (entomb rs r) pend, ex, false)
  | Some _, false, DReplays => (insert (fresh r) pend, ex, false)
  | _, _, _ => (pend, insert_ex ((g, rs), r) ex, true)
  end.

(** What a replay past the limit makes of a record under the skip policy:
    a live record becomes a tombstone, a tombstone goes on under a fresh
    budget. *)
Definition revive (r : record) : record :=
  match dead r with None => entomb DReplays r | Some _ => fresh r end.

(** ** Transitions *)

Definition enqueue (st : state) (p : nat) :=
  (mkState (gen st) (next st + 1) (pending st ++ [mkRec (next st) 0 0 0 false None 0 p]) (inflight st)
           (parked st) (exhausted st) (acked st) (recvd st) (sent st) (retry_st st) (progressed st) (isol st),
   OSeq (next st),
   mkCh true false false false false false false false).

Definition do_claim (st : state) (r : record) (rest : list record) :=
  (mkState (gen st) (next st) rest (inflight st ++ [claimed r]) (parked st) (exhausted st) (acked st) (recvd st)
           (Some (match sent st with Some s => N.max s (seq r) | None => seq r end)) (retry_st st) (progressed st)
           (match isol st with IReady => IProbe (seq r) | i => i end),
   OClaimed (gen st) (seq r) (bump (att r)) (payload r) (dead r),
   mkCh true true false false false false false false).

(** Isolation, then the window. *)
Definition claim_open (pol : policy) (st : state) (r : record) (rest : list record) :=
  match isol st with
  | IProbe p => (st, OIsolating p, nochange)
  | _ => if window_end pol st <=? seq r then (st, OWindowFull, nochange) else do_claim st r rest
  end.

Definition claim (pol : policy) (st : state) (g : N) :=
  if negb (g =? gen st) then stale st else
  match pending st with
  | [] => (st, OEmpty, nochange)
  | r :: rest =>
      let blocking :=
        match ordering_of pol with
        | Strict => lowest (map (fun p => seq (prec p)) (parked st) ++ map (fun e => seq (snd e)) (exhausted st))
        | Pipelined => None
        end in
      match blocking with
      | Some b => if b <? seq r then (st, OBlocked b, nochange) else claim_open pol st r rest
      | None => claim_open pol st r rest
      end
  end.

Definition above (t : N) (s : N) : bool := t <? s.

(** The watermark moves to [t]: everything at or below it leaves. *)
Definition advance (st : state) (t : N) :=
  let rt_cleared := match retry_st st with Some x => rseq x <=? t | None => false end in
  let rose := rises (recvd st) t in
  (mkState (gen st) (next st)
           (filter (fun r => above t (seq r)) (pending st))
           (filter (fun r => above t (seq r)) (inflight st))
           (filter (fun p => above t (seq (prec p))) (parked st))
           (filter (fun e => above t (seq (snd e))) (exhausted st))
           (Some t) (if rose then Some t else recvd st) (sent st)
           (if rt_cleared then None else retry_st st)
           (progressed st || rose)
           (if rose then IOff else match isol st with IProbe p => if p <=? t then IReady else IProbe p | i => i end),
   OAdvanced t,
   mkCh (existsb (fun r => negb (above t (seq r))) (pending st))
        (existsb (fun r => negb (above t (seq r))) (inflight st))
        true rt_cleared
        (existsb (fun p => negb (above t (seq (prec p)))) (parked st))
        (existsb (fun e => negb (above t (seq (snd e)))) (exhausted st))
        false rose).

Definition ack (st : state) (g t : N) :=
  if negb (g =? gen st) then stale st else
  if unsent st t then (st, OUnsent (sent st), nochange) else
  match acked st with
  | Some w => if t <=? w then (st, OAckUnchanged (Some w), nochange) else advance st t
  | None => advance st t
  end.

(** The peer holds everything through [t]: pending records at or below it
    go in flight unsent, refunded. *)
Definition received (st : state) (g t : N) :=
  if negb (g =? gen st) then stale st else
  if unsent st t then (st, OUnsent (sent st), nochange) else
  let rose := rises (recvd st) t in
  let moved := filter (fun r => seq r <=? t) (pending st) in
  if negb rose && negb (nonempty moved) then (st, ORecvUnchanged (recvd st), nochange) else
  let rc := if rose then Some t else recvd st in
  (mkState (gen st) (next st) (filter (fun r => negb (seq r <=? t)) (pending st))
           (inflight st ++ map refunded moved) (parked st) (exhausted st) (acked st) rc (sent st) (retry_st st)
           (progressed st || rose) (if rose then IOff else isol st),
   ORecorded (match rc with Some x => x | None => t end) (length moved),
   mkCh (nonempty moved) (nonempty moved) false false false false false rose).

(** [spread] is the jitter: what is added to the backoff [b] (before
    saturating), as a function of [b]. The Rust core computes it from the
    policy's jitter and the caller's sample as [b * jitter * sample], a
    float truncated to an integer; the model takes any function, and the
    replay and the trace generator pass that same float computation. With
    jitter 0 it is 0. *)
Definition fail (pol : policy) (st : state) (g s : N) (kd : kind) (now : N) (spread : N -> N) :=
  if negb (g =? gen st) then stale st else
  match take seq s (inflight st) with
  | None => (st, OUnknown, nochange)
  | Some (r, rest) =>
      let r1 := failed r in
      let k := fails r1 in
      let hint := match kd with RetryAfter d => Some d | _ => None end in
      let b := sat (backoff pol k hint + spread (backoff pol k hint)) in
      (* A tombstone under skip is not given up on for its budget: it parks
         for its backoff under a fresh budget. *)
      let renew := match dead r, hold pol with Some _, false => true | _, _ => false end in
      let dr := match kd with
                | Permanent => Some DPermanent
                | _ => if budget pol <? k then (if renew then None else Some DRetries) else None
                end in
      let r2 := if andb renew (budget pol <? k) then fresh r1 else r1 in
      let rt := mkRetry s (att r) b (match dr with Some _ => true | None => false end) in
      let ch_retry := negb (opt_retry_eqb (retry_st st) (Some rt)) in
      let iso1 := match isol st with IProbe p => if p =? s then IReady else IProbe p | i => i end in
      match dr with
      | Some rs =>
          let '(pend, ex, held) := bury pol (gen st) rs r1 (pending st) (exhausted st) in
          (mkState (gen st) (next st) pend rest (parked st) ex (acked st) (recvd st) (sent st) (Some rt)
                   (progressed st) iso1,
           OExhausted rt, mkCh (negb held) true false ch_retry false held false false)
      | None =>
          (mkState (gen st) (next st) (pending st) rest
                   (insert_parked (mkPark r2 b (sat (now + b))) (parked st))
                   (exhausted st) (acked st) (recvd st) (sent st) (Some rt) (progressed st) iso1,
           ORetrying rt, mkCh false true false ch_retry true false false false)
      end
  end.

Definition retry_now (st : state) (g s : N) :=
  if negb (g =? gen st) then stale st else
  match take (fun p => seq (prec p)) s (parked st) with
  | None => (st, OUnknown, nochange)
  | Some (p, rest) =>
      let (rt, cleared) := clear_retry s (retry_st st) in
      (mkState (gen st) (next st) (insert (prec p) (pending st)) (inflight st) rest
               (exhausted st) (acked st) (recvd st) (sent st) rt (progressed st) (isol st),
       OScheduled s, mkCh true false false cleared true false false false)
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
  let any := nonempty due in
  (mkState (gen st) (next st) (fold_left (fun acc p => insert (prec p) acc) due (pending st))
           (inflight st) rest (exhausted st) (acked st) (recvd st) (sent st)
           (if cleared then None else retry_st st) (progressed st) (isol st),
   OTimeout (map (fun p => seq (prec p)) due),
   mkCh any false false cleared any false false false).

Definition requeue (st : state) (g s : N) :=
  if negb (g =? gen st) then stale st else
  match take (fun e => seq (snd e)) s (exhausted st) with
  | None => (st, OUnknown, nochange)
  | Some ((_, r), rest) =>
      let (rt, cleared) := clear_retry s (retry_st st) in
      (mkState (gen st) (next st) (insert (fresh r) (pending st))
               (inflight st) (parked st) rest (acked st) (recvd st) (sent st) rt (progressed st) (isol st),
       OScheduled s, mkCh true false false cleared false true false false)
  end.

(** A reconnect replays what was in flight, charging each a replay: those
    past the replay limit die ([dying]), as tombstones ([tombs], skip) or
    held ([kept]). The rest and the parked records go back to pending. *)
Definition dies (pol : policy) (r : record) : bool := rlimit pol <? reps r.

Definition reconnect (pol : policy) (st : state) (g : N) :=
  if g <? gen st then stale st else
  if g =? gen st then (st, OReconnectUnchanged, nochange) else
  let fl := map replayed (inflight st) in
  let alive := filter (fun r => negb (dies pol r)) fl in
  let dying := filter (dies pol) fl in
  let tombs := if hold pol then [] else map revive dying in
  let kept := if hold pol then dying else [] in
  let moved := alive ++ tombs ++ map prec (parked st) in
  let pend := fold_left (fun acc r => insert r acc) moved (pending st) in
  let ex := fold_left (fun acc r => insert_ex ((g, DReplays), r) acc) kept (exhausted st) in
  let cleared :=
    match retry_st st with
    | Some x => existsb (fun p => rseq x =? seq (prec p)) (parked st)
    | None => false
    end in
  (mkState g (next st) pend [] [] ex (acked st) (recvd st) (sent st) (if cleared then None else retry_st st)
           false
           (if progressed st then IOff else if nonempty (inflight st) then IReady
            else match isol st with IOff => IOff | _ => IReady end),
   OReconnected g (length (inflight st) + length (parked st)) (length dying),
   mkCh (nonempty pend) (nonempty (inflight st)) false cleared (nonempty (parked st)) (nonempty kept) true false).

Definition step (pol : policy) (st : state) (o : op) : state * outcome * changes :=
  match o with
  | Enqueue p => enqueue st p
  | Claim g => claim pol st g
  | Ack g t => ack st g t
  | Received g t => received st g t
  | Fail g s k now spread => fail pol st g s k now spread
  | RetryNow g s => retry_now st g s
  | Timeout now => timeout st now
  | Requeue g s => requeue st g s
  | Reconnect g => reconnect pol st g
  end.

Definition st_of (x : state * outcome * changes) : state := fst (fst x).
Definition out_of (x : state * outcome * changes) : outcome := snd (fst x).
Definition ch_of (x : state * outcome * changes) : changes := snd x.
