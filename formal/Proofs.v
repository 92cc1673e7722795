(** * Theorems about the model of the egress core (Model.v).

    Each theorem is stated in words in formal/README.md beside its name. *)

From Coq Require Import NArith List Bool Lia Permutation Sorting.Sorted.
From Egress Require Import Model.
Import ListNotations.
Open Scope N_scope.


(** ** Automation: split every test in the goal, then do arithmetic. *)

Ltac facts :=
  repeat match goal with
  | H : (_ <=? _) = false |- _ => apply N.leb_gt in H
  | H : (_ <=? _) = true |- _ => apply N.leb_le in H
  | H : (_ <? _) = true |- _ => apply N.ltb_lt in H
  | H : (_ <? _) = false |- _ => apply N.ltb_ge in H
  | H : (_ =? _) = true |- _ => apply N.eqb_eq in H
  | H : (_ =? _) = false |- _ => apply N.eqb_neq in H
  | H : negb _ = true |- _ => apply negb_true_iff in H
  | H : negb _ = false |- _ => apply negb_false_iff in H
  | H : Some _ = Some _ |- _ => injection H as H
  | H1 : ?x = Some _, H2 : ?x = Some _ |- _ => rewrite H1 in H2
  end.

(** Destructs the innermost tests first: a scrutinee that holds a test
    itself is skipped (the [fail] backtracks to the next candidate). *)
Ltac split_goal :=
  repeat match goal with
  | |- context [match ?x with _ => _ end] =>
      lazymatch x with
      | context [match _ with _ => _ end] => fail
      | _ => let E := fresh "E" in destruct x eqn:E
      end
  end.

Ltac unfold_ops :=
  unfold step, enqueue, claim, claim_open, do_claim, ack, advance, received, fail, bury, retry_now, timeout,
    requeue, reconnect, nonempty, stale, st_of, out_of, ch_of in *.

(** ** 3. A stale generation changes nothing *)

Definition op_generation (o : op) : option N :=
  match o with
  | Claim g | Ack g _ | Received g _ | Fail g _ _ _ _ | RetryNow g _ | Requeue g _ => Some g
  | _ => None
  end.

Theorem stale_generation_is_a_noop :
  forall pol st o g, op_generation o = Some g -> g <> gen st ->
  step pol st o = (st, OStale (gen st), nochange).
Proof.
  intros pol st o g Hg Hne.
  assert (E : (g =? gen st) = false) by (apply N.eqb_neq; exact Hne).
  destruct o; simpl in Hg; inversion Hg; subst; simpl;
    unfold claim, ack, received, fail, retry_now, requeue; rewrite E; reflexivity.
Qed.

Theorem stale_reconnect_is_a_noop :
  forall pol st g, g < gen st -> step pol st (Reconnect g) = (st, OStale (gen st), nochange).
Proof.
  intros pol st g H. simpl. unfold reconnect.
  replace (g <? gen st) with true by (symmetry; apply N.ltb_lt; exact H). reflexivity.
Qed.

(** ** 4. Reconnect fences and preserves *)

Theorem reconnect_advances :
  forall pol st g, gen st < g ->
  let r := step pol st (Reconnect g) in
  gen (st_of r) = g /\ next (st_of r) = next st /\ acked (st_of r) = acked st /\ recvd (st_of r) = recvd st /\
  sent (st_of r) = sent st /\ inflight (st_of r) = [] /\ parked (st_of r) = [] /\
  exists dead, out_of r = OReconnected g (length (inflight st) + length (parked st)) dead.
Proof.
  intros pol st g H. simpl. unfold reconnect.
  replace (g <? gen st) with false by (symmetry; apply N.ltb_ge; lia).
  replace (g =? gen st) with false by (symmetry; apply N.eqb_neq; lia).
  simpl. repeat split; try reflexivity. eexists. reflexivity.
Qed.

(** ** 11. Acknowledgements and receipts are bounded by what was sent *)

Theorem ack_within_sent :
  forall pol st g t, out_of (step pol st (Ack g t)) = OAdvanced t ->
  exists s, sent st = Some s /\ t <= s.
