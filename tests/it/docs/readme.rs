//! The README's reference tables agree with the code and the man page: every option clap knows is
//! in the README and every option the README names is one clap knows; the environment tables
//! name what the man page's ENVIRONMENT names; the exit status table has the code's statuses.

use std::collections::BTreeSet;
use std::fs;

use clap::CommandFactory;

use super::{man, root};

fn readme() -> String {
    fs::read_to_string(root().join("README.md")).unwrap()
}

/// The README's text from the heading `from` to the next heading of that level or higher.
fn section(text: &str, from: &str) -> String {
    let level = from.split(' ').next().unwrap().len();
    let start = text
        .find(&format!("\n{from}\n"))
        .unwrap_or_else(|| panic!("README has no {from}"));
    let rest = &text[start + from.len() + 2..];
    let end = rest
        .lines()
        .scan(0, |at, l| {
            let here = *at;
            *at += l.len() + 1;
            Some((here, l))
        })
        .find(|(_, l)| l.starts_with('#') && l.split(' ').next().unwrap().len() <= level)
        .map_or(rest.len(), |(at, _)| at);
    rest[..end].to_owned()
}

/// The first cells of the table whose header row is `header`.
fn first_cells(text: &str, header: &str) -> Vec<String> {
    let start = text
        .find(header)
        .unwrap_or_else(|| panic!("README has no table {header}"));
    let rows = text[start..]
        .lines()
        .skip(2)
        .take_while(|l| l.starts_with('|'));
    rows.map(|r| {
        r.split(" | ")
            .next()
            .unwrap()
            .trim_start_matches("| ")
            .to_owned()
    })
    .collect()
}

/// The backquoted words of `text` that match `keep`, first word of each.
fn quoted(text: &str, keep: impl Fn(&str) -> bool) -> BTreeSet<String> {
    let spans = text.split('`').skip(1).step_by(2);
    let words = spans.filter_map(|s| s.split_whitespace().next());
    words.filter(|w| keep(w)).map(str::to_owned).collect()
}

/// `--long` of every argument of `cmd` and of its subcommands, and `-s` of each short.
fn clap_flags(cmd: &clap::Command) -> BTreeSet<String> {
    let mut flags = BTreeSet::new();
    for arg in cmd.get_arguments() {
        flags.extend(arg.get_long().map(|l| format!("--{l}")));
        flags.extend(arg.get_short().map(|s| format!("-{s}")));
    }
    for sub in cmd.get_subcommands() {
        flags.extend(clap_flags(sub));
    }
    flags
}

/// `-v` for `-vv` or `-vvv` (a count given by repeating the flag).
fn repeated_short(flag: &str) -> String {
    let letters = &flag[1..];
    let same = !flag.starts_with("--") && letters.chars().all(|c| letters.starts_with(c));
    if same {
        flag[..2].to_owned()
    } else {
        flag.to_owned()
    }
}

#[test]
fn readme_reference_names_every_run_option_clap_has_and_only_those() {
    let reference = section(&readme(), "## Reference");
    let named: BTreeSet<String> = quoted(&reference, |w| w.starts_with('-') && w != "--")
        .into_iter()
        .map(|f| repeated_short(&f))
        .collect();
    let cmd = leasewrap::cli::Cli::command();
    let known = clap_flags(&cmd);
    let unknown: Vec<&String> = named.iter().filter(|f| !known.contains(*f)).collect();
    assert!(
        unknown.is_empty(),
        "README names options clap does not have: {unknown:?}"
    );
    let ignored = ["help", "version"];
    let run_args = cmd.get_arguments().filter(|a| {
        !a.is_positional() && !a.is_hide_set() && !ignored.contains(&a.get_id().as_str())
    });
    let missing: Vec<String> = run_args
        .filter(|a| {
            let long = a.get_long().map(|l| format!("--{l}"));
            let short = a.get_short().map(|s| format!("-{s}"));
            !long.into_iter().chain(short).any(|f| named.contains(&f))
        })
        .map(|a| a.get_id().to_string())
        .collect();
    assert!(
        missing.is_empty(),
        "run options missing from the README's Reference: {missing:?}"
    );
}

fn names(rows: &[(&str, &str)]) -> BTreeSet<String> {
    rows.iter()
        .flat_map(|(n, _)| n.split(", "))
        .map(str::to_owned)
        .collect()
}

#[test]
fn readme_environment_tables_name_what_the_man_pages_environment_names() {
    let text = readme();
    let env = section(&text, "### Environment");
    let is_var = |w: &str| w.chars().all(|c| c.is_ascii_uppercase() || c == '_') && w.len() > 2;
    let read: BTreeSet<String> = first_cells(&env, "| variable | for |")
        .iter()
        .flat_map(|c| quoted(c, is_var))
        .collect();
    let given: BTreeSet<String> = first_cells(&env, "| variable | value |")
        .iter()
        .flat_map(|c| quoted(c, is_var))
        .collect();
    // The man page also lists what only fenced-write/-put and the default directory read.
    let elsewhere = [
        "XDG_STATE_HOME",
        "HOME",
        "PATH",
        "NOTIFY_SOCKET",
        "LEASEWRAP_FENCING_TOKEN",
        "LEASEWRAP_KEY",
    ];
    let man_read: BTreeSet<String> = names(man::READ)
        .into_iter()
        .filter(|n| !elsewhere.contains(&n.as_str()))
        .collect();
    assert_eq!(
        read, man_read,
        "README's variables read vs the man page's (tests/it/docs/man.rs READ)"
    );
    assert_eq!(
        given,
        names(man::GIVEN),
        "README's variables the child gets vs the man page's (GIVEN)"
    );
}

#[test]
fn readme_exit_status_table_has_the_statuses_of_the_man_page() {
    let text = readme();
    let table = section(&text, "### Exit status");
    let cells = first_cells(&table, "| status | when |");
    let readme: BTreeSet<String> = cells
        .iter()
        .flat_map(|c| c.split(" / ").map(str::to_owned))
        .collect();
    let code: BTreeSet<String> = leasewrap::error::EXIT_STATUS_TABLE
        .iter()
        .map(|(s, _)| s.to_string())
        .collect();
    assert_eq!(
        readme, code,
        "README's exit statuses vs error::EXIT_STATUS_TABLE (the man page's EXIT STATUS)"
    );
}

#[test]
fn readme_install_states_the_glibc_floor_the_release_builds_for_and_the_kernel_features() {
    let install = section(&readme(), "## Install");
    let floor = crate::support::release::glibc_floor();
    assert!(
        install.contains(&format!("glibc {floor}")),
        "README's Install does not state the glibc floor {floor} of scripts/release.sh"
    );
    for (feature, _) in leasewrap::supervise::kernel::FEATURES {
        // "a CLOCK_BOOTTIME timerfd (Linux 3.15)": the name, and the release that has it.
        let (name, since) = feature.rsplit_once(" (").unwrap();
        let name = name.split(' ').find(|w| w.contains('_')).unwrap();
        let since = since.trim_end_matches(')');
        assert!(
            install.contains(&format!("`{name}`")) && install.contains(since),
            "README's Install does not name {feature}"
        );
    }
    assert!(
        install.contains("exits 71"),
        "README's Install: the status on an older kernel"
    );
}
