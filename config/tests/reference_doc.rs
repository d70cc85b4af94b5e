//! docs/CONFIG.md stays true to the key table: its reference file is what
//! `blipless-ctl config defaults` prints, and its Keys table has a row for
//! every key. Both went stale once (a key added, a hint changed) with
//! nothing to notice it.

use blipless_config::documented_defaults;

const CONFIG_MD: &str = include_str!("../../docs/CONFIG.md");

/// The `node.host` line shows the hostname of the machine that rendered it.
fn without_hostname(text: &str) -> Vec<&str> {
    text.lines()
        .filter(|line| !line.starts_with("# host = "))
        .collect()
}

/// The first TOML block after the "Reference file" heading.
fn reference_block() -> &'static str {
    let section = CONFIG_MD
        .split_once("## Reference file")
        .expect("docs/CONFIG.md has a Reference file section")
        .1;
    let block = section
        .split_once("```toml\n")
        .expect("the section has a TOML block")
        .1;
    block
        .split_once("\n```")
        .expect("the TOML block is closed")
        .0
}

#[test]
fn the_reference_file_is_what_config_defaults_prints() {
    let rendered = documented_defaults();
    let documented = without_hostname(reference_block());
    let current = without_hostname(rendered.trim_end());
    let first_difference = documented
        .iter()
        .zip(&current)
        .position(|(a, b)| a != b)
        .unwrap_or(documented.len().min(current.len()));
    assert!(
        documented == current,
        "docs/CONFIG.md's reference file differs from `blipless-ctl config defaults` \
         at its line {}:\n  doc:  {:?}\n  code: {:?}\n(regenerate it as the section says)",
        first_difference + 1,
        documented.get(first_difference),
        current.get(first_difference),
    );
}

#[test]
fn every_key_has_a_row_in_the_keys_table() {
    let rendered = documented_defaults();
    let mut section = String::new();
    let mut missing = Vec::new();
    for line in rendered.lines() {
        if line.starts_with("# [[") {
            // The commented-out examples of array tables (upstreams) close
            // the key table; docs/EGRESS.md documents their fields.
            break;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.to_owned();
            continue;
        }
        // A key line, set or commented out: `key = value` or `# key = value`.
        let line = line.strip_prefix("# ").unwrap_or(line);
        let Some((key, _)) = line.split_once(" = ") else {
            continue;
        };
        if key.is_empty()
            || !key
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        {
            continue;
        }
        let dotted = format!("{section}.{key}");
        if !CONFIG_MD.contains(&format!("| `{dotted}` |")) {
            missing.push(dotted);
        }
    }
    assert!(
        missing.is_empty(),
        "keys without a row in docs/CONFIG.md's Keys table: {missing:?}"
    );
}