Proof.
  intros pol st g t H. simpl in H. unfold ack, stale, unsent in H.
  destruct (negb (g =? gen st)); [discriminate |].
  destruct (sent st) as [s |]; [| discriminate].
  destruct (s <? t) eqn:E; [discriminate |]. apply N.ltb_ge in E. eauto.
Qed.

Theorem received_within_sent :
  forall pol st g t w k, out_of (step pol st (Received g t)) = ORecorded w k ->
  exists s, sent st = Some s /\ t <= s.
Proof.
  intros pol st g t w k H. simpl in H. unfold received, stale, unsent in H.
  destruct (negb (g =? gen st)); [discriminate |].
  destruct (sent st) as [s |]; [| discriminate].
  destruct (s <? t) eqn:E; [discriminate |]. apply N.ltb_ge in E. eauto.
Qed.

(** ** 10. Without a hint, the backoff never exceeds the ceiling *)

Theorem backoff_within_ceiling : forall pol k, backoff pol k None <= ceiling pol.
Proof. intros. unfold backoff. lia. Qed.

Theorem fail_backoff_within_ceiling :
  forall pol st g s kd now r,
  (forall d, kd <> RetryAfter d) ->
  let o := Fail g s kd now (fun _ => 0) in
  (out_of (step pol st o) = ORetrying r \/ out_of (step pol st o) = OExhausted r) ->
  rbackoff r <= ceiling pol.
Proof.
  intros pol st g s kd now r Hk o Ho. subst o. simpl in Ho. unfold fail, stale in Ho.
  destruct (negb (g =? gen st)); [simpl in Ho; destruct Ho; discriminate |].
  destruct (take seq s (inflight st)) as [[x rest] |]; [| simpl in Ho; destruct Ho; discriminate].
  destruct kd as [ | | d]; [ | | exfalso; exact (Hk d eq_refl)]; unfold bury in Ho;
    simpl in Ho; try destruct (budget pol <? fails x + 1); simpl in Ho;
    destruct (dead x), (hold pol); simpl in Ho;
    destruct Ho as [Ho | Ho]; inversion Ho; subst; simpl; unfold sat, backoff; lia.
Qed.

(** ** 2. The watermark never regresses *)

Definition le_opt (a b : option N) : Prop :=
  match a, b with
  | None, _ => True
  | Some x, Some y => x <= y
  | Some _, None => False
  end.

Lemma le_opt_refl : forall a, le_opt a a.
Proof. destruct a; simpl; lia. Qed.

Theorem acked_monotone : forall pol st o, le_opt (acked st) (acked (st_of (step pol st o))).
Proof.
  intros pol st o. destruct (acked st) as [w |] eqn:A; [| exact I].
  destruct o; unfold_ops; simpl; split_goal; simpl in *; facts; subst; try congruence; try lia.
  all: rewrite A; simpl; lia.
Qed.

(** ** 1. Sequence assignment is monotone (first half; the bound on every
    held sequence is part of the invariant below) *)

Theorem enqueue_assigns_next :
  forall pol st p,
  out_of (step pol st (Enqueue p)) = OSeq (next st) /\ next (st_of (step pol st (Enqueue p))) = next st + 1.
Proof. intros. split; reflexivity. Qed.

Theorem next_monotone : forall pol st o, next st <= next (st_of (step pol st o)).
Proof. intros pol st o. destruct o; unfold_ops; simpl; split_goal; simpl; lia. Qed.

(** ** 9. A step that reports no change left the state unchanged *)

Lemma filter_none_keeps_rest :
  forall A (f : A -> bool) l, filter f l = [] -> filter (fun x => negb (f x)) l = l.
Proof.
  intros A f l. induction l as [| a l IH]; simpl; auto.
  destruct (f a); simpl; [discriminate | intro H; f_equal; auto].
Qed.

Theorem no_change_no_effect :
  forall pol st o, ch_of (step pol st o) = nochange -> st_of (step pol st o) = st.
Proof.
  intros pol st o. destruct o; unfold_ops; simpl; split_goal; simpl; intro H;
    try discriminate; try reflexivity.
  all: try (unfold nochange in H; injection H; intros; simpl in *; facts; congruence).
  all: try (rewrite filter_none_keeps_rest by assumption); destruct st; simpl in *; subst; reflexivity.
Qed.
