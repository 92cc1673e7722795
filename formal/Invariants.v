(** * The invariants of the egress core, preserved by every transition:
    the watermarks (acked <= received <= sent < next, 1 and 11),
    conservation (7), the window (6), sorted pending (8), and the bound on
    sends per budget (5). *)

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


Lemma fold_insert_ex_perm :
  forall (g : N) (rs : dreason) moved ex,
  Permutation (fold_left (fun acc r => insert_ex ((g, rs), r) acc) moved ex) (map (fun r => ((g, rs), r)) moved ++ ex).
Proof.
  intros g rs. induction moved as [| m ms IH]; intros ex; simpl; [auto |].
  eapply perm_trans; [apply IH |].
  eapply perm_trans; [apply Permutation_app_head; apply insert_by_perm |].
  apply Permutation_sym, Permutation_middle.
Qed.

Lemma map_seq_refunded : forall l, map seq (map refunded l) = map seq l.
Proof. induction l as [| a l IH]; simpl; [reflexivity |]. rewrite IH. unfold refunded. destruct (resend a); reflexivity. Qed.

Lemma map_seq_replayed : forall l, map seq (map replayed l) = map seq l.
Proof. induction l as [| a l IH]; simpl; [reflexivity |]. rewrite IH. reflexivity. Qed.

Lemma map_seq_entomb : forall rs l, map seq (map (entomb rs) l) = map seq l.
Proof. intros rs. induction l as [| a l IH]; simpl; [reflexivity |]. rewrite IH. reflexivity. Qed.

(** The records a reconnect takes out of flight end up, by sequence,
    exactly once among the survivors, the tombstones and the held. *)
Lemma reconnect_partition :
  forall pol (l : list record) x,
  let dying := filter (dies pol) l in
  let tombs := if hold pol then [] else map revive dying in
  let kept := if hold pol then dying else [] in
  (cnt (map seq (filter (fun r => negb (dies pol r)) l)) x + cnt (map seq tombs) x + cnt (map seq kept) x
   = cnt (map seq l) x)%nat.
Proof.
  intros pol l x dying tombs kept. subst dying tombs kept.
  pose proof (cnt_filter _ seq (dies pol) l x (fun _ _ => eq_refl)) as P.
  destruct (hold pol); simpl; [lia |].
  assert (R : forall m, map seq (map revive m) = map seq m).
  { induction m as [| a m IH]; simpl; [reflexivity |]. rewrite IH. unfold revive. destruct (dead a); reflexivity. }
  rewrite R. lia.
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

(** ** 1 and 11. The watermarks: acknowledged at most what was received,
    received at most what was sent, sent only what was assigned *)

Definition below_next (st : state) (o : option N) : Prop :=
  match o with Some w => w < next st | None => True end.

Definition marks_ok (st : state) : Prop :=
  le_opt (acked st) (recvd st) /\ le_opt (recvd st) (sent st) /\ below_next st (sent st).

(** The ops that leave every number but the generation alone. *)
Definition frame_op (o : op) : bool :=
  match o with Fail _ _ _ _ _ | RetryNow _ _ | Timeout _ | Requeue _ _ | Reconnect _ => true | _ => false end.

Lemma frame_step :
  forall pol st o, frame_op o = true ->
  let s' := st_of (step pol st o) in
  next s' = next st /\ acked s' = acked st /\ recvd s' = recvd st /\ sent s' = sent st.
Proof.
  intros pol st o F. destruct o; try discriminate; simpl step.
  - unfold fail, stale. destruct (negb (g =? gen st)); [simpl; auto |].
    destruct (take seq s (inflight st)) as [[r rest] |]; [| simpl; auto].
    destruct k; unfold bury; simpl;
      repeat match goal with |- context [if ?c then _ else _] => destruct c end;
      destruct (dead (failed r)), (hold pol); simpl; auto.
  - unfold retry_now, stale. destruct (negb (g =? gen st)); [simpl; auto |].
    destruct (take _ s (parked st)) as [[p rest] |]; [| simpl; auto].
    destruct (clear_retry s (retry_st st)); simpl; auto.
  - unfold timeout; simpl; auto.
  - unfold requeue, stale. destruct (negb (g =? gen st)); [simpl; auto |].
    destruct (take _ s (exhausted st)) as [[[? r] rest] |]; [| simpl; auto].
    destruct (clear_retry s (retry_st st)); simpl; auto.
  - unfold reconnect, stale. destruct (g <? gen st); [simpl; auto |].
    destruct (g =? gen st); simpl; auto.
