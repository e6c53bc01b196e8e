//! The Helm chart (deploy/helm/hearth) stays consistent: runs
//! deploy/helm/test_chart.py, which renders the chart's templates without
//! helm and checks values, objects and the wiring between the control plane
//! and the hosts (and runs `helm lint`/`helm template` when helm is
//! installed). Needs python3 with PyYAML (Debian: python3-yaml); without
//! them the test prints SKIP, unless `HEARTH_REQUIRE_HELM_TEST=1`, which
//! turns the skip into a failure.

use std::path::PathBuf;
use std::process::Command;

fn required() -> bool {
    std::env::var("HEARTH_REQUIRE_HELM_TEST").is_ok_and(|v| v == "1")
}

/// Whether `python3` runs and imports yaml; the reason when not.
fn python_with_yaml() -> Result<(), String> {
    match Command::new("python3").args(["-c", "import yaml"]).output() {
        Err(e) => Err(format!("python3 cannot be run: {e}")),
        Ok(out) if !out.status.success() => Err(format!(
            "python3 has no PyYAML (apt-get install python3-yaml): {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Ok(_) => Ok(()),
    }
}

#[test]
fn helm_chart_is_consistent() {
    if let Err(why) = python_with_yaml() {
        assert!(!required(), "HEARTH_REQUIRE_HELM_TEST=1 but {why}");
        eprintln!("SKIP: the Helm chart test needs python3 with PyYAML: {why}");
        return;
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let script = root.join("deploy/helm/test_chart.py");
    let out = Command::new("python3")
        .arg(&script)
        .current_dir(&root)
        .output()
        .expect("run deploy/helm/test_chart.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    eprintln!("{stderr}");
    assert!(
        out.status.success(),
        "deploy/helm/test_chart.py failed ({}):\n{stdout}{stderr}",
        out.status
    );
}
