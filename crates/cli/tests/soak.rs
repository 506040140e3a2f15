//! `granary-bench soak` for a few seconds: memcache, RESP and native
//! clients against `granary serve`, SIGKILLed and restarted a few times,
//! every acknowledged write checked after each restart (the bench fails on
//! any loss). Its seed is printed in its output, which a failure shows.

use std::process::Command;

#[test]
fn a_short_soak_loses_no_acknowledged_write() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_granary-bench"))
        .args(["soak", "--seconds", "6", "--kill-every-secs", "1.5", "--keys", "300"])
        .arg("--dir")
        .arg(dir.path())
        .arg("--granary")
        .arg(env!("CARGO_BIN_EXE_granary"))
        .env_remove("GRANARY_FAULT_SOCKET")
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{text}");
    let json_end = text.find("\n}").expect("JSON report") + 2;
    let v: serde_json::Value = serde_json::from_str(&text[..json_end]).unwrap();
    assert_eq!(v["lost"], 0, "{text}");
    assert!(v["kills"].as_u64().unwrap() >= 2, "{text}");
    assert!(v["acked_writes"].as_u64().unwrap() > 0, "{text}");
    assert!(v["verified_reads"].as_u64().unwrap() > 0, "{text}");
    for p in ["memcache", "resp", "native"] {
        assert!(v["ops"][p].as_u64().unwrap() > 0, "no {p} operations: {text}");
    }
}
