(** * Theorems about the latest-value projection (Latest.v).

    The design's list (shared/design/lazily.md, 3.4): newer wins, a stale
    upsert is a no-op, an upsert preserves the flight, one flight per key,
    a claim takes the latest desire, the frontier is monotone, an ack
    never clears a newer desire, a retryable failure keeps the desire, a
    reconnect requeues the unsuperseded flights and frees the key, a stale
    report after a reconnect is a no-op, and keys are isolated. *)

From Coq Require Import NArith List Bool Lia.
From Egress Require Import Model Latest.
Import ListNotations.
Open Scope N_scope.

(** ** Keys *)

Lemma lookup_put_same : forall k s l, lookup k (put k s l) = Some s.
Proof.
  intros k s l; induction l as [| [k' s'] t IH]; simpl.
  - rewrite N.eqb_refl; reflexivity.
  - destruct (k =? k') eqn:E; simpl.
    + rewrite N.eqb_refl; reflexivity.
    + destruct (k <? k'); simpl.
      * rewrite N.eqb_refl; reflexivity.
      * rewrite E; exact IH.
Qed.

Lemma lookup_put_other : forall k k' s l, k <> k' -> lookup k' (put k s l) = lookup k' l.
Proof.
  intros k k' s l Hne; induction l as [| [k1 s1] t IH]; simpl.
  - destruct (k' =? k) eqn:E; [apply N.eqb_eq in E; congruence | reflexivity].
  - destruct (k =? k1) eqn:E1; simpl.
    + apply N.eqb_eq in E1; subst k1.
      destruct (k' =? k) eqn:E; [apply N.eqb_eq in E; congruence | reflexivity].
    + destruct (k <? k1); simpl.
      * destruct (k' =? k) eqn:E; [apply N.eqb_eq in E; congruence | reflexivity].
      * destruct (k' =? k1); [reflexivity | exact IH].
Qed.

Lemma lookup_map : forall h k l,
  lookup k (map (fun e : N * slot => (fst e, h (snd e))) l) = option_map h (lookup k l).
Proof.
  intros h k l; induction l as [| [k1 s1] t IH]; simpl; [reflexivity |].
  destruct (k =? k1); [reflexivity | exact IH].
Qed.

(** The slot of [k] after a step, from the one before, for each op. *)
Definition slot_after (pol : lpolicy) (st : lstate) (o : lop) (k : N) : option slot :=
  lookup k (keys (lst_of (lstep pol st o))).

(** ** Upserts *)

Theorem upsert_desired_newer_wins : forall pol st k v x s,
  lookup k (keys st) = Some s ->
  (forall d, durable s = Some d -> d < v) ->
  (forall c y, newest s = Some (c, y) -> c < v) ->
  lout_of (lstep pol st (LUpsert k v x)) = UAccepted /\
  slot_after pol st (LUpsert k v x) k = Some (mkSlot (Some (v, x)) (in_flight s) (durable s) (failures s) (waiting s)).
Proof.
  intros pol st k v x s Hk Hd Hn; unfold slot_after, lout_of, lst_of; simpl; unfold upsert; rewrite Hk.
  destruct (durable s) as [d |] eqn:D.
  - specialize (Hd d eq_refl). replace (v <=? d) with false by (symmetry; apply N.leb_gt; lia).
    destruct (newest s) as [[c y] |] eqn:Ne.
    + specialize (Hn c y eq_refl).
      replace (v <? c) with false by (symmetry; apply N.ltb_ge; lia).
      replace (v =? c) with false by (symmetry; apply N.eqb_neq; lia).
      simpl; split; [reflexivity | apply lookup_put_same].
    + simpl; split; [reflexivity | apply lookup_put_same].
  - destruct (newest s) as [[c y] |] eqn:Ne.
    + specialize (Hn c y eq_refl).
      replace (v <? c) with false by (symmetry; apply N.ltb_ge; lia).
      replace (v =? c) with false by (symmetry; apply N.eqb_neq; lia).
      simpl; split; [reflexivity | apply lookup_put_same].
    + simpl; split; [reflexivity | apply lookup_put_same].
Qed.

Theorem upsert_desired_new_key : forall pol st k v x,
  lookup k (keys st) = None ->
  N.of_nat (length (keys st)) < lmax_keys pol ->
  lout_of (lstep pol st (LUpsert k v x)) = UAccepted /\
  slot_after pol st (LUpsert k v x) k = Some (mkSlot (Some (v, x)) None None 0 None).
Proof.
  intros pol st k v x Hk Hroom; unfold slot_after, lout_of, lst_of; simpl; unfold upsert; rewrite Hk.
  replace (lmax_keys pol <=? N.of_nat (length (keys st))) with false by (symmetry; apply N.leb_gt; lia).
  simpl; split; [reflexivity | apply lookup_put_same].
Qed.

(** Every upsert that is not accepted changes nothing. *)
Theorem upsert_desired_refused_noop : forall pol st k v x,
  lout_of (lstep pol st (LUpsert k v x)) <> UAccepted ->
  lst_of (lstep pol st (LUpsert k v x)) = st.
Proof.
  intros pol st k v x Hno; unfold lout_of, lst_of in *; simpl in *; unfold upsert in *.
  destruct (lookup k (keys st)) as [s |].
  - destruct (durable s) as [d |]; [destruct (v <=? d); [reflexivity |] |];
      (destruct (newest s) as [[c y] |];
       [destruct (v <? c); [reflexivity | destruct (v =? c); [reflexivity | simpl in Hno; congruence]]
       | simpl in Hno; congruence]).
  - destruct (lmax_keys pol <=? N.of_nat (length (keys st))); [reflexivity | simpl in Hno; congruence].
Qed.

Theorem upsert_desired_stale_noop : forall pol st k v x s c y,
  lookup k (keys st) = Some s -> newest s = Some (c, y) -> v < c ->
  lst_of (lstep pol st (LUpsert k v x)) = st.
Proof.
  intros pol st k v x s c y Hk Hn Hlt; unfold lst_of; simpl; unfold upsert; rewrite Hk, Hn.
  replace (v <? c) with true by (symmetry; apply N.ltb_lt; lia).
  destruct (durable s) as [d |]; [destruct (v <=? d) |]; reflexivity.
Qed.

(** An upsert never touches any key's flight. *)
Theorem upsert_desired_preserves_inflight : forall pol st k v x k',
  option_map in_flight (slot_after pol st (LUpsert k v x) k') = option_map in_flight (lookup k' (keys st))
  \/ (lookup k' (keys st) = None /\ option_map in_flight (slot_after pol st (LUpsert k v x) k') = Some None).
Proof.
  intros pol st k v x k'; unfold slot_after, lst_of; simpl; unfold upsert.
  destruct (N.eq_dec k k') as [-> | Hne].
  - destruct (lookup k' (keys st)) as [s |] eqn:Hk.
    + left. destruct (durable s) as [d |]; [destruct (v <=? d); [simpl; rewrite Hk; reflexivity |] |];
        (destruct (newest s) as [[c y] |];
         [destruct (v <? c); [simpl; rewrite Hk; reflexivity |
            destruct (v =? c); [simpl; rewrite Hk; reflexivity | simpl; cbn; rewrite lookup_put_same; reflexivity]]
         | simpl; cbn; rewrite lookup_put_same; reflexivity]).
    + destruct (lmax_keys pol <=? N.of_nat (length (keys st))).
      * left; simpl; rewrite Hk; reflexivity.
      * right; split; [reflexivity | simpl; cbn; rewrite lookup_put_same; reflexivity].
  - left. destruct (lookup k (keys st)) as [s |].
    + destruct (durable s) as [d |]; [destruct (v <=? d); [reflexivity |] |];
        (destruct (newest s) as [[c y] |];
         [destruct (v <? c); [reflexivity | destruct (v =? c); [reflexivity | simpl; rewrite lookup_put_other by exact Hne; reflexivity]]
         | simpl; rewrite lookup_put_other by exact Hne; reflexivity]).
    + destruct (lmax_keys pol <=? N.of_nat (length (keys st))); [reflexivity |].
      simpl; rewrite lookup_put_other by exact Hne; reflexivity.
Qed.

(** ** Claims *)

Theorem claim_single_flight : forall pol st g k s f,
  lookup k (keys st) = Some s -> in_flight s = Some f ->
  lst_of (lstep pol st (LClaim g k)) = st /\ lch_of (lstep pol st (LClaim g k)) = [].
Proof.
  intros pol st g k s f Hk Hf; unfold lst_of, lch_of; simpl; unfold claim.
  destruct (negb (g =? lgen st)); [split; reflexivity |]. rewrite Hk, Hf; split; reflexivity.
Qed.

Theorem claim_uses_latest_desired : forall pol st g' k g k' v x,
  lout_of (lstep pol st (LClaim g' k)) = CClaimed g k' v x ->
  exists s, lookup k (keys st) = Some s /\ desired s = Some (v, x) /\ in_flight s = None /\
    g = lgen st /\ k' = k /\
    slot_after pol st (LClaim g' k) k = Some (mkSlot None (Some (mkFlight g v x)) (durable s) (failures s) None).
Proof.
  intros pol st g' k g k' v x H; unfold lout_of, slot_after, lst_of in *; simpl in *; unfold claim in *.
  destruct (negb (g' =? lgen st)); [discriminate |].
  destruct (lookup k (keys st)) as [s |] eqn:Hk; [| discriminate].
  destruct (in_flight s) eqn:Hf; [discriminate |].
  destruct (desired s) as [[v0 x0] |] eqn:Hd; [| discriminate].
  destruct (waiting s); [discriminate |].
  simpl in H; inversion H; subst. exists s; repeat split; auto. cbn; rewrite lookup_put_same; reflexivity.
Qed.

(** ** Acknowledgements *)

(** An ack changes no key's desire. *)
Theorem ack_never_clears_desired : forall pol st g k v k',
  option_map desired (slot_after pol st (LAck g k v) k') = option_map desired (lookup k' (keys st)).
Proof.
  intros pol st g k v k'; unfold slot_after, lst_of; simpl; unfold ack.
  destruct (negb (g =? lgen st)); [reflexivity |].
  destruct (lookup k (keys st)) as [s |] eqn:Hk; [| reflexivity].
  destruct (durable s) as [d |];
  (destruct (in_flight s) as [f |]; [destruct (fver f =? v) |]);
  try (destruct (v <=? d)); try reflexivity;
  (destruct (N.eq_dec k k') as [-> | Hne];
   [simpl; cbn; rewrite lookup_put_same, Hk; reflexivity | simpl; rewrite lookup_put_other by exact Hne; reflexivity]).
Qed.

(** Only the exact flight moves the frontier; it moves to its version. *)
Theorem ack_applied_exact : forall pol st g k v d,
  lout_of (lstep pol st (LAck g k v)) = AAdvanced d ->
  d = v /\ g = lgen st /\ exists s f, lookup k (keys st) = Some s /\ in_flight s = Some f /\ fver f = v /\
    slot_after pol st (LAck g k v) k = Some (mkSlot (desired s) None (Some v) 0 (waiting s)).
Proof.
  intros pol st g k v d H; unfold lout_of, slot_after, lst_of in *; simpl in *; unfold ack in *.
  destruct (g =? lgen st) eqn:G; simpl in H; [| discriminate]. apply N.eqb_eq in G.
  destruct (lookup k (keys st)) as [s |] eqn:Hk; [| discriminate].
  destruct (in_flight s) as [f |] eqn:Hf.
  - destruct (fver f =? v) eqn:Fv.
    + simpl in H; inversion H; subst. apply N.eqb_eq in Fv.
      repeat split; auto. exists s, f; repeat split; auto. cbn; rewrite lookup_put_same; reflexivity.
    + destruct (durable s) as [d0 |]; [destruct (v <=? d0) |]; discriminate.
  - destruct (durable s) as [d0 |]; [destruct (v <=? d0) |]; discriminate.
Qed.

(** ** Failures *)

Theorem fail_retryable_keeps_desired : forall pol st g k v now hint t,
  (lout_of (lstep pol st (LFail g k v now hint)) = FPending t \/
   lout_of (lstep pol st (LFail g k v now hint)) = FSuperseded t) ->
  exists s f, lookup k (keys st) = Some s /\ in_flight s = Some f /\ fver f = v /\
    exists s', slot_after pol st (LFail g k v now hint) k = Some s' /\ in_flight s' = None /\ waiting s' = Some t /\
      desired s' = match desired s with Some d => Some d | None => Some (fver f, fval f) end.
Proof.
  intros pol st g k v now hint t H; unfold lout_of, slot_after, lst_of in *; simpl in *; unfold fail in *.
  destruct (negb (g =? lgen st)); [destruct H; discriminate |].
  destruct (lookup k (keys st)) as [s |] eqn:Hk; [| destruct H; discriminate].
  destruct (in_flight s) as [f |] eqn:Hf; [| destruct H; discriminate].
  destruct (fver f =? v) eqn:Fv; [| destruct H; discriminate]. apply N.eqb_eq in Fv.
  exists s, f; repeat split; auto.
  destruct (desired s) as [dd |] eqn:Hd; simpl in *;
    (destruct H as [H | H]; inversion H; subst;
     eexists; cbn; rewrite lookup_put_same; repeat split; reflexivity).
Qed.

(** ** Reconnects *)

Theorem reconnect_requeues_and_frees : forall pol st g k s,
  lgen st < g -> lookup k (keys st) = Some s ->
  slot_after pol st (LReconnect g) k =
    Some (match in_flight s with
          | Some f => mkSlot (match desired s with Some d => Some d | None => Some (fver f, fval f) end)
                             None (durable s) (failures s) (waiting s)
          | None => s
          end).
Proof.
  intros pol st g k s Hlt Hk; unfold slot_after, lst_of; simpl; unfold reconnect.
  replace (g <? lgen st) with false by (symmetry; apply N.ltb_ge; lia).
  replace (g =? lgen st) with false by (symmetry; apply N.eqb_neq; lia).
  simpl; rewrite lookup_map, Hk; reflexivity.
Qed.

Corollary reconnect_leaves_nothing_in_flight : forall pol st g k s',
  lgen st < g -> slot_after pol st (LReconnect g) k = Some s' -> in_flight s' = None.
Proof.
  intros pol st g k s' Hlt H; unfold slot_after, lst_of in H; simpl in H; unfold reconnect in H.
  replace (g <? lgen st) with false in H by (symmetry; apply N.ltb_ge; lia).
  replace (g =? lgen st) with false in H by (symmetry; apply N.eqb_neq; lia).
  simpl in H; rewrite lookup_map in H.
  destruct (lookup k (keys st)) as [s |]; [| discriminate]. simpl in H; inversion H; subst.
  unfold requeue_slot; destruct (in_flight s) eqn:F; [reflexivity | exact F].
Qed.

(** A report of another generation (an ack, a failure, a claim) changes
    nothing: after a reconnect, the old sink's reports are no-ops. *)
Theorem stale_reports_noop : forall pol st g k v now hint,
  g <> lgen st ->
  lst_of (lstep pol st (LAck g k v)) = st /\ lst_of (lstep pol st (LFail g k v now hint)) = st /\
  lst_of (lstep pol st (LClaim g k)) = st.
Proof.
  intros pol st g k v now hint Hne; unfold lst_of; simpl; unfold ack, fail, claim.
  replace (g =? lgen st) with false by (symmetry; apply N.eqb_neq; exact Hne).
  repeat split; reflexivity.
Qed.

Corollary stale_ack_after_reconnect_noop : forall pol st g g' k v,
  lgen st < g' -> g <= lgen st ->
  lst_of (lstep pol (lst_of (lstep pol st (LReconnect g'))) (LAck g k v)) = lst_of (lstep pol st (LReconnect g')).
Proof.
  intros pol st g g' k v Hlt Hle.
  assert (lgen (lst_of (lstep pol st (LReconnect g'))) = g') as Hg.
  { unfold lst_of; simpl; unfold reconnect.
    replace (g' <? lgen st) with false by (symmetry; apply N.ltb_ge; lia).
    replace (g' =? lgen st) with false by (symmetry; apply N.eqb_neq; lia). reflexivity. }
  assert (g <> lgen (lst_of (lstep pol st (LReconnect g')))) as Hne by (rewrite Hg; lia).
  exact (proj1 (stale_reports_noop pol _ g k v 0 None Hne)).
Qed.

(** ** Keys are isolated *)

(** An op on one key leaves every other key's slot as it was. *)
Theorem keys_isolated : forall pol st o k k',
  match o with
  | LUpsert k0 _ _ | LClaim _ k0 | LAck _ k0 _ | LFail _ k0 _ _ _ => k0 = k
  | _ => False
  end ->
  k <> k' -> slot_after pol st o k' = lookup k' (keys st).
Proof.
  intros pol st o k k' Ho Hne; unfold slot_after, lst_of.
  destruct o as [k0 v x | g k0 | g k0 v | g k0 v now hint | now | g]; try contradiction; subst k0; simpl.
  - unfold upsert. destruct (lookup k (keys st)) as [s |].
    + destruct (durable s) as [d |]; [destruct (v <=? d); [reflexivity |] |];
        (destruct (newest s) as [[c y] |];
         [destruct (v <? c); [reflexivity | destruct (v =? c); [reflexivity | simpl; apply lookup_put_other; exact Hne]]
         | simpl; apply lookup_put_other; exact Hne]).
    + destruct (lmax_keys pol <=? N.of_nat (length (keys st))); [reflexivity | simpl; apply lookup_put_other; exact Hne].
  - unfold claim. destruct (negb (g =? lgen st)); [reflexivity |].
    destruct (lookup k (keys st)) as [s |]; [| reflexivity].
    destruct (in_flight s); [reflexivity |]. destruct (desired s) as [[v x] |]; [| reflexivity].
    destruct (waiting s); [reflexivity | simpl; apply lookup_put_other; exact Hne].
  - unfold ack. destruct (negb (g =? lgen st)); [reflexivity |].
    destruct (lookup k (keys st)) as [s |]; [| reflexivity].
    destruct (durable s) as [d |];
    (destruct (in_flight s) as [f |]; [destruct (fver f =? v) |]);
    try (destruct (v <=? d)); try reflexivity; simpl; apply lookup_put_other; exact Hne.
  - unfold fail. destruct (negb (g =? lgen st)); [reflexivity |].
    destruct (lookup k (keys st)) as [s |]; [| reflexivity].
    destruct (in_flight s) as [f |]; [| reflexivity]. destruct (fver f =? v); [| reflexivity].
    destruct (desired s); simpl; apply lookup_put_other; exact Hne.
Qed.

(** ** The frontier is monotone *)

(** In every reachable state, a key's flight lies above its frontier, and
    its desire above its flight and its frontier. *)
Definition above (d : option N) (v : N) : Prop := match d with Some x => x < v | None => True end.

Definition sinv (s : slot) : Prop :=
  (forall f, in_flight s = Some f -> above (durable s) (fver f)) /\
  (forall v x, desired s = Some (v, x) -> above (durable s) v) /\
  (forall f v x, in_flight s = Some f -> desired s = Some (v, x) -> fver f < v).

Definition inv (st : lstate) : Prop := forall k s, lookup k (keys st) = Some s -> sinv s.

Lemma inv_init : forall g, inv (linit g).
Proof. intros g k s H; discriminate. Qed.

Lemma inv_put : forall st k s, inv st -> sinv s -> inv (mkL (lgen st) (put k s (keys st))).
Proof.
  intros st k s Hinv Hs k' s' H'; simpl in H'.
  destruct (N.eq_dec k k') as [-> | Hne].
  - rewrite lookup_put_same in H'; inversion H'; subst; exact Hs.
  - rewrite lookup_put_other in H' by exact Hne; exact (Hinv k' s' H').
Qed.

Lemma inv_map : forall st g h, inv st -> (forall s, sinv s -> sinv (h s)) ->
  inv (mkL g (map (fun e : N * slot => (fst e, h (snd e))) (keys st))).
Proof.
  intros st g h Hinv Hh k s H; simpl in H; rewrite lookup_map in H.
  destruct (lookup k (keys st)) as [s0 |] eqn:Hk; [| discriminate].
  simpl in H; inversion H; subst; exact (Hh s0 (Hinv k s0 Hk)).
Qed.

(** An accepted upsert of [v]: above the frontier and the newest. *)
Lemma sinv_accept : forall s v x,
  sinv s -> above (durable s) v -> (forall c y, newest s = Some (c, y) -> c < v) ->
  sinv (mkSlot (Some (v, x)) (in_flight s) (durable s) (failures s) (waiting s)).
Proof.
  intros s v x [Hf [Hd Hfd]] Ha Hn; unfold newest in Hn; repeat split; simpl.
  - exact Hf.
  - intros v0 x0 E; inversion E; subst; exact Ha.
  - intros f v0 x0 F E; inversion E; subst.
    destruct (desired s) as [[dv dx] |] eqn:D.
    + pose proof (Hn dv dx eq_refl). pose proof (Hfd f dv dx F eq_refl). lia.
    + rewrite F in Hn. exact (Hn (fver f) (fval f) eq_refl).
Qed.

Lemma sinv_accept_at : forall s v x d',
  durable s = d' -> sinv s -> above d' v -> (forall c y, newest s = Some (c, y) -> c < v) ->
  sinv (mkSlot (Some (v, x)) (in_flight s) d' (failures s) (waiting s)).
Proof. intros s v x d' <-; apply sinv_accept. Qed.

Theorem inv_step : forall pol st o, inv st -> inv (lst_of (lstep pol st o)).
Proof.
  intros pol st o Hinv.
  destruct o as [k v x | g k | g k v | g k v now hint | now | g]; unfold lst_of; simpl.
  - unfold upsert. destruct (lookup k (keys st)) as [s |] eqn:Hk.
    + pose proof (Hinv k s Hk) as Hs.
      destruct (durable s) as [d |] eqn:D.
      * destruct (v <=? d) eqn:Vd; [exact Hinv |]. apply N.leb_gt in Vd.
        destruct (newest s) as [[c y] |] eqn:Ne.
        -- destruct (v <? c) eqn:Vc; [exact Hinv |]. destruct (v =? c) eqn:Ve; [exact Hinv |].
           apply N.ltb_ge in Vc; apply N.eqb_neq in Ve.
           apply inv_put; [exact Hinv |]. apply (sinv_accept_at s v x (Some d) D Hs Vd).
           intros c0 y0 E; rewrite Ne in E; inversion E; subst; lia.
        -- apply inv_put; [exact Hinv |]. apply (sinv_accept_at s v x (Some d) D Hs Vd).
           intros c0 y0 E; rewrite Ne in E; discriminate.
      * destruct (newest s) as [[c y] |] eqn:Ne.
        -- destruct (v <? c) eqn:Vc; [exact Hinv |]. destruct (v =? c) eqn:Ve; [exact Hinv |].
           apply N.ltb_ge in Vc; apply N.eqb_neq in Ve.
           apply inv_put; [exact Hinv |]. apply (sinv_accept_at s v x None D Hs I).
           intros c0 y0 E; rewrite Ne in E; inversion E; subst; lia.
        -- apply inv_put; [exact Hinv |]. apply (sinv_accept_at s v x None D Hs I).
           intros c0 y0 E; rewrite Ne in E; discriminate.
    + destruct (lmax_keys pol <=? N.of_nat (length (keys st))); [exact Hinv |].
      apply inv_put; [exact Hinv |]. repeat split; simpl; intros; try discriminate; exact I.
  - unfold claim. destruct (negb (g =? lgen st)); [exact Hinv |].
    destruct (lookup k (keys st)) as [s |] eqn:Hk; [| exact Hinv].
    pose proof (Hinv k s Hk) as [Hf [Hd Hfd]].
    destruct (in_flight s); [exact Hinv |]. destruct (desired s) as [[v x] |] eqn:D; [| exact Hinv].
    destruct (waiting s); [exact Hinv |].
    apply inv_put; [exact Hinv |]. repeat split; simpl.
    + intros f E; inversion E; subst; exact (Hd v x eq_refl).
    + intros v0 x0 E; discriminate.
    + intros f v0 x0 _ E; discriminate.
  - unfold ack. destruct (negb (g =? lgen st)); [exact Hinv |].
    destruct (lookup k (keys st)) as [s |] eqn:Hk; [| exact Hinv].
    pose proof (Hinv k s Hk) as [Hf [Hd Hfd]].
    destruct (in_flight s) as [f |] eqn:F.
    + destruct (fver f =? v) eqn:Fv.
      * apply N.eqb_eq in Fv; subst v. apply inv_put; [exact Hinv |]. repeat split; simpl.
        -- intros f' E; discriminate.
        -- intros v0 x0 E. exact (Hfd f v0 x0 eq_refl E).
        -- intros f' v0 x0 E; discriminate.
      * destruct (durable s) as [d |]; [destruct (v <=? d) |]; exact Hinv.
    + destruct (durable s) as [d |]; [destruct (v <=? d) |]; exact Hinv.
  - unfold fail. destruct (negb (g =? lgen st)); [exact Hinv |].
    destruct (lookup k (keys st)) as [s |] eqn:Hk; [| exact Hinv].
    pose proof (Hinv k s Hk) as [Hf [Hd Hfd]].
    destruct (in_flight s) as [f |] eqn:F; [| exact Hinv]. destruct (fver f =? v); [| exact Hinv].
    destruct (desired s) as [[dv dx] |] eqn:D; apply inv_put; try exact Hinv; repeat split; simpl;
      try (intros f' E; discriminate); try (intros f' v0 x0 E; discriminate).
    + intros v0 x0 E; inversion E; subst; exact (Hd v0 x0 eq_refl).
    + intros v0 x0 E; inversion E; subst; exact (Hf f eq_refl).
  - unfold timeout. apply inv_map; [exact Hinv |].
    intros s [Hf [Hd Hfd]]. unfold free_slot.
    destruct (waiting s) as [u |]; [destruct (u <=? now) |]; repeat split; simpl; auto.
  - unfold reconnect. destruct (g <? lgen st); [exact Hinv |]. destruct (g =? lgen st); [exact Hinv |].
    apply inv_map; [exact Hinv |].
    intros s [Hf [Hd Hfd]]. unfold requeue_slot.
    destruct (in_flight s) as [f |] eqn:F;
      [| repeat split; [intros f' E; rewrite F in E; discriminate | exact Hd | intros f' v0 x0 E; rewrite F in E; discriminate]].
    repeat split; simpl; [intros f' E; discriminate | | intros f' v0 x0 E; discriminate].
    destruct (desired s) as [[dv dx] |] eqn:D; intros v0 x0 E; inversion E; subst;
      [exact (Hd v0 x0 eq_refl) | exact (Hf f eq_refl)].
Qed.

(** The states a sequence of ops reaches from a fresh projection. *)
Fixpoint run (pol : lpolicy) (st : lstate) (ops : list lop) : lstate :=
  match ops with [] => st | o :: t => run pol (lst_of (lstep pol st o)) t end.

Corollary inv_reachable : forall pol g ops, inv (run pol (linit g) ops).
Proof.
  intros pol g ops. assert (forall st, inv st -> inv (run pol st ops)) as H.
  { induction ops as [| o t IH]; intros st Hst; simpl; [exact Hst | apply IH, inv_step, Hst]. }
  apply H, inv_init.
Qed.

(** A key's frontier never falls, and a key never disappears. *)
Definition dle (a b : option N) : Prop :=
  match a, b with None, _ => True | Some x, Some y => x <= y | Some _, None => False end.

Theorem frontier_monotone : forall pol st o k s,
  inv st -> lookup k (keys st) = Some s ->
  exists s', slot_after pol st o k = Some s' /\ dle (durable s) (durable s').
Proof.
  intros pol st o k s Hinv Hk.
  assert (Hrefl : forall d, dle d d) by (intros [d |]; simpl; [lia | exact I]).
  assert (Hsame : forall l, lookup k l = Some s -> exists s', lookup k l = Some s' /\ dle (durable s) (durable s'))
    by (intros l H; exists s; split; [exact H | apply Hrefl]).
  assert (Hput : forall s', durable s' = durable s -> exists s0, lookup k (put k s' (keys st)) = Some s0 /\ dle (durable s) (durable s0))
    by (intros s' E; exists s'; cbn; rewrite lookup_put_same; split; [reflexivity | rewrite E; apply Hrefl]).
  assert (Hput_other : forall k' s', k' <> k -> exists s0, lookup k (put k' s' (keys st)) = Some s0 /\ dle (durable s) (durable s0))
    by (intros k' s' Hne; exists s; rewrite lookup_put_other by exact Hne; split; [exact Hk | apply Hrefl]).
  destruct o as [k0 v x | g k0 | g k0 v | g k0 v now hint | now | g]; unfold slot_after, lst_of; simpl.
  - unfold upsert. destruct (N.eq_dec k0 k) as [-> | Hne].
    + rewrite Hk. destruct (durable s) as [d |] eqn:D; [destruct (v <=? d); [apply Hsame, Hk |] |];
        (destruct (newest s) as [[c y] |];
         [destruct (v <? c); [apply Hsame, Hk | destruct (v =? c); [apply Hsame, Hk | apply Hput; reflexivity]]
         | apply Hput; reflexivity]).
    + destruct (lookup k0 (keys st)) as [s0 |].
      * destruct (durable s0) as [d |]; [destruct (v <=? d); [apply Hsame, Hk |] |];
          (destruct (newest s0) as [[c y] |];
           [destruct (v <? c); [apply Hsame, Hk | destruct (v =? c); [apply Hsame, Hk | apply Hput_other, Hne]]
           | apply Hput_other, Hne]).
      * destruct (lmax_keys pol <=? N.of_nat (length (keys st))); [apply Hsame, Hk | apply Hput_other, Hne].
  - unfold claim. destruct (negb (g =? lgen st)); [apply Hsame, Hk |].
    destruct (N.eq_dec k0 k) as [-> | Hne].
    + rewrite Hk. destruct (in_flight s); [apply Hsame, Hk |].
      destruct (desired s) as [[v x] |]; [| apply Hsame, Hk].
      destruct (waiting s); [apply Hsame, Hk | apply Hput; reflexivity].
    + destruct (lookup k0 (keys st)) as [s0 |]; [| apply Hsame, Hk].
      destruct (in_flight s0); [apply Hsame, Hk |]. destruct (desired s0) as [[v x] |]; [| apply Hsame, Hk].
      destruct (waiting s0); [apply Hsame, Hk | apply Hput_other, Hne].
  - unfold ack. destruct (negb (g =? lgen st)); [apply Hsame, Hk |].
    destruct (N.eq_dec k0 k) as [-> | Hne].
    + rewrite Hk. pose proof (Hinv k s Hk) as [Hf _].
      destruct (in_flight s) as [f |] eqn:F.
      * destruct (fver f =? v) eqn:Fv.
        -- apply N.eqb_eq in Fv; subst v. exists (mkSlot (desired s) None (Some (fver f)) 0 (waiting s)).
           cbn; rewrite lookup_put_same; split; [reflexivity |]. simpl.
           specialize (Hf f eq_refl). destruct (durable s) as [d |]; simpl in *; lia.
        -- destruct (durable s) as [d |]; [destruct (v <=? d) |]; apply Hsame, Hk.
      * destruct (durable s) as [d |]; [destruct (v <=? d) |]; apply Hsame, Hk.
    + destruct (lookup k0 (keys st)) as [s0 |]; [| apply Hsame, Hk].
      destruct (in_flight s0) as [f |].
      * destruct (fver f =? v); [apply Hput_other, Hne |].
        destruct (durable s0) as [d |]; [destruct (v <=? d) |]; apply Hsame, Hk.
      * destruct (durable s0) as [d |]; [destruct (v <=? d) |]; apply Hsame, Hk.
  - unfold fail. destruct (negb (g =? lgen st)); [apply Hsame, Hk |].
    destruct (N.eq_dec k0 k) as [-> | Hne].
    + rewrite Hk. destruct (in_flight s) as [f |]; [| apply Hsame, Hk].
      destruct (fver f =? v); [| apply Hsame, Hk].
      destruct (desired s); apply Hput; reflexivity.
    + destruct (lookup k0 (keys st)) as [s0 |]; [| apply Hsame, Hk].
      destruct (in_flight s0) as [f |]; [| apply Hsame, Hk].
      destruct (fver f =? v); [| apply Hsame, Hk].
      destruct (desired s0); apply Hput_other, Hne.
  - unfold timeout; simpl. rewrite lookup_map, Hk. simpl. eexists; split; [reflexivity |].
    unfold free_slot. destruct (waiting s) as [u |]; [destruct (u <=? now) |]; simpl; apply Hrefl.
  - unfold reconnect. destruct (g <? lgen st); [apply Hsame, Hk |]. destruct (g =? lgen st); [apply Hsame, Hk |].
    simpl. rewrite lookup_map, Hk. simpl. eexists; split; [reflexivity |].
    unfold requeue_slot. destruct (in_flight s); simpl; apply Hrefl.
Qed.
