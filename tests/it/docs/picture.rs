//! The paused-leader picture (docs/paused-leader.svg, drawn by `cargo bench -- --write`, figure
//! 12) says what BENCHMARKS.md's rows of figure 12 say: each case's title and the line under it
//! are a cell of those rows, with the same numbers (takeover, how long A's child ran beside B's,
//! when it was killed), and the README shows the picture after its first paragraph.

use std::fs;

use super::root;

const PICTURE: &str = "docs/paused-leader.svg";

/// The four cases the figure draws, as each panel is titled.
const CASES: [&str; 4] = [
    "etcdctl lock (etcd 3.4)",
    "leasewrap on etcd",
    "kazoo Lock, killing on SUSPENDED",
    "leasewrap on ZooKeeper",
];

/// The text of every `<text>` element of `svg`, entities decoded.
fn texts(svg: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = svg;
    while let Some(open) = rest.find("<text") {
        let after = &rest[open..];
        let Some(start) = after.find('>') else { break };
        let Some(end) = after.find("</text>") else {
            break;
        };
        out.push(unescape(after[start + 1..end].trim()));
        rest = &after[end..];
    }
    out
}

fn unescape(text: &str) -> String {
    text.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&#39;", "'")
        .replace("&amp;", "&")
}

/// The cells of BENCHMARKS.md's table rows of figure 12.
fn figure_12_cells(benchmarks: &str) -> Vec<String> {
    let rows = benchmarks.lines().filter(|l| l.starts_with("| 12. "));
    rows.flat_map(|r| {
        r.split(" | ")
            .map(|c| c.trim_matches(['|', ' ']).to_owned())
    })
    .collect()
}

/// The numbers of `text`, in order (`2.31`, `4.0`, `3`...).
fn numbers(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for c in text.chars().chain([' ']) {
        if c.is_ascii_digit() || (c == '.' && !current.is_empty()) {
            current.push(c);
        } else if !current.is_empty() {
            out.push(current.trim_end_matches('.').to_owned());
            current.clear();
        }
    }
    out
}

#[test]
fn the_paused_leader_picture_labels_the_numbers_of_benchmarks_md_figure_12() {
    let svg = fs::read_to_string(root().join(PICTURE))
        .unwrap_or_else(|e| panic!("{PICTURE}: {e} (cargo bench -- --write draws it)"));
    let benchmarks = fs::read_to_string(root().join("BENCHMARKS.md")).unwrap();
    let cells = figure_12_cells(&benchmarks);
    assert!(!cells.is_empty(), "BENCHMARKS.md has no row of figure 12");
    let labels = texts(&svg);
    for case in CASES {
        // A panel's title, then what it showed: together, the table's cell.
        let at = labels.iter().position(|t| t == case);
        let at = at.unwrap_or_else(|| panic!("{PICTURE} has no panel {case:?}"));
        let facts = labels.get(at + 1).map_or("", String::as_str);
        let caption = format!("{case}: {facts}");
        let cell = cells.iter().find(|c| c.starts_with(&format!("{case}: ")));
        let cell = cell.unwrap_or_else(|| panic!("BENCHMARKS.md's figure 12 has no {case:?}…"));
        assert_eq!(
            numbers(&caption),
            numbers(cell),
            "{PICTURE} and BENCHMARKS.md disagree:\n  picture: {caption}\n  table:   {cell}\n\
             Draw both from one run: cargo bench -- --write"
        );
        assert_eq!(
            &caption, cell,
            "the picture's caption is the table's cell, word for word"
        );
    }
}

#[test]
fn the_readme_shows_the_paused_leader_picture_after_its_first_paragraph() {
    let readme = fs::read_to_string(root().join("README.md")).unwrap();
    let paragraphs: Vec<&str> = readme.split("\n\n").collect();
    let picture = paragraphs.get(2).map(|p| p.trim());
    assert!(
        picture.is_some_and(|p| p.starts_with("![") && p.ends_with(&format!("]({PICTURE})"))),
        "the README's third block (after the title and the first paragraph) is not an image \
         link to {PICTURE}: {picture:?}"
    );
}

#[test]
fn numbers_are_read_with_their_decimals_and_without_a_trailing_full_stop() {
    assert_eq!(
        numbers("B's child started 2.31 s into the pause; ran 4.0 ms, exit 124."),
        ["2.31", "4.0", "124"]
    );
    assert_eq!(
        figure_12_cells("| 12. a | b: 1 | c |\n| 11. x |"),
        ["12. a", "b: 1", "c"]
    );
}
