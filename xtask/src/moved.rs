//! `cargo run -p xtask -- unmoved-diff < full.diff > changed.diff`: the
//! lines a unified diff really changed, with code that only moved left out.
//!
//! The mutation gate (`.ci/mutants`) mutates the lines of a gated file set
//! changed since the commit at which the set was last reviewed. `git diff`
//! shows code moved to another place (a file split along its seams) as
//! removed and added again, so a split would put every moved line back in
//! the gate as if it were new. A moved line is the same code under the
//! same tests: its mutants are the ones the review already saw caught.
//!
//! The rule, and nothing looser:
//! - A **moved block** is a run of consecutive added lines equal, up to
//!   leading and trailing whitespace (a move into a module or an `impl`
//!   indents differently), to a run of consecutive removed lines of the
//!   same diff, with at least [`MIN_ALNUM`] letters and digits in it (git's
//!   own threshold for `--color-moved`), so a lone brace or a short common
//!   line elsewhere is still new. Each removed line moves at most once: code
//!   removed once and pasted twice has a copy no review has seen.
//! - And it is **whole items**: it starts where an item starts (an
//!   attribute, a doc comment, `fn`, `impl`, `struct`, `use`, … with any
//!   visibility) and its braces balance, never closing one it did not
//!   open. A statement moved into another function, two statements
//!   swapped, a line re-indented inside a string literal: each changes
//!   behaviour with every line's text kept, and none is whole items, so
//!   each stays a change. What a file split moves (functions, impls,
//!   types, with their docs) is.
//! - Every other added line is **changed**, and so is each line next to a
//!   removal that did not move (what cargo-mutants itself counts for a
//!   deletion: the line before it and the line after it).
//! - A blank line or a `//` comment, added or removed, changes no
//!   behaviour and is never a change.
//!
//! The output is a diff of the new side only: each changed line as a
//! one-line insertion at its line number, which cargo-mutants' `--in-diff`
//! reads (it checks each line against the tree and mutates what
//! intersects). A diff with nothing changed comes out empty.

use std::collections::HashMap;
use std::fmt::Write as _;

use anyhow::{Context, Result, bail};

/// Letters and digits a moved block needs (git's `--color-moved` uses 20).
pub(crate) const MIN_ALNUM: usize = 20;

/// One line of a hunk, with where it stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Added,
    Removed,
    Context,
}

#[derive(Debug)]
struct Line<'a> {
    kind: Kind,
    text: &'a str,
    /// The new side's line number: the line itself for an added or context
    /// line; for a removed line, the new-side line that follows it.
    new_line: usize,
    /// Which file (index into `files`).
    file: usize,
    /// Consecutive lines of one kind in one hunk share a run.
    run: usize,
}

/// A file's changed lines: its new-side path, and each line's number and
/// text, in order.
pub(crate) type Changed = (String, Vec<(usize, String)>);

/// The lines of `diff` that changed, by file. Moved code is left out (see
/// the module docs).
pub(crate) fn changed_lines(diff: &str) -> Result<Vec<Changed>> {
    let (files, lines) = parse(diff)?;
    let moved = moved(&lines);
    let mut out: Vec<Changed> = files.iter().map(|f| (f.clone(), Vec::new())).collect();
    // The new side's text by (file, line), from added and context lines, for
    // the neighbours of a removal.
    let mut text: HashMap<(usize, usize), &str> = HashMap::new();
    for l in &lines {
        if l.kind != Kind::Removed {
            text.insert((l.file, l.new_line), l.text);
        }
    }
    let mut marked: Vec<std::collections::BTreeSet<usize>> = vec![Default::default(); files.len()];
    for (i, l) in lines.iter().enumerate() {
        if moved[i] || !is_code(l.text) {
            continue;
        }
        match l.kind {
            Kind::Added => {
                marked[l.file].insert(l.new_line);
            }
            Kind::Removed => {
                // The lines around the removal, where the new side has them.
                for n in [l.new_line.checked_sub(1), Some(l.new_line)].into_iter().flatten() {
                    if text.contains_key(&(l.file, n)) {
                        marked[l.file].insert(n);
                    }
                }
            }
            Kind::Context => {}
        }
    }
    for (f, set) in marked.iter().enumerate() {
        for &n in set {
            let t = text.get(&(f, n)).copied().unwrap_or_default();
            out[f].1.push((n, t.to_owned()));
        }
    }
    out.retain(|(path, changed)| path != "/dev/null" && !changed.is_empty());
    Ok(out)
}

