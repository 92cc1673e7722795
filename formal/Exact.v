(** * 12. The change sets are exact

    Every transition reports the projections it changed. Theorem 9
    (Proofs.v) says a step that reports nothing changed nothing. This file
    proves the converse for each projection on its own: a projection's
    flag is set if and only if the value a reader observes changed. The
    reactive shells rest on it: a reader re-runs exactly when its value is
    new.

    A reader observes a projection as the conformance corpus shows it: the
    pending and in-flight envelopes (generation, sequence, attempt,
    payload, tombstone reason), the parked entries (sequence, attempt,
    backoff, due, reason), the held dead letters (the generation and reason
    they died under, sequence, attempt, payload), the retry state, the two
    watermarks and the generation. *)

From Coq Require Import NArith List Bool Lia Permutation.
From Egress Require Import Model Proofs Invariants.
Import ListNotations.
Open Scope N_scope.

Definition envelope (g : N) (r : record) := (g, seq r, att r, payload r, dead r).

Definition v_pending (st : state) := map (envelope (gen st)) (pending st).
Definition v_inflight (st : state) := map (envelope (gen st)) (inflight st).
Definition v_parked (st : state) :=
  map (fun p => (seq (prec p), att (prec p), pbackoff p, pdue p, dead (prec p))) (parked st).
Definition v_exhausted (st : state) :=
  map (fun e : (N * dreason) * record => (fst e, seq (snd e), att (snd e), payload (snd e))) (exhausted st).

(** [flag] is set exactly when [after] differs from [before]. *)
Definition exactly {A} (flag : bool) (after before : A) : Prop := flag = true <-> after <> before.

