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

(** A property of a record that what happens to a record keeps, a claim
    aside. *)
Definition kept_by_transforms (P : record -> Prop) : Prop :=
  forall r, P r -> P (failed r) /\ P (replayed r) /\ P (refunded r) /\ P (fresh r) /\
                   forall rs, P (entomb rs r).

Lemma all_held_step :
  forall P pol st o, kept_by_transforms P -> (forall p, o = Enqueue p -> P (mkRec (next st) 0 0 0 false None 0 p)) ->
  (forall g r rest, o = Claim g -> pending st = r :: rest -> P (claimed r) /\
     Forall P rest /\ Forall P (inflight st) /\ Forall (fun p => P (prec p)) (parked st) /\
     Forall (fun e => P (snd e)) (exhausted st)) ->
  all_held P st -> all_held P (st_of (step pol st o)).
Proof.
  intros P pol st o K New KC H0. pose proof H0 as [Hp [Hi [Hk He]]].
  destruct o; simpl step.
  - unfold enqueue, all_held; simpl. repeat split; auto.
    apply Forall_app. split; [exact Hp |]. constructor; [apply (New p eq_refl) | constructor].
  - unfold claim, claim_open, do_claim, stale. destruct (negb _); [exact H0 |].
    destruct (pending st) as [| r rest] eqn:Pd; [exact H0 |].
    destruct (KC g r rest eq_refl eq_refl) as [Hc [Hrest [Hi' [Hk' He']]]].
    assert (C : forall sn iso, all_held P (mkState (gen st) (next st) rest (inflight st ++ [claimed r]) (parked st)
                  (exhausted st) (acked st) (recvd st) sn (retry_st st) (progressed st) iso)).
    { intros sn iso. unfold all_held; simpl. repeat split; try assumption.
      apply Forall_app. split; [exact Hi' |]. constructor; [exact Hc | constructor]. }
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
    destruct (K r Hr) as [Hf _]. destruct (K _ Hf) as [_ [_ [_ [Hfr He']]]].
    destruct k; unfold bury; simpl; try destruct (budget pol <? fails r + 1);
      simpl; destruct (dead r), (hold pol); unfold all_held; simpl; repeat split; auto;
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
        apply filter_In in Ha. destruct Ha as [Ha _].
        rewrite Forall_forall in Fl. destruct (K a (Fl a Ha)) as [_ [_ [_ [Hfr Hen]]]].
        unfold revive. destruct (dead a); [exact Hfr | apply Hen].
      * apply Forall_map. exact Hk.
    + apply Forall_fold_insert_ex; [| exact He].
      apply Forall_forall. intros a Ha. simpl. rewrite Forall_forall in Fl. apply Fl.
      destruct (hold pol); [apply filter_In in Ha; apply Ha | destruct Ha].
Qed.

(** What each sequence was enqueued with: [assign f st o] is [f], and for
    an enqueue also the payload at the sequence it returns. *)
Definition assign (f : N -> nat) (st : state) (o : op) : N -> nat :=
  match o with
  | Enqueue p => fun s => if s =? next st then p else f s
  | _ => f
  end.

(** The state after running [ops] from [st], with a ghost [a] updated by
    [upd] at each step. *)
Fixpoint run_with {A} (upd : A -> state -> op -> A) (pol : policy) (st : state) (a : A) (ops : list op)
    : state * A :=
  match ops with
  | [] => (st, a)
  | o :: os => run_with upd pol (st_of (step pol st o)) (upd a st o) os
  end.

(** A property of the state and the ghost that every step keeps from a
    reachable state holds after any run from [init]. *)
Lemma run_with_keeps :
  forall A (upd : A -> state -> op -> A) (P : A -> state -> Prop) pol,
  (forall st o a, reachable pol st -> P a st -> P (upd a st o) (st_of (step pol st o))) ->
  forall ops st a, reachable pol st -> P a st -> let (st', a') := run_with upd pol st a ops in P a' st'.
Proof.
  intros A upd P pol K ops. induction ops as [| o os IH]; intros st a R H; simpl; [exact H |].
  apply IH; [apply reach_step; exact R | apply K; assumption].
Qed.

(** The state and the assignment after running [ops] from [st]. *)
Definition exec (pol : policy) (st : state) (f : N -> nat) (ops : list op) : state * (N -> nat) :=
  run_with assign pol st f ops.

Definition attached (f : N -> nat) (r : record) : Prop := payload r = f (seq r).

(** What happens to a record, a claim aside, keeps its sequence, its
    attempt count and its payload; so it keeps any property of those. *)
Lemma kept_by_stamps :
  forall P : record -> Prop,
  (forall r r', seq r' = seq r -> att r' = att r -> payload r' = payload r -> P r -> P r') ->
  kept_by_transforms P.
Proof.
  intros P S r H.
  assert (K : forall r', seq r' = seq r -> att r' = att r -> payload r' = payload r -> P r')
    by (intros r' A B C; exact (S r r' A B C H)).
  unfold failed, replayed, refunded, fresh, entomb.
  repeat split; intros; try (apply K; reflexivity). destruct (resend r); apply K; reflexivity.
Qed.

Lemma attached_kept : forall f, kept_by_transforms (attached f).
Proof. intro f. apply kept_by_stamps. unfold attached. intros r r' -> _ -> H. exact H. Qed.

Lemma attached_claim :
  forall f st r rest, all_held (attached f) st -> pending st = r :: rest ->
  attached f (claimed r) /\ Forall (attached f) rest /\ Forall (attached f) (inflight st) /\
  Forall (fun p => attached f (prec p)) (parked st) /\ Forall (fun e => attached f (snd e)) (exhausted st).
Proof.
  intros f st r rest [Hp [Hi [Hk He]]] P. rewrite P in Hp. inversion Hp as [| ? ? Hr Hrest]; subst.
  repeat split; try assumption.
Qed.

Lemma all_held_agree :
  forall (P Q : record -> Prop) st, (forall r, In (seq r) (held st) -> P r -> Q r) -> all_held P st -> all_held Q st.
Proof.
  intros P Q st A [Hp [Hi [Hk He]]]. unfold all_held, held in *.
  repeat split; rewrite Forall_forall in *; intros x Hx; apply A.
  - apply in_or_app. left. apply in_map. exact Hx.
  - apply Hp. exact Hx.
  - apply in_or_app. right. apply in_or_app. left. apply in_map. exact Hx.
  - apply Hi. exact Hx.
  - apply in_or_app. right. apply in_or_app. right. apply in_or_app. left.
    apply (in_map (fun p => seq (prec p))). exact Hx.
  - apply Hk. exact Hx.
  - apply in_or_app. right. apply in_or_app. right. apply in_or_app. right.
    apply (in_map (fun e => seq (snd e))). exact Hx.
  - apply He. exact Hx.
Qed.

Lemma attached_step :
  forall pol st o f, Inv pol st -> all_held (attached f) st -> all_held (attached (assign f st o)) (st_of (step pol st o)).
Proof.
  intros pol st o f I H. destruct o as [p | | | | | | | |]; simpl assign;
    try (apply all_held_step;
         [apply attached_kept | intros q E; discriminate |
          intros g' r rest E P; try discriminate; injection E as <-; apply (attached_claim f st r rest H P) | exact H]).
  apply all_held_step; [apply attached_kept | | intros g' r rest E; discriminate | ].
  - intros q E. injection E as <-. unfold attached. simpl. rewrite N.eqb_refl. reflexivity.
  - (* Every record held lies below [next], so the new assignment agrees on it. *)
    apply (all_held_agree (attached f)); [| exact H].
    intros r Hin A. unfold attached in *.
    destruct (held_below_next st (inv_conservation _ _ I) _ Hin) as [Lt _].
    replace (seq r =? next st) with false by (symmetry; apply N.eqb_neq; lia). exact A.
Qed.

(** 15. Run any operations from [init]: every record held at the end
    carries the payload of the enqueue that returned its sequence. *)
Theorem payloads_attached :
  forall pol g f0 ops, let (st, f) := exec pol (init g) f0 ops in all_held (attached f) st.
Proof.
  intros pol g f0 ops. apply (run_with_keeps _ assign (fun f st => all_held (attached f) st)).
  - intros st o f R H. apply attached_step; [apply invariants_hold; exact R | exact H].
  - apply reach_init.
  - unfold all_held; simpl. repeat split; constructor.
Qed.

(** ** 15 (attempts). A record's attempt count is what the last claim of
    its sequence reported, and 0 before any: attempts stay with their
    sequence through failures, replays, receipts, requeues and tombstones. *)

Definition attempt_of (fa : N -> N) (r : record) : Prop := att r = fa (seq r).

(** What each sequence's attempt is after [o]: 0 at an enqueue, the
    reported attempt at a claim. *)
Definition assign_att (fa : N -> N) (pol : policy) (st : state) (o : op) : N -> N :=
  match o with
  | Enqueue _ => fun s => if s =? next st then 0 else fa s
  | Claim _ =>
      match out_of (step pol st o) with
      | OClaimed _ s a _ _ => fun x => if x =? s then a else fa x
      | _ => fa
      end
  | _ => fa
  end.

Definition exec_att (pol : policy) (st : state) (fa : N -> N) (ops : list op) : state * (N -> N) :=
  run_with (fun fa st o => assign_att fa pol st o) pol st fa ops.

Lemma attempt_kept : forall fa, kept_by_transforms (attempt_of fa).
Proof. intro fa. apply kept_by_stamps. unfold attempt_of. intros r r' -> -> _ H. exact H. Qed.



(** In a reachable state the head of pending is the only record with its
    sequence. *)
Lemma head_unique :
  forall pol st r rest, reachable pol st -> pending st = r :: rest ->
  forall x, In (seq x) (map seq rest ++ map seq (inflight st) ++ map (fun p => seq (prec p)) (parked st)
                        ++ map (fun e => seq (snd e)) (exhausted st)) -> seq x <> seq r.
Proof.
  intros pol st r rest R P x Hx E. pose proof (nothing_is_lost pol st (seq r) R) as C.
  unfold held in C. rewrite P in C. simpl in C. fold (cnt (map seq rest ++ map seq (inflight st) ++ map (fun p => seq (prec p)) (parked st)
                        ++ map (fun e => seq (snd e)) (exhausted st)) (seq r)) in C.
  destruct (N.eq_dec (seq r) (seq r)) as [_ | N]; [| contradiction].
  rewrite E in Hx. apply (count_occ_In N.eq_dec) in Hx.
  destruct ((seq r <? next st) && unacked (acked st) (seq r)); unfold cnt in C; lia.
Qed.

Lemma attempt_step :
  forall pol st o fa, reachable pol st -> all_held (attempt_of fa) st ->
  all_held (attempt_of (assign_att fa pol st o)) (st_of (step pol st o)).
Proof.
  intros pol st o fa R H. pose proof (invariants_hold pol st R) as I.
  destruct o as [p | g | | | | | | |]; [| | simpl assign_att; apply all_held_step;
    [apply attempt_kept | intros q E; discriminate | intros g' r rest E; discriminate | exact H] ..].
  - apply all_held_step; [apply attempt_kept | | intros g' r rest E; discriminate |].
    + intros q E. unfold attempt_of. simpl. rewrite N.eqb_refl. reflexivity.
    + apply (all_held_agree (attempt_of fa)); [| exact H].
      intros r Hin A. unfold attempt_of in *. simpl.
      destruct (held_below_next st (inv_conservation _ _ I) _ Hin) as [Lt _].
      replace (seq r =? next st) with false by (symmetry; apply N.eqb_neq; lia). exact A.
  - simpl assign_att. simpl step. unfold claim, claim_open, do_claim, stale.
    destruct (negb _); [exact H |].
    destruct (pending st) as [| r rest] eqn:P; [exact H |].
    assert (U := head_unique pol st r rest R P).
    destruct H as [Hp [Hi [Hk He]]]. rewrite P in Hp. inversion Hp as [| ? ? Hr Hrest]; subst.
    assert (Other : forall Q (l : list Q) (key : Q -> record),
              (forall q, In q l -> In (seq (key q)) (map seq rest ++ map seq (inflight st) ++ map (fun p => seq (prec p)) (parked st)
                        ++ map (fun e => seq (snd e)) (exhausted st))) ->
              Forall (fun q => attempt_of fa (key q)) l ->
              Forall (fun q => attempt_of (fun x => if x =? seq r then bump (att r) else fa x) (key q)) l).
    { intros Q l key In' F. rewrite Forall_forall in *. intros q Hq. unfold attempt_of in *.
      replace (seq (key q) =? seq r) with false by (symmetry; apply N.eqb_neq; apply (U (key q)); apply In'; exact Hq).
      apply F. exact Hq. }
    assert (C : forall sn iso, all_held (attempt_of (fun x => if x =? seq r then bump (att r) else fa x))
                  (mkState (gen st) (next st) rest (inflight st ++ [claimed r]) (parked st)
                  (exhausted st) (acked st) (recvd st) sn (retry_st st) (progressed st) iso)).
    { intros sn iso. unfold all_held; simpl. repeat split.
      - apply (Other _ rest (fun q => q)); [| exact Hrest]. intros q Hq. apply in_or_app. left. apply in_map. exact Hq.
      - apply Forall_app. split.
        + apply (Other _ (inflight st) (fun q => q)); [| exact Hi]. intros q Hq.
          apply in_or_app. right. apply in_or_app. left. apply in_map. exact Hq.
        + constructor; [| constructor]. unfold attempt_of, claimed. simpl. rewrite N.eqb_refl. reflexivity.
      - apply (Other _ (parked st) prec); [| exact Hk]. intros q Hq.
        apply in_or_app. right. apply in_or_app. right. apply in_or_app. left.
        apply (in_map (fun p => seq (prec p))). exact Hq.
      - apply (Other _ (exhausted st) snd); [| exact He]. intros q Hq.
        apply in_or_app. right. apply in_or_app. right. apply in_or_app. right.
        apply (in_map (fun e => seq (snd e))). exact Hq. }
    assert (H0 : all_held (attempt_of fa) st) by (unfold all_held; rewrite P; repeat split; assumption).
    unfold st_of, out_of.
    repeat (match goal with
            | |- context [match ?x with _ => _ end] =>
                lazymatch x with
                | context [match _ with _ => _ end] => fail
                | _ => let E := fresh "E" in destruct x eqn:E
                end
            end; cbn [fst snd]).
    all: try exact H0; apply C.
Qed.

(** 15, for attempts. *)
Theorem attempts_attached :
  forall pol g fa0 ops, let (st, fa) := exec_att pol (init g) fa0 ops in all_held (attempt_of fa) st.
Proof.
  intros pol g fa0 ops.
  apply (run_with_keeps _ (fun fa st o => assign_att fa pol st o) (fun fa st => all_held (attempt_of fa) st)).
  - intros st o fa R H. apply attempt_step; assumption.
  - apply reach_init.
  - unfold all_held; simpl. repeat split; constructor.
Qed.
