//! The committed corpora (`fuzz/corpus/<target>/`: seeds, what fuzzing
//! found worth keeping, and every input that once crashed a decoder)
//! replayed through every target on stable, and the seeds checked against
//! what the encoders produce today.

use granary_fuzz::{seeds, TARGETS};
use std::path::{Path, PathBuf};

fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus").join(target)
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.is_file())
        .collect();
    v.sort();
    v
}

#[test]
fn every_corpus_file_replays_through_its_target() {
    for &(name, target) in TARGETS {
        let dir = corpus_dir(name);
        let inputs = files(&dir);
        assert!(!inputs.is_empty(), "{}: no corpus", dir.display());
        for p in inputs {
            let data = std::fs::read(&p).expect("corpus file");
            if std::panic::catch_unwind(|| target(&data)).is_err() {
                panic!("target {name} panicked on {}", p.display());
            }
        }
    }
}

#[test]
fn seeds_are_committed() {
    let write = std::env::var_os("GRANARY_FUZZ_WRITE_SEEDS").is_some();
    let mut stale = Vec::new();
    for s in seeds::all() {
        assert!(TARGETS.iter().any(|(t, _)| *t == s.target), "seed for unknown target {}", s.target);
        assert!(s.bytes.len() <= 4096, "{}/{}: seeds stay small", s.target, s.name);
        let p = corpus_dir(s.target).join(format!("seed-{}", s.name));
        if std::fs::read(&p).ok().as_deref() == Some(&s.bytes[..]) {
            continue;
        }
        if write {
            std::fs::create_dir_all(p.parent().expect("parent")).expect("corpus dir");
            std::fs::write(&p, &s.bytes).expect("write seed");
        } else {
            stale.push(p.display().to_string());
        }
    }
    assert!(
        stale.is_empty(),
        "seeds differ from the encoders' output (rerun with GRANARY_FUZZ_WRITE_SEEDS=1): {stale:?}"
    );
}

#[test]
fn format_and_catalog_seeds_decode() {
    use granary_format::{checkpoint::Manifest, RecordHeader, SegmentHeader, Superblock};
    for s in seeds::all() {
        let b = &s.bytes[1..];
        let ok = match s.target {
            "record" => {
                RecordHeader::decode(b).and_then(|h| granary_format::record::verify_crc(0, &h, b).map(|_| ())).is_ok()
            }
            "segment_header" => SegmentHeader::decode(b).is_ok(),
            "superblock" => Superblock::decode(b).is_ok(),
            "stripe_label" => granary_store::io::stripe::fuzz_label(b),
            "checkpoint" if s.name == "manifest" => Manifest::decode(b).is_ok(),
            "checkpoint" => granary_format::batch::Commit::decode(b).is_ok(),
            "catalog" if s.bytes[0] == 0 => granary_store::fuzzing::catalog(b),
            "catalog" => granary_store::fuzzing::totals(b),
            _ => true,
        };
        assert!(ok, "seed {}/{} does not decode", s.target, s.name);
    }
}

/// The summary target reaches its decoders: its seeds decode (with their
/// checksums as written, and rewritten by the choice byte).
#[test]
fn summary_seeds_decode() {
    let seed = |name: &str| std::fs::read(corpus_dir("summary").join(format!("seed-{name}"))).expect("a seed");
    assert_eq!(granary_fuzz::targets::summary_entries(&seed("two")), Some(2));
    assert_eq!(granary_fuzz::targets::summary_entries(&seed("empty")), Some(0));
}

/// Every target is a libFuzzer binary (`fuzz/Cargo.toml`'s `[[bin]]`, its
/// driver in `fuzz/fuzz_targets/`) and every binary a target: a target on
/// one side only is replayed here but never fuzzed (`scripts/fuzz.sh`
/// runs `cargo fuzz list`), or fuzzed but never replayed.
#[test]
fn every_target_is_a_fuzz_binary_and_back() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz");
    let manifest: toml::Table = std::fs::read_to_string(root.join("Cargo.toml")).unwrap().parse().unwrap();
    let mut bins: Vec<String> = manifest["bin"]
        .as_array()
        .expect("[[bin]] entries")
        .iter()
        .map(|b| {
            let name = b["name"].as_str().expect("a bin's name").to_string();
            assert_eq!(b["path"].as_str(), Some(format!("fuzz_targets/{name}.rs").as_str()), "{name}'s driver");
            assert!(root.join("fuzz_targets").join(format!("{name}.rs")).is_file(), "{name}: no driver file");
            name
        })
        .collect();
    let mut drivers: Vec<String> = std::fs::read_dir(root.join("fuzz_targets"))
        .unwrap()
        .map(|e| e.unwrap().path().file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    let mut targets: Vec<String> = TARGETS.iter().map(|(n, _)| n.to_string()).collect();
    for v in [&mut bins, &mut drivers, &mut targets] {
        v.sort();
    }
    assert_eq!(bins, targets, "fuzz/Cargo.toml's bins against granary_fuzz::TARGETS");
    assert_eq!(drivers, targets, "fuzz/fuzz_targets/ against granary_fuzz::TARGETS");
}
