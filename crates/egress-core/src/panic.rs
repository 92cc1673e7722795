//! The message of a caught panic, for the shells that catch one in user
//! code (a codec, a handler, a connect callback) and report it.

use std::any::Any;

/// The text a panic was raised with: its payload when that is a `&str` (a
/// literal message) or a `String` (a formatted one); `None` for any other
/// payload (`std::panic::panic_any`).
pub fn panic_message(payload: &(dyn Any + Send)) -> Option<&str> {
    payload.downcast_ref::<&str>().copied().or_else(|| payload.downcast_ref::<String>().map(String::as_str))
}

#[cfg(test)]
mod tests {
    use super::panic_message;

    #[test]
    fn a_literal_and_a_formatted_message_are_read_and_another_payload_is_none() {
        let caught = |f: fn()| std::panic::catch_unwind(f).expect_err("it panics");
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let literal = caught(|| panic!("a literal"));
        let formatted = caught(|| panic!("formatted {}", 7));
        let other = caught(|| std::panic::panic_any(7_u32));
        std::panic::set_hook(hook);
        assert_eq!(panic_message(&*literal), Some("a literal"));
        assert_eq!(panic_message(&*formatted), Some("formatted 7"));
        assert_eq!(panic_message(&*other), None);
    }
}
