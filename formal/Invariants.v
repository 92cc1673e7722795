(** * The invariants of the egress core, preserved by every transition:
    conservation (7), the window bound (6), sorted pending (8), the bound on
    held sequences (1), the retry budget of parked records (5). *)

From Coq Require Import NArith List Bool Lia Permutation Sorting.Sorted.
From Egress Require Import Model Proofs.
Import ListNotations.
Open Scope N_scope.

(** ** Lists: what insert, take, fold and filter do to the elements *)

Lemma insert_by_perm : forall A (key : A -> N) x l, Permutation (insert_by key x l) (x :: l).
Proof.
  intros A key x l. induction l as [| a l IH]; simpl; [auto |].
  destruct (key x <? key a); [auto |].
  eapply perm_trans; [apply perm_skip; exact IH | apply perm_swap].
Qed.

Lemma Forall_insert_by :
  forall A (P : A -> Prop) key x l, P x -> Forall P l -> Forall P (insert_by key x l).
Proof.
  intros A P key x l Hx Hl. apply (Permutation_Forall (Permutation_sym (insert_by_perm _ key x l))).
  constructor; assumption.
Qed.

Lemma take_perm :
  forall A (key : A -> N) s l y rest, take key s l = Some (y, rest) -> Permutation l (y :: rest) /\ key y = s.
