//! The configuration file's fuzz corpus (`fuzz/corpus/config_toml/`, see
//! docs/FUZZING.md) through `granary serve --config FILE --print-config`:
//! the whole path a file takes (TOML, every setting's value check, the
//! configuration it resolves to), which the fuzz target, outside the
//! binary, reaches only to the TOML. Every file is accepted or refused
//! with an error; none panics.

use std::process::Command;

#[test]
fn every_config_corpus_file_is_accepted_or_refused_without_a_panic() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/config_toml");
    let mut files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    assert!(!files.is_empty(), "{}: no corpus", dir.display());
    let mut accepted = 0;
    for f in &files {
        let out = Command::new(env!("CARGO_BIN_EXE_granary"))
            .args(["serve", "--print-config", "--config"])
            .arg(f)
            .env_remove("GRANARY_LOG")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.code().is_some_and(|c| c != 101) && !err.contains("panicked"),
            "{}: {} {err}",
            f.display(),
            out.status
        );
        if out.status.success() {
            accepted += 1;
            assert!(String::from_utf8_lossy(&out.stdout).contains("granary serve"), "{}", f.display());
        } else {
            assert!(err.contains(&*f.to_string_lossy()), "{}: the error names the file: {err}", f.display());
        }
    }
    // The seeds include the docs' example, which is valid.
    assert!(accepted > 0, "no corpus file was accepted");
}
