(** * What a claim promises, and payloads staying with their sequence

    13. Strict ordering: under [Strict], a claim never passes a lower
        parked or dead-lettered record.
    14. Progress: a claim succeeds when something is pending, the window
        has room for it, no probe is out, and (under [Strict]) nothing lower
        waits parked or dead.
    15. Payloads stay attached: in every state reachable from [init], each
        record's payload is the one enqueued with its sequence. *)

From Coq Require Import NArith List Bool Lia Permutation.
From Egress Require Import Model Proofs Invariants.
Import ListNotations.
Open Scope N_scope.

(** The sequences a strict claim must not pass. *)
Definition waiting_below (st : state) : list N :=
  map (fun p => seq (prec p)) (parked st) ++ map (fun e => seq (snd e)) (exhausted st).

Lemma lowest_le : forall l b, lowest l = Some b -> forall x, In x l -> b <= x.
Proof.
  induction l as [| a l IH]; simpl; intros b H x Hx; [contradiction |].
  unfold min_opt in H. destruct (lowest l) as [m |] eqn:L.
  - injection H as <-. destruct Hx as [<- | Hx]; [lia |]. specialize (IH m eq_refl x Hx). lia.
  - injection H as <-. destruct Hx as [<- | Hx]; [lia |].
    destruct l; simpl in L; [contradiction |]. unfold min_opt in L. destruct (lowest l); discriminate.
Qed.

Lemma lowest_none : forall l, lowest l = None -> l = [].
Proof.
  destruct l as [| a l]; simpl; [reflexivity |]. unfold min_opt. destruct (lowest l); discriminate.
Qed.

Lemma lowest_in : forall l b, lowest l = Some b -> In b l.
Proof.
  induction l as [| a l IH]; simpl; intros b H; [discriminate |].
  unfold min_opt in H. destruct (lowest l) as [m |] eqn:L.
  - injection H as <-. destruct (N.min_spec a m) as [[_ ->] | [_ ->]]; [left | right; apply IH]; reflexivity.
  - injection H as <-. left. reflexivity.
Qed.

(** 13. *)
Theorem strict_claims_in_order :
  forall pol st g g' s a p d,
  ordering_of pol = Strict ->
  out_of (step pol st (Claim g)) = OClaimed g' s a p d ->
  forall x, In x (waiting_below st) -> s <= x.
Proof.
  intros pol st g g' s a p d Hs H x Hx. simpl in H. unfold claim, stale in H.
  destruct (negb (g =? gen st)); [discriminate |].
  destruct (pending st) as [| r rest]; [discriminate |].
  rewrite Hs in H. unfold waiting_below in Hx.
  assert (Open : out_of (claim_open pol st r rest) = OClaimed g' s a p d -> s = seq r).
  { unfold claim_open, do_claim. destruct (isol st); simpl; try discriminate;
      destruct (window_end pol st <=? seq r); simpl; try discriminate; intro E; injection E; intros; lia. }
  destruct (lowest _) as [b |] eqn:L.
  - destruct (b <? seq r) eqn:B; [discriminate |]. apply N.ltb_ge in B.
    rewrite (Open H). pose proof (lowest_le _ b L x Hx). lia.
  - apply lowest_none in L. rewrite L in Hx. contradiction.
Qed.

(** 14. *)
Theorem claim_progress :
  forall pol st r rest,
  pending st = r :: rest ->
  seq r < window_end pol st ->
  (forall q, isol st <> IProbe q) ->
  (ordering_of pol = Strict -> forall x, In x (waiting_below st) -> seq r <= x) ->
  out_of (step pol st (Claim (gen st))) = OClaimed (gen st) (seq r) (bump (att r)) (payload r) (dead r).
Proof.
  intros pol st r rest P W I S. simpl. unfold claim, stale. rewrite N.eqb_refl. simpl. rewrite P.
  assert (Open : out_of (claim_open pol st r rest) = OClaimed (gen st) (seq r) (bump (att r)) (payload r) (dead r)).
  { unfold claim_open. replace (window_end pol st <=? seq r) with false by (symmetry; apply N.leb_gt; exact W).
    destruct (isol st) as [| | q]; [reflexivity | reflexivity | exfalso; exact (I q eq_refl)]. }
  destruct (ordering_of pol); [exact Open |].
  destruct (lowest _) as [b |] eqn:L; [| exact Open].
  pose proof (S eq_refl b (lowest_in _ _ L)) as Le.
  replace (b <? seq r) with false by (symmetry; apply N.ltb_ge; exact Le). exact Open.
Qed.

(** ** 15. Payloads stay attached to their sequence *)

(** [P] holds of every record the state holds. *)
Definition all_held (P : record -> Prop) (st : state) : Prop :=
  Forall P (pending st) /\ Forall P (inflight st) /\ Forall (fun p => P (prec p)) (parked st) /\
  Forall (fun e => P (snd e)) (exhausted st).

(** A property of a record that what happens to a record keeps. *)
Definition kept_by_transforms (P : record -> Prop) : Prop :=
  forall r, P r -> P (claimed r) /\ P (failed r) /\ P (replayed r) /\ P (refunded r) /\ P (fresh r) /\
                   forall rs, P (entomb rs r).

Lemma all_held_step :
  forall P pol st o, kept_by_transforms P -> (forall p, o = Enqueue p -> P (mkRec (next st) 0 0 0 false None 0 p)) ->
  all_held P st -> all_held P (st_of (step pol st o)).
Proof.
  intros P pol st o K New H0. pose proof H0 as [Hp [Hi [Hk He]]].
  destruct o; simpl step.
  - unfold enqueue, all_held; simpl. repeat split; auto.
    apply Forall_app. split; [exact Hp |]. constructor; [apply (New p eq_refl) | constructor].
  - unfold claim, claim_open, do_claim, stale. destruct (negb _); [exact H0 |].
    destruct (pending st) as [| r rest] eqn:Pd; [exact H0 |].
    inversion Hp as [| ? ? Hr Hrest]; subst.
    assert (C : forall sn iso, all_held P (mkState (gen st) (next st) rest (inflight st ++ [claimed r]) (parked st)
                  (exhausted st) (acked st) (recvd st) sn (retry_st st) (progressed st) iso)).
    { intros sn iso. unfold all_held; simpl. repeat split; try assumption.
      apply Forall_app. split; [exact Hi |]. constructor; [apply (K r Hr) | constructor]. }
    split_goal; unfold st_of; simpl; try exact H0; apply C.
  - unfold ack, advance, stale. split_goal; unfold st_of; simpl; try exact H0;
      unfold all_held; simpl; repeat split; apply Forall_filter; assumption.
  - unfold received, stale. split_goal; unfold st_of; simpl; try exact H0;
      unfold all_held; simpl; repeat split; try assumption; try (apply Forall_filter; assumption).
    all: apply Forall_app; split; [exact Hi |]; apply Forall_map; apply Forall_filter;
      eapply Forall_impl; [| exact Hp]; intros a Ha; apply (K a Ha).
  - unfold fail, stale. destruct (negb _); [exact H0 |].
    destruct (take seq s (inflight st)) as [[r rest] |] eqn:T; [| exact H0].
    destruct (Forall_take _ _ _ _ _ _ _ T Hi) as [Hr Hrest].
    destruct (K r Hr) as [_ [Hf _]]. destruct (K _ Hf) as [_ [_ [_ [_ [_ He']]]]].
    destruct k; simpl; try destruct (budget pol <? fails r + 1);
      unfold bury; destruct (dead (failed r)), (hold pol); unfold all_held; simpl; repeat split; auto;
      apply Forall_insert_by; auto.
  - unfold retry_now, stale. destruct (negb _); [exact H0 |].
    destruct (take _ s (parked st)) as [[p rest] |] eqn:T; [| exact H0].
    destruct (Forall_take _ _ _ _ _ _ _ T Hk) as [Hr Hrest].
    destruct (clear_retry s (retry_st st)); unfold all_held; simpl; repeat split; auto.
    apply Forall_insert_by; auto.
  - unfold timeout, all_held; simpl. repeat split; auto; [| apply Forall_filter; exact Hk].
    apply (Permutation_Forall (Permutation_sym (fold_insert_prec_perm _ _))). apply Forall_app. split; [| exact Hp].
    apply Forall_map. apply Forall_filter. exact Hk.
  - unfold requeue, stale. destruct (negb _); [exact H0 |].
    destruct (take _ s (exhausted st)) as [[[? r] rest] |] eqn:T; [| exact H0].
    destruct (Forall_take _ _ _ _ _ _ _ T He) as [Hr Hrest].
    destruct (clear_retry s (retry_st st)); unfold all_held; simpl; repeat split; auto.
    apply Forall_insert_by; [apply (K r Hr) | exact Hp].
  - unfold reconnect, stale. destruct (g <? gen st); [exact H0 |]. destruct (g =? gen st); [exact H0 |].
    assert (Fl : Forall P (map replayed (inflight st))).
    { apply Forall_map. eapply Forall_impl; [| exact Hi]. intros a Ha. apply (K a Ha). }
    unfold all_held; simpl. repeat split; try constructor.
    + apply Forall_fold_insert; [| exact Hp]. apply Forall_app. split; [| apply Forall_app; split].
      * apply Forall_filter. exact Fl.
      * destruct (hold pol); [constructor |]. apply Forall_map. apply Forall_forall. intros a Ha.
        apply filter_In in Ha. destruct Ha as [Ha _]. apply filter_In in Ha. destruct Ha as [Ha _].
        rewrite Forall_forall in Fl. apply (K a (Fl a Ha)).
      * apply Forall_map. exact Hk.
    + apply Forall_fold_insert_ex; [| exact He].
      apply Forall_forall. intros a Ha. simpl. rewrite Forall_forall in Fl. apply Fl.
      destruct (hold pol); [apply filter_In in Ha; apply Ha |].
      apply filter_In in Ha. destruct Ha as [Ha _]. apply filter_In in Ha. apply Ha.
Qed.

(** What each sequence was enqueued with: [assign f st o] is [f], and for
    an enqueue also the payload at the sequence it returns. *)
Definition assign (f : N -> nat) (st : state) (o : op) : N -> nat :=
  match o with
  | Enqueue p => fun s => if s =? next st then p else f s
  | _ => f
  end.

(** The state and the assignment after running [ops] from [st]. *)
Fixpoint exec (pol : policy) (st : state) (f : N -> nat) (ops : list op) : state * (N -> nat) :=
  match ops with
  | [] => (st, f)
  | o :: os => exec pol (st_of (step pol st o)) (assign f st o) os
  end.

Definition attached (f : N -> nat) (r : record) : Prop := payload r = f (seq r).

Lemma attached_kept : forall f, kept_by_transforms (attached f).
Proof.
  intros f r H. unfold attached in *.
  unfold claimed, failed, replayed, refunded, fresh, entomb; cbn [payload seq].
  repeat split; try (intros; exact H). destruct (resend r); exact H.
Qed.

Lemma attached_step :
  forall pol st o f, Inv pol st -> all_held (attached f) st -> all_held (attached (assign f st o)) (st_of (step pol st o)).
Proof.
  intros pol st o f I H. destruct o as [p | | | | | | | |]; simpl assign;
    try (apply all_held_step; [apply attached_kept | intros q E; discriminate | exact H]).
  apply all_held_step; [apply attached_kept | | ].
  - intros q E. injection E as <-. unfold attached. simpl. rewrite N.eqb_refl. reflexivity.
  - (* Every record held lies below [next], so the new assignment agrees on it. *)
    pose proof (held_below_next st (inv_conservation _ _ I)) as B.
    destruct H as [Hp [Hi [Hk He]]].
    assert (Agree : forall r, In (seq r) (held st) -> attached f r -> attached (fun s => if s =? next st then p else f s) r).
    { intros r Hin A. unfold attached in *. destruct (B _ Hin) as [Lt _].
      replace (seq r =? next st) with false by (symmetry; apply N.eqb_neq; lia). exact A. }
    unfold all_held, held in *. repeat split; rewrite Forall_forall in *; intros x Hx; apply Agree.
    + apply in_or_app. left. apply in_map. exact Hx.
    + apply Hp. exact Hx.
    + apply in_or_app. right. apply in_or_app. left. apply in_map. exact Hx.
    + apply Hi. exact Hx.
    + apply in_or_app. right. apply in_or_app. right. apply in_or_app. left.
      apply (in_map (fun p => seq (prec p))). exact Hx.
    + apply Hk. exact Hx.
    + apply in_or_app. right. apply in_or_app. right. apply in_or_app. right.
      apply (in_map (fun e => seq (snd e))). exact Hx.
    + apply He. exact Hx.
Qed.

(** 15. Run any operations from [init]: every record held at the end
    carries the payload of the enqueue that returned its sequence. *)
Theorem payloads_attached :
  forall pol g f0 ops, let (st, f) := exec pol (init g) f0 ops in all_held (attached f) st.
Proof.
  intros pol g f0 ops.
  assert (Gen : forall st f, reachable pol st -> all_held (attached f) st ->
                let (st', f') := exec pol st f ops in all_held (attached f') st').
  { induction ops as [| o os IH]; intros st f R H; simpl; [exact H |].
    apply IH; [apply reach_step; exact R |]. apply attached_step; [apply invariants_hold; exact R | exact H]. }
  apply Gen; [apply reach_init |]. unfold all_held; simpl. repeat split; constructor.
Qed.