Proof.
  intros A key s l. induction l as [| a l IH]; intros y rest H; simpl in H; [discriminate |].
  destruct (key a =? s) eqn:E.
  - inversion H; subst. split; [auto | apply N.eqb_eq; exact E].
  - destruct (take key s l) as [[y' t'] |] eqn:T; [| discriminate].
    inversion H; subst. destruct (IH y t' eq_refl) as [P K].
    split; [| exact K]. eapply perm_trans; [apply perm_skip; exact P | apply perm_swap].
Qed.

Lemma fold_insert_perm :
  forall moved pend, Permutation (fold_left (fun acc r => insert r acc) moved pend) (moved ++ pend).
Proof.
  induction moved as [| m ms IH]; intros pend; simpl; [auto |].
  eapply perm_trans; [apply IH |].
  eapply perm_trans; [apply Permutation_app_head; apply insert_by_perm |].
  apply Permutation_sym, Permutation_middle.
Qed.

Lemma fold_insert_prec_perm :
  forall due pend,
  Permutation (fold_left (fun acc p => insert (prec p) acc) due pend) (map prec due ++ pend).
Proof.
  induction due as [| m ms IH]; intros pend; simpl; [auto |].
  eapply perm_trans; [apply IH |].
  eapply perm_trans; [apply Permutation_app_head; apply insert_by_perm |].
  apply Permutation_sym, Permutation_middle.
Qed.

(** ** Occurrence counts *)

Definition cnt (l : list N) (x : N) : nat := count_occ N.eq_dec l x.

Lemma cnt_app : forall l1 l2 x, cnt (l1 ++ l2) x = (cnt l1 x + cnt l2 x)%nat.
Proof. intros. apply count_occ_app. Qed.

Lemma cnt_cons : forall a l x, cnt (a :: l) x = ((if N.eq_dec a x then 1 else 0) + cnt l x)%nat.
Proof. intros. unfold cnt. simpl. destruct (N.eq_dec a x); reflexivity. Qed.

Lemma cnt_nil : forall x, cnt [] x = 0%nat.
Proof. reflexivity. Qed.

Lemma cnt_perm : forall A (f : A -> N) l1 l2 x, Permutation l1 l2 -> cnt (map f l1) x = cnt (map f l2) x.
Proof. intros. apply Permutation_count_occ, Permutation_map. assumption. Qed.

Lemma cnt_filter :
  forall A (key : A -> N) (f : A -> bool) l x,
  (forall a, key a = x -> f a = f a) ->
  (cnt (map key (filter f l)) x + cnt (map key (filter (fun a => negb (f a)) l)) x = cnt (map key l) x)%nat.
Proof.
  intros A key f l x _. induction l as [| a l IH]; [reflexivity |].
  cbn [filter]. destruct (f a); cbn [negb map]; rewrite !cnt_cons; lia.
Qed.

Lemma cnt_filter_above :
  forall A (key : A -> N) t l x,
  cnt (map key (filter (fun a => above t (key a)) l)) x = if t <? x then cnt (map key l) x else 0%nat.
Proof.
  intros A key t l x. induction l as [| a l IH].
  - destruct (t <? x); reflexivity.
  - cbn [filter map]. rewrite cnt_cons. unfold above at 1.
    destruct (t <? key a) eqn:E; cbn [map]; rewrite ?cnt_cons, IH;
      destruct (N.eq_dec (key a) x) as [Q | Q]; subst; rewrite ?E; try reflexivity.
Qed.

(** ** 7. Conservation: every assigned, unacknowledged sequence is held
    exactly once; nothing else is held *)

Definition held (st : state) : list N :=
  map seq (pending st) ++ map seq (inflight st) ++ map (fun p => seq (prec p)) (parked st)
  ++ map (fun e => seq (snd e)) (exhausted st).

Definition unacked (a : option N) (x : N) : bool :=
  match a with None => true | Some w => w <? x end.

Definition owed (st : state) (x : N) : nat :=
  if (x <? next st) && unacked (acked st) x then 1 else 0.

Definition acked_assigned (st : state) : Prop :=
  match acked st with Some w => w < next st | None => True end.

Theorem acked_assigned_step : forall pol st o, acked_assigned st -> acked_assigned (st_of (step pol st o)).
Proof.
  intros pol st o H. unfold acked_assigned in *. destruct (acked st) as [w |] eqn:A;
    destruct o; unfold_ops; simpl; rewrite ?A; split_goal; simpl in *; facts; subst; try congruence; try lia;
    exact I.
Qed.

Ltac counts :=
  unfold held in *; simpl in *; rewrite ?map_app, ?cnt_app in *; cbn [map seq prec snd] in *;
  rewrite ?cnt_cons, ?cnt_nil in *.

Ltac finish :=
  repeat match goal with
  | H : context [N.eq_dec ?a ?b] |- _ => destruct (N.eq_dec a b)
  | |- context [N.eq_dec ?a ?b] => destruct (N.eq_dec a b)
  end; subst; simpl in *; lia.

(** Rewrites [Hc] through the record the step took out of a list. *)
Ltac use_source Hc :=
  match goal with
  | H : pending _ = _ :: _ |- _ => rewrite H in Hc
  | H : take _ _ _ = Some _ |- _ =>
      let P := fresh "P" in let K := fresh "K" in
      destruct (take_perm _ _ _ _ _ _ H) as [P K]; rewrite (cnt_perm _ _ _ _ _ P) in Hc
  end.

Ltac use_inserts := rewrite ?(cnt_perm _ _ _ _ _ (insert_by_perm _ _ _ _)).

Lemma owed_enqueue : forall st x p,
  acked_assigned st ->
  owed (st_of (enqueue st p)) x = ((if N.eq_dec (next st) x then 1 else 0) + owed st x)%nat.
Proof.
  intros st x p Ha. unfold owed, acked_assigned in *. simpl.
  destruct (N.eq_dec (next st) x) as [Q | Q].
  - subst. replace (next st <? next st + 1) with true by (symmetry; apply N.ltb_lt; lia).
    replace (next st <? next st) with false by (symmetry; apply N.ltb_ge; lia).
    destruct (acked st) as [w |]; simpl; [| reflexivity].
    replace (w <? next st) with true by (symmetry; apply N.ltb_lt; lia). reflexivity.
  - replace (x <? next st + 1) with (x <? next st); [reflexivity |].
    destruct (x <? next st) eqn:L1; destruct (x <? next st + 1) eqn:L2; facts; try lia; reflexivity.
Qed.

Lemma conservation_advance :
  forall st t x, (match acked st with Some w => w < t | None => True end) ->
  cnt (held st) x = owed st x -> cnt (held (st_of (advance st t))) x = owed (st_of (advance st t)) x.
Proof.
  intros st t x Hw Hc. unfold advance, st_of, owed, held in *; simpl in *.
  rewrite !cnt_app in *.
  pose proof (cnt_filter_above _ seq t (pending st) x) as F1.
  pose proof (cnt_filter_above _ seq t (inflight st) x) as F2.
  pose proof (cnt_filter_above _ (fun p => seq (prec p)) t (parked st) x) as F3.
  pose proof (cnt_filter_above _ (fun e => seq (snd e)) t (exhausted st) x) as F4.
  cbn beta in F1, F2, F3, F4. rewrite F1, F2, F3, F4.
  destruct (t <? x) eqn:T; [| rewrite andb_false_r; reflexivity].
  rewrite andb_true_r. apply N.ltb_lt in T.
  destruct (acked st) as [w |]; simpl in *; [| rewrite andb_true_r in Hc; lia].
  replace (w <? x) with true in Hc by (symmetry; apply N.ltb_lt; lia). rewrite andb_true_r in Hc. lia.
Qed.

Theorem conservation_step :
  forall pol st o, acked_assigned st -> (forall x, cnt (held st) x = owed st x) ->
  forall x, cnt (held (st_of (step pol st o))) x = owed (st_of (step pol st o)) x.
Proof.
  intros pol st o Ha Hc x. specialize (Hc x).
  destruct o.
  - (* enqueue *)
    simpl step. rewrite owed_enqueue by exact Ha. rewrite <- Hc. unfold enqueue, st_of; simpl.
    counts. lia.
  - (* claim *)
    unfold step, claim, do_claim, stale, st_of; split_goal; simpl; try exact Hc; unfold owed in *; simpl;
      counts; use_source Hc; counts; finish.
  - (* ack *)
    unfold step, ack, stale. destruct (negb (g =? gen st)); [exact Hc |].
    destruct (next st <=? t); [exact Hc |].
    destruct (acked st) as [w |] eqn:A; [destruct (t <=? w) eqn:W; [exact Hc |]; apply N.leb_gt in W |];
      apply conservation_advance; try rewrite A; auto.
  - (* fail *)
    unfold step, fail, stale, st_of; split_goal; simpl; try exact Hc; unfold owed in *; simpl;
      counts; use_source Hc; counts; use_inserts; counts; finish.
  - (* retry_now *)
    unfold step, retry_now, stale, st_of; split_goal; simpl; try exact Hc; unfold owed in *; simpl;
      counts; use_source Hc; counts; use_inserts; counts; finish.
  - (* timeout *)
    unfold step, timeout, st_of; simpl; unfold owed in *; simpl.
    counts. rewrite (cnt_perm _ _ _ _ _ (fold_insert_prec_perm _ _)), map_app, cnt_app, map_map.
    pose proof (cnt_filter _ (fun p => seq (prec p)) (is_due now) (parked st) x (fun _ _ => eq_refl)).
    split_goal; simpl; finish.
  - (* requeue *)
    unfold step, requeue, stale, st_of; split_goal; simpl; try exact Hc; unfold owed in *; simpl;
      counts; use_source Hc; counts; use_inserts; counts; finish.
  - (* reconnect *)
    unfold step, reconnect, stale, st_of; destruct (g <? gen st); [exact Hc |];
      destruct (g =? gen st); [exact Hc |]; unfold owed in *; simpl; unfold held in *; simpl in *;
      rewrite !cnt_app in *; rewrite (cnt_perm _ _ _ _ _ (fold_insert_perm _ _)), !map_app, !cnt_app, map_map;
      finish.
Qed.

(** ** 6. The window bound *)

Lemma take_length : forall A (key : A -> N) s l y rest, take key s l = Some (y, rest) -> length l = S (length rest).
Proof. intros. apply take_perm in H. destruct H as [P _]. apply Permutation_length in P. exact P. Qed.

Lemma filter_length : forall A (f : A -> bool) l, (length (filter f l) <= length l)%nat.
Proof. intros A f l. induction l as [| a l IH]; simpl; [lia |]. destruct (f a); simpl; lia. Qed.

Definition window_ok (pol : policy) (st : state) : Prop := N.of_nat (length (inflight st)) <= limit pol.

Theorem window_step : forall pol st o, window_ok pol st -> window_ok pol (st_of (step pol st o)).
Proof.
  intros pol st o H. unfold window_ok in *.
  destruct o; unfold_ops; simpl; split_goal; simpl in *; facts; try exact H;
    try (rewrite app_length; simpl; lia).
  all: try (match goal with T : take _ _ _ = Some _ |- _ => apply take_length in T end; lia).
  all: try (unfold advance; simpl; pose proof (filter_length _ (fun r => above t (seq r)) (inflight st)); lia).
  all: simpl; lia.
Qed.

(** ** 8. Pending stays sorted by sequence *)

Definition seq_le (a b : record) : Prop := seq a <= seq b.
Definition sorted_pending (st : state) : Prop := StronglySorted seq_le (pending st).

Lemma insert_sorted : forall r l, StronglySorted seq_le l -> StronglySorted seq_le (insert r l).
Proof.
  intros r l H. induction H as [| a l Hs IH Hf]; simpl; [repeat constructor |].
  destruct (seq r <? seq a) eqn:E.
  - apply N.ltb_lt in E. constructor; [constructor; assumption |].
    constructor; [unfold seq_le; lia |].
    eapply Forall_impl; [| exact Hf]. unfold seq_le. intros b Hb. lia.
  - apply N.ltb_ge in E. constructor; [exact IH |]. apply Forall_insert_by; [unfold seq_le; lia | exact Hf].
Qed.

Lemma fold_insert_sorted :
  forall moved pend, StronglySorted seq_le pend -> StronglySorted seq_le (fold_left (fun acc r => insert r acc) moved pend).
Proof. induction moved; intros; simpl; auto using insert_sorted. Qed.

Lemma fold_insert_prec_sorted :
  forall due pend, StronglySorted seq_le pend ->
  StronglySorted seq_le (fold_left (fun acc p => insert (prec p) acc) due pend).
Proof. induction due; intros; simpl; auto using insert_sorted. Qed.

Lemma Forall_filter : forall A (P : A -> Prop) f l, Forall P l -> Forall P (filter f l).
Proof. intros A P f l H. induction H; simpl; [auto |]. destruct (f x); auto. Qed.

Lemma filter_sorted : forall f l, StronglySorted seq_le l -> StronglySorted seq_le (filter f l).
Proof.
  intros f l H. induction H as [| a l Hs IH Hf]; simpl; [constructor |].
  destruct (f a); [constructor; [exact IH | apply Forall_filter; exact Hf] | exact IH].
Qed.

(** ** 1. (second half) Every held sequence was assigned: it lies below
    [next], and above the watermark *)

Theorem held_below_next :
  forall st, (forall x, cnt (held st) x = owed st x) ->
  forall x, In x (held st) -> x < next st /\ unacked (acked st) x = true.
Proof.
  intros st Hc x Hin. apply (count_occ_In N.eq_dec) in Hin. fold (cnt (held st) x) in Hin.
  rewrite Hc in Hin. unfold owed in Hin.
  destruct ((x <? next st) && unacked (acked st) x) eqn:E; [| lia].
  apply andb_true_iff in E. destruct E as [E1 E2]. apply N.ltb_lt in E1. auto.
Qed.

Lemma sorted_append :
  forall l r, StronglySorted seq_le l -> (forall y, In y l -> seq y < seq r) -> StronglySorted seq_le (l ++ [r]).
Proof.
  intros l r H. induction H as [| a l Hs IH Hf]; intros Hlt; simpl; [repeat constructor |].
  constructor.
  - apply IH. intros y Hy. apply Hlt. right. exact Hy.
  - apply Forall_app. split; [exact Hf |]. constructor; [| constructor].
    unfold seq_le. specialize (Hlt a (or_introl eq_refl)). lia.
Qed.

Theorem sorted_step :
  forall pol st o, (forall y, In y (pending st) -> seq y < next st) ->
  sorted_pending st -> sorted_pending (st_of (step pol st o)).
Proof.
  intros pol st o Hb H. unfold sorted_pending in *.
  destruct o; unfold_ops; simpl.
  - apply sorted_append; [exact H |]. simpl. exact Hb.
  - destruct (negb (g =? gen st)); [exact H |]. destruct (pending st) as [| r rest] eqn:P; [simpl; rewrite P; exact H |].
    apply StronglySorted_inv in H. destruct H as [Hs Hf].
    split_goal; simpl; try (rewrite P; constructor; assumption); exact Hs.
  - split_goal; simpl; try exact H; apply filter_sorted; exact H.
  - split_goal; simpl; exact H.
  - split_goal; simpl; try exact H; apply insert_sorted; exact H.
  - apply fold_insert_prec_sorted; exact H.
  - split_goal; simpl; try exact H; apply insert_sorted; exact H.
  - destruct (g <? gen st); [exact H |]. destruct (g =? gen st); [exact H |]. simpl.
    apply fold_insert_sorted; exact H.
Qed.

(** ** 5. Attempts are bounded by the retry budget *)

Definition in_budget (pol : policy) (extra : N) (r : record) : Prop :=
  bstart r <= att r /\ att r - bstart r <= budget pol + extra.

Lemma Forall_take :
  forall A (P : A -> Prop) key s l y rest, take key s l = Some (y, rest) -> Forall P l -> P y /\ Forall P rest.
Proof.
  intros A P key s l y rest T H. destruct (take_perm _ _ _ _ _ _ T) as [Pm _].
  apply (Permutation_Forall Pm) in H. inversion H; subst. auto.
Qed.



(** Always: a record is only parked, that is, scheduled for another
    attempt by a failure, while its failures in the current budget are
    within the budget. *)
Definition parked_in_budget (pol : policy) (st : state) : Prop :=
  Forall (fun p => in_budget pol 0 (prec p)) (parked st).

(** Claims: records waiting have been claimed at most [budget] times in
    their budget, records in flight at most [budget + 1]. *)
Definition claims_in_budget (pol : policy) (st : state) : Prop :=
  Forall (in_budget pol 0) (pending st) /\ Forall (in_budget pol 1) (inflight st) /\
  parked_in_budget pol st /\ Forall (fun e => bstart (snd e) <= att (snd e)) (exhausted st).

Ltac forall_tac :=
  repeat match goal with
  | |- Forall _ (filter _ _) => apply Forall_filter
  | |- Forall _ (_ ++ _) => apply Forall_app; split
  | |- Forall _ (insert_by _ _ _) => apply Forall_insert_by
  | |- Forall _ [] => constructor
  | |- Forall _ (_ :: _) => constructor
  end.

Theorem claims_in_budget_step :
  forall pol st o, (forall g, o <> Reconnect g) ->
  claims_in_budget pol st -> claims_in_budget pol (st_of (step pol st o)).
Proof.
  intros pol st o Hno [Hp [Hi [Hk He]]]. unfold claims_in_budget, parked_in_budget, in_budget in *.
  destruct o; [| | | | | | | exfalso; exact (Hno g eq_refl)]; unfold_ops; simpl.
  - repeat split; forall_tac; simpl; try lia; assumption.
  - destruct (negb _); [auto |]. destruct (pending st) as [| r rest] eqn:P; [simpl; rewrite P; auto |].
    inversion Hp as [| ? ? Hr Hrest]; subst.
    split_goal; simpl; try (rewrite P; auto); repeat split; forall_tac; simpl; try lia; assumption.
  - split_goal; simpl; auto; repeat split; forall_tac; assumption.
  - split_goal; simpl; auto;
      match goal with T : take _ _ _ = Some _ |- _ => destruct (Forall_take _ _ _ _ _ _ _ T Hi) as [Hr Hrest] end;
      repeat split; forall_tac; simpl; facts; try lia; try assumption.
  - split_goal; simpl; auto;
      match goal with T : take _ _ _ = Some _ |- _ => destruct (Forall_take _ _ _ _ _ _ _ T Hk) as [Hr Hrest] end;
      repeat split; forall_tac; simpl in *; try lia; try assumption.
  - repeat split; try assumption; forall_tac; try assumption.
    + apply (Permutation_Forall (Permutation_sym (fold_insert_prec_perm _ _))). apply Forall_app. split; [| assumption].
      apply Forall_map. apply Forall_filter. eapply Forall_impl; [| exact Hk]. simpl. intros a [A1 A2]. lia.
  - split_goal; simpl; auto;
      match goal with T : take _ _ _ = Some _ |- _ => destruct (Forall_take _ _ _ _ _ _ _ T He) as [Hr Hrest] end;
      repeat split; forall_tac; simpl in *; try lia; try assumption.
Qed.

Theorem parked_in_budget_step :
  forall pol st o, (Forall (fun r => bstart r <= att r) (inflight st)) ->
  parked_in_budget pol st -> parked_in_budget pol (st_of (step pol st o)).
Proof.
  intros pol st o Hi Hk. unfold parked_in_budget, in_budget in *.
  destruct o; unfold_ops; simpl; split_goal; simpl; auto; forall_tac; try assumption.
  all: match goal with
       | T : take _ _ _ = Some _ |- _ =>
           first [ destruct (Forall_take _ _ _ _ _ _ _ T Hi) as [Hr Hr']
                 | destruct (Forall_take _ _ _ _ _ _ _ T Hk) as [Hr Hr'] ]
       end; simpl in *; facts; try lia; assumption.
Qed.

(** The claim bound does not survive a reconnect: a record in flight is
    replayed and claimed again without having failed. Budget 0, one
    record, one claim, a reconnect, a second claim: two claims in one
    budget of 0 retries. *)
Example reconnect_replays_beyond_the_budget :
  let pol := mkPolicy 1 0 1 1 Pipelined in
  let s1 := st_of (step pol (init 0) (Enqueue 0)) in
  let s2 := st_of (step pol s1 (Claim 0)) in
  let s3 := st_of (step pol s2 (Reconnect 1)) in
  out_of (step pol s3 (Claim 1)) = OClaimed 1 0 2 0.
Proof. reflexivity. Qed.

(** ** Every invariant holds in every reachable state *)

Definition stamped (r : record) : Prop := bstart r <= att r.

Definition stamps_ok (st : state) : Prop :=
  Forall stamped (pending st) /\ Forall stamped (inflight st) /\
  Forall (fun p => stamped (prec p)) (parked st) /\ Forall (fun e => stamped (snd e)) (exhausted st).

Theorem stamps_step : forall pol st o, stamps_ok st -> stamps_ok (st_of (step pol st o)).
Proof.
  intros pol st o [Hp [Hi [Hk He]]]. unfold stamps_ok, stamped in *.
  destruct o; unfold_ops; simpl.
  - repeat split; forall_tac; simpl; try lia; assumption.
  - destruct (negb _); [auto |]. destruct (pending st) as [| r rest] eqn:P; [simpl; rewrite P; auto |].
    inversion Hp as [| ? ? Hr Hrest]; subst.
    split_goal; simpl; try (rewrite P; auto); repeat split; forall_tac; simpl; try lia; assumption.
  - split_goal; simpl; auto; repeat split; forall_tac; assumption.
  - split_goal; simpl; auto;
      match goal with T : take _ _ _ = Some _ |- _ => destruct (Forall_take _ _ _ _ _ _ _ T Hi) as [Hr Hrest] end;
      repeat split; forall_tac; simpl; try assumption.
  - split_goal; simpl; auto;
      match goal with T : take _ _ _ = Some _ |- _ => destruct (Forall_take _ _ _ _ _ _ _ T Hk) as [Hr Hrest] end;
      repeat split; forall_tac; simpl in *; try assumption.
  - repeat split; try assumption; forall_tac; try assumption.
    apply (Permutation_Forall (Permutation_sym (fold_insert_prec_perm _ _))). apply Forall_app. split; [| assumption].
    apply Forall_map. apply Forall_filter. exact Hk.
  - split_goal; simpl; auto;
      match goal with T : take _ _ _ = Some _ |- _ => destruct (Forall_take _ _ _ _ _ _ _ T He) as [Hr Hrest] end;
      repeat split; forall_tac; simpl in *; try lia; try assumption.
  - destruct (g <? gen st); [auto |]. destruct (g =? gen st); [auto |]. simpl.
    repeat split; forall_tac; try assumption.
    apply (Permutation_Forall (Permutation_sym (fold_insert_perm _ _))).
    apply Forall_app. split; [| assumption]. apply Forall_app. split; [assumption |]. apply Forall_map. exact Hk.
Qed.

Record Inv (pol : policy) (st : state) : Prop := {
  inv_acked : acked_assigned st;
  inv_conservation : forall x, cnt (held st) x = owed st x;
  inv_window : window_ok pol st;
  inv_sorted : sorted_pending st;
  inv_parked : parked_in_budget pol st;
  inv_stamps : stamps_ok st }.

Inductive reachable (pol : policy) : state -> Prop :=
| reach_init : forall g, reachable pol (init g)
| reach_step : forall st o, reachable pol st -> reachable pol (st_of (step pol st o)).

Theorem inv_init : forall pol g, Inv pol (init g).
Proof.
  intros pol g. constructor; unfold acked_assigned, window_ok, sorted_pending, parked_in_budget, stamps_ok; simpl;
    auto; try lia; try constructor; try (repeat split; constructor).
  intros x. unfold owed. simpl. destruct (x <? 0) eqn:E; [apply N.ltb_lt in E; lia | reflexivity].
Qed.

Theorem inv_step : forall pol st o, Inv pol st -> Inv pol (st_of (step pol st o)).
Proof.
  intros pol st o [Ha Hc Hw Hs Hk Ht]. constructor.
  - apply acked_assigned_step; exact Ha.
  - apply conservation_step; assumption.
  - apply window_step; exact Hw.
  - apply sorted_step; [| exact Hs].
    intros y Hy. apply (held_below_next st Hc). unfold held. apply in_or_app. left. apply in_map. exact Hy.
  - apply parked_in_budget_step; [destruct Ht as [_ [Hi _]]; exact Hi | exact Hk].
  - apply stamps_step; exact Ht.
Qed.

Theorem invariants_hold : forall pol st, reachable pol st -> Inv pol st.
Proof.
  intros pol st R. induction R; [apply inv_init | apply inv_step; assumption].
Qed.

(** Theorem 7 in the words of the README: in a reachable state every
    sequence below [next] and above the watermark is held exactly once,
    and nothing else is held. *)
Corollary nothing_is_lost :
  forall pol st x, reachable pol st ->
  cnt (held st) x = (if (x <? next st) && unacked (acked st) x then 1 else 0)%nat.
Proof. intros pol st x R. apply (inv_conservation _ _ (invariants_hold pol st R)). Qed.