/// [`changed_lines`] written as a unified diff of one-line insertions.
pub(crate) fn unmoved_diff(diff: &str) -> Result<String> {
    let mut s = String::new();
    for (path, changed) in changed_lines(diff)? {
        writeln!(s, "diff --git a/{path} b/{path}")?;
        writeln!(s, "--- a/{path}")?;
        writeln!(s, "+++ b/{path}")?;
        for (i, (n, text)) in changed.iter().enumerate() {
            // As insertions into a file without them: the old side has the
            // lines before this one that were not inserted.
            let old = n - 1 - i;
            writeln!(s, "@@ -{old},0 +{n},1 @@")?;
            writeln!(s, "+{text}")?;
        }
    }
    Ok(s)
}

/// The file paths (new side, without `b/`) and every hunk line.
fn parse(diff: &str) -> Result<(Vec<String>, Vec<Line<'_>>)> {
    let mut files = Vec::new();
    let mut lines = Vec::new();
    let mut new_line = 0usize;
    let mut old_left = 0usize;
    let mut new_left = 0usize;
    let mut run = 0usize;
    let mut last: Option<Kind> = None;
    for (no, raw) in diff.lines().enumerate() {
        let in_hunk = old_left > 0 || new_left > 0;
        if in_hunk {
            let (kind, text) = match raw.split_at_checked(1) {
                Some(("+", t)) => (Kind::Added, t),
                Some(("-", t)) => (Kind::Removed, t),
                Some((" ", t)) => (Kind::Context, t),
                // `\ No newline at end of file` belongs to the line above.
                Some(("\\", _)) => continue,
                _ if raw.is_empty() => (Kind::Context, ""),
                _ => bail!("diff line {}: {raw:?} inside a hunk", no + 1),
            };
            if last != Some(kind) {
                run += 1;
                last = Some(kind);
            }
            let file = files.len().checked_sub(1).context("a hunk before any file header")?;
            lines.push(Line { kind, text, new_line, file, run });
            match kind {
                Kind::Added => {
                    new_left = new_left.checked_sub(1).context("a hunk longer than its header")?;
                    new_line += 1;
                }
                Kind::Removed => old_left = old_left.checked_sub(1).context("a hunk longer than its header")?,
                Kind::Context => {
                    new_left = new_left.checked_sub(1).context("a hunk longer than its header")?;
                    old_left = old_left.checked_sub(1).context("a hunk longer than its header")?;
                    new_line += 1;
                }
            }
            continue;
        }
        if raw.starts_with("diff --git ") {
            // The path comes from `+++`; until then this file has none.
            files.push(String::new());
        } else if let Some(path) = raw.strip_prefix("+++ ") {
            let path = path.strip_prefix("b/").unwrap_or(path);
            let slot = files.last_mut().context("a `+++` line before `diff --git`")?;
            *slot = path.to_owned();
        } else if let Some(rest) = raw.strip_prefix("--- ") {
            // The old side's path matters only for a deletion, whose `+++`
            // is /dev/null; nothing to record.
            let _ = rest;
        } else if let Some(header) = raw.strip_prefix("@@ ") {
            let (old, new) = hunk_ranges(header).with_context(|| format!("diff line {}: {raw:?}", no + 1))?;
            (old_left, new_left) = (old.1, new.1);
            // A hunk of count 0 names the line before it.
            new_line = if new.1 == 0 { new.0 + 1 } else { new.0 };
            last = None;
        }
        // Other header lines (index, mode, rename, similarity, `\ No
        // newline`) say nothing about lines.
    }
    if old_left > 0 || new_left > 0 {
        bail!("the diff ends inside a hunk");
    }
    Ok((files, lines))
}