Qed.

Theorem marks_step :
  forall pol st o, (forall y, In y (pending st) -> seq y < next st) ->
  marks_ok st -> marks_ok (st_of (step pol st o)).
Proof.
  intros pol st o Hb H. destruct (frame_op o) eqn:F.
  { destruct (frame_step pol st o F) as [E1 [E2 [E3 E4]]]. unfold marks_ok, below_next in *.
    rewrite E1, E2, E3, E4. exact H. }
  destruct o; try discriminate; simpl step.
  - destruct H as [H1 [H2 H3]]. unfold enqueue, marks_ok, below_next in *; simpl. repeat split; auto.
    destruct (sent st); simpl in *; lia.
  - unfold claim, stale. destruct (negb _); [exact H |].
    destruct (pending st) as [| r rest] eqn:P; [exact H |].
    assert (R : seq r < next st) by (apply Hb; try rewrite P; left; reflexivity).
    assert (C : marks_ok (st_of (claim_open pol st r rest))).
    { unfold claim_open, do_claim. destruct (isol st); [| | exact H];
        destruct (window_end pol st <=? seq r); try exact H;
        destruct H as [H1 [H2 H3]]; unfold marks_ok, below_next, le_opt in *; simpl;
        destruct (acked st), (recvd st), (sent st); simpl in *; repeat split; try contradiction; lia. }
    destruct (ordering_of pol); [exact C |].
    destruct (lowest _) as [b |]; [destruct (b <? seq r); [exact H | exact C] | exact C].
  - unfold ack, stale, unsent. destruct (negb _); [exact H |].
    destruct (sent st) as [s |] eqn:S; [| exact H].
    destruct (s <? t) eqn:U; [exact H |]. apply N.ltb_ge in U.
    assert (Adv : marks_ok (st_of (advance st t))).
    { destruct H as [H1 [H2 H3]]. unfold advance, rises, marks_ok, below_next, le_opt in *; simpl. rewrite S in *.
      destruct (recvd st) as [v |]; [destruct (v <? t) eqn:W; facts |];
        destruct (acked st); simpl in *; repeat split; try contradiction; lia. }
    destruct (acked st) as [w |]; [destruct (t <=? w); [exact H | exact Adv] | exact Adv].
  - unfold received, stale, unsent. destruct (negb _); [exact H |].
    destruct (sent st) as [s |] eqn:S; [| exact H].
    destruct (s <? t) eqn:U; [exact H |]. apply N.ltb_ge in U.
    destruct (negb _ && negb _); [exact H |].
    destruct H as [H1 [H2 H3]]. unfold rises, marks_ok, below_next, le_opt in *; simpl. rewrite S in *.
    destruct (recvd st) as [v |]; [destruct (v <? t) eqn:W; facts |];
      destruct (acked st); simpl in *; repeat split; try contradiction; lia.
Qed.

Lemma acked_below_next : forall st, marks_ok st -> below_next st (acked st).
Proof.
  intros st [H1 [H2 H3]]. unfold below_next, le_opt in *.
  destruct (acked st), (recvd st), (sent st); simpl in *; try contradiction; lia.
Qed.

Lemma acked_below : forall st w, marks_ok st -> acked st = Some w -> w < next st.
Proof. intros st w H A. pose proof (acked_below_next st H) as B. unfold below_next in B. rewrite A in B. exact B. Qed.

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

Ltac unfold_records := unfold claimed, failed, replayed, refunded, fresh, entomb in *.

Lemma owed_enqueue : forall st x p,
  marks_ok st ->
  owed (st_of (enqueue st p)) x = ((if N.eq_dec (next st) x then 1 else 0) + owed st x)%nat.
Proof.
  intros st x p Hm. unfold owed. simpl.
  destruct (N.eq_dec (next st) x) as [Q | Q].
  - subst. replace (next st <? next st + 1) with true by (symmetry; apply N.ltb_lt; lia).
    replace (next st <? next st) with false by (symmetry; apply N.ltb_ge; lia).
    destruct (acked st) as [w |] eqn:A; simpl; [| reflexivity].
    pose proof (acked_below st w Hm A).
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

Lemma fold_insert_ex_cnt :
  forall g rs (moved : list record) ex x,
  cnt (map (fun e => seq (snd e)) (fold_left (fun acc r => insert_ex ((g, rs), r) acc) moved ex)) x
  = (cnt (map seq moved) x + cnt (map (fun e => seq (snd e)) ex) x)%nat.
