//! Feeds arbitrary text to the configuration loader, through
//! `Config::from_toml_str` (what `Config::load` does with a file's text):
//! a TOML file, `--set` entries and `BLIPLESS_*` environment variables.
//!
//! The first byte picks how the rest is used. Even: as is, split at NUL
//! bytes into the TOML file, then `--set` entries (one a line), then
//! environment variables (`NAME=value` lines, given as `BLIPLESS_NAME`).
//! Odd: built from every real key, by construction, so that each key's value
//! parser is reached: the keys and their defaults come from
//! `documented_defaults()` (rendered from the key table, so never stale), and
//! the fuzzer picks keys and gives each its default, another key's default,
//! an arbitrary string or raw text, in the file, as `--set` or as a variable.
//!
//! Checked: no panic; an error is a non-empty list of problems, each on its
//! own bullet, under a heading that counts them; a configuration that loads
//! loads the same from the same input again.
#![no_main]

use std::sync::OnceLock;

use blipless_config::{documented_defaults, Config};
use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;

/// Every key (dotted) and its documented default, as TOML.
fn keys() -> &'static [(String, String)] {
    static KEYS: OnceLock<Vec<(String, String)>> = OnceLock::new();
    KEYS.get_or_init(|| {
        let mut keys = Vec::new();
        let mut table = String::new();
        for line in documented_defaults().lines() {
            if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                table = name.to_owned();
                continue;
            }
            let line = line.strip_prefix("# ").unwrap_or(line);
            let Some((leaf, value)) = line.split_once(" = ") else {
                continue;
            };
            let is_key = !leaf.is_empty()
                && leaf
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
            if is_key && !table.is_empty() {
                keys.push((format!("{table}.{leaf}"), value.to_owned()));
            }
        }
        assert!(keys.len() > 10, "documented_defaults() lists the keys");
        keys
    })
}

/// A TOML basic string (JSON's escapes are TOML's).
fn quoted(text: &str) -> String {
    serde_json::to_string(text).expect("a string serialises")
}

/// A TOML value for a key.
fn toml_value(u: &mut Unstructured<'_>, keys: &[(String, String)], own: &str) -> Result<String> {
    Ok(match u.int_in_range(0..=5)? {
        0 => own.to_owned(),
        1 => u.choose(keys)?.1.clone(),
        2 => quoted(&u.arbitrary::<String>()?),
        3 => u.arbitrary::<i64>()?.to_string(),
        4 => format!(
            "[{}, {}]",
            quoted(&u.arbitrary::<String>()?),
            u.arbitrary::<bool>()?
        ),
        _ => u.arbitrary::<String>()?.replace('\n', " "),
    })
}

/// A value as `--set` and the environment give it: text.
fn text_value(u: &mut Unstructured<'_>, own: &str) -> Result<String> {
    Ok(if u.arbitrary()? {
        own.trim_matches('"').to_owned()
    } else {
        u.arbitrary()?
    })
}

type Input = (String, Vec<String>, Vec<(String, String)>);

fn built(u: &mut Unstructured<'_>) -> Result<Input> {
    let keys = keys();
    let mut toml = String::new();
    for _ in 0..u.int_in_range(0..=12)? {
        let (key, own) = u.choose(keys)?;
        let value = toml_value(u, keys, own)?;
        toml.push_str(&format!("{key} = {value}\n"));
    }
    let mut sets = Vec::new();
    for _ in 0..u.int_in_range(0..=4)? {
        let (key, own) = u.choose(keys)?;
        sets.push(format!("{key}={}", text_value(u, own)?));
    }
    let mut env = Vec::new();
    for _ in 0..u.int_in_range(0..=4)? {
        let (key, own) = u.choose(keys)?;
        let name = format!("BLIPLESS_{}", key.to_uppercase().replace('.', "_"));
        env.push((name, text_value(u, own)?));
    }
    Ok((toml, sets, env))
}

fn raw(text: &str) -> Input {
    let mut parts = text.split('\0');
    let toml = parts.next().unwrap_or_default().to_owned();
    let sets = parts
        .next()
        .map(|part| part.lines().map(str::to_owned).collect())
        .unwrap_or_default();
    let env = parts
        .next()
        .map(|part| {
            part.lines()
                .filter_map(|line| line.split_once('='))
                .map(|(name, value)| (format!("BLIPLESS_{name}"), value.to_owned()))
                .collect()
        })
        .unwrap_or_default();
    (toml, sets, env)
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let (toml, sets, env) = if mode & 1 == 0 {
        let Ok(text) = std::str::from_utf8(rest) else {
            return;
        };
        raw(text)
    } else {
        match built(&mut Unstructured::new(rest)) {
            Ok(input) => input,
            Err(_) => return,
        }
    };

    match Config::from_toml_str(&toml, "fuzz.toml", env.clone(), &sets) {
        Ok(config) => {
            let again = Config::from_toml_str(&toml, "fuzz.toml", env, &sets);
            assert_eq!(
                again.ok().as_ref(),
                Some(&config),
                "loading is deterministic"
            );
        }
        Err(errors) => {
            let n = errors.0.len();
            assert!(n > 0, "an error with no problem in it");
            let shown = errors.to_string();
            let noun = if n == 1 { "problem" } else { "problems" };
            assert!(
                shown.starts_with(&format!("{n} {noun} in the configuration:")),
                "{shown}"
            );
            assert_eq!(shown.matches("\n  - ").count(), n, "{shown}");
        }
    }
});
