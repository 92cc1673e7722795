//! A terminal screen captured as text (`tmux capture-pane -p`) drawn as
//! an SVG: the picture of the chat app in the README
//! (`crates/egress-chat/tests/tmux.sh` writes the capture). Monospace, one
//! text element per row, a delivery mark coloured as the app colours it,
//! the last row (the status bar) reversed.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};

/// A cell's size in the picture, in pixels.
const CELL_W: f32 = 8.4;
const CELL_H: u32 = 17;

/// Reads the capture at `input` and writes its picture to `output`.
pub(crate) fn write_svg(input: &Path, output: &Path) -> Result<()> {
    let text = std::fs::read_to_string(input).with_context(|| format!("reading {}", input.display()))?;
    std::fs::write(output, svg(&text)).with_context(|| format!("writing {}", output.display()))
}

/// The picture of a capture.
fn svg(capture: &str) -> String {
    let rows: Vec<&str> = capture.trim_end_matches('\n').lines().collect();
    let cols = rows.iter().map(|r| r.chars().count()).max().unwrap_or(0);
    let (w, h) = ((cols as f32 * CELL_W).ceil() as u32 + 16, rows.len() as u32 * CELL_H + 16);
    let mut out = String::new();
    let _ = writeln!(
        out,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="DejaVu Sans Mono, Menlo, Consolas, monospace" font-size="14">"##
    );
    let _ = writeln!(out, r##"<rect width="100%" height="100%" fill="#1e1e1e"/>"##);
    for (i, row) in rows.iter().enumerate() {
        let y = 8 + (i as u32 + 1) * CELL_H - 4;
        let last = i + 1 == rows.len();
        if last {
            let _ = writeln!(
                out,
                r##"<rect x="8" y="{}" width="{}" height="{CELL_H}" fill="#d4d4d4"/>"##,
                y + 4 - CELL_H,
                (cols as f32 * CELL_W).ceil()
            );
        }
        let fill = if last { "#1e1e1e" } else { "#d4d4d4" };
        let _ = write!(
            out,
            r##"<text x="8" y="{y}" fill="{fill}" xml:space="preserve" textLength="{}" lengthAdjust="spacingAndGlyphs">"##,
            (row.chars().count() as f32 * CELL_W).ceil()
        );
        out.push_str(&spans(row));
        out.push_str("</text>\n");
    }
    out.push_str("</svg>\n");
    out
}

/// A row's text, escaped, with its delivery mark (`[delivered]`,
/// `[failed…]`, any other `[…]`) coloured.
fn spans(row: &str) -> String {
    let mut out = String::new();
    let mut rest = row;
    while let Some(start) = rest.find("  [") {
        let Some(len) = rest[start..].find(']') else { break };
        let (before, mark) = (&rest[..start + 2], &rest[start + 2..start + len + 1]);
        out.push_str(&escape(before));
        let colour = if mark == "[delivered]" {
            "#6a9955"
        } else if mark.starts_with("[failed") {
            "#f44747"
        } else {
            "#d7ba7d"
        };
        let _ = write!(out, r##"<tspan fill="{colour}">{}</tspan>"##, escape(mark));
        rest = &rest[start + len + 1..];
    }
    out.push_str(&escape(rest));
    out
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_are_coloured_and_text_escaped() {
        let row = "│alice: a<b  [delivered]   │";
        let out = spans(row);
        assert_eq!(out, r##"│alice: a&lt;b  <tspan fill="#6a9955">[delivered]</tspan>   │"##);
        assert!(spans("x  [queued]").contains(r##"<tspan fill="#d7ba7d">[queued]</tspan>"##));
        assert!(spans("x  [failed: refused]").contains("#f44747"));
        let picture = svg("one\ntwo\n");
        assert_eq!(picture.matches("<text ").count(), 2);
        assert!(picture.starts_with("<svg ") && picture.ends_with("</svg>\n"));
    }
}
