//! `sluice check-config --quotas FILE_OR_DIR`: envoyproxy/ratelimit's
//! configuration directory checked without starting a server (exit 0 and
//! what it holds, or exit 1 and every broken file's `file:line:column:
//! field: message`).

use std::process::Command;

use sluice_integration_tests::paths;

fn check(args: &[&str]) -> (bool, String, String) {
    let output = Command::new(paths::sluice_bin().unwrap())
        .arg("check-config")
        .args(args)
        .output()
        .unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn a_ratelimit_config_directory_is_checked_without_a_server() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config");
    std::fs::create_dir_all(&config).unwrap();
    // The shapes envoyproxy/ratelimit's example and test configurations
    // use: quota_mode, metadata, share_threshold, value_to_metric,
    // wildcards anywhere, units in any case.
    std::fs::write(
        config.join("example.yaml"),
        "---\ndomain: rl\ndescriptors:\n  - key: service\n    value: service_1\n    quota_mode: true\n    rate_limit: {unit: Minute, requests_per_unit: 1}\n    metadata:\n      service_with_quota: {name: service_1}\n  - key: files\n    value: files/*\n    share_threshold: true\n    value_to_metric: true\n    rate_limit: {unit: SECOND, requests_per_unit: 10}\n  - key: midWild\n    value: bar*b\n    rate_limit: {unit: hour, requests_per_unit: 20}\n",
    )
    .unwrap();
    std::fs::write(
        config.join("another.yml"),
        "domain: another\ndescriptors:\n  - key: key2\n    rate_limit: {unit: minute, requests_per_unit: 20}\n",
    )
    .unwrap();
    let (ok, stdout, stderr) = check(&["--quotas", config.to_str().unwrap()]);
    assert!(ok, "{stdout}{stderr}");
    assert!(stdout.contains("OK: 2 domain(s): another, rl"), "{stdout}");
    assert!(stdout.contains("example.yaml"), "{stdout}");

    // Two broken files: both named, at their line and column.
    std::fs::write(
        config.join("broken-unit.yaml"),
        "domain: broken\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n",
    )
    .unwrap();
    std::fs::write(
        config.join("broken-key.yaml"),
        "domain: misspelled\ndescriptors:\n  - key: k\n    value: v\n    ratelimit:\n      unit: day\n",
    )
    .unwrap();
    let (ok, stdout, stderr) = check(&["--quotas", config.to_str().unwrap()]);
    assert!(!ok, "{stdout}{stderr}");
    let unit = format!(
        "{}:3:5: descriptors[0]: rate_limit.unit: invalid rate limit unit 'fortnight'",
        config.join("broken-unit.yaml").display()
    );
    let key = format!(
        "{}:5:5: descriptors[0]: unknown field `ratelimit`",
        config.join("broken-key.yaml").display()
    );
    assert!(stderr.contains(&unit), "{unit}\n{stderr}");
    assert!(stderr.contains(&key), "{key}\n{stderr}");

    // A domain in two files, unless domains merge (MERGE_DOMAIN_CONFIG).
    std::fs::remove_file(config.join("broken-unit.yaml")).unwrap();
    std::fs::remove_file(config.join("broken-key.yaml")).unwrap();
    std::fs::write(
        config.join("more-another.yaml"),
        "# more of another\ndomain: another\ndescriptors:\n  - key: key3\n    rate_limit: {unit: hour, requests_per_unit: 10}\n",
    )
    .unwrap();
    let (ok, _, stderr) = check(&["--quotas", config.to_str().unwrap()]);
    assert!(!ok);
    assert!(
        stderr.contains(&format!(
            "{}:2:1: domain: duplicate domain \"another\"",
            config.join("more-another.yaml").display()
        )),
        "{stderr}"
    );
    let (ok, stdout, stderr) = check(&[
        "--quotas",
        config.to_str().unwrap(),
        "--quota-merge-domains",
    ]);
    assert!(ok, "{stdout}{stderr}");
    // A file on its own, and a path that does not exist.
    let (ok, stdout, _) = check(&["--quotas", config.join("another.yml").to_str().unwrap()]);
    assert!(ok, "{stdout}");
    let (ok, _, stderr) = check(&["--quotas", dir.path().join("missing").to_str().unwrap()]);
    assert!(!ok);
    assert!(stderr.contains("missing"), "{stderr}");
}
