//! The async engine under concurrency on an executor: many tasks on two
//! executors overwrite and delete their own keys and fight over shared ones
//! on a small device, so GC runs and writers wait for room asynchronously.
//! Every task's own keys must end as its model says, shared keys must hold
//! some value a task wrote, and verify must be clean. Run on an O_DIRECT
//! file through the executors' io_uring, and on the in-memory device, whose
//! reads (and the engine's index lookups) yield on an executor. And the
//! durability barrier, `sync_async`, on an executor over io_uring.

use granary_io::{Device, FileDevice, IoBackend, MemDevice, OpenMode, SimRng};
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

const DEVICE_BYTES: u64 = 24 << 20;

#[test]
fn concurrent_tasks_with_gc_on_io_uring_match_their_models() {
    let dir = tempfile::tempdir().unwrap();
    let dev = FileDevice::create(&dir.path().join("dev"), DEVICE_BYTES, OpenMode::Direct)
        .unwrap()
        .with_backend(IoBackend::Uring);
    let rt = Runtime::new(RuntimeConfig { threads: 2, pin: false, ..Default::default() }).unwrap();
    tasks_match_their_models(Arc::new(dev), &rt);
    assert!(rt.stats().iter().map(|s| s.sqes).sum::<u64>() > 0);
}

#[test]
fn concurrent_tasks_with_gc_on_the_in_memory_device_match_their_models() {
    let rt = Runtime::new(RuntimeConfig { threads: 2, pin: false, ..Default::default() }).unwrap();
    tasks_match_their_models(Arc::new(MemDevice::new(DEVICE_BYTES)), &rt);
}

/// A GET on an executor over the in-memory device yields twice: before its
/// index lookup (the lookup's line was asked for) and before the record's
/// copy (the device's read), so a core's concurrent GETs overlap their
/// memory misses. Counted in the executor's polls of one task doing GETs.
#[test]
fn a_get_on_an_executor_yields_before_each_memory_miss() {
    const KEYS: u64 = 200;
    let store =
        Arc::new(Store::create(Arc::new(MemDevice::new(DEVICE_BYTES)), &small(), &OpenOptions::default()).unwrap());
    for k in 0..KEYS {
        store.put(format!("k{k}").as_bytes(), &value(0, k, 0)).unwrap();
    }
    let rt = Runtime::new(RuntimeConfig { threads: 1, pin: false, ..Default::default() }).unwrap();
    let polls = || rt.stats()[0].polls;
    let before = polls();
    let s = store.clone();
    rt.block_on(async move {
        for k in 0..KEYS {
            assert_eq!(s.get_async(format!("k{k}").as_bytes()).await.unwrap(), Some(value(0, k, 0)));
        }
    })
    .unwrap();
    let polled = polls() - before;
    assert!(polled > 2 * KEYS, "{KEYS} GETs took {polled} polls: each should yield twice");
    // The synchronous API does not yield (no executor): same answers.
    for k in 0..KEYS {
        assert_eq!(store.get(format!("k{k}").as_bytes()).unwrap(), Some(value(0, k, 0)));
    }
}

/// `sync_async` on an executor over an O_DIRECT file with the io_uring
/// backend: writes made through the ring, then one flush of the file; what
/// was written reads back after the store is reopened.
#[test]
fn sync_async_on_io_uring_flushes_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dev");
    let dev = FileDevice::create(&path, DEVICE_BYTES, OpenMode::Direct).unwrap().with_backend(IoBackend::Uring);
    let store = Arc::new(Store::create(Arc::new(dev), &small(), &OpenOptions::default()).unwrap());
    let disk = store.create_export("disk", 1 << 20, 4096).unwrap();
    let rt = Runtime::new(RuntimeConfig { threads: 1, pin: false, ..Default::default() }).unwrap();
    let before = store.stats().io.flushes;
    let s = store.clone();
    rt.block_on(async move {
        for n in 0..16 {
            disk.put_async(&granary_store::block::block_key(n), &[n as u8; 4096]).await.unwrap();
        }
        s.sync_async().await.unwrap();
    })
    .unwrap();
    assert_eq!(store.stats().io.flushes - before, 1);
    assert!(rt.stats().iter().map(|s| s.sqes).sum::<u64>() > 0, "the writes went through the ring");
    drop(store);
    let dev = FileDevice::open(&path, OpenMode::Direct).unwrap().with_backend(IoBackend::Uring);
    let store = Store::open(Arc::new(dev), &OpenOptions::default()).unwrap();
    let disk = store.namespace("disk").unwrap();
    for n in 0..16 {
        assert_eq!(disk.get(&granary_store::block::block_key(n)).unwrap(), Some(vec![n as u8; 4096]), "block {n}");
    }
}

fn small() -> CreateOptions {
    CreateOptions { grain_bytes: Some(512), segment_bytes: Some(1 << 20), index_table_homes: None }
}

fn tasks_match_their_models(dev: Arc<dyn Device>, rt: &Runtime) {
    let store = Arc::new(Store::create(dev, &small(), &OpenOptions::default()).unwrap());
    let handles: Vec<_> = (0..TASKS)
        .map(|t| {
            let store = store.clone();
            rt.spawn(async move {
                let mut model: HashMap<u64, Option<Vec<u8>>> = HashMap::new();
                let mut rng = SimRng::new(t);
                for round in 0..ROUNDS {
                    for k in 0..OWN_KEYS {
                        let x = rng.next_u64();
                        let key = format!("own-{t}-{k}").into_bytes();
                        if x.is_multiple_of(5) {
                            let had = model.get(&k).is_some_and(|v| v.is_some());
                            assert_eq!(store.delete_async(&key).await.unwrap(), had);
                            model.insert(k, None);
                        } else {
                            let v = value(t, k, round);
                            store.put_async(&key, &v).await.unwrap();
                            model.insert(k, Some(v));
                        }
                        if x.is_multiple_of(3) {
                            let got = store.get_async(&key).await.unwrap();
                            assert_eq!(got, model[&k].clone(), "task {t} key {k} round {round}");
                        }
                    }
                    let s = rng.below(SHARED_KEYS);
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
    let report = store.verify().unwrap();
    assert!(report.is_clean(), "{:?}", report.errors);
}