Proof.
  intros. rewrite (cnt_perm _ _ _ _ _ (fold_insert_ex_perm g rs moved ex)), map_app, cnt_app, map_map. reflexivity.
Qed.

Theorem conservation_step :
  forall pol st o, marks_ok st -> (forall x, cnt (held st) x = owed st x) ->
  forall x, cnt (held (st_of (step pol st o))) x = owed (st_of (step pol st o)) x.
Proof.
  intros pol st o Hm Hc x. specialize (Hc x).
  destruct o.
  - (* enqueue *)
    simpl step. rewrite owed_enqueue by exact Hm. rewrite <- Hc. unfold enqueue, st_of; simpl.
    counts. lia.
  - (* claim *)
    unfold step, claim, claim_open, do_claim, stale, st_of; split_goal; simpl; try exact Hc; unfold owed in *; simpl;
      unfold_records; counts; use_source Hc; counts; finish.
  - (* ack *)
    unfold step, ack, stale, unsent. destruct (negb (g =? gen st)); [exact Hc |].
    destruct (sent st) as [s |]; [destruct (s <? t); [exact Hc |] | exact Hc].
    destruct (acked st) as [w |] eqn:A; [destruct (t <=? w) eqn:W; [exact Hc |]; apply N.leb_gt in W |];
      apply conservation_advance; try rewrite A; auto.
  - (* received *)
    unfold step, received, stale, unsent. destruct (negb (g =? gen st)); [exact Hc |].
    destruct (sent st) as [s |]; [destruct (s <? t); [exact Hc |] | exact Hc].
    destruct (negb _ && negb _); [exact Hc |].
    unfold owed, held in *; simpl in *. rewrite !map_app, !cnt_app, map_seq_refunded in *.
    pose proof (cnt_filter _ seq (fun r => seq r <=? t) (pending st) x (fun _ _ => eq_refl)). lia.
  - (* fail *)
    unfold step, fail, bury, stale, st_of; split_goal; simpl; try exact Hc; unfold owed in *; simpl;
      unfold_records; counts; use_source Hc; counts; use_inserts; counts; finish.
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
      unfold_records; counts; use_source Hc; counts; use_inserts; counts; finish.
  - (* reconnect *)
    unfold step, reconnect, stale. destruct (g <? gen st); [exact Hc |]. destruct (g =? gen st); [exact Hc |].
    unfold owed, held in *; simpl in *. rewrite !cnt_app in *.
    rewrite (cnt_perm _ _ _ _ _ (fold_insert_perm _ _)), fold_insert_ex_cnt, !map_app, !cnt_app.
    pose proof (reconnect_partition pol (map replayed (inflight st)) x) as Part. cbv zeta in Part.
    rewrite map_seq_replayed in Part. rewrite map_map. simpl. lia.
Qed.

(** ** 6. The window: every record in flight lies below the window's end,
    so (being distinct and above the watermark) at most [limit] are in
    flight *)

Definition window_inv (pol : policy) (st : state) : Prop :=
  Forall (fun r => seq r < window_end pol st) (inflight st) /\
  match sent st with Some s => s < window_end pol st | None => True end.

Lemma Forall_filter : forall A (P : A -> Prop) f l, Forall P l -> Forall P (filter f l).
Proof. intros A P f l H. induction H; simpl; [auto |]. destruct (f x); auto. Qed.

Lemma Forall_take :
  forall A (P : A -> Prop) key s l y rest, take key s l = Some (y, rest) -> Forall P l -> P y /\ Forall P rest.
Proof.
  intros A P key s l y rest T H. destruct (take_perm _ _ _ _ _ _ T) as [Pm _].
  apply (Permutation_Forall Pm) in H. inversion H; subst. auto.
Qed.

Lemma Forall_mono_lt :
  forall (l : list record) a b, a <= b -> Forall (fun r => seq r < a) l -> Forall (fun r => seq r < b) l.
Proof. intros l a b Hab H. eapply Forall_impl; [| exact H]. intros r Hr. simpl in Hr. lia. Qed.

Lemma frame_inflight :
  forall pol st o, frame_op o = true -> incl (inflight (st_of (step pol st o))) (inflight st).
