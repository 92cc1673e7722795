(** * 16. The journal: what reached the wire survives a crash

    A model of the journal the Rust core keeps when it is built by
    [EgressCore::restore] (crates/egress-core/src/durable.rs), at the level
    the crash rules are about: the core (Model.v), what is durable
    ([dnext]: every sequence below it; [dgen]: the generation), what was
    handed to the store and not yet reported ([wnext], [wgen], [batch]),
    and the store itself ([store]: the records it holds, each a sequence
    and its payload).

    - [PollReady] hands every record from [dnext] to [next] to the store,
      with the generation (one batch at a time: group commit);
    - [Persisted] makes the batch durable; [PersistFailed] forgets it, so
      the next [PollReady] hands it again;
    - [Adopt p] takes a record another writer appended durably at [next]
      (an application's transactional outbox);
    - a claim is refused unless the head of pending is durable (R1) and
      the generation is (R2).

    The theorem: in every state reachable from an empty store, every
    sequence that reached the wire is in the store with the payload that
    went on the wire with it, and every durable sequence is in the store;
    so a crash that drops everything not yet reported durable, followed by
    a restore from the store, binds no sent sequence to another payload and
    loses no durable record, and the restored core's next sequence lies
    above everything sent.

    Left out of this model (and covered by the Rust crash property test in
    crates/egress-core/tests/durable.rs): the acknowledgement watermark and
    the dead-letter marks in a batch, pruning, flush-epoch gates, and
    [rebase] (an outbox append that takes sequences the core had given to
    records not yet durable). *)

From Coq Require Import NArith List Bool Lia.
From Egress Require Import Model Proofs Invariants Claims.
Import ListNotations.
Open Scope N_scope.

Record jstate := mkJ {
  core : state; dnext : N; wnext : N; dgen : N; wgen : N; writing : bool;
  batch : list (N * nat); store : list (N * nat) }.

Inductive jop := Core (o : op) | PollReady | Persisted | PersistFailed | Adopt (p : nat).

(** Every record the core holds, wherever it is. *)
Definition recs (st : state) : list record :=
  pending st ++ inflight st ++ map prec (parked st) ++ map snd (exhausted st).

Definition tag (r : record) : N * nat := (seq r, payload r).

Definition in_range (lo hi : N) (r : record) : bool := (lo <=? seq r) && (seq r <? hi).

(** The gates on a claim: the generation is durable, and so is the head of
    pending. *)
Definition gated (js : jstate) : bool :=
  (dgen js <? gen (core js)) ||
  match pending (core js) with r :: _ => dnext js <=? seq r | [] => false end.

Definition with_core (js : jstate) (c : state) : jstate :=
  mkJ c (dnext js) (wnext js) (dgen js) (wgen js) (writing js) (batch js) (store js).

Definition jstep (pol : policy) (js : jstate) (o : jop) : jstate :=
  match o with
  | Core (Claim g) => if gated js then js else with_core js (st_of (step pol (core js) (Claim g)))
  | Core o => with_core js (st_of (step pol (core js) o))
  | PollReady =>
      if writing js then js
      else mkJ (core js) (dnext js) (next (core js)) (dgen js) (gen (core js)) true
             (map tag (filter (in_range (dnext js) (next (core js))) (recs (core js)))) (store js)
  | Persisted =>
      if writing js then mkJ (core js) (wnext js) (wnext js) (wgen js) (wgen js) false [] (store js ++ batch js)
      else js
  | PersistFailed =>
      if writing js then mkJ (core js) (dnext js) (dnext js) (dgen js) (dgen js) false [] (store js) else js
  | Adopt p =>
      let n := next (core js) in
      if dnext js =? n then
        mkJ (st_of (step pol (core js) (Enqueue p))) (n + 1) (n + 1) (dgen js) (wgen js) (writing js) (batch js)
            (store js ++ [(n, p)])
      else js
  end.

(** What each sequence was enqueued or adopted with. *)
Definition jassign (f : N -> nat) (js : jstate) (o : jop) : N -> nat :=
  match o with
  | Core o => assign f (core js) o
  | Adopt p => if dnext js =? next (core js) then assign f (core js) (Enqueue p) else f
  | _ => f
  end.

Fixpoint jexec (pol : policy) (js : jstate) (f : N -> nat) (ops : list jop) : jstate * (N -> nat) :=
  match ops with
  | [] => (js, f)
  | o :: os => jexec pol (jstep pol js o) (jassign f js o) os
  end.

(** A fresh durable stream: nothing stored, the generation durable. *)
Definition jinit (g : N) : jstate := mkJ (init g) 0 0 g g false [] [].

Definition sent_below (st : state) (d : N) : Prop :=
  match sent st with Some s => s < d | None => True end.

Record JInv (pol : policy) (js : jstate) (f : N -> nat) : Prop := {
  j_reach : reachable pol (core js);
  j_attached : all_held (attached f) (core js);
  j_order : dnext js <= wnext js /\ wnext js <= next (core js);
  j_idle : writing js = false -> wnext js = dnext js;
  j_sent : sent_below (core js) (dnext js);
  j_complete : forall s, s < dnext js -> In (s, f s) (store js);
  j_stored : forall s p, In (s, p) (store js) -> p = f s /\ s < dnext js;
  j_batch_complete : writing js = true -> forall s, dnext js <= s -> s < wnext js -> In (s, f s) (batch js);
  j_batch : forall s p, In (s, p) (batch js) -> p = f s /\ s < wnext js }.

(** ** Lemmas about the core *)

Lemma sent_unless_claim :
  forall pol st o, (forall g, o <> Claim g) -> sent (st_of (step pol st o)) = sent st.
Proof.
  intros pol st o H. destruct o; [| exfalso; eapply H; reflexivity | ..];
    unfold_ops; simpl; split_goal; reflexivity.
Qed.

Lemma claim_sent :
  forall pol st g, sent (st_of (step pol st (Claim g))) = sent st \/
  exists r rest, pending st = r :: rest /\
    sent (st_of (step pol st (Claim g))) = Some (match sent st with Some s => N.max s (seq r) | None => seq r end).
Proof.
  intros pol st g. simpl. unfold claim, claim_open, do_claim, stale, st_of.
  destruct (negb _); [left; reflexivity |].
  destruct (pending st) as [| r rest] eqn:P; [left; reflexivity |].
  set (x := match sent st with Some s => N.max s (seq r) | None => seq r end).
  split_goal; cbn [fst sent]; try (left; congruence);
    right; exists r, rest; split; try reflexivity; subst x; rewrite ?E2; reflexivity.
Qed.

Lemma all_held_recs : forall P st, all_held P st -> forall r, In r (recs st) -> P r.
Proof.
  intros P st [Hp [Hi [Hk He]]] r H. unfold recs in H. rewrite Forall_forall in *.
  repeat rewrite in_app_iff in H. destruct H as [H | [H | [H | H]]]; auto.
  - apply in_map_iff in H. destruct H as [x [<- Hx]]. apply Hk. exact Hx.
  - apply in_map_iff in H. destruct H as [x [<- Hx]]. apply He. exact Hx.
Qed.

Lemma held_recs : forall st, held st = map seq (recs st).
Proof. intro st. unfold held, recs. rewrite !map_app, !map_map. reflexivity. Qed.

(** A sequence above the watermark and below [next] is held by a record. *)
Lemma owed_present :
  forall pol st s, reachable pol st -> s < next st -> unacked (acked st) s = true ->
  exists r, In r (recs st) /\ seq r = s.
Proof.
  intros pol st s R Lt U. pose proof (nothing_is_lost pol st s R) as C.
  replace ((s <? next st) && unacked (acked st) s) with true in C
    by (symmetry; apply andb_true_iff; split; [apply N.ltb_lt; exact Lt | exact U]).
  assert (In s (held st)) as Hin by (apply (count_occ_In N.eq_dec); unfold cnt in C; lia).
  rewrite held_recs in Hin. apply in_map_iff in Hin. destruct Hin as [r [E Hr]]. eauto.
Qed.

Lemma assign_below :
  forall f st o s, s < next st -> assign f st o s = f s.
Proof.
  intros f st o s Lt. destruct o; simpl; try reflexivity.
  replace (s =? next st) with false by (symmetry; apply N.eqb_neq; lia). reflexivity.
Qed.

Lemma eqb_lt : forall s n, s < n -> (s =? n) = false.
Proof. intros s n H. apply N.eqb_neq. lia. Qed.

(** ** The invariant holds everywhere *)

Lemma jinv_init : forall pol g f, JInv pol (jinit g) f.
Proof.
  intros pol g f. constructor; simpl; try (intros; lia); try (intros; contradiction); try discriminate.
  all: try apply reach_init; try exact I; try reflexivity.
  all: try (split; lia).
  unfold all_held; simpl. repeat split; constructor.
Qed.

(** The store and the batch say the same under an assignment that agrees
    below [wnext]. *)
Lemma jinv_frame :
  forall pol js f c f',
  JInv pol js f -> reachable pol c -> all_held (attached f') c ->
  next (core js) <= next c -> sent_below c (dnext js) ->
  (forall s, s < wnext js -> f' s = f s) ->
  JInv pol (with_core js c) f'.
Proof.
  intros pol js f c f' J R A N S E. destruct J as [J1 J2 [J3 J3'] J4 J5 J6 J7 J8 J9].
  constructor; simpl; auto.
  - split; lia.
  - intros s Hs. rewrite E by lia. auto.
  - intros s p Hin. destruct (J7 s p Hin) as [-> Lt]. rewrite E by lia. auto.
  - intros W s L H. rewrite E by lia. auto.
  - intros s p Hin. destruct (J9 s p Hin) as [-> Lt]. rewrite E by lia. auto.
Qed.

Lemma jinv_step :
  forall pol js f o, JInv pol js f -> JInv pol (jstep pol js o) (jassign f js o).
Proof.
  intros pol js f o J. pose proof J as [J1 J2 [J3 J3'] J4 J5 J6 J7 J8 J9].
  destruct o as [o | | | | p]; simpl jstep; simpl jassign.
  - assert (Frame : (forall g, o <> Claim g) -> sent_below (st_of (step pol (core js) o)) (dnext js) ->
                    JInv pol (with_core js (st_of (step pol (core js) o))) (assign f (core js) o)).
    { intros _ S. apply (jinv_frame pol js f); auto.
      - apply reach_step. exact J1.
      - apply attached_step; [apply invariants_hold; exact J1 | exact J2].
      - apply next_monotone.
      - intros s Hs. apply assign_below. lia. }
    destruct o; try (apply Frame; [intros g' E; discriminate |
                                   unfold sent_below; rewrite sent_unless_claim by (intros g' E; discriminate); exact J5]).
    (* A claim: gated, or the head is durable. *)
    destruct (gated js) eqn:G; [exact J |].
    change (claim pol (core js) g) with (step pol (core js) (Claim g)).
    apply (jinv_frame pol js f); auto.
    + exact (reach_step pol (core js) (Claim g) J1).
    + exact (attached_step pol (core js) (Claim g) f (invariants_hold _ _ J1) J2).
    + exact (next_monotone pol (core js) (Claim g)).
    + unfold sent_below. destruct (claim_sent pol (core js) g) as [-> | [r [rest [P ->]]]]; [exact J5 |].
      unfold gated in G. rewrite P in G. apply orb_false_iff in G. destruct G as [_ G]. apply N.leb_gt in G.
      unfold sent_below in J5. destruct (sent (core js)); lia.
  - destruct (writing js) eqn:W; [exact J |].
    pose proof (J4 eq_refl) as Idle.
    constructor; simpl; auto.
    + split; lia.
    + discriminate.
    + intros _ s L H.
      assert (U : unacked (acked (core js)) s = true).
      { destruct (marks_hold pol _ J1) as [M1 [M2 M3]]. unfold sent_below in J5. unfold unacked.
        destruct (acked (core js)) as [a |]; [| reflexivity]. apply N.ltb_lt.
        destruct (recvd (core js)) as [v |]; [| contradiction]. destruct (sent (core js)) as [x |]; [| contradiction].
        simpl in M1, M2. lia. }
      destruct (owed_present pol (core js) s J1 H U) as [r [Hr Hs]].
      apply in_map_iff. exists r. split.
      * unfold tag. rewrite <- Hs. f_equal. apply (all_held_recs _ _ J2 r Hr).
      * apply filter_In. split; [exact Hr |]. unfold in_range. rewrite Hs.
        apply andb_true_iff. split; [apply N.leb_le | apply N.ltb_lt]; lia.
    + intros s p Hin. apply in_map_iff in Hin. destruct Hin as [r [E Hr]]. apply filter_In in Hr.
      destruct Hr as [Hr Rg]. unfold tag in E. injection E as <- <-.
      unfold in_range in Rg. apply andb_true_iff in Rg. destruct Rg as [_ Rg]. apply N.ltb_lt in Rg.
      split; [apply (all_held_recs _ _ J2 r Hr) | exact Rg].
  - destruct (writing js) eqn:W; [| exact J].
    constructor; simpl; auto.
    + split; lia.
    + unfold sent_below in *. destruct (sent (core js)); lia.
    + intros s Hs. apply in_or_app. destruct (N.lt_ge_cases s (dnext js)).
      * left. auto.
      * right. apply J8; auto.
    + intros s p Hin. apply in_app_iff in Hin. destruct Hin as [Hin | Hin].
      * destruct (J7 s p Hin). split; [assumption | lia].
      * apply J9. exact Hin.
    + discriminate.
    + contradiction.
  - destruct (writing js) eqn:W; [| exact J].
    constructor; simpl; auto.
    + split; lia.
    + discriminate.
    + contradiction.
  - destruct (dnext js =? next (core js)) eqn:D; [| exact J]. apply N.eqb_eq in D.
    set (n := next (core js)) in *.
    constructor; cbn [core dnext wnext dgen wgen writing batch store].
    + exact (reach_step pol (core js) (Enqueue p) J1).
    + exact (attached_step pol (core js) (Enqueue p) f (invariants_hold _ _ J1) J2).
    + split; [lia | simpl; unfold n; lia].
    + reflexivity.
    + unfold sent_below in *. simpl. destruct (sent (core js)); lia.
    + intros s Hs. apply in_or_app. destruct (N.lt_ge_cases s n).
      * left. rewrite (eqb_lt s n) by lia. apply J6. lia.
      * right. assert (s = n) by lia. subst s. rewrite N.eqb_refl. left. reflexivity.
    + intros s q Hin. apply in_app_iff in Hin. destruct Hin as [Hin | [E | []]].
      * destruct (J7 s q Hin) as [-> Lt]. rewrite (eqb_lt s n) by lia. split; [reflexivity | lia].
      * injection E as <- <-. rewrite N.eqb_refl. split; [reflexivity | lia].
    + intros _ s L H. lia.
    + intros s q Hin. destruct (J9 s q Hin) as [-> Lt]. rewrite (eqb_lt s n) by lia. split; [reflexivity | lia].
Qed.

(** ** 16. The theorem *)

(** What the store holds after a crash, restored: one record per stored
    sequence, the next sequence the stored counter, nothing in flight. *)
Definition restored (g : N) (js : jstate) : state :=
  mkState g (dnext js) (map (fun e => mkRec (fst e) 0 0 0 false None 0 (snd e)) (store js)) [] [] []
          None None None None false IOff.

Theorem crash_keeps_what_was_sent :
  forall pol g0 f0 ops g,
  let (js, f) := jexec pol (jinit g0) f0 ops in
  (* every sequence that reached the wire is stored, with the payload it
     was enqueued (and so sent) with *)
  (forall s, le_opt (Some s) (sent (core js)) -> In (s, f s) (store js)) /\
  (* every durable sequence is stored: nothing durable is lost *)
  (forall s, s < dnext js -> In (s, f s) (store js)) /\
  (* restored after a crash, a record under any sequence carries the
     payload enqueued with it, and new sequences start above all sent *)
  (forall r, In r (pending (restored g js)) -> payload r = f (seq r)) /\
  sent_below (core js) (next (restored g js)).
Proof.
  intros pol g0 f0 ops g.
  assert (Gen : forall js f, JInv pol js f -> let (js', f') := jexec pol js f ops in JInv pol js' f').
  { induction ops as [| o os IH]; intros js f J; simpl; [exact J |]. apply IH. apply jinv_step. exact J. }
  specialize (Gen (jinit g0) f0 (jinv_init pol g0 f0)).
  destruct (jexec pol (jinit g0) f0 ops) as [js f].
  destruct Gen as [J1 J2 J3 J4 J5 J6 J7 J8 J9].
  split; [| split; [exact J6 | split]].
  - intros s Hs. apply J6. unfold sent_below in J5. destruct (sent (core js)); simpl in Hs; [lia | contradiction].
  - intros r Hr. simpl in Hr. apply in_map_iff in Hr. destruct Hr as [[s p] [<- Hin]]. simpl.
    apply (J7 s p Hin).
  - exact J5.
Qed.

(** R1 and R2 in the model: a claim that goes through has a durable head
    and a durable generation. *)
Theorem claims_are_durable :
  forall js, gated js = false ->
  forall r rest, pending (core js) = r :: rest -> seq r < dnext js /\ gen (core js) <= dgen js.
Proof.
  intros js G r rest P. unfold gated in G. rewrite P in G. apply orb_false_iff in G.
  destruct G as [G1 G2]. apply N.ltb_ge in G1. apply N.leb_gt in G2. split; assumption.
Qed.

(** What goes on the wire under a sequence is the payload enqueued with it
    (with theorem 16: the payload the store holds under it). *)
Theorem wire_payload :
  forall pol st g f g' s a p d,
  all_held (attached f) st -> out_of (step pol st (Claim g)) = OClaimed g' s a p d -> p = f s.
Proof.
  intros pol st g f g' s a p d [Hp _] H. simpl in H. unfold claim, claim_open, do_claim, stale, out_of in H.
  destruct (negb _); [discriminate |].
  destruct (pending st) as [| r rest] eqn:P; [discriminate |].
  inversion Hp as [| ? ? Hr' _]. clear Hp. revert H.
  split_goal; simpl; intro H; try discriminate; injection H; intros; subst; exact Hr'.
Qed.
