//! The screen against what peers write and what terminals are (a hostile
//! review's probes): drawn with ratatui's test backend through
//! `egress_chat::ui::render`, the function the binary's one effect calls.
#![allow(clippy::unwrap_used)]

use egress_chat::ui::{RoomRow, Shown, View, render};
use ratatui::Terminal;
use ratatui::backend::TestBackend;

fn view(lines: Vec<Shown>) -> View {
    View {
        rooms: vec![RoomRow { name: "general".into(), unread: 0, unsent: 0, current: true }],
        title: "general".into(),
        lines,
        input: String::new(),
        status: "alice | unsent 0".into(),
        debug: None,
    }
}

fn shown(from: &str, text: &str) -> Shown {
    Shown { from: from.into(), text: text.into(), mark: None }
}

fn screen(w: u16, h: u16, view: &View) -> Terminal<TestBackend> {
    let mut terminal = Terminal::new(TestBackend::new(w, h)).unwrap();
    terminal.draw(|frame| render(frame, view)).unwrap();
    terminal
}

fn text_of(terminal: &Terminal<TestBackend>) -> String {
    let buffer = terminal.backend().buffer();
    let mut out = String::new();
    for y in 0..buffer.area.height {
        for x in 0..buffer.area.width {
            out.push_str(buffer[(x, y)].symbol());
        }
        out.push('\n');
    }
    out
}

/// A peer's line is text: what it holds must not reach the terminal as
/// control characters (ESC sequences would retitle, clear or rewrite the
/// reader's terminal; CR moves its cursor). The server stores and pushes a
/// line's `text` as the peer wrote it, so it is the screen's to refuse.
#[test]
fn a_peers_control_characters_do_not_reach_the_terminal() {
    let hostile = "hi\u{1b}]0;owned\u{7}\u{1b}[2J\rX";
    let terminal = screen(80, 12, &view(vec![shown("mallory", hostile)]));
    let controls: Vec<String> = terminal
        .backend()
        .buffer()
        .content()
        .iter()
        .map(|c| c.symbol().to_owned())
        .filter(|s| s.chars().any(char::is_control))
        .collect();
    assert!(controls.is_empty(), "control characters in the cells written to the terminal: {controls:?}");
}

/// The room shows its newest lines: with lines that wrap, the last one
/// must still be on screen (the scroll counts lines, the paragraph wraps
/// them into more rows).
#[test]
fn the_newest_line_is_on_screen_when_lines_wrap() {
    let long = "word ".repeat(40);
    let mut lines: Vec<Shown> = (0..5).map(|_| shown("bob", &long)).collect();
    lines.push(shown("bob", "NEWEST"));
    let terminal = screen(80, 14, &view(lines));
    let text = text_of(&terminal);
    assert!(text.contains("NEWEST"), "the newest line is not shown:\n{text}");
}

/// No size of terminal, however small, and no text, however wide, makes
/// the draw panic.
#[test]
fn tiny_terminals_and_wide_text_do_not_panic() {
    let lines = vec![
        shown("李", &"漢字😀\u{301}".repeat(50)),
        Shown { from: "me".into(), text: "\u{200b}".repeat(30), mark: Some("retrying in 3 s".into()) },
    ];
    let mut v = view(lines);
    v.input = "写".repeat(100);
    v.status = "状".repeat(100);
    for w in 0..40 {
        for h in 0..12 {
            let _ = screen(w, h, &v);
        }
    }
}