Proof.
  intros pol st o F. destruct o; try discriminate; simpl step.
  - unfold fail, stale. destruct (negb (g =? gen st)); [simpl; apply incl_refl |].
    destruct (take seq s (inflight st)) as [[r rest] |] eqn:T; [| simpl; apply incl_refl].
    assert (I : incl rest (inflight st)).
    { destruct (take_perm _ _ _ _ _ _ T) as [Pm _]. intros a Ha.
      apply (Permutation_in _ (Permutation_sym Pm)). right. exact Ha. }
    destruct k; unfold bury; simpl;
      repeat match goal with |- context [if ?c then _ else _] => destruct c end;
      destruct (dead (failed r)), (hold pol); simpl; exact I.
  - unfold retry_now, stale. destruct (negb (g =? gen st)); [simpl; apply incl_refl |].
    destruct (take _ s (parked st)) as [[p rest] |]; [| simpl; apply incl_refl].
    destruct (clear_retry s (retry_st st)); simpl; apply incl_refl.
  - unfold timeout; simpl; apply incl_refl.
  - unfold requeue, stale. destruct (negb (g =? gen st)); [simpl; apply incl_refl |].
    destruct (take _ s (exhausted st)) as [[[? r] rest] |]; [| simpl; apply incl_refl].
    destruct (clear_retry s (retry_st st)); simpl; apply incl_refl.
  - unfold reconnect, stale. destruct (g <? gen st); [simpl; apply incl_refl |].
    destruct (g =? gen st); simpl; [apply incl_refl | intros a []].
Qed.

Theorem window_step :
  forall pol st o, window_inv pol st -> window_inv pol (st_of (step pol st o)).
Proof.
  intros pol st o H0. pose proof H0 as [Hi Hs]. destruct (frame_op o) eqn:F.
  { destruct (frame_step pol st o F) as [_ [E2 [_ E4]]]. unfold window_inv, window_end in *.
    rewrite E2, E4. split; [| exact Hs].
    apply incl_Forall with (l1 := inflight st); [apply frame_inflight; exact F | exact Hi]. }
  destruct o; try discriminate; simpl step.
  - exact H0.
  - unfold claim, stale. destruct (negb _); [exact H0 |].
    destruct (pending st) as [| r rest]; [exact H0 |].
    assert (C : window_inv pol (st_of (claim_open pol st r rest))).
    { unfold claim_open, do_claim. destruct (isol st); [| | exact H0];
        destruct (window_end pol st <=? seq r) eqn:W; try (exact H0); facts;
        unfold window_inv, window_end in *; simpl; split;
        try (apply Forall_app; split; [exact Hi | constructor; [unfold claimed; simpl; lia | constructor]]);
        destruct (sent st); lia. }
    destruct (ordering_of pol); [exact C |].
    destruct (lowest _) as [b |]; [destruct (b <? seq r); [exact H0 | exact C] | exact C].
  - unfold ack, stale, unsent. destruct (negb _); [exact H0 |].
    destruct (sent st) as [s |] eqn:S; [| exact H0].
    destruct (s <? t) eqn:U; [exact H0 |].
    assert (Adv : match acked st with Some a => a < t | None => True end ->
                  window_inv pol (st_of (advance st t))).
    { intros Hw. unfold advance, window_inv, window_end in *; simpl. rewrite S in *. split.
      - apply Forall_filter. eapply Forall_mono_lt; [| exact Hi]. destruct (acked st); lia.
      - destruct (acked st); lia. }
    destruct (acked st) as [w |] eqn:A; [destruct (t <=? w) eqn:W; [exact H0 |] |];
      apply Adv; rewrite ?A; try exact I; facts; lia.
  - unfold received, stale, unsent. destruct (negb _); [exact H0 |].
    destruct (sent st) as [s |] eqn:S; [| exact H0].
    destruct (s <? t) eqn:U; [exact H0 |]. facts.
    destruct (negb _ && negb _); [exact H0 |].
    unfold window_inv, window_end in *; simpl; rewrite S in *. split; [| exact Hs].
    apply Forall_app. split; [exact Hi |]. apply Forall_forall. intros r Hr.
    apply in_map_iff in Hr. destruct Hr as [y [<- Hy]]. apply filter_In in Hy. destruct Hy as [_ Hy].
    facts. unfold refunded. destruct (resend y); simpl; lia.
Qed.

Lemma NoDup_map_on :
  forall A B (f : A -> B) l, (forall a b, In a l -> In b l -> f a = f b -> a = b) -> NoDup l -> NoDup (map f l).
Proof.
  intros A B f l Hinj H. induction H as [| a l Ha Hl IH]; simpl; constructor.
  - intro Hin. apply in_map_iff in Hin. destruct Hin as [b [E Hb]].
    assert (b = a) by (apply Hinj; [right | left | ]; auto). subst. contradiction.
  - apply IH. intros x y Hx Hy. apply Hinj; right; auto.
