//! The control plane's rules, decided once for both API doors.
//!
//! A door (LangSmith's in `service.rs` and its neighbours, E2B's in `e2b/`)
//! parses its wire format and renders results; what a sandbox may become
//! is decided here.

pub(crate) mod commands;
pub(crate) mod create;
pub mod error;
pub(crate) mod lifetime;
pub(crate) mod model;
pub(crate) mod queries;
pub(crate) mod state;
pub(crate) mod templates;
pub(crate) mod volume_content;
pub(crate) mod volumes;

#[cfg(test)]
mod tests {
    /// A door reads through the domain, never the database, and speaks
    /// no other door's language: no file of E2B's door names the control
    /// plane's `db`, the database crate (its nouns come from
    /// [`super::model`]) or LangSmith's API crate (its errors come from
    /// [`super::error`]).
    #[test]
    fn the_e2b_door_reads_no_rows_and_no_other_door() {
        let mut dirs = vec![std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/e2b")];
        let mut files = Vec::new();
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).expect("read src/e2b") {
                let path = entry.expect("entry").path();
                if path.is_dir() {
                    dirs.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    files.push(path);
                }
            }
        }
        assert!(files.len() > 5, "the door's files: {files:?}");
        let mut offenders = Vec::new();
        for path in files {
            let text = std::fs::read_to_string(&path).expect("read");
            for (i, line) in text.lines().enumerate() {
                let code = line.split("//").next().unwrap_or("");
                let t = code.trim_start();
                if code.contains(".db.") || code.trim_end().ends_with(".db") || t.starts_with(".db")
                {
                    offenders.push(format!("{}:{}: the database", path.display(), i + 1));
                }
                // LangSmith's error and its rendering are that door's.
                for other in ["hearth_db", "hearth_api", "ApiError", "HttpError"] {
                    if code.contains(other) {
                        offenders.push(format!("{}:{}: {other}", path.display(), i + 1));
                    }
                }
            }
        }
        assert!(
            offenders.is_empty(),
            "the E2B door reads the database or another door's types: {offenders:?}"
        );
    }
}
