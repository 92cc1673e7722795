//! The screen: a [`View`] computed from the client's signals and the
//! cells' computeds, and a function that draws it (ratatui). The binary
//! draws it from one effect, which runs only when the view changed: no
//! redraw loop.

use std::time::Duration;

use egress_core::MessageStatus;
use egress_reactive::{ConnectionState, Signal, Threaded};
use ratatui::Frame;
use ratatui::layout::{Constraint, Direction, Layout};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line as TextLine, Span};
use ratatui::widgets::{Block, Borders, List, ListItem, Paragraph};
use unicode_width::UnicodeWidthChar as _;

use crate::client::{Client, PushState};

/// Everything the screen shows, as one value: the effect that draws it
/// runs when it changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct View {
    /// The rooms, with their counts.
    pub rooms: Vec<RoomRow>,
    /// The room shown.
    pub title: String,
    /// Its lines: the server's history, then the client's own lines not
    /// pushed back yet.
    pub lines: Vec<Shown>,
    /// The input line.
    pub input: String,
    /// The status bar.
    pub status: String,
    /// The debug overlay, if shown.
    pub debug: Option<String>,
}

/// A room in the room list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoomRow {
    /// Its name.
    pub name: String,
    /// Lines of others not seen yet.
    pub unread: usize,
    /// The client's own lines not delivered yet.
    pub unsent: usize,
    /// Whether it is the room shown.
    pub current: bool,
}

/// A line on screen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shown {
    /// Its author.
    pub from: String,
    /// What it says.
    pub text: String,
    /// Its delivery state, for the client's own lines: "delivered" once
    /// the server stored it, else the cell's status.
    pub mark: Option<String>,
}

/// What a UI's input adds to the client's state.
#[derive(Clone)]
pub struct Input {
    /// The line being typed.
    pub text: Signal<String, Threaded>,
    /// Whether the debug overlay is shown.
    pub debug: Signal<bool, Threaded>,
    /// Redraws per second, measured (for the overlay).
    pub redraws: Signal<u64, Threaded>,
    /// A tick every half second: read by the view only while it shows a
    /// countdown ("retrying in 3 s"), so that only then does time redraw
    /// the screen (and only when the number shown changed).
    pub clock: Signal<u64, Threaded>,
}

/// The view of `client` with `input`: read from signals and computeds, so
/// a computed of it changes exactly when something shown changed.
#[must_use]
pub fn view(client: &Client, input: &Input) -> View {
    let current = client.current.get();
    let rooms: Vec<RoomRow> = client
        .rooms()
        .iter()
        .enumerate()
        .map(|(i, r)| RoomRow {
            name: r.name.clone(),
            unread: r.unread.get(),
            unsent: r.unsent(),
            current: i == current,
        })
        .collect();
    let Some(room) = client.rooms().get(current) else { return View::default() };
    let me = client.name();
    let mut lines: Vec<Shown> = room.history.with(|h| {
        h.iter()
            .map(|p| Shown {
                from: p.line.from.clone(),
                text: p.line.text.clone(),
                mark: (p.line.from == me).then(|| "delivered".to_owned()),
            })
            .collect()
    });
    room.mine.with(|mine| {
        for m in mine {
            let mark = match m.status.get() {
                None => "saving".to_owned(),
                Some(MessageStatus::Retrying) => {
                    // When its backoff ends: its parked record's due time
                    // on the cell's clock.
                    let due = room.cell().parked().get().iter().find(|r| r.sequence == m.seq).map(|r| r.due);
                    match due {
                        Some(due) => {
                            let _ = input.clock.get();
                            let left = Duration::from_millis(due.0.saturating_sub(room.cell().now().0));
                            format!("retrying in {} s", seconds(left))
                        }
                        None => "retrying".to_owned(),
                    }
                }
                Some(other) => other.to_string(),
            };
            lines.push(Shown { from: m.line.from.clone(), text: m.line.text.clone(), mark: Some(mark) });
        }
    });
    let online = client.online.get();
    let connection = match (online, room.connection()) {
        (false, _) => "offline (by you: ctrl-o to reconnect)".to_owned(),
        (true, None) => "connecting".to_owned(),
        (true, Some(state)) => connection_label(&state, &input.clock),
    };
    let push = match client.push_state.get() {
        PushState::Connected => "live".to_owned(),
        PushState::Connecting => "connecting".to_owned(),
        PushState::Reconnecting(why) => format!("reconnecting ({why})"),
        PushState::Offline => "offline".to_owned(),
    };
    let unsent: usize = rooms.iter().map(|r| r.unsent).sum();
    // The short parts first: a long error must not push them off the row.
    let mut status = format!("{me} | unsent {unsent} | send: {connection} | updates: {push}");
    if let Some(notice) = client.notice.get() {
        status.push_str(&format!(" | {notice}"));
    }
    let debug = input.debug.get().then(|| format!("redraws/s {}", input.redraws.get()));
    View { rooms, title: room.name.clone(), lines, input: input.text.get(), status, debug }
}

/// `text` with every control character (ESC, CR, BEL, ...) shown as
/// U+FFFD: what peers write (and the errors their connections end with) is
/// text to the screen, never a command to the terminal. [`render`] draws
/// every string through it (or through the same rule, wrapping).
#[must_use]
pub fn clean(text: &str) -> String {
    text.chars().map(|c| if c.is_control() { '\u{fffd}' } else { c }).collect()
}

