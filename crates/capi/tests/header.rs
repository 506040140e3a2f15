//! include/granary.h is what cbindgen makes of this crate now: the header
//! is committed (building the crate needs no generator), and this test
//! fails when it is stale. `GRANARY_BLESS=1` writes the new one instead.

use std::path::Path;

#[test]
fn header_is_current() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let bindings = cbindgen::generate_with_config(dir, config).expect("cbindgen generates the header");
    let mut fresh = Vec::new();
    bindings.write(&mut fresh);
    let path = dir.join("include/granary.h");
    if std::env::var_os("GRANARY_BLESS").is_some() {
        std::fs::write(&path, &fresh).expect("write include/granary.h");
        return;
    }
    let committed = std::fs::read(&path).unwrap_or_default();
    assert!(
        committed == fresh,
        "include/granary.h is stale: run `GRANARY_BLESS=1 cargo test -p granary-capi --test header` and commit it"
    );
}