Qed.

(** At most [limit] distinct numbers lie in a range of [limit]. *)
Lemma nodup_range_length :
  forall (l : list N) lo n, NoDup l -> (forall x, In x l -> lo <= x /\ x < lo + n) -> N.of_nat (length l) <= n.
Proof.
  intros l lo n H R.
  assert (Hm : NoDup (map (fun x => N.to_nat (x - lo)) l)).
  { apply NoDup_map_on; [| exact H].
    intros a b Ha Hb E. destruct (R a Ha), (R b Hb). lia. }
  assert (Hi : incl (map (fun x => N.to_nat (x - lo)) l) (List.seq 0 (N.to_nat n))).
  { intros y Hy. apply in_map_iff in Hy. destruct Hy as [x [<- Hx]]. destruct (R x Hx).
    apply in_seq. lia. }
  pose proof (NoDup_incl_length Hm Hi) as L. rewrite map_length, seq_length in L. lia.
Qed.

Definition window_ok (pol : policy) (st : state) : Prop := N.of_nat (length (inflight st)) <= limit pol.

Theorem window_bound :
  forall pol st, window_inv pol st -> (forall x, cnt (held st) x = owed st x) -> window_ok pol st.
Proof.
  intros pol st [Hi _] Hc. unfold window_ok.
  assert (R : forall x, In x (map seq (inflight st)) ->
              match acked st with Some a => a + 1 | None => 0 end <= x /\
              x < match acked st with Some a => a + 1 | None => 0 end + limit pol).
  { intros x Hx. pose proof (Hc x) as C. unfold held, owed in C. rewrite !cnt_app in C.
    assert (P : (0 < cnt (map seq (inflight st)) x)%nat) by (apply count_occ_In; exact Hx).
    destruct ((x <? next st) && unacked (acked st) x) eqn:U; [| lia]. apply andb_true_iff in U.
    destruct U as [_ U]. apply in_map_iff in Hx. destruct Hx as [r [<- Hr]].
    rewrite Forall_forall in Hi. specialize (Hi r Hr). unfold window_end in Hi.
    destruct (acked st); simpl in *; facts; lia. }
  assert (D : NoDup (map seq (inflight st))).
  { apply (NoDup_count_occ N.eq_dec). intros x. pose proof (Hc x) as C. unfold held, owed in C.
    rewrite !cnt_app in C. unfold cnt in C. destruct (_ && _); lia. }
  pose proof (nodup_range_length _ _ _ D R) as L. rewrite map_length in L. exact L.
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
  destruct o; simpl step.
  - apply sorted_append; [exact H |]. simpl. exact Hb.
  - unfold claim, claim_open, do_claim, stale. destruct (negb (g =? gen st)); [exact H |].
    destruct (pending st) as [| r rest] eqn:P; [unfold st_of; simpl; rewrite P; constructor |].
    apply StronglySorted_inv in H. destruct H as [Hs Hf].
    split_goal; unfold st_of; simpl; try (rewrite P; constructor; assumption); exact Hs.
  - unfold ack, advance, stale. split_goal; simpl; try exact H; apply filter_sorted; exact H.
  - unfold received, stale. split_goal; simpl; try exact H; apply filter_sorted; exact H.
  - unfold fail, bury, stale. split_goal; simpl; try exact H; apply insert_sorted; exact H.
  - unfold retry_now, stale. split_goal; simpl; try exact H; apply insert_sorted; exact H.
  - unfold timeout. apply fold_insert_prec_sorted; exact H.
  - unfold requeue, stale. split_goal; simpl; try exact H; apply insert_sorted; exact H.
  - unfold reconnect, stale. destruct (g <? gen st); [exact H |]. destruct (g =? gen st); [exact H |]. simpl.
    apply fold_insert_sorted; exact H.
Qed.

(** ** 5. Sends are bounded per budget: a record is claimed at most
    [budget + rlimit + 1] times between the start of its budget (enqueue,
    requeue, or becoming a tombstone) and its end *)

Definition ind (c : N) : N := if 0 <? c then 1 else 0.

(** A record waiting (pending or parked) owes its next claim to a failure
    or a replay if it was claimed before; a record in flight does not. *)
Definition waits_ok (pol : policy) (r : record) : Prop :=
  claims r + ind (claims r) <= 1 + fails r + reps r /\ fails r <= budget pol /\ reps r <= rlimit pol.