Definition Exact (st st' : state) (ch : changes) : Prop :=
  exactly (c_pending ch) (v_pending st') (v_pending st) /\
  exactly (c_inflight ch) (v_inflight st') (v_inflight st) /\
  exactly (c_acked ch) (acked st') (acked st) /\
  exactly (c_retry ch) (retry_st st') (retry_st st) /\
  exactly (c_parked ch) (v_parked st') (v_parked st) /\
  exactly (c_exhausted ch) (v_exhausted st') (v_exhausted st) /\
  exactly (c_gen ch) (gen st') (gen st) /\
  exactly (c_recv ch) (recvd st') (recvd st).

(** ** Tools *)

Lemma exact_false : forall A (x : A), exactly false x x.
Proof. intros; unfold exactly. split; [discriminate | intro H; exfalso; apply H; reflexivity]. Qed.

Lemma exact_true : forall A (x y : A), x <> y -> exactly true x y.
Proof. intros; unfold exactly. split; auto. Qed.

Lemma exact_bool : forall A (b : bool) (x y : A), (b = true -> x <> y) -> (b = false -> x = y) -> exactly b x y.
Proof.
  intros A b x y T F. unfold exactly. destruct b; split; intro H.
  - exact (T eq_refl).
  - reflexivity.
  - discriminate.
  - exfalso. apply H. apply F. reflexivity.
Qed.

Lemma map_len_neq :
  forall A B C (f : A -> C) (g : B -> C) l1 l2, length l1 <> length l2 -> map f l1 <> map g l2.
Proof. intros A B C f g l1 l2 H E. apply H. rewrite <- (map_length f), <- (map_length g), E. reflexivity. Qed.

Lemma len_insert : forall A (key : A -> N) x l, length (insert_by key x l) = S (length l).
Proof. intros. rewrite (Permutation_length (insert_by_perm _ key x l)). reflexivity. Qed.

Lemma len_take :
  forall A (key : A -> N) s l y rest, take key s l = Some (y, rest) -> length l = S (length rest).
Proof. intros A key s l y rest H. destruct (take_perm _ key s l y rest H) as [P _]. exact (Permutation_length P). Qed.

Lemma len_filter_split :
  forall A (f : A -> bool) l, (length (filter f l) + length (filter (fun x => negb (f x)) l))%nat = length l.
Proof. intros A f l. induction l as [| a l IH]; simpl; [reflexivity |]. destruct (f a); simpl; lia. Qed.

Lemma filter_all :
  forall A (f : A -> bool) l, existsb (fun x => negb (f x)) l = false -> filter f l = l.
Proof.
  intros A f l. induction l as [| a l IH]; simpl; [reflexivity |].
  destruct (f a); simpl; [intro H; rewrite IH; auto | discriminate].
Qed.

Lemma filter_length_le' : forall A (f : A -> bool) l, (length (filter f l) <= length l)%nat.
Proof. intros A f l. induction l as [| a l IH]; simpl; [lia |]. destruct (f a); simpl; lia. Qed.

Lemma filter_shorter :
  forall A (f : A -> bool) l, existsb (fun x => negb (f x)) l = true -> length (filter f l) <> length l.
Proof.
  intros A f l. induction l as [| a l IH]; simpl; [discriminate |].
  destruct (f a); simpl.
  - intros H E. apply IH; [exact H | lia].
  - intros _ E. pose proof (filter_length_le' _ f l) as Le. lia.
Qed.

Lemma retry_eqb_eq : forall a b, opt_retry_eqb a b = true <-> a = b.
Proof.
  intros [[s1 a1 b1 e1] |] [[s2 a2 b2 e2] |]; simpl; split; intro H; try discriminate; try reflexivity.
  - unfold retry_eqb in H. simpl in H. repeat rewrite andb_true_iff in H. destruct H as [[[H1 H2] H3] H4].
    apply N.eqb_eq in H1, H2, H3. apply Bool.eqb_prop in H4. subst. reflexivity.
  - injection H as <- <- <- <-. unfold retry_eqb. simpl.
    rewrite !N.eqb_refl, Bool.eqb_reflx. reflexivity.
Qed.

Lemma Exact_nochange : forall st, Exact st st nochange.
Proof. intro st. unfold Exact. repeat split; intro H; try discriminate; exfalso; apply H; reflexivity. Qed.

Lemma clear_retry_exact :
  forall s rt, exactly (snd (clear_retry s rt)) (fst (clear_retry s rt)) rt.
Proof.
  intros s [x |]; unfold clear_retry; simpl; [| apply exact_false].
  destruct (rseq x =? s); simpl; [apply exact_true; discriminate | apply exact_false].
Qed.

Ltac conj_split := repeat match goal with |- _ /\ _ => split end.

(** ** Each transition *)

Lemma enqueue_exact : forall st p, Exact st (st_of (enqueue st p)) (ch_of (enqueue st p)).
Proof.
  intros st p. unfold Exact, enqueue, st_of, ch_of, v_pending, v_inflight, v_parked, v_exhausted; simpl.
  conj_split; try apply exact_false.
  apply exact_true, map_len_neq. rewrite app_length. simpl. lia.
Qed.

Lemma claim_exact : forall pol st g, Exact st (st_of (claim pol st g)) (ch_of (claim pol st g)).
Proof.
  intros pol st g. unfold claim, stale.
  destruct (negb (g =? gen st)); [apply Exact_nochange |].
  destruct (pending st) as [| r rest] eqn:P; [apply Exact_nochange |].
  assert (C : Exact st (st_of (do_claim st r rest)) (ch_of (do_claim st r rest))).
  { unfold Exact, do_claim, st_of, ch_of, v_pending, v_inflight, v_parked, v_exhausted; simpl.
    conj_split; try apply exact_false; apply exact_true, map_len_neq;
      [rewrite P; simpl; lia | rewrite app_length; simpl; lia]. }
  assert (O : Exact st (st_of (claim_open pol st r rest)) (ch_of (claim_open pol st r rest))).
  { unfold claim_open. destruct (isol st); [| | apply Exact_nochange];
      (destruct (window_end pol st <=? seq r); [apply Exact_nochange | exact C]). }
  destruct (ordering_of pol); [exact O |].
  destruct (lowest _); [| exact O].
  destruct (_ <? seq r); [apply Exact_nochange | exact O].
Qed.

Lemma rises_neq : forall rc t, rises rc t = true -> Some t <> rc.
Proof.
  intros [r |] t; simpl; [| discriminate]. intros H E. injection E as E. subst. apply N.ltb_lt in H. lia.
Qed.

Lemma ack_exact : forall st g t, Exact st (st_of (ack st g t)) (ch_of (ack st g t)).
Proof.
  intros st g t. unfold ack, stale.
  destruct (negb (g =? gen st)); [apply Exact_nochange |].
  destruct (unsent st t); [apply Exact_nochange |].
  assert (A : acked st <> Some t -> Exact st (st_of (advance st t)) (ch_of (advance st t))).
  { intro Hne. unfold Exact, advance, st_of, ch_of, v_pending, v_inflight, v_parked, v_exhausted; simpl.
    conj_split.
    - apply exact_bool; intro H; [apply map_len_neq, filter_shorter, H | rewrite (filter_all _ _ _ H); reflexivity].
    - apply exact_bool; intro H; [apply map_len_neq, filter_shorter, H | rewrite (filter_all _ _ _ H); reflexivity].
    - apply exact_true. intro E. apply Hne. symmetry. exact E.
    - destruct (retry_st st) as [x |]; simpl; [| apply exact_false].
      destruct (rseq x <=? t); [apply exact_true; discriminate | apply exact_false].
    - apply exact_bool; intro H; [apply map_len_neq, filter_shorter, H | rewrite (filter_all _ _ _ H); reflexivity].
    - apply exact_bool; intro H; [apply map_len_neq, filter_shorter, H | rewrite (filter_all _ _ _ H); reflexivity].
    - apply exact_false.
    - apply exact_bool; intro H; [rewrite H; apply rises_neq, H | rewrite H; reflexivity]. }
  destruct (acked st) as [w |] eqn:W.
  - destruct (t <=? w) eqn:T; [apply Exact_nochange |]. apply A. intro E. injection E as E. subst.
    apply N.leb_gt in T. lia.
  - apply A. discriminate.
Qed.

Lemma received_exact : forall st g t, Exact st (st_of (received st g t)) (ch_of (received st g t)).
Proof.
  intros st g t. unfold received, stale, nonempty.
  destruct (negb (g =? gen st)); [apply Exact_nochange |].
  destruct (unsent st t); [apply Exact_nochange |].
  set (moved := filter (fun r => seq r <=? t) (pending st)).
  destruct (rises (recvd st) t) eqn:R; destruct moved as [| m ms] eqn:M; simpl;
    try apply Exact_nochange;
    unfold Exact, st_of, ch_of, v_pending, v_inflight, v_parked, v_exhausted; simpl; conj_split;
    try apply exact_false.
  all: try (apply exact_true, rises_neq, R).
  all: try (apply exact_true, map_len_neq;
            pose proof (len_filter_split _ (fun r => seq r <=? t) (pending st)) as L;
            fold moved in L; rewrite M in L; simpl in L; lia).
  all: try (apply exact_true, map_len_neq; rewrite app_length; simpl; lia).
  all: assert (N0 : filter (fun r => negb (seq r <=? t)) (pending st) = pending st)
         by (apply filter_none_keeps_rest; fold moved; rewrite M; reflexivity).
  all: rewrite ?N0, ?app_nil_r; apply exact_false.
Qed.

Lemma retry_change_exact : forall a b, exactly (negb (opt_retry_eqb a b)) b a.
Proof.
  intros a b. destruct (opt_retry_eqb a b) eqn:E; simpl.
  - apply retry_eqb_eq in E. subst. apply exact_false.
  - apply exact_true. intro H. rewrite H in E. rewrite (proj2 (retry_eqb_eq a a) eq_refl) in E. discriminate.
Qed.

Ltac close_lengths :=
  first [ apply exact_false
        | apply exact_true, map_len_neq; rewrite ?len_insert, ?app_length; simpl; lia ].

Lemma fail_exact :
  forall pol st g s kd now sp, Exact st (st_of (fail pol st g s kd now sp)) (ch_of (fail pol st g s kd now sp)).
Proof.
  intros pol st g s kd now sp. unfold fail, stale.
  destruct (negb (g =? gen st)); [apply Exact_nochange |].
  destruct (take seq s (inflight st)) as [[r rest] |] eqn:T; [| apply Exact_nochange].
  pose proof (len_take _ seq s _ _ _ T) as LT.
  cbv zeta. unfold bury, failed. cbn [dead fails].
  destruct (dead r) eqn:Dr; destruct (hold pol) eqn:Hh;
  destruct kd; try destruct (budget pol <? fails r + 1) eqn:B;
    unfold Exact, st_of, ch_of, v_pending, v_inflight, v_parked, v_exhausted; simpl; conj_split;
    first [apply retry_change_exact | close_lengths].
Qed.

Lemma retry_now_exact : forall st g s, Exact st (st_of (retry_now st g s)) (ch_of (retry_now st g s)).
Proof.
  intros st g s. unfold retry_now, stale.
  destruct (negb (g =? gen st)); [apply Exact_nochange |].
  destruct (take (fun p => seq (prec p)) s (parked st)) as [[p rest] |] eqn:T; [| apply Exact_nochange].
  pose proof (len_take _ _ s _ _ _ T) as LT.
  pose proof (clear_retry_exact s (retry_st st)) as X.
  destruct (clear_retry s (retry_st st)) as [rt cleared]. simpl in X.
  unfold Exact, st_of, ch_of, v_pending, v_inflight, v_parked, v_exhausted; simpl; conj_split;
    first [exact X | close_lengths].
Qed.

Lemma requeue_exact : forall st g s, Exact st (st_of (requeue st g s)) (ch_of (requeue st g s)).
Proof.
  intros st g s. unfold requeue, stale.
  destruct (negb (g =? gen st)); [apply Exact_nochange |].
  destruct (take (fun e => seq (snd e)) s (exhausted st)) as [[[x r] rest] |] eqn:T; [| apply Exact_nochange].
  pose proof (len_take _ _ s _ _ _ T) as LT.
  pose proof (clear_retry_exact s (retry_st st)) as X.
  destruct (clear_retry s (retry_st st)) as [rt cleared]. simpl in X.
  unfold Exact, st_of, ch_of, v_pending, v_inflight, v_parked, v_exhausted; simpl; conj_split;
    first [exact X | close_lengths].
Qed.

Lemma timeout_exact : forall st now, Exact st (st_of (timeout st now)) (ch_of (timeout st now)).
Proof.
  intros st now. unfold timeout. cbv zeta.
  pose proof (len_filter_split _ (is_due now) (parked st)) as L.
  pose proof (Permutation_length (fold_insert_prec_perm (filter (is_due now) (parked st)) (pending st))) as F.
  rewrite app_length, map_length in F.
  assert (R : forall c : bool, exactly c (if c then None else retry_st st) (retry_st st) \/ retry_st st = None).
  { intro c. destruct c; [| left; apply exact_false].
    destruct (retry_st st); [left; apply exact_true; discriminate | right; reflexivity]. }
  destruct (filter (is_due now) (parked st)) as [| d ds] eqn:D; simpl in *.
  - assert (K : filter (fun p => negb (is_due now p)) (parked st) = parked st)
      by (apply filter_none_keeps_rest; exact D).
    unfold Exact, st_of, ch_of, v_pending, v_inflight, v_parked, v_exhausted; simpl; rewrite K; conj_split;
      try apply exact_false.
    destruct (retry_st st); apply exact_false.
  - unfold Exact, st_of, ch_of, v_pending, v_inflight, v_parked, v_exhausted; simpl; conj_split;
      try close_lengths.
    destruct (retry_st st) as [x |]; [| apply exact_false].
    destruct (_ || _); [apply exact_true; discriminate | apply exact_false].
Qed.

Lemma regen_exact :
  forall g g' l l', g <> g' -> (length l' <= length l)%nat ->
  exactly (nonempty l) (map (envelope g) l) (map (envelope g') l').
Proof.
  intros g g' [| a l] l' H Le; simpl.
  - destruct l'; [apply exact_false | simpl in Le; lia].
  - apply exact_true. destruct l' as [| b l']; [discriminate |].
    simpl. intro E. inversion E. contradiction.
Qed.

Lemma emptied_exact : forall A B (f : A -> B) l, exactly (nonempty l) [] (map f l).
Proof. intros A B f [| a l]; simpl; [apply exact_false | apply exact_true; discriminate]. Qed.

Lemma fold_ex_exact :
  forall A (h : (N * dreason) * record -> A) g rs kept ex,
  exactly (nonempty kept) (map h (fold_left (fun acc r => insert_ex ((g, rs), r) acc) kept ex)) (map h ex).
Proof.
  intros A h g rs [| k ks] ex; simpl; [apply exact_false |].
  apply exact_true, map_len_neq.
  rewrite (Permutation_length (fold_insert_ex_perm g rs ks _)), app_length, map_length, len_insert. lia.
Qed.

Lemma reconnect_exact : forall pol st g, Exact st (st_of (reconnect pol st g)) (ch_of (reconnect pol st g)).
Proof.
  intros pol st g. unfold reconnect, stale.
  destruct (g <? gen st) eqn:Lt; [apply Exact_nochange |].
  destruct (g =? gen st) eqn:Eq; [apply Exact_nochange |].
  apply N.eqb_neq in Eq. cbv zeta.
  unfold Exact, st_of, ch_of, v_pending, v_inflight, v_parked, v_exhausted; simpl; conj_split.
  - apply regen_exact; [exact Eq |].
    rewrite (Permutation_length (fold_insert_perm _ _)), app_length. lia.
  - apply emptied_exact.
  - apply exact_false.
  - destruct (retry_st st) as [x |]; [| apply exact_false].
    destruct (existsb _ _); [apply exact_true; discriminate | apply exact_false].
  - apply emptied_exact.
  - apply fold_ex_exact.
  - apply exact_true. exact Eq.
  - apply exact_false.
Qed.

(** ** 12. The theorem *)

Theorem change_sets_exact :
  forall pol st o, Exact st (st_of (step pol st o)) (ch_of (step pol st o)).
Proof.
  intros pol st o. destruct o; simpl.
  - apply enqueue_exact.
  - apply claim_exact.
  - apply ack_exact.
  - apply received_exact.
  - apply fail_exact.
  - apply retry_now_exact.
  - apply timeout_exact.
  - apply requeue_exact.
  - apply reconnect_exact.
Qed.
