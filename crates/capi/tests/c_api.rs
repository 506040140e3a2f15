//! The C API from C: tests/c/test.c compiled with the system's C compiler
//! against include/granary.h and linked with this crate's static library,
//! examples/example.c linked with its shared library, and the header
//! compiled as C++; each program run and its exit status and output
//! checked.
//!
//! The libraries are the ones cargo built for this test run: `cargo test`
//! builds every crate type of the library beside the test's executable
//! (target/<profile>/deps).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Libraries the Rust standard library needs from the system when linked
/// statically (`rustc --print native-static-libs` lists them).
const NATIVE_LIBS: &[&str] = &["-lgcc_s", "-lutil", "-lrt", "-lpthread", "-lm", "-ldl", "-lc"];

fn crate_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The folder holding this run's libgranary_capi.{a,so}.
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's path");
    let deps = exe.parent().expect("the test's folder").to_path_buf();
    for dir in [deps.clone(), deps.parent().expect("the profile's folder").to_path_buf()] {
        if dir.join("libgranary_capi.a").exists() && dir.join("libgranary_capi.so").exists() {
            return dir;
        }
    }
    panic!("libgranary_capi.a and .so not found beside {} (cargo builds them with the tests)", deps.display());
}

fn cc() -> String {
    std::env::var("CC").unwrap_or_else(|_| "cc".to_string())
}

/// Run `cmd`, failing the test with its output if it fails.
fn run(cmd: &mut Command, what: &str) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: cannot run {cmd:?}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{what} failed ({}):\n{cmd:?}\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
    out
}

/// Compile C file `src` into executable `exe`, linked with `link`.
fn compile(src: &Path, exe: &Path, link: &[String]) {
    let mut cmd = Command::new(cc());
    cmd.args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-g"])
        .arg("-I")
        .arg(crate_dir().join("include"))
        .arg(src)
        .args(link)
        .arg("-o")
        .arg(exe);
    run(&mut cmd, "compiling");
}

#[test]
fn c_test_program_passes() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let exe = tmp.path().join("granary-c-test");
    let mut link = vec![lib_dir().join("libgranary_capi.a").display().to_string()];
    link.extend(NATIVE_LIBS.iter().map(|s| s.to_string()));
    compile(&crate_dir().join("tests/c/test.c"), &exe, &link);
    let data = tmp.path().join("data");
    std::fs::create_dir(&data).expect("data dir");
    let out = run(Command::new(&exe).arg(&data), "the C test");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().unwrap_or("");
    let passed: u32 = last
        .strip_prefix("c api: ")
        .and_then(|r| r.strip_suffix(" passed, 0 failed"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("unexpected output of the C test:\n{stdout}"));
    // Every check ran (a check that was skipped would lower the count).
    assert!(passed >= 200, "only {passed} checks ran:\n{stdout}");
}

#[test]
fn c_example_runs_with_the_shared_library() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let exe = tmp.path().join("granary-example");
    let dir = lib_dir();
    let link =
        vec![format!("-L{}", dir.display()), format!("-Wl,-rpath,{}", dir.display()), "-lgranary_capi".to_string()];
    compile(&crate_dir().join("examples/example.c"), &exe, &link);
    let out = run(Command::new(&exe).arg(tmp.path().join("example.granary")), "the C example");
    let stdout = String::from_utf8_lossy(&out.stdout);
    for want in
        ["greeting needs 12 bytes", "greeting = hello, world", "after reopen: users/bob = reader", "users holds 2 keys"]
    {
        assert!(stdout.contains(want), "the example's output lacks {want:?}:\n{stdout}");
    }
}

/// The header is valid C++ too (its `extern "C"` block and types).
/// Skipped without a C++ compiler unless GRANARY_REQUIRE_PEERS is set
/// (scripts/test.sh sets it, and installs g++).
#[test]
fn header_compiles_as_cpp() {
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".to_string());
    if Command::new(&cxx).arg("--version").output().is_err() {
        assert!(std::env::var_os("GRANARY_REQUIRE_PEERS").is_none(), "no C++ compiler ({cxx}): install g++");
        eprintln!("skipped: no C++ compiler ({cxx})");
        return;
    }
    let tmp = tempfile::tempdir().expect("temp dir");
    let src = tmp.path().join("use.cpp");
    std::fs::write(&src, "#include \"granary.h\"\nint main() { granary_store *s = nullptr; return granary_close(s) == GRANARY_EINVAL ? 0 : 1; }\n")
        .expect("write the C++ file");
    let mut cmd = Command::new(cxx);
    cmd.args(["-std=c++11", "-Wall", "-Wextra", "-Werror", "-fsyntax-only", "-I"])
        .arg(crate_dir().join("include"))
        .arg(&src);
    run(&mut cmd, "compiling the header as C++");
}