/// `-a,b +c,d @@…` as ((a, b), (c, d)); a missing count is 1.
fn hunk_ranges(header: &str) -> Result<((usize, usize), (usize, usize))> {
    let mut parts = header.split_whitespace();
    let range = |p: Option<&str>, sign: char| -> Result<(usize, usize)> {
        let p = p.and_then(|p| p.strip_prefix(sign)).context("a hunk header without its ranges")?;
        let (start, count) = p.split_once(',').unwrap_or((p, "1"));
        Ok((start.parse()?, count.parse()?))
    };
    Ok((range(parts.next(), '-')?, range(parts.next(), '+')?))
}

/// For each line, whether it belongs to a moved block (added lines) or was
/// the source of one (removed lines).
fn moved(lines: &[Line<'_>]) -> Vec<bool> {
    let mut moved = vec![false; lines.len()];
    let mut removed_at: HashMap<&str, Vec<usize>> = HashMap::new();
    for (i, l) in lines.iter().enumerate() {
        if l.kind == Kind::Removed {
            removed_at.entry(l.text.trim()).or_default().push(i);
        }
    }
    let same_run = |a: usize, b: usize| lines[a].run == lines[b].run;
    let mut i = 0;
    while i < lines.len() {
        if lines[i].kind != Kind::Added {
            i += 1;
            continue;
        }
        // The longest unconsumed removed run matching from here.
        let mut best: Option<(usize, usize)> = None;
        for &j in removed_at.get(lines[i].text.trim()).map(Vec::as_slice).unwrap_or_default() {
            let mut k = 0;
            while i + k < lines.len()
                && j + k < lines.len()
                && same_run(i, i + k)
                && same_run(j, j + k)
                && !moved[j + k]
                && lines[i + k].text.trim() == lines[j + k].text.trim()
            {
                k += 1;
            }
            if k > best.map_or(0, |b| b.1) {
                best = Some((j, k));
            }
        }
        // The longest prefix of the match that is whole items.
        let best = best.and_then(|(j, k)| whole_items(&lines[i..i + k]).map(|k| (j, k)));
        match best {
            Some((j, k)) if alnum(&lines[i..i + k]) >= MIN_ALNUM => {
                for m in 0..k {
                    moved[i + m] = true;
                    moved[j + m] = true;
                }
                i += k;
            }
            _ => i += 1,
        }
    }
    moved
}

/// How many of `block`'s first lines make whole items (see the module
/// docs), the most that do; `None` if it does not start an item.
fn whole_items(block: &[Line<'_>]) -> Option<usize> {
    let first = block.first()?.text.trim_start();
    if !starts_item(first) {
        return None;
    }
    let (mut depth, mut whole) = (0i64, None);
    for (n, line) in block.iter().enumerate() {
        for c in line.text.chars() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                _ => {}
            }
            if depth < 0 {
                return whole;
            }
        }
        // A line at depth 0 ends an item (or is one), unless it is an
        // attribute or a doc comment still waiting for its item.
        let t = line.text.trim();
        if depth == 0 && !t.starts_with("#[") && !t.starts_with("///") && !t.is_empty() {
            whole = Some(n + 1);
        }
    }
    whole
}

/// Whether `line` (trimmed at its start) begins an item.
fn starts_item(line: &str) -> bool {
    const STARTS: [&str; 20] = [
        "#[",
        "#![",
        "///",
        "//!",
        "fn ",
        "pub ",
        "pub(",
        "impl",
        "struct ",
        "enum ",
        "mod ",
        "use ",
        "const ",
        "static ",
        "type ",
        "trait ",
        "async fn ",
        "unsafe ",
        "extern ",
        "macro_rules!",
    ];
    STARTS.iter().any(|s| line.starts_with(s))
}

/// Whether a line is code: not blank and not a `//` comment.
fn is_code(text: &str) -> bool {
    let t = text.trim();
    !t.is_empty() && !t.starts_with("//")
}