Definition flies_ok (pol : policy) (r : record) : Prop :=
  claims r <= 1 + fails r + reps r /\ fails r <= budget pol /\ reps r <= rlimit pol.

Definition claims_ok (pol : policy) (st : state) : Prop :=
  Forall (waits_ok pol) (pending st) /\ Forall (flies_ok pol) (inflight st) /\
  Forall (fun p => waits_ok pol (prec p)) (parked st) /\
  Forall (fun e => claims (snd e) <= 1 + budget pol + rlimit pol) (exhausted st).

Ltac rec_cbn := cbn [claims fails reps resend seq att dead payload prec] in *.

Lemma waits_fresh : forall pol r, waits_ok pol (fresh r).
Proof. intros. unfold waits_ok, fresh, ind; rec_cbn. simpl. repeat split; lia. Qed.

Lemma waits_entomb : forall pol rs r, waits_ok pol (entomb rs r).
Proof. intros. unfold waits_ok, entomb, ind; rec_cbn. simpl. repeat split; lia. Qed.

Lemma flies_claimed : forall pol r, waits_ok pol r -> flies_ok pol (claimed r).
Proof.
  intros pol r [H1 [H2 H3]]. unfold flies_ok, claimed, ind in *; rec_cbn.
  destruct (0 <? claims r) eqn:C; facts; repeat split; lia.
Qed.

Lemma flies_refunded : forall pol r, waits_ok pol r -> flies_ok pol (refunded r).
Proof.
  intros pol r [H1 [H2 H3]]. unfold flies_ok, refunded, ind in *.
  destruct (resend r); rec_cbn; destruct (0 <? claims r) eqn:C; facts; repeat split; lia.
Qed.

Lemma flies_bound : forall pol r, flies_ok pol r -> claims r <= 1 + budget pol + rlimit pol.
Proof. intros pol r [H1 [H2 H3]]. lia. Qed.

Lemma Forall_fold_insert :
  forall P moved pend, Forall P moved -> Forall P pend -> Forall P (fold_left (fun acc r => insert r acc) moved pend).
Proof.
  intros P moved pend Hm Hp. apply (Permutation_Forall (Permutation_sym (fold_insert_perm _ _))).
  apply Forall_app. auto.
Qed.

Lemma Forall_fold_insert_ex :
  forall (P : (N * dreason) * record -> Prop) g rs moved ex,
  Forall (fun r => P ((g, rs), r)) moved -> Forall P ex ->
  Forall P (fold_left (fun acc r => insert_ex ((g, rs), r) acc) moved ex).
Proof.
  intros P g rs moved ex Hm He. apply (Permutation_Forall (Permutation_sym (fold_insert_ex_perm _ _ _ _))).
  apply Forall_app. split; [| exact He]. apply Forall_map. exact Hm.
Qed.

