//! The one escaping rule for every untrusted field leasewrap prints (a name from a directory
//! listing, a holder or run record, a server's error text), and argv as a shell would need it
//! typed. Pure functions of strings; every printer (status, the logs, usage lines) calls these.

/// `text` with every character that does not print as itself (controls, escape sequences, bidi
/// and other format characters) written as `\u{..}`: a name from a directory listing, a holder
/// or run record never drives the terminal. The one rule for every untrusted field printed.
pub fn printable(text: &str) -> String {
    text.chars()
        .map(|c| {
            if shows_as_itself(c) {
                c.to_string()
            } else {
                format!("\\u{{{:x}}}", c as u32)
            }
        })
        .collect()
}

/// `bytes` as lowercase hex, two digits each: a digest, or bytes that are not text.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether `c` prints as itself: not a control, escape or format character.
fn shows_as_itself(c: char) -> bool {
    matches!(c, '"' | '\'' | '\\') || c.escape_debug().count() == 1
}

/// A line of JSON text with every character that [`printable`] would escape and the JSON writer
/// left as it was (DEL, C1 controls, bidi and other format characters) written as a JSON escape,
/// `\u202e`: a reader of the JSON gets the same string back, a terminal shows no raw control.
pub fn json_printable(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        if shows_as_itself(c) || c == '\n' {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        }
    }
    out
}

/// argv as a shell would need it typed: words with anything unusual in single quotes.
pub fn shell_words(argv: &[String]) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_@%+=:,./-".contains(c);
    let words: Vec<String> = argv
        .iter()
        .map(|a| {
            if !a.is_empty() && a.chars().all(plain) {
                a.clone()
            } else {
                format!("'{}'", a.replace('\'', r"'\''"))
            }
        })
        .collect();
    words.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_output_shows_control_and_format_characters_escaped() {
        assert_eq!(printable("job"), "job");
        assert_eq!(printable("sh -c 'a \"b\"'"), "sh -c 'a \"b\"'");
        assert_eq!(printable("e\x1b[2Jx\x07"), r"e\u{1b}[2Jx\u{7}");
        assert_eq!(printable("jo\u{202e}b\u{200b}"), r"jo\u{202e}b\u{200b}");
    }

    #[test]
    fn escaping_twice_changes_nothing_more() {
        let once = printable("a\x1b]0;PWNED\x07\\b\u{202e}");
        assert_eq!(printable(&once), once);
    }

    #[test]
    fn json_lines_keep_their_meaning_and_lose_their_raw_controls() {
        let value = "a\u{7f}b\u{202e}c\u{e0001}";
        let json = serde_json::to_string(&value).unwrap();
        let escaped = json_printable(&json);
        assert_eq!(escaped, r#""a\u007fb\u202ec\udb40\udc01""#);
        let back: String = serde_json::from_str(&escaped).unwrap();
        assert_eq!(back, value);
    }

    #[test]
    fn shell_words_quote_only_what_needs_it() {
        let argv = ["a".into(), "it's".into(), String::new(), "x=1".into()];
        assert_eq!(shell_words(&argv), r"a 'it'\''s' '' x=1");
    }
}
