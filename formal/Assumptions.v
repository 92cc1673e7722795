(** Prints the axioms each theorem rests on; the Makefile requires every
    one of them to be "Closed under the global context". *)
From Egress Require Import Model Proofs Invariants Exact Claims Journal.
Print Assumptions stale_generation_is_a_noop.
Print Assumptions stale_reconnect_is_a_noop.
Print Assumptions reconnect_advances.
Print Assumptions ack_within_sent.
Print Assumptions received_within_sent.
Print Assumptions backoff_within_ceiling.
Print Assumptions fail_backoff_within_ceiling.
Print Assumptions acked_monotone.
Print Assumptions enqueue_assigns_next.
Print Assumptions next_monotone.
Print Assumptions no_change_no_effect.
Print Assumptions held_below_next.
Print Assumptions marks_step.
Print Assumptions conservation_step.
Print Assumptions window_step.
Print Assumptions window_bound.
Print Assumptions sorted_step.
Print Assumptions claims_step.
Print Assumptions a_replay_past_the_limit_dies.
Print Assumptions invariants_hold.
Print Assumptions nothing_is_lost.
Print Assumptions window_holds.
Print Assumptions marks_hold.
Print Assumptions sends_bounded.
Print Assumptions change_sets_exact.
Print Assumptions strict_claims_in_order.
Print Assumptions claim_progress.
Print Assumptions payloads_attached.
Print Assumptions jinv_step.
Print Assumptions crash_keeps_what_was_sent.
Print Assumptions claims_are_durable.
Print Assumptions wire_payload.
Print Assumptions attempts_attached.