/// Whole seconds left, rounded up ("in 1 s" until it is due).
fn seconds(left: Duration) -> u64 {
    left.as_millis().div_ceil(1000).try_into().unwrap_or(u64::MAX)
}

/// A connection state as the status bar says it (reading `clock` while it
/// counts down to the next attempt).
fn connection_label<E: std::fmt::Display>(state: &ConnectionState<E>, clock: &Signal<u64, Threaded>) -> String {
    match state {
        ConnectionState::Connecting { attempt } if *attempt > 1 => format!("connecting (attempt {attempt})"),
        ConnectionState::Connecting { .. } => "connecting".to_owned(),
        ConnectionState::Connected { .. } => "online".to_owned(),
        ConnectionState::Reconnecting { error, retry_at, .. } => {
            let _ = clock.get();
            let left = retry_at.saturating_duration_since(std::time::Instant::now());
            format!("offline ({error}); reconnecting in {} s", seconds(left))
        }
        ConnectionState::Stopped { error: Some(error) } => format!("stopped: {error}"),
        ConnectionState::Stopped { error: None } => "stopped".to_owned(),
        _ => "unknown".to_owned(),
    }
}

/// Styled text cut into rows of at most `width` columns (a character wider
/// than the row gets a row of its own; at least one row, even empty).
fn wrap(parts: &[(String, Style)], width: usize) -> Vec<TextLine<'static>> {
    let mut rows = Vec::new();
    let mut row: Vec<Span<'static>> = Vec::new();
    let mut used = 0;
    for (text, style) in parts {
        let mut run = String::new();
        for c in text.chars() {
            let c = if c.is_control() { '\u{fffd}' } else { c };
            let w = c.width().unwrap_or(0);
            if used + w > width && used > 0 {
                if !run.is_empty() {
                    row.push(Span::styled(std::mem::take(&mut run), *style));
                }
                rows.push(TextLine::from(std::mem::take(&mut row)));
                used = 0;
            }
            run.push(c);
            used += w;
        }
        if !run.is_empty() {
            row.push(Span::styled(run, *style));
        }
    }
    rows.push(TextLine::from(row));
    rows
}

/// Draws `view` on `frame`.
pub fn render(frame: &mut Frame<'_>, view: &View) {
    let [body, input, status] = Layout::default()
        .direction(Direction::Vertical)
        .constraints([Constraint::Min(3), Constraint::Length(3), Constraint::Length(1)])
        .areas(frame.area());
    let [list, lines] = Layout::default()
        .direction(Direction::Horizontal)
        .constraints([Constraint::Length(24), Constraint::Min(10)])
        .areas(body);
    let rooms: Vec<ListItem<'_>> = view
        .rooms
        .iter()
        .map(|r| {
            let mut text = format!("{} #{}", if r.current { ">" } else { " " }, clean(&r.name));
            if r.unread > 0 {
                text.push_str(&format!(" {} new", r.unread));
            }
            if r.unsent > 0 {
                text.push_str(&format!(" {} unsent", r.unsent));
            }
            let style = if r.current { Style::default().add_modifier(Modifier::BOLD) } else { Style::default() };
            ListItem::new(text).style(style)
        })
        .collect();
    frame.render_widget(List::new(rooms).block(Block::default().borders(Borders::ALL).title("rooms")), list);
    // Wrapped here, not by the paragraph: the room shows its newest rows,
    // and only the wrapping knows how many rows a line takes.
    let (width, height) = (usize::from(lines.width.saturating_sub(2)), usize::from(lines.height.saturating_sub(2)));
    let mut rows: Vec<TextLine<'_>> = Vec::new();
    for l in &view.lines {
        let mut parts =
            vec![(format!("{}: ", l.from), Style::default().fg(Color::Cyan)), (l.text.clone(), Style::default())];
        if let Some(mark) = &l.mark {
            let color = match mark.as_str() {
                "delivered" => Color::Green,
                m if m.starts_with("failed") => Color::Red,
                _ => Color::Yellow,
            };
            parts.push((format!("  [{mark}]"), Style::default().fg(color)));
        }
        rows.extend(wrap(&parts, width));
    }
    let shown = rows.split_off(rows.len().saturating_sub(height));
    let title = format!("#{}", clean(&view.title));
    frame.render_widget(Paragraph::new(shown).block(Block::default().borders(Borders::ALL).title(title)), lines);
    frame.render_widget(
        Paragraph::new(format!("> {}", clean(&view.input))).block(
            Block::default().borders(Borders::ALL).title("enter: send  tab: next room  ctrl-o: offline  esc: quit"),
        ),
        input,
    );
    let mut status_line = clean(&view.status);
    if let Some(debug) = &view.debug {
        status_line.push_str(&format!(" | {debug}"));
    }
    frame.render_widget(Paragraph::new(status_line).style(Style::default().add_modifier(Modifier::REVERSED)), status);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_countdown_rounds_up_to_whole_seconds() {
        assert_eq!(seconds(Duration::ZERO), 0);
        assert_eq!(seconds(Duration::from_millis(1)), 1);
        assert_eq!(seconds(Duration::from_millis(1000)), 1);
        assert_eq!(seconds(Duration::from_millis(1001)), 2);
        assert_eq!(seconds(Duration::MAX), u64::MAX, "saturates");
    }
}
