//! The shape of the code itself: no function in src/ or tests/ is longer than a screen (50
//! lines, from its `fn` line to its closing brace), so that each can be read at once.

use std::fs;
use std::path::{Path, PathBuf};

const MOST_LINES: usize = 50;

#[test]
fn no_function_in_src_or_tests_is_over_50_lines() {
    let mut files = Vec::new();
    for dir in ["src", "tests"] {
        rust_files(&Path::new(env!("CARGO_MANIFEST_DIR")).join(dir), &mut files);
    }
    let long: Vec<String> = files
        .iter()
        .flat_map(|file| {
            let text = fs::read_to_string(file).unwrap();
            long_functions(&text)
                .into_iter()
                .map(move |(line, n)| format!("{}:{line}: {n} lines", file.display()))
        })
        .collect();
    assert!(
        long.is_empty(),
        "functions over {MOST_LINES} lines:\n{}",
        long.join("\n")
    );
}

#[test]
fn a_function_is_counted_from_its_fn_line_to_its_closing_brace() {
    let body = "    x();\n".repeat(48);
    let text = format!("fn short() {{\n{body}}}\nfn long() {{\n{body}    y(\"}}\");\n}}\n");
    // `short` is 50 lines; `long` one more, with a brace in a string that does not count.
    assert_eq!(long_functions(&text), [(51, 51)]);
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// (1-based line of `fn`, length in lines) of each function over `MOST_LINES` in `text`. Braces
/// in strings, char literals and `//` comments do not count; a declaration without a body is
/// skipped.
fn long_functions(text: &str) -> Vec<(usize, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut found = Vec::new();
    for (start, line) in lines.iter().enumerate() {
        if !starts_a_fn(line) {
            continue;
        }
        let mut depth = 0i32;
        for (end, line) in lines.iter().enumerate().skip(start) {
            let code = code_of(line);
            if depth == 0 && !code.contains('{') && code.trim_end().ends_with(';') {
                break;
            }
            depth += code.matches('{').count() as i32 - code.matches('}').count() as i32;
            if depth == 0 && code.contains('}') {
                let n = end - start + 1;
                if n > MOST_LINES {
                    found.push((start + 1, n));
                }
                break;
            }
        }
    }
    found
}

fn starts_a_fn(line: &str) -> bool {
    let words: Vec<&str> = line.split_whitespace().collect();
    let fn_at = words.iter().position(|w| *w == "fn");
    fn_at.is_some_and(|i| {
        words[..i].iter().all(|w| {
            w.starts_with("pub") || ["const", "async", "unsafe", "extern", "\"C\""].contains(w)
        })
    })
}

/// `line` without string and char literals and without a `//` comment.
fn code_of(line: &str) -> String {
    let mut out = String::new();
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                while let Some(c) = chars.next() {
                    match c {
                        '\\' => _ = chars.next(),
                        '"' => break,
                        _ => {}
                    }
                }
            }
            '\'' if matches!(chars.clone().nth(1), Some('\'')) => _ = chars.nth(1),
            '\'' if chars.peek() == Some(&'\\') => while chars.next().is_some_and(|c| c != '\'') {},
            '/' if chars.peek() == Some(&'/') => break,
            c => out.push(c),
        }
    }
    out
}
