//! What `contrib/` ships for monitoring, checked: the Prometheus alert rules
//! by Debian's `promtool check rules`, the Grafana dashboard against the
//! JSON schema of the parts it relies on (`contrib/grafana/dashboard.schema.json`,
//! with Debian's `jsonschema`), and every metric either of them names
//! against a running node's `/metrics`, so a renamed metric cannot leave a
//! dashboard panel or an alert silently empty.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use blipless_tests::node::Node;

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every `blipless_*` and `process_*` name in `text`.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let bytes = text.as_bytes();
    for prefix in ["blipless_", "process_"] {
        let mut from = 0;
        while let Some(at) = text[from..].find(prefix) {
            let start = from + at;
            let boundary = start == 0
                || !(bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_');
            let end = text[start..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .map_or(text.len(), |n| start + n);
            if boundary {
                names.insert(text[start..end].to_owned());
            }
            from = end;
        }
    }
    names
}

#[test]
fn alert_rules_pass_promtool() {
    let promtool = Command::new(repository().join("scripts/promtool.sh"))
        .output()
        .expect("scripts/promtool.sh");
    assert!(
        promtool.status.success(),
        "{}",
        String::from_utf8_lossy(&promtool.stderr)
    );
    let promtool = String::from_utf8_lossy(&promtool.stdout).trim().to_owned();
    let rules = repository().join("contrib/prometheus/alerts.yml");
    let checked = Command::new(&promtool)
        .args(["check", "rules"])
        .arg(&rules)
        .output()
        .expect("promtool");
    let said = String::from_utf8_lossy(&checked.stdout);
    assert!(
        checked.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&checked.stderr)
    );
    assert!(said.contains("SUCCESS: 9 rules found"), "{said}");

    // promtool does catch a broken rule (the check can fail).
    let dir = tempfile::tempdir().expect("tempdir");
    let broken = dir.path().join("broken.yml");
    std::fs::write(
        &broken,
        "groups:\n  - name: x\n    rules:\n      - alert: X\n        expr: rate(blipless_ready[5m]\n",
    )
    .expect("write");
    let failed = Command::new(&promtool)
        .args(["check", "rules"])
        .arg(&broken)
        .output()
        .expect("promtool");
    assert!(!failed.status.success());
}

#[test]
fn the_dashboard_matches_its_schema() {
    let schema = repository().join("contrib/grafana/dashboard.schema.json");
    let check = |instance: &Path| {
        Command::new("jsonschema")
            .arg("-i")
            .arg(instance)
            .arg(&schema)
            .output()
            .expect("jsonschema (Debian python3-jsonschema)")
    };
    let good = check(&repository().join("contrib/grafana/blipless.json"));
    assert!(
        good.status.success(),
        "{}",
        String::from_utf8_lossy(&good.stderr)
    );

    // A panel without queries is refused (the check can fail).
    let mut dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(repository().join("contrib/grafana/blipless.json")).expect("read"),
    )
    .expect("JSON");
    dashboard["panels"][0]["targets"] = serde_json::json!([]);
    let dir = tempfile::tempdir().expect("tempdir");
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, dashboard.to_string()).expect("write");
    assert!(!check(&bad).status.success());
}

/// Families that have no series until there is something to say (a route's
/// latency once it was measured), so an idle node does not list them; they
/// must be documented instead.
const LATER: [&str; 1] = ["blipless_egress_route_latency_seconds"];

#[test]
fn every_metric_the_dashboard_and_the_alerts_name_exists() {
    let documented = std::fs::read_to_string(repository().join("docs/METRICS.md")).expect("read");
    for name in LATER {
        assert!(
            documented.contains(&format!("| `{name}` |")),
            "{name} in METRICS.md"
        );
    }
    let mut node = Node::new("");
    let _ingress = node.start_ingress();
    let _device = node.start_device();
    node.wait_ready();
    let exposed: BTreeSet<String> = node
        .metrics()
        .lines()
        // Families are declared even before their first series.
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| {
            let (name, kind) = rest.split_once(' ')?;
            Some(match kind {
                "counter" => format!("{name}_total"),
                "info" => format!("{name}_info"),
                _ => name.to_owned(),
            })
        })
        .collect();
    for file in [
        "contrib/grafana/blipless.json",
        "contrib/prometheus/alerts.yml",
    ] {
        let text = std::fs::read_to_string(repository().join(file)).expect("read");
        let used = metric_names(&text);
        assert!(used.len() >= 5, "{file}: {used:?}");
        let missing: Vec<&String> = used
            .iter()
            .filter(|name| !exposed.contains(*name) && !LATER.contains(&name.as_str()))
            .collect();
        assert!(
            missing.is_empty(),
            "{file} names {missing:?}, not in /metrics: {exposed:?}"
        );
    }
}
