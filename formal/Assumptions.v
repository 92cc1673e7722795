(** Prints the axioms each theorem rests on; the Makefile requires every
    one of them to be "Closed under the global context". *)
From Egress Require Import Model Proofs Invariants.
Print Assumptions stale_generation_is_a_noop.
Print Assumptions stale_reconnect_is_a_noop.
Print Assumptions reconnect_advances.
Print Assumptions backoff_within_ceiling.
Print Assumptions fail_backoff_within_ceiling.
Print Assumptions acked_monotone.
Print Assumptions enqueue_assigns_next.
Print Assumptions next_monotone.
Print Assumptions no_change_no_effect.
Print Assumptions held_below_next.
Print Assumptions window_step.
Print Assumptions sorted_step.
Print Assumptions claims_in_budget_step.
Print Assumptions parked_in_budget_step.
Print Assumptions reconnect_replays_beyond_the_budget.
Print Assumptions invariants_hold.
Print Assumptions nothing_is_lost.