Theorem claims_step : forall pol st o, claims_ok pol st -> claims_ok pol (st_of (step pol st o)).
Proof.
  intros pol st o H0. pose proof H0 as [Hp [Hi [Hk He]]].
  destruct o; simpl step.
  - unfold enqueue, claims_ok; simpl. repeat split; auto.
    apply Forall_app. split; [exact Hp |]. constructor; [| constructor]. unfold waits_ok, ind; simpl; lia.
  - unfold claim, claim_open, do_claim, stale. destruct (negb _); [exact H0 |].
    destruct (pending st) as [| r rest] eqn:P; [exact H0 |].
    inversion Hp as [| ? ? Hr Hrest]; subst.
    assert (C : claims_ok pol (mkState (gen st) (next st) rest (inflight st ++ [claimed r]) (parked st)
                  (exhausted st) (acked st) (recvd st) (Some (match sent st with Some s => N.max s (seq r) | None => seq r end))
                  (retry_st st) (progressed st) (match isol st with IReady => IProbe (seq r) | i => i end))).
    { unfold claims_ok; simpl. repeat split; try assumption.
      apply Forall_app. split; [exact Hi |]. constructor; [apply flies_claimed; exact Hr | constructor]. }
    split_goal; unfold st_of; simpl; try exact H0; rewrite ?E0 in C; simpl in C; exact C.
  - unfold ack, advance, stale. split_goal; unfold st_of; simpl; try exact H0;
      unfold claims_ok; simpl; repeat split; apply Forall_filter; assumption.
  - unfold received, stale. split_goal; unfold st_of; simpl; try exact H0;
      unfold claims_ok; simpl; repeat split; try assumption; try (apply Forall_filter; assumption).
    all: apply Forall_app; split; [exact Hi |]; apply Forall_map; apply Forall_filter;
      eapply Forall_impl; [| exact Hp]; intros a Ha; apply flies_refunded; exact Ha.
  - unfold fail, stale. destruct (negb _); [exact H0 |].
    destruct (take seq s (inflight st)) as [[r rest] |] eqn:T; [| exact H0].
    destruct (Forall_take _ _ _ _ _ _ _ T Hi) as [Hr Hrest].
    destruct Hr as [R1 [R2 R3]].
    assert (Bury : forall rs, claims_ok pol (let '(pend, ex, _) := bury pol (gen st) rs (failed r) (pending st) (exhausted st) in
                   mkState (gen st) (next st) pend rest (parked st) ex (acked st) (recvd st) (sent st) (retry_st st)
                           (progressed st) (isol st))).
    { intros rs. unfold bury. destruct (dead (failed r)), (hold pol), rs; unfold claims_ok;
        cbn [pending inflight parked exhausted snd fst]; repeat split; auto;
        try (apply Forall_insert_by; [apply waits_entomb | exact Hp]);
        try (apply Forall_insert_by; [apply waits_fresh | exact Hp]);
        apply Forall_insert_by; auto; cbn [snd]; unfold failed; rec_cbn; lia. }
    destruct k; simpl;
      [ destruct (budget pol <? fails r + 1) eqn:B | | destruct (budget pol <? fails r + 1) eqn:B ];
      unfold bury, failed in Bury |- *; simpl in Bury |- *; destruct (dead r) eqn:Dr, (hold pol); simpl in Bury |- *;
      try exact (Bury DRetries); try exact (Bury DPermanent);
      unfold claims_ok; simpl; repeat split; auto; apply Forall_insert_by; auto;
      try (simpl; apply waits_fresh);
      unfold waits_ok, failed, ind; rec_cbn; facts; destruct (0 <? claims r) eqn:C; facts; repeat split; lia.
  - unfold retry_now, stale. destruct (negb _); [exact H0 |].
    destruct (take _ s (parked st)) as [[p rest] |] eqn:T; [| exact H0].
    destruct (Forall_take _ _ _ _ _ _ _ T Hk) as [Hr Hrest].
    destruct (clear_retry s (retry_st st)); unfold claims_ok; simpl; repeat split; auto.
    apply Forall_insert_by; auto.
  - unfold timeout, claims_ok; simpl. repeat split; auto; [| apply Forall_filter; exact Hk].
    apply (Permutation_Forall (Permutation_sym (fold_insert_prec_perm _ _))). apply Forall_app. split; [| exact Hp].
    apply Forall_map. apply Forall_filter. exact Hk.
  - unfold requeue, stale. destruct (negb _); [exact H0 |].
    destruct (take _ s (exhausted st)) as [[[? r] rest] |] eqn:T; [| exact H0].
    destruct (Forall_take _ _ _ _ _ _ _ T He) as [Hr Hrest].
    destruct (clear_retry s (retry_st st)); unfold claims_ok; simpl; repeat split; auto.
    apply Forall_insert_by; [apply waits_fresh | exact Hp].
  - unfold reconnect, stale. destruct (g <? gen st); [exact H0 |]. destruct (g =? gen st); [exact H0 |].
    unfold claims_ok; simpl. repeat split; try constructor.
    + apply Forall_fold_insert; [| exact Hp]. apply Forall_app. split; [| apply Forall_app; split].
      * apply Forall_forall. intros a Ha. apply filter_In in Ha. destruct Ha as [Ha D].
        apply in_map_iff in Ha. destruct Ha as [b [<- Hb]]. rewrite Forall_forall in Hi.
        destruct (Hi b Hb) as [B1 [B2 B3]]. unfold dies in D. facts.
        unfold waits_ok, replayed, ind in *; rec_cbn. destruct (0 <? claims b) eqn:C; facts; repeat split; lia.
      * destruct (hold pol); [constructor |]. apply Forall_map. apply Forall_forall. intros a _.
        unfold revive. destruct (dead a); [apply waits_fresh | apply waits_entomb].
      * apply Forall_map. exact Hk.
    + apply Forall_fold_insert_ex; [| exact He].
      assert (K : forall a, In a (filter (dies pol) (map replayed (inflight st))) -> claims a <= 1 + budget pol + rlimit pol).
      { intros a Ha. apply filter_In in Ha. destruct Ha as [Ha _]. apply in_map_iff in Ha.
        destruct Ha as [b [<- Hb]]. rewrite Forall_forall in Hi. unfold replayed; rec_cbn.
        apply (flies_bound pol b). exact (Hi b Hb). }
      apply Forall_forall. intros a Ha. simpl. apply K.
      destruct (hold pol); [exact Ha | destruct Ha].
