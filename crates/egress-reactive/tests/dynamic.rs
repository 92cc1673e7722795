#![allow(clippy::unwrap_used)]
//! Dynamic dependencies: branch switching, dropped dependencies
//! unsubscribed, re-subscription.

mod common;
use common::Counter;

each_flavour! {
    fn a_signal_read_again_after_another_is_linked_once(cx) {
        let (a, b) = (cx.signal(1), cx.signal(2));
        let fx = cx.effect({ let (a, b) = (a.clone(), b.clone()); move || { a.get(); b.get(); a.get(); } });
        assert_eq!((a.subscriber_count(), b.subscriber_count()), (1, 1), "one link each, though a was read twice");
        a.set(5);
        assert_eq!(fx.runs(), 2, "one run per change");
        assert_eq!((a.subscriber_count(), b.subscriber_count()), (1, 1));
    }

    fn branch_switch_drops_the_old_branch(cx) {
        let cond = cx.signal(true);
        let a = cx.signal(1);
        let b = cx.signal(100);
        let runs = Counter::new();
        let c = cx.computed({
            let (cond, a, b, r) = (cond.clone(), a.clone(), b.clone(), runs.clone());
            move || { r.hit(); if cond.get() { a.get() } else { b.get() } }
        });
        let fx = cx.effect({ let c = c.clone(); move || { c.get(); } });
        assert_eq!((a.subscriber_count(), b.subscriber_count()), (1, 0));
        b.set(101);
        assert_eq!(runs.get(), 1, "b is not a dependency yet");
        cond.set(false);
        assert_eq!(c.get(), 101);
        assert_eq!((a.subscriber_count(), b.subscriber_count()), (0, 1), "a was unsubscribed");
        a.set(2);
        assert_eq!(runs.get(), 2, "a dropped dependency re-runs nothing");
        assert_eq!(fx.runs(), 2);
        cond.set(true);
        assert_eq!(c.get(), 2, "re-subscribed to a");
        a.set(3);
        assert_eq!(c.get(), 3);
        assert_eq!(fx.runs(), 4);
        assert_eq!(c.dependency_count(), 2);
    }

    fn effect_dependencies_follow_its_reads(cx) {
        let show = cx.signal(false);
        let detail = cx.signal(0);
        let fx = cx.effect({ let (s, d) = (show.clone(), detail.clone()); move || { if s.get() { d.get(); } } });
        detail.set(1);
        assert_eq!(fx.runs(), 1);
        show.set(true);
        detail.set(2);
        assert_eq!(fx.runs(), 3);
        show.set(false);
        detail.set(3);
        assert_eq!(fx.runs(), 4);
        assert_eq!(fx.dependency_count(), 1);
    }

    fn repeated_reads_make_one_dependency(cx) {
        let a = cx.signal(2);
        let c = cx.computed({ let a = a.clone(); move || (0..30).map(|_| a.get()).sum::<i32>() });
        assert_eq!(c.get(), 60);
        a.set(3);
        assert_eq!(c.get(), 90);
        assert_eq!(c.dependency_count(), 1);
        assert_eq!(a.subscriber_count(), 1);
    }

    fn alternating_dependencies_stay_bounded(cx) {
        let head = cx.signal(1);
        let double = cx.computed({ let h = head.clone(); move || h.get() * 2 });
        let inverse = cx.computed({ let h = head.clone(); move || -h.get() });
        let current = cx.computed({
            let (h, d, i) = (head.clone(), double.clone(), inverse.clone());
            move || (0..20).map(|_| if h.get() % 2 == 1 { d.get() } else { i.get() }).sum::<i32>()
        });
        assert_eq!(current.get(), 40);
        let links = cx.link_count();
        for v in 2..50 {
            head.set(v);
            let expect = if v % 2 == 1 { 40 * v } else { -20 * v };
            assert_eq!(current.get(), expect);
        }
        assert!(cx.link_count() <= links + 4, "links do not grow with switches: {} vs {}", cx.link_count(), links);
    }
}
