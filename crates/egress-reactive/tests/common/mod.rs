//! Shared test helpers: a thread-safe run counter and a log, usable in both
//! flavours (they are `Send + Sync`), and the macro that instantiates one
//! test body per flavour.
#![allow(dead_code, unreachable_pub)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

#[derive(Clone, Default)]
pub struct Counter(Arc<AtomicUsize>);

impl Counter {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn hit(&self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
    pub fn get(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
    pub fn reset(&self) {
        self.0.store(0, Ordering::SeqCst);
    }
}

#[derive(Clone, Default)]
pub struct Log(Arc<Mutex<Vec<String>>>);

impl Log {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn push(&self, s: impl Into<String>) {
        self.0.lock().expect("log lock").push(s.into());
    }
    pub fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().expect("log lock"))
    }
}

/// `each_flavour! { fn name(cx) { body } ... }`: one `#[test]` per body and
/// per flavour, in modules `local`, `thread_safe` and `async_context` (the
/// synchronous API of `AsyncContext`; its async effects have their own file).
#[macro_export]
macro_rules! each_flavour {
    ($( $(#[$meta:meta])* fn $name:ident($cx:ident) $body:block )*) => {
        mod local {
            #[allow(unused_imports)]
            use super::*;
            $( $(#[$meta])* #[test] fn $name() { let $cx = egress_reactive::Context::new(); $body } )*
        }
        mod thread_safe {
            #[allow(unused_imports)]
            use super::*;
            $( $(#[$meta])* #[test] fn $name() { let $cx = egress_reactive::ThreadSafeContext::new(); $body } )*
        }
        mod async_context {
            #[allow(unused_imports)]
            use super::*;
            $( $(#[$meta])* #[test] fn $name() { let $cx = egress_reactive::AsyncContext::new(); $body } )*
        }
    };
}

/// An effect over `reader`, counting its runs (reset after the first).
#[macro_export]
macro_rules! watch {
    ($cx:ident, $reader:expr) => {{
        let hits = $crate::common::Counter::new();
        let _ = $cx.effect({
            let (r, hits) = ($reader.clone(), hits.clone());
            move || {
                r.with(|_| ());
                hits.hit();
            }
        });
        hits.reset();
        hits
    }};
}