fn alnum(lines: &[Line<'_>]) -> usize {
    lines.iter().map(|l| l.text.chars().filter(char::is_ascii_alphanumeric).count()).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn changed(diff: &str) -> Vec<(String, Vec<usize>)> {
        changed_lines(diff)
            .expect("a well-formed diff")
            .into_iter()
            .map(|(p, c)| (p, c.into_iter().map(|(n, _)| n).collect()))
            .collect()
    }

    /// A file split: `helper` (with its doc) moved whole from a.rs into an
    /// impl in b.rs, indented one level deeper; `other` moved too, but its
    /// first line edited (`pub(super)`), so the rest of it is no whole item
    /// and stays a change.
    const SPLIT: &str = "\
diff --git a/src/a.rs b/src/a.rs
--- a/src/a.rs
+++ b/src/a.rs
@@ -1,11 +1,2 @@
 use std::fmt;
-/// Doubles and adds one.
-fn helper(value: u64) -> u64 {
-    let doubled = value.saturating_mul(2);
-    doubled + 1
-}
-
-fn other(value: u64) -> u64 {
-    value.wrapping_add(7)
-}
 fn keep() {}
diff --git a/src/b.rs b/src/b.rs
new file mode 100644
--- /dev/null
+++ b/src/b.rs
@@ -0,0 +1,11 @@
+impl Thing {
+    /// Doubles and adds one.
+    fn helper(value: u64) -> u64 {
+        let doubled = value.saturating_mul(2);
+        doubled + 1
+    }
+
+    pub(super) fn other(value: u64) -> u64 {
+        value.wrapping_add(7)
+    }
+}
";

    #[test]
    fn a_moved_item_is_left_out_and_an_edited_one_and_new_lines_are_kept() {
        // b.rs: 2-6 moved (7 is blank); 1, 8-11 changed. a.rs: the removal
        // of `other` did not move, so its neighbours are marked.
        assert_eq!(
            changed(SPLIT),
            vec![("src/a.rs".to_owned(), vec![1, 2]), ("src/b.rs".to_owned(), vec![1, 8, 9, 10, 11])]
        );
    }

    #[test]
    fn a_block_below_the_letter_threshold_is_new_even_if_the_same_text_was_removed() {
        let diff = "\
diff --git a/x.rs b/x.rs
--- a/x.rs
+++ b/x.rs
@@ -1,1 +1,1 @@
-use a::b;
+use a::c;
diff --git a/y.rs b/y.rs
--- a/y.rs
+++ b/y.rs
@@ -1,1 +1,2 @@
 fn g() {}
+use a::b;
";
        // x.rs line 1 is new; y.rs's `use a::b;` has 4 letters: not a
        // move, so it is changed (and x.rs's removal marks line 1).
        assert_eq!(changed(diff), vec![("x.rs".to_owned(), vec![1]), ("y.rs".to_owned(), vec![2])]);
    }

    #[test]
    fn a_removed_item_pasted_twice_moves_once() {
        let item = "fn total_of(items: &[u64]) -> u64 { items.iter().sum() }";
        let diff = format!(
            "diff --git a/a.rs b/a.rs\n--- a/a.rs\n+++ b/a.rs\n@@ -1,2 +1,1 @@\n fn a() {{}}\n-{item}\n\
             diff --git a/b.rs b/b.rs\n--- a/b.rs\n+++ b/b.rs\n@@ -1,0 +1,3 @@\n+{item}\n+fn g() {{}}\n+{item}\n"
        );
        assert_eq!(changed(&diff), vec![("b.rs".to_owned(), vec![2, 3])]);
    }

    #[test]
    fn a_removal_that_did_not_move_marks_its_neighbours() {
        let diff = "\
diff --git a/a.rs b/a.rs
--- a/a.rs
+++ b/a.rs
@@ -10,5 +10,4 @@ fn f() {
     let x = 1;
-    if x > limit_of_everything_here { return; }
     run(x);
     done();
     end();
";
        assert_eq!(changed(diff), vec![("a.rs".to_owned(), vec![10, 11])]);
    }

    #[test]
    fn what_changes_behaviour_with_every_line_kept_is_no_move() {
        // Two statements swapped in one function: neither is an item.
        let swapped = "\
diff --git a/a.rs b/a.rs
--- a/a.rs
+++ b/a.rs
@@ -1,4 +1,4 @@
 fn ack(&mut self, through: u64) {
-    self.rows.retain(|r| r.sequence > through);
     self.acked_through_watermark = through;
+    self.rows.retain(|r| r.sequence > through);
 }
";
        assert_eq!(changed(swapped), vec![("a.rs".to_owned(), vec![1, 2, 3])]);
        // A statement moved from one function into another.
        let moved = "\
diff --git a/a.rs b/a.rs
--- a/a.rs
+++ b/a.rs
@@ -1,6 +1,6 @@
 fn release(&mut self, stream: &str) {
-    self.owned_streams_by_name.remove(stream);
 }
 fn apply(&mut self, stream: &str) {
+    self.owned_streams_by_name.remove(stream);
     self.write(stream);
 }
";
        assert_eq!(changed(moved), vec![("a.rs".to_owned(), vec![1, 2, 4])]);
        // A string literal's continuation line re-indented.
        let literal = "\
diff --git a/a.rs b/a.rs
--- a/a.rs
+++ b/a.rs
@@ -1,3 +1,3 @@
 const SQL: &str = \"SELECT owner
-    FROM egress_stream_table WHERE stream = ?1\";
+        FROM egress_stream_table WHERE stream = ?1\";
 fn f() {}
";
        assert_eq!(changed(literal), vec![("a.rs".to_owned(), vec![1, 2])]);
    }

    #[test]
    fn the_output_is_a_diff_of_insertions_at_the_new_line_numbers() {
        let out = unmoved_diff(SPLIT).expect("a well-formed diff");
        assert!(out.starts_with(
            "diff --git a/src/a.rs b/src/a.rs\n--- a/src/a.rs\n+++ b/src/a.rs\n\
             @@ -0,0 +1,1 @@\n+use std::fmt;\n\
             @@ -0,0 +2,1 @@\n+fn keep() {}\n\
             diff --git a/src/b.rs b/src/b.rs\n--- a/src/b.rs\n+++ b/src/b.rs\n\
             @@ -0,0 +1,1 @@\n+impl Thing {\n\
             @@ -6,0 +8,1 @@\n+    pub(super) fn other(value: u64) -> u64 {\n"
        ));
        // Read back, it names the same lines.
        assert_eq!(changed(&out), changed(SPLIT));
    }

    #[test]
    fn a_diff_of_moves_only_is_empty_and_a_broken_one_is_an_error() {
        let moved_only = "\
diff --git a/a.rs b/a.rs
--- a/a.rs
+++ b/a.rs
@@ -1,5 +1,1 @@
 fn keep() {}
-/// Doubles and adds one.
-fn helper(value: u64) -> u64 {
-    value.saturating_mul(2) + 1
-}
diff --git a/b.rs b/b.rs
--- /dev/null
+++ b/b.rs
@@ -0,0 +1,5 @@
+/// Doubles and adds one.
+fn helper(value: u64) -> u64 {
+    value.saturating_mul(2) + 1
+}
+
";
        assert_eq!(changed(moved_only), vec![]);
        assert!(changed_lines("diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1,2 +1,2 @@\n x\n").is_err());
        assert!(changed_lines("@@ -1,1 +1,1 @@\n-x\n+y\n").is_err());
        assert!(changed_lines("diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n?x\n").is_err());
        assert_eq!(changed_lines("").expect("an empty diff"), vec![]);
    }

    #[test]
    fn a_file_deleted_whole_whose_items_moved_elsewhere_changes_nothing() {
        // The deletion's hunk ends in removals (its new side is empty), as
        // every file a split removes does.
        let body = ["fn helper(value: u64) -> u64 {", "    value.saturating_mul(2) + 1", "}"];
        let diff = format!(
            "diff --git a/old.rs b/old.rs\ndeleted file mode 100644\n--- a/old.rs\n+++ /dev/null\n@@ -1,3 +0,0 @@\n-{0}\n-{1}\n-{2}\n\
             diff --git a/new.rs b/new.rs\n--- /dev/null\n+++ b/new.rs\n@@ -0,0 +1,3 @@\n+{0}\n+{1}\n+{2}\n",
            body[0], body[1], body[2]
        );
        assert_eq!(changed(&diff), vec![]);
        // Left where it was, only the added side: all new.
        let added = "diff --git a/new.rs b/new.rs\n--- /dev/null\n+++ b/new.rs\n@@ -0,0 +1,1 @@\n+fn helper_only_here_now() {}\n";
        assert_eq!(changed(added), vec![("new.rs".to_owned(), vec![1])]);
    }

    #[test]
    fn no_newline_markers_and_bare_blank_lines_inside_a_hunk_are_read() {
        // The old last line had no newline; the new side adds after it. A
        // blank context line stripped of its space is still context.
        let diff = "diff --git a/a.rs b/a.rs\n--- a/a.rs\n+++ b/a.rs\n@@ -1,3 +1,4 @@\n fn f() {}\n\n-fn g() {}\n\\ No newline at end of file\n+fn g() {}\n+fn h() {}\n";
        // Line 3 (`fn g`) is new again (the text with a newline), 4 new;
        // the removal marks its neighbours, 2 (the blank line) and 3.
        assert_eq!(changed(diff), vec![("a.rs".to_owned(), vec![2, 3, 4])]);
    }

    #[test]
    fn a_moved_block_ends_where_its_run_of_added_lines_ends() {
        // The removed item is followed by a removed `}`; on the added side
        // the same `}` is context, not part of the move, so the removed
        // `}` did not move: its removal marks its neighbours.
        let diff = "diff --git a/a.rs b/a.rs\n--- a/a.rs\n+++ b/a.rs\n@@ -1,4 +1,2 @@\n fn keep() {}\n-fn alpha_beta_gamma_delta_call() {}\n-}\n fn after() {}\n\
                    diff --git a/b.rs b/b.rs\n--- a/b.rs\n+++ b/b.rs\n@@ -1,2 +1,3 @@\n mod g {\n+fn alpha_beta_gamma_delta_call() {}\n }\n";
        assert_eq!(changed(diff), vec![("a.rs".to_owned(), vec![1, 2])]);
    }

    #[test]
    fn a_hunk_cut_short_on_either_side_is_an_error() {
        let header = "diff --git a/x b/x\n--- a/x\n+++ b/x\n";
        // The old side has a line left.
        assert!(changed_lines(&format!("{header}@@ -1,2 +1,1 @@\n x\n")).is_err());
        // The new side has a line left.
        assert!(changed_lines(&format!("{header}@@ -1,1 +1,2 @@\n x\n")).is_err());
    }

    #[test]
    fn of_two_equal_removed_items_a_single_paste_takes_the_first_and_the_other_stays_a_change() {
        // The same item removed from a.rs and from b.rs, pasted once into
        // c.rs: the move takes a.rs's (the first); b.rs's removal did not
        // move, so its neighbours (lines 1 and 2 of b.rs) are changed.
        let item = "-fn total_of(items: &[u64]) -> u64 { items.iter().sum() }\n";
        let diff = format!(
            "diff --git a/a.rs b/a.rs\n--- a/a.rs\n+++ b/a.rs\n@@ -1,3 +1,2 @@\n fn a() {{}}\n{item} fn z() {{}}\n\
             diff --git a/b.rs b/b.rs\n--- a/b.rs\n+++ b/b.rs\n@@ -1,3 +1,2 @@\n fn b() {{}}\n{item} fn y() {{}}\n\
             diff --git a/c.rs b/c.rs\n--- a/c.rs\n+++ b/c.rs\n@@ -1,1 +1,2 @@\n fn c() {{}}\n+fn total_of(items: &[u64]) -> u64 {{ items.iter().sum() }}\n"
        );
        assert_eq!(changed(&diff), vec![("b.rs".to_owned(), vec![1, 2])]);
    }

    #[test]
    fn a_block_moves_whole_wherever_it_stands_in_a_long_diff() {
        // The new file first, then forty unrelated changed lines, then the
        // file the block came from: the block is matched in full, however
        // far into the diff its source is. (Each line alone, 6 letters and
        // digits, is below the threshold; the four together are above.)
        let body: Vec<String> = (0..4).map(|n| format!("use a::b{n};")).collect();
        let added: String = body.iter().map(|l| format!("+{l}\n")).collect();
        let removed: String = body.iter().map(|l| format!("-{l}\n")).collect();
        let filler: String = (0..40).map(|n| format!("+// note {n}\n")).collect();
        let diff = format!(
            "diff --git a/new.rs b/new.rs\n--- /dev/null\n+++ b/new.rs\n@@ -0,0 +1,4 @@\n{added}\
             diff --git a/notes.rs b/notes.rs\n--- /dev/null\n+++ b/notes.rs\n@@ -0,0 +1,40 @@\n{filler}\
             diff --git a/old.rs b/old.rs\n--- a/old.rs\n+++ /dev/null\n@@ -1,4 +0,0 @@\n{removed}"
        );
        // Comments are no change either: nothing is.
        assert_eq!(changed(&diff), vec![]);
    }

    #[test]
    fn a_removed_block_at_the_very_end_of_the_diff_matches_up_to_its_end() {
        // The added run is longer than the removed block it starts with, and
        // the removed block is the diff's last line: the match stops there.
        let diff = "diff --git a/new.rs b/new.rs\n--- /dev/null\n+++ b/new.rs\n@@ -0,0 +1,3 @@\n\
                    +fn alpha_value_computed() {}\n+fn beta_value_computed() {}\n+fn brand_new_call() {}\n\
                    diff --git a/old.rs b/old.rs\n--- a/old.rs\n+++ /dev/null\n@@ -1,2 +0,0 @@\n\
                    -fn alpha_value_computed() {}\n-fn beta_value_computed() {}\n";
        assert_eq!(changed(diff), vec![("new.rs".to_owned(), vec![3])]);
    }

    #[test]
    fn a_move_stops_at_the_end_of_its_added_run_even_where_the_next_line_matches() {
        // `two` is removed from a.rs and was already in b.rs (context): only
        // `one` moved; `two`'s removal did not, so it marks its neighbours.
        let diff = "diff --git a/a.rs b/a.rs\n--- a/a.rs\n+++ b/a.rs\n@@ -1,4 +1,2 @@\n fn keep() {}\n\
                    -fn a_rather_long_name_one() {}\n-fn a_rather_long_name_two() {}\n fn after() {}\n\
                    diff --git a/b.rs b/b.rs\n--- a/b.rs\n+++ b/b.rs\n@@ -1,2 +1,3 @@\n fn b() {}\n\
                    +fn a_rather_long_name_one() {}\n fn a_rather_long_name_two() {}\n";
        assert_eq!(changed(diff), vec![("a.rs".to_owned(), vec![1, 2])]);
    }

    #[test]
    fn a_function_whose_body_changed_after_its_first_lines_did_not_move() {
        // The first lines match, the third body line differs: no prefix of
        // the match is whole items, so the function is a change.
        let diff = "diff --git a/a.rs b/a.rs\n--- a/a.rs\n+++ /dev/null\n@@ -1,5 +0,0 @@\n\
                    -fn settle(state: &mut State) -> bool {\n-    let moved_forward = state.advance();\n\
                    -    state.flush_everything();\n-    moved_forward\n-}\n\
                    diff --git a/b.rs b/b.rs\n--- /dev/null\n+++ b/b.rs\n@@ -0,0 +1,5 @@\n\
                    +fn settle(state: &mut State) -> bool {\n+    let moved_forward = state.advance();\n\
                    +    state.flush_everything();\n+    !moved_forward\n+}\n";
        assert_eq!(changed(diff), vec![("b.rs".to_owned(), vec![1, 2, 3, 4, 5])]);
    }
}
