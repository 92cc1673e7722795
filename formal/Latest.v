(** * The latest-value projection as a Coq model.

    A transcription of the rules of [Latest] (crates/egress-core/src/latest):
    per key, a desired [(version, value)], at most one value in flight, the
    frontier [durable_through], the failures in a row and the backoff.
    Every transition returns the new state, an outcome, and for each key
    it touched the projections of that key it changed. Keys are [N]s (the
    trace generator names them "a", "b", ...), values opaque [nat]s, and
    numbers saturate where the Rust core's do ([sat] at [u64::MAX], the
    failure count at [u32::MAX]). The retry schedule is the egress core's
    without jitter (the conformance runner passes a zero sample). *)

From Coq Require Import NArith List Bool.
From Egress Require Import Model.
Import ListNotations.
Open Scope N_scope.

(** The backoff's base and ceiling, and the most keys. *)
Record lpolicy := mkLPol { lbase : N; lceiling : N; lmax_keys : N }.

(** The value in flight: the generation it was claimed under, its
    version and value. *)
Record flight := mkFlight { fgen : N; fver : N; fval : nat }.

Record slot := mkSlot {
  desired : option (N * nat); in_flight : option flight; durable : option N;
  failures : N; waiting : option N }.

(** The generation, and the keys in ascending order, each once. *)
Record lstate := mkL { lgen : N; keys : list (N * slot) }.

(** What changed of one key. *)
Record kch := mkKch { k_desired : bool; k_inflight : bool; k_durable : bool; k_backoff : bool }.

Inductive lop :=
| LUpsert (k v : N) (x : nat)
| LClaim (g k : N)
| LAck (g k v : N)
| LFail (g k v now : N) (hint : option N)
| LTimeout (now : N)
| LReconnect (g : N).

Inductive lout :=
| UAccepted | UUnchanged | UAlreadyDurable (d : N) | UStale (c : N) | UConflict | UTooMany (l : N)
| CClaimed (g k v : N) (x : nat) | CEmpty | CBusy | CBackoff (u : N) | CStale (g : N)
| AAdvanced (d : N) | AUnchanged | AUnknown | AStale (g : N)
| FPending (t : N) | FSuperseded (t : N) | FUnknown | FStale (g : N)
| TFreed (ks : list N)
| RAdvanced (g : N) (requeued superseded : nat) | RUnchanged | RStale (g : N).

Definition linit (g : N) : lstate := mkL g [].

(** ** Keys *)

Fixpoint lookup (k : N) (l : list (N * slot)) : option slot :=
  match l with
  | [] => None
  | (k', s) :: t => if k =? k' then Some s else lookup k t
  end.

(** Sets [k]'s slot: replaced in place, or inserted in order. *)
Fixpoint put (k : N) (s : slot) (l : list (N * slot)) : list (N * slot) :=
  match l with
  | [] => [(k, s)]
  | (k', s') :: t =>
      if k =? k' then (k, s) :: t
      else if k <? k' then (k, s) :: (k', s') :: t
      else (k', s') :: put k s t
  end.

Definition newest (s : slot) : option (N * nat) :=
  match desired s, in_flight s with
  | Some d, _ => Some d
  | None, Some f => Some (fver f, fval f)
  | None, None => None
  end.

(** [min(ceiling, base * 2^(k-1))], raised to the hint; as the Rust core
    computes it in [u64] (a factor of [2^64] or more saturates). *)
Definition lsched (pol : lpolicy) (k : N) (hint : option N) : N :=
  let e := k - 1 in
  let b := if 64 <=? e then (if lbase pol =? 0 then 0 else lceiling pol)
           else N.min (lceiling pol) (lbase pol * 2 ^ e) in
  match hint with Some h => N.max b h | None => b end.

Definition kone (d i u b : bool) := mkKch d i u b.

(** ** Transitions *)

Definition upsert (pol : lpolicy) (st : lstate) (k v : N) (x : nat) :=
  let accept (s : slot) :=
    (mkL (lgen st) (put k (mkSlot (Some (v, x)) (in_flight s) (durable s) (failures s) (waiting s)) (keys st)),
     UAccepted, [(k, kone true false false false)]) in
  match lookup k (keys st) with
  | None =>
      if lmax_keys pol <=? N.of_nat (length (keys st)) then (st, UTooMany (lmax_keys pol), [])
      else (mkL (lgen st) (put k (mkSlot (Some (v, x)) None None 0 None) (keys st)),
            UAccepted, [(k, kone true false false false)])
  | Some s =>
      match durable s with
      | Some d => if v <=? d then (st, UAlreadyDurable d, []) else
          match newest s with
          | Some (c, y) => if v <? c then (st, UStale c, [])
                           else if v =? c then (st, if Nat.eqb x y then UUnchanged else UConflict, [])
                           else accept s
          | None => accept s
          end
      | None =>
          match newest s with
          | Some (c, y) => if v <? c then (st, UStale c, [])
                           else if v =? c then (st, if Nat.eqb x y then UUnchanged else UConflict, [])
                           else accept s
          | None => accept s
          end
      end
  end.

Definition claim (st : lstate) (g k : N) :=
  if negb (g =? lgen st) then (st, CStale (lgen st), []) else
  match lookup k (keys st) with
  | None => (st, CEmpty, [])
  | Some s =>
      match in_flight s with
      | Some _ => (st, CBusy, [])
      | None =>
          match desired s with
          | None => (st, CEmpty, [])
          | Some (v, x) =>
              match waiting s with
              | Some u => (st, CBackoff u, [])
              | None =>
                  (mkL (lgen st) (put k (mkSlot None (Some (mkFlight (lgen st) v x)) (durable s) (failures s) None)
                                      (keys st)),
                   CClaimed (lgen st) k v x, [(k, kone true true false false)])
              end
          end
      end
  end.

Definition ack (st : lstate) (g k v : N) :=
  if negb (g =? lgen st) then (st, AStale (lgen st), []) else
  match lookup k (keys st) with
  | None => (st, AUnknown, [])
  | Some s =>
      let old := match durable s with
                 | Some d => if v <=? d then (st, AUnchanged, []) else (st, AUnknown, [])
                 | None => (st, AUnknown, [])
                 end in
      match in_flight s with
      | Some f =>
          if fver f =? v then
            (mkL (lgen st) (put k (mkSlot (desired s) None (Some v) 0 (waiting s)) (keys st)),
             AAdvanced v, [(k, kone false true true false)])
          else old
      | None => old
      end
  end.

Definition fail (pol : lpolicy) (st : lstate) (g k v now : N) (hint : option N) :=
  if negb (g =? lgen st) then (st, FStale (lgen st), []) else
  match lookup k (keys st) with
  | None => (st, FUnknown, [])
  | Some s =>
      match in_flight s with
      | Some f =>
          if fver f =? v then
            let n := bump (failures s) in
            let t := sat (now + N.max (lsched pol n hint) 1) in
            match desired s with
            | Some d =>
                (mkL (lgen st) (put k (mkSlot (Some d) None (durable s) n (Some t)) (keys st)),
                 FSuperseded t, [(k, kone false true false true)])
            | None =>
                (mkL (lgen st) (put k (mkSlot (Some (fver f, fval f)) None (durable s) n (Some t)) (keys st)),
                 FPending t, [(k, kone true true false true)])
            end
          else (st, FUnknown, [])
      | None => (st, FUnknown, [])
      end
  end.

Definition due (now : N) (e : N * slot) : bool :=
  match waiting (snd e) with Some u => u <=? now | None => false end.

(** A slot whose backoff ended at [now] waits no more. *)
Definition free_slot (now : N) (s : slot) : slot :=
  match waiting s with
  | Some u => if u <=? now then mkSlot (desired s) (in_flight s) (durable s) (failures s) None else s
  | None => s
  end.

Definition timeout (st : lstate) (now : N) :=
  let ks := map fst (filter (due now) (keys st)) in
  (mkL (lgen st) (map (fun e => (fst e, free_slot now (snd e))) (keys st)), TFreed ks,
   map (fun k => (k, kone false false false true)) ks).

(** A flight back as the desire, unless a newer desire exists. *)
Definition requeue_slot (s : slot) : slot :=
  match in_flight s with
  | Some f =>
      mkSlot (match desired s with Some d => Some d | None => Some (fver f, fval f) end)
             None (durable s) (failures s) (waiting s)
  | None => s
  end.

Definition flying (e : N * slot) : bool := match in_flight (snd e) with Some _ => true | None => false end.
Definition wanted (e : N * slot) : bool := match desired (snd e) with Some _ => true | None => false end.

Definition reconnect (st : lstate) (g : N) :=
  if g <? lgen st then (st, RStale (lgen st), []) else
  if g =? lgen st then (st, RUnchanged, []) else
  let fl := filter flying (keys st) in
  (mkL g (map (fun e => (fst e, requeue_slot (snd e))) (keys st)),
   RAdvanced g (length (filter (fun e => negb (wanted e)) fl)) (length (filter wanted fl)),
   map (fun e => (fst e, kone (negb (wanted e)) true false false)) fl).

Definition lstep (pol : lpolicy) (st : lstate) (o : lop) : lstate * lout * list (N * kch) :=
  match o with
  | LUpsert k v x => upsert pol st k v x
  | LClaim g k => claim st g k
  | LAck g k v => ack st g k v
  | LFail g k v now hint => fail pol st g k v now hint
  | LTimeout now => timeout st now
  | LReconnect g => reconnect st g
  end.

Definition lst_of (x : lstate * lout * list (N * kch)) : lstate := fst (fst x).
Definition lout_of (x : lstate * lout * list (N * kch)) : lout := snd (fst x).
Definition lch_of (x : lstate * lout * list (N * kch)) : list (N * kch) := snd x.
