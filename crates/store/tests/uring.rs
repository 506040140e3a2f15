//! The async engine on the io_uring backend under concurrency: many tasks
//! on two executors overwrite and delete their own keys and fight over
//! shared ones on a small O_DIRECT file, so GC runs and writers wait for
//! room asynchronously. Every task's own keys must end as its model says,
//! shared keys must hold some value a task wrote, and verify must be clean.

use granary_io::{FileDevice, IoBackend, OpenMode};
use granary_rt::{Runtime, RuntimeConfig};
use granary_store::{CreateOptions, OpenOptions, Store};
use std::collections::HashMap;
use std::sync::Arc;

const TASKS: u64 = 48;
const OWN_KEYS: u64 = 20;
const SHARED_KEYS: u64 = 8;
const ROUNDS: u64 = 60;

fn value(task: u64, key: u64, round: u64) -> Vec<u8> {
    let len = 200 + ((task * 7 + key * 13 + round * 31) % 1800) as usize;
    let tag = format!("t{task}-k{key}-r{round}|");
    tag.bytes().cycle().take(len).collect()
}

#[test]
fn concurrent_tasks_with_gc_on_io_uring_match_their_models() {
    let dir = tempfile::tempdir().unwrap();
    let dev =
        FileDevice::create(&dir.path().join("dev"), 24 << 20, OpenMode::Direct).unwrap().with_backend(IoBackend::Uring);
    let opts = CreateOptions { grain_bytes: Some(512), segment_bytes: Some(1 << 20), index_table_homes: None };
    let store = Arc::new(Store::create(Arc::new(dev), &opts, &OpenOptions::default()).unwrap());
    let rt = Runtime::new(RuntimeConfig { threads: 2, pin: false, ..Default::default() }).unwrap();
    let handles: Vec<_> = (0..TASKS)
        .map(|t| {
            let store = store.clone();
            rt.spawn(async move {
                let mut model: HashMap<u64, Option<Vec<u8>>> = HashMap::new();
                let mut x = t.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
                for round in 0..ROUNDS {
                    for k in 0..OWN_KEYS {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let key = format!("own-{t}-{k}").into_bytes();
                        if x % 5 == 0 {
                            let had = model.get(&k).is_some_and(|v| v.is_some());
                            assert_eq!(store.delete_async(&key).await.unwrap(), had);
                            model.insert(k, None);
                        } else {
                            let v = value(t, k, round);
                            store.put_async(&key, &v).await.unwrap();
                            model.insert(k, Some(v));
                        }
                        if x % 3 == 0 {
                            let got = store.get_async(&key).await.unwrap();
                            assert_eq!(got, model[&k].clone(), "task {t} key {k} round {round}");
                        }
                    }
                    let s = x % SHARED_KEYS;
                    let key = format!("shared-{s}").into_bytes();
                    store.put_async(&key, &value(t, 1000 + s, round)).await.unwrap();
                }
                for k in 0..OWN_KEYS {
                    let key = format!("own-{t}-{k}").into_bytes();
                    assert_eq!(store.get_async(&key).await.unwrap(), model[&k].clone(), "task {t} key {k} at the end");
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    for s in 0..SHARED_KEYS {
        let v = store.get(format!("shared-{s}").as_bytes()).unwrap();
        if let Some(v) = v {
            let text = String::from_utf8_lossy(&v[..v.len().min(40)]).to_string();
            let written = (0..TASKS).any(|t| (0..ROUNDS).any(|r| value(t, 1000 + s, r) == v));
            assert!(written, "shared key {s} holds a value nobody wrote: {text}");
        }
    }
    let stats = store.stats();
    assert!(stats.gc.victims > 0, "the device was small enough for GC to run: {stats:?}");
    assert!(rt.stats().iter().map(|s| s.sqes).sum::<u64>() > 0);
    let report = store.verify().unwrap();
    assert!(report.is_clean(), "{:?}", report.errors);
}