Qed.

(** ** Every invariant holds in every reachable state *)

Record Inv (pol : policy) (st : state) : Prop := {
  inv_marks : marks_ok st;
  inv_conservation : forall x, cnt (held st) x = owed st x;
  inv_window : window_inv pol st;
  inv_sorted : sorted_pending st;
  inv_claims : claims_ok pol st }.

Inductive reachable (pol : policy) : state -> Prop :=
| reach_init : forall g, reachable pol (init g)
| reach_step : forall st o, reachable pol st -> reachable pol (st_of (step pol st o)).

Theorem inv_init : forall pol g, Inv pol (init g).
Proof.
  intros pol g. constructor; unfold marks_ok, window_inv, sorted_pending, claims_ok; simpl;
    repeat split; try constructor.
  intros x. unfold owed. simpl. destruct (x <? 0) eqn:E; [apply N.ltb_lt in E; lia | reflexivity].
Qed.

Theorem inv_step : forall pol st o, Inv pol st -> Inv pol (st_of (step pol st o)).
Proof.
  intros pol st o [Hm Hc Hw Hs Hk].
  assert (Hb : forall y, In y (pending st) -> seq y < next st).
  { intros y Hy. apply (held_below_next st Hc). unfold held. apply in_or_app. left. apply in_map. exact Hy. }
  constructor.
  - apply marks_step; assumption.
  - apply conservation_step; assumption.
  - apply window_step; exact Hw.
  - apply sorted_step; assumption.
  - apply claims_step; exact Hk.
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

(** Theorem 6: never more than [limit] records in flight. *)
Corollary window_holds : forall pol st, reachable pol st -> window_ok pol st.
Proof.
  intros pol st R. destruct (invariants_hold pol st R). apply window_bound; assumption.
Qed.

(** Theorem 11: the watermarks are ordered: acknowledged at most what was
    received, received at most what was sent, sent only what was
    assigned. *)
Corollary marks_hold : forall pol st, reachable pol st -> marks_ok st.
Proof. intros pol st R. apply (inv_marks _ _ (invariants_hold pol st R)). Qed.

(** Theorem 5: across any number of reconnects, every record wherever it
    is has been claimed at most [budget + rlimit + 1] times in its current
    budget, and a live record has spent at most its budget and its replay
    limit. *)
Corollary sends_bounded :
  forall pol st r, reachable pol st ->
  (In r (pending st) \/ In r (inflight st) \/ In r (map prec (parked st)) \/ In r (map snd (exhausted st))) ->
  claims r <= 1 + budget pol + rlimit pol.
Proof.
  intros pol st r R Hin. destruct (inv_claims _ _ (invariants_hold pol st R)) as [Hp [Hi [Hk He]]].
  rewrite Forall_forall in Hp, Hi, Hk, He.
  destruct Hin as [H | [H | [H | H]]].
  - destruct (Hp r H) as [A [B C]]. unfold ind in A. destruct (0 <? claims r) eqn:Z; facts; lia.
  - apply flies_bound. exact (Hi r H).
  - apply in_map_iff in H. destruct H as [p [<- Hp']]. destruct (Hk p Hp') as [A [B C]].
    unfold ind in A. destruct (0 <? claims (prec p)) eqn:Z; facts; lia.
  - apply in_map_iff in H. destruct H as [e [<- He']]. exact (He e He').
Qed.

(** A replay past the limit is a dead letter: replay limit 0, one record
    claimed, a reconnect: it dies of replays (and, under the skip policy,
    is a tombstone claimed next), while its retry budget of 0 is untouched. *)
Example a_replay_past_the_limit_dies :
  let pol := mkPolicy 1 0 0 1 1 Pipelined false in
  let s1 := st_of (step pol (init 0) (Enqueue 0)) in
  let s2 := st_of (step pol s1 (Claim 0)) in
  let s3 := st_of (step pol s2 (Reconnect 1)) in
  out_of (step pol s2 (Reconnect 1)) = OReconnected 1 1 1 /\
  out_of (step pol s3 (Claim 1)) = OClaimed 1 0 2 0 (Some DReplays).
Proof. split; reflexivity. Qed.
