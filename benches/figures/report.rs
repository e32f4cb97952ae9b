//! The report: what a figure returns (rows and notes), the table printed to stdout, and
//! BENCHMARKS.md, whose hand-written analysis (everything after `KEEP`) survives a rewrite.

use std::fs;
use std::path::Path;

use super::goals::{self, Verdict};
use super::machine::Machine;
use super::stats;

/// Everything after this line of BENCHMARKS.md is written by hand and kept across rewrites.
pub const KEEP: &str =
    "<!-- Below: analysis written by hand; `cargo bench -- --write` keeps it when it rewrites the file. -->";

/// How older versions of the file marked the same place.
const KEEP_STEM: &str = "<!-- Below: analysis written by hand";

/// One line of the table.
pub struct Row {
    /// What the goals table calls it.
    pub id: &'static str,
    pub figure: String,
    pub leasewrap: String,
    pub baseline: String,
    /// leasewrap's median over the baseline's, in the same run.
    pub ratio: Option<f64>,
    /// The numbers goals judge, by name.
    pub values: Vec<(&'static str, f64)>,
}

impl Row {
    pub fn new(id: &'static str, figure: impl Into<String>) -> Row {
        Row {
            id,
            figure: figure.into(),
            leasewrap: "—".into(),
            baseline: "—".into(),
            ratio: None,
            values: Vec::new(),
        }
    }

    /// Sets `ratio` and records it as the value `ratio`.
    pub fn with_ratio(mut self, ratio: Option<f64>) -> Row {
        self.ratio = ratio;
        self.set("ratio", ratio)
    }

    /// Records a value for the goals (nothing when None).
    pub fn set(mut self, name: &'static str, value: Option<f64>) -> Row {
        if let Some(v) = value {
            self.values.push((name, v));
        }
        self
    }

    pub fn value(&self, name: &str) -> Option<f64> {
        self.values
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| *v)
    }

    fn goals(&self) -> String {
        let texts: Vec<String> = goals::of(self.id).map(|g| g.text()).collect();
        if texts.is_empty() {
            "— (no goal set)".into()
        } else {
            texts.join("; ")
        }
    }

    fn verdicts(&self) -> Vec<Verdict> {
        goals::of(self.id)
            .map(|g| g.judge(self.value(g.value)))
            .collect()
    }

    fn verdict_words(&self) -> String {
        let words: Vec<&str> = self.verdicts().into_iter().map(Verdict::word).collect();
        if words.is_empty() {
            "—".into()
        } else {
            words.join("; ")
        }
    }
}

/// What one figure module returns.
#[derive(Default)]
pub struct Figure {
    pub rows: Vec<Row>,
    /// Lines of "Notes on the figures": how it was measured, the parts of a number.
    pub notes: Vec<String>,
    /// Pictures drawn from the run: a file name (docs/NAME with `--write`) and its SVG.
    pub pictures: Vec<(&'static str, String)>,
}

/// Every goal that was not met, as `row: goal` lines.
pub fn missed(figures: &[Figure]) -> Vec<String> {
    let rows = figures.iter().flat_map(|f| &f.rows);
    rows.flat_map(|row| {
        goals::of(row.id)
            .filter(|g| g.judge(row.value(g.value)) != Verdict::Met)
            .map(|g| {
                format!(
                    "{}: {} {}",
                    row.figure,
                    g.text(),
                    g.judge(row.value(g.value)).word()
                )
            })
    })
    .collect()
}

/// The table and notes as plain text, for the terminal.
pub fn print(figures: &[Figure]) {
    println!();
    for row in figures.iter().flat_map(|f| &f.rows) {
        println!("{}", row.figure);
        println!("    leasewrap: {}", row.leasewrap);
        println!("    baseline:  {}", row.baseline);
        println!("    ratio {}", stats::show_ratio(row.ratio));
        for g in goals::of(row.id) {
            println!(
                "    goal {}: {}",
                g.text(),
                g.judge(row.value(g.value)).word()
            );
        }
    }
    println!();
    for note in figures.iter().flat_map(|f| &f.notes) {
        println!("{}\n", bullet(note));
    }
}

/// A note is a bullet, unless it is a table or a paragraph of its own.
fn bullet(note: &str) -> String {
    if note.contains('\n') || note.starts_with('|') {
        note.to_owned()
    } else {
        format!("- {note}")
    }
}

pub fn markdown(figures: &[Figure], machine: &Machine, command: &str) -> String {
    let mut out = vec![
        "# Benchmarks".to_owned(),
        String::new(),
        "Made by `cargo bench` (`benches/figures/`, SPEC §11). Medians, with p10–p90 and min–max;"
            .into(),
        "ratios are leasewrap's median over the baseline's, both measured in the same run,".into(),
        "interleaved iteration by iteration.".into(),
        String::new(),
        "Command:".into(),
        String::new(),
        format!("    {command}"),
        String::new(),
        "| figure | leasewrap | baseline | ratio | goal | goal met? |".into(),
        "|---|---|---|---|---|---|".into(),
    ];
    for row in figures.iter().flat_map(|f| &f.rows) {
        out.push(format!(
            "| {} | {} | {} | {} | {} | {} |",
            row.figure,
            row.leasewrap,
            row.baseline,
            stats::show_ratio(row.ratio),
            row.goals(),
            row.verdict_words()
        ));
    }
    out.extend(["".into(), "## Notes on the figures".into(), "".into()]);
    for note in figures.iter().flat_map(|f| &f.notes) {
        out.extend([bullet(note), String::new()]);
    }
    out.extend(["## Machine and run".into(), String::new()]);
    out.extend(machine.lines().into_iter().map(|l| format!("- {l}")));
    out.push(String::new());
    out.join("\n")
}

/// Writes every figure's pictures into `dir`; returns the paths written.
pub fn write_pictures(figures: &[Figure], dir: &Path) -> Vec<std::path::PathBuf> {
    let pictures = figures.iter().flat_map(|f| &f.pictures);
    pictures
        .map(|(name, svg)| {
            let path = dir.join(name);
            fs::write(&path, svg).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
            path
        })
        .collect()
}

/// Rewrites `path` with `generated`, keeping the hand-written part after the marker.
pub fn write(path: &Path, generated: &str) {
    let old = fs::read_to_string(path).unwrap_or_default();
    let kept = match old.find(KEEP_STEM) {
        Some(at) => {
            let rest = &old[at..];
            let after_marker = rest.split_once('\n').map_or("", |(_, r)| r);
            format!("{KEEP}\n{after_marker}")
        }
        None => format!("{KEEP}\n"),
    };
    let text = format!("{generated}\n{kept}");
    fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}
