//! Model-based test of namespaces and atomic batches: random creates,
//! drops, truncates, puts, deletes, batches (with conditions), GC steps,
//! checkpoints, crashes and clean restarts against a model of namespaces
//! holding maps; after every step each key of each namespace reads as the
//! model says, and each namespace's key count matches.

mod common;

use granary_store::{
    Background, BatchOutcome, CreateOptions, Entropy, Error, NamespaceOptions, OpenOptions, PutOutcome, Store,
    DEFAULT_NAMESPACE,
};
use proptest::prelude::*;
use std::collections::{BTreeMap, HashMap};

const NAMES: [&str; 3] = ["default", "a", "b"];
const KEYS: u8 = 6;

#[derive(Debug, Clone)]
enum BOp {
    Put(usize, u8, u8),
    PutAbsent(usize, u8, u8),
    Delete(usize, u8),
}

#[derive(Debug, Clone)]
enum Op {
    Create(usize),
    Drop(usize),
    Truncate(usize),
    Put(usize, u8, u8),
    Delete(usize, u8),
    Batch(Vec<BOp>),
    Gc,
    Checkpoint,
    Crash,
    Restart,
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let ns = 0..NAMES.len();
    let bop = prop_oneof![
        4 => (0..NAMES.len(), 0..KEYS, any::<u8>()).prop_map(|(n, k, v)| BOp::Put(n, k, v)),
        2 => (0..NAMES.len(), 0..KEYS, any::<u8>()).prop_map(|(n, k, v)| BOp::PutAbsent(n, k, v)),
        2 => (0..NAMES.len(), 0..KEYS).prop_map(|(n, k)| BOp::Delete(n, k)),
    ];
    prop_oneof![
        2 => ns.clone().prop_map(Op::Create),
        1 => ns.clone().prop_map(Op::Drop),
        1 => ns.clone().prop_map(Op::Truncate),
        6 => (ns.clone(), 0..KEYS, any::<u8>()).prop_map(|(n, k, v)| Op::Put(n, k, v)),
        2 => (ns, 0..KEYS).prop_map(|(n, k)| Op::Delete(n, k)),
        4 => proptest::collection::vec(bop, 1..5).prop_map(Op::Batch),
        1 => Just(Op::Gc),
        1 => Just(Op::Checkpoint),
        1 => Just(Op::Crash),
        1 => Just(Op::Restart),
    ]
}

fn key(k: u8) -> Vec<u8> {
    vec![b'k', k]
}

fn value(v: u8, k: u8) -> Vec<u8> {
    vec![v; 1 + (k as usize * 97) % 700]
}

/// Each namespace (None: does not exist) and its keys.
type Model = BTreeMap<&'static str, Option<HashMap<u8, u8>>>;

/// `seed` picks the store's random numbers, its key hash's seed among
/// them: which keys share an index neighbourhood is part of a case.
fn open_opts(seed: u64) -> OpenOptions {
    OpenOptions {
        background: Background::Manual,
        blind_overwrite_bytes: Some(1 << 20),
        entropy: Entropy::seeded(seed),
        ..OpenOptions::default()
    }
}

/// `flushed`: the default namespace was emptied by a flush, whose values
/// still count until GC reclaims them (documented), so its count is not
/// compared.
fn check(s: &Store, m: &Model, flushed: bool) -> Result<(), TestCaseError> {
    for (name, keys) in m {
        match keys {
            None => prop_assert!(matches!(s.namespace(name), Err(Error::NoSuchNamespace { .. })), "{name} exists"),
            Some(keys) => {
                let ns = s.namespace(name).map_err(|e| TestCaseError::fail(format!("{name}: {e}")))?;
                for k in 0..KEYS {
                    let want = keys.get(&k).map(|&v| value(v, k));
                    prop_assert_eq!(ns.get(&key(k)).unwrap(), want, "{}/{}", name, k);
                }
                if !(flushed && *name == DEFAULT_NAMESPACE) {
                    // A blind overwrite of another key of one fingerprint
                    // counts as an overwrite until its link is settled
                    // (docs/ARCHITECTURE.md, "Counting"): one key short per
                    // unsettled link at most.
                    let (counted, want) = (ns.stats().unwrap().keys, keys.len() as u64);
                    let unsettled = s.stats().unsettled_links;
                    prop_assert!(
                        counted <= want && counted + unsettled >= want,
                        "{} keys: {} counted, {} in the model, {} unsettled links",
                        name,
                        counted,
                        want,
                        unsettled
                    );
                }
            }
        }
    }
    Ok(())
}

fn run(seed: u64, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let create = CreateOptions { grain_bytes: Some(512), segment_bytes: Some(64 << 10), index_table_homes: Some(64) };
    // In memory, or the emulated zoned device (zones of the segment size)
    // with `GRANARY_TEST_BACKEND=zoned`.
    let dev = common::test_device(8 << 20, create.segment_bytes.unwrap());
    let mut s = Some(Store::create(dev.clone(), &create, &open_opts(seed)).unwrap());
    let mut m: Model = NAMES.iter().map(|&n| (n, (n == DEFAULT_NAMESPACE).then(HashMap::new))).collect();
    let mut flushed = false;
    for op in ops {
        let st = s.as_ref().unwrap();
        match op {
            Op::Create(n) => match st.create_namespace(NAMES[n], NamespaceOptions::default()) {
                Ok(_) => {
                    prop_assert!(m[NAMES[n]].is_none());
                    m.insert(NAMES[n], Some(HashMap::new()));
                }
                Err(Error::NamespaceExists { .. }) => prop_assert!(m[NAMES[n]].is_some()),
                Err(e) => return Err(TestCaseError::fail(e.to_string())),
            },
            Op::Drop(n) => match st.drop_namespace(NAMES[n]) {
                Ok(()) => {
                    prop_assert!(m[NAMES[n]].is_some());
                    m.insert(NAMES[n], None);
                }
                Err(Error::NoSuchNamespace { .. }) => prop_assert!(m[NAMES[n]].is_none()),
                Err(Error::BadNamespace { .. }) => prop_assert_eq!(NAMES[n], DEFAULT_NAMESPACE),
                Err(e) => return Err(TestCaseError::fail(e.to_string())),
            },
            Op::Truncate(n) => match st.truncate(NAMES[n]) {
                Ok(()) => {
                    prop_assert!(m[NAMES[n]].is_some());
                    flushed |= NAMES[n] == DEFAULT_NAMESPACE;
                    m.insert(NAMES[n], Some(HashMap::new()));
                }
                Err(Error::NoSuchNamespace { .. }) => prop_assert!(m[NAMES[n]].is_none()),
                Err(e) => return Err(TestCaseError::fail(e.to_string())),
            },
            Op::Put(n, k, v) => {
                if let Ok(ns) = st.namespace(NAMES[n]) {
                    ns.put(&key(k), &value(v, k)).unwrap();
                    m.get_mut(NAMES[n]).unwrap().as_mut().unwrap().insert(k, v);
                }
            }
            Op::Delete(n, k) => {
                if let Ok(ns) = st.namespace(NAMES[n]) {
                    let was = ns.delete(&key(k)).unwrap();
                    let had = m.get_mut(NAMES[n]).unwrap().as_mut().unwrap().remove(&k).is_some();
                    prop_assert_eq!(was, had);
                }
            }
            Op::Batch(bops) => {
                let mut b = st.batch();
                let mut seen = std::collections::HashSet::new();
                let mut applied = Vec::new();
                let mut missing_ns = false;
                for bop in &bops {
                    let (n, k) = match *bop {
                        BOp::Put(n, k, _) | BOp::PutAbsent(n, k, _) | BOp::Delete(n, k) => (n, k),
                    };
                    if !seen.insert((n, k)) {
                        continue;
                    }
                    let Ok(ns) = st.namespace(NAMES[n]) else {
                        missing_ns = true;
                        break;
                    };
                    match *bop {
                        BOp::Put(_, _, v) => b.put(&ns, &key(k), &value(v, k)),
                        BOp::PutAbsent(_, _, v) => b.put_absent(&ns, &key(k), &value(v, k)),
                        BOp::Delete(..) => b.delete(&ns, &key(k)),
                    };
                    applied.push(bop.clone());
                }
                if missing_ns {
                    continue;
                }
                // The model's answer: the first put_absent of a key it holds fails.
                let fails = applied.iter().position(|bop| match *bop {
                    BOp::PutAbsent(n, k, _) => m[NAMES[n]].as_ref().unwrap().contains_key(&k),
                    _ => false,
                });
                match b.commit().unwrap() {
                    BatchOutcome::Committed { .. } => {
                        prop_assert_eq!(fails, None);
                        for bop in applied {
                            match bop {
                                BOp::Put(n, k, v) | BOp::PutAbsent(n, k, v) => {
                                    m.get_mut(NAMES[n]).unwrap().as_mut().unwrap().insert(k, v);
                                }
                                BOp::Delete(n, k) => {
                                    m.get_mut(NAMES[n]).unwrap().as_mut().unwrap().remove(&k);
                                }
                            }
                        }
                    }
                    BatchOutcome::ConditionFailed { op, outcome } => {
                        prop_assert_eq!(Some(op), fails);
                        prop_assert_eq!(outcome, PutOutcome::Exists);
                    }
                }
            }
            Op::Gc => while st.gc_step() {},
            Op::Checkpoint => {
                st.checkpoint().unwrap();
            }
            Op::Crash => {
                drop(s.take());
                s = Some(Store::open(dev.clone(), &open_opts(seed)).unwrap());
            }
            Op::Restart => {
                s.take().unwrap().close().unwrap();
                s = Some(Store::open(dev.clone(), &open_opts(seed)).unwrap());
            }
        }
        check(s.as_ref().unwrap(), &m, flushed)?;
    }
    s.take().unwrap().verify().unwrap();
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn namespaces_and_batches_match_the_model(seed in any::<u64>(), ops in proptest::collection::vec(op_strategy(), 1..50)) {
        run(seed, ops)?;
    }
}

/// A case the model found once keys hashed with a seed of their own store:
/// under this seed `k2` and `k4` share a fingerprint, and the batch's
/// blind overwrite of `k4` over `k2`'s entry counted as an overwrite (the
/// namespace one key short until the link settles, as documented; the
/// model compared counts exactly before).
#[test]
fn a_batch_that_blindly_displaces_a_tag_mate_matches_the_model() {
    let ops = vec![Op::Create(2), Op::Put(2, 2, 0), Op::Batch(vec![BOp::Put(2, 4, 0)])];
    run(978_135_340_292_899_393, ops).unwrap();
}

/// A case saved before cases carried a seed (proptest keeps only the seed
/// that drew a case, which now draws another): a truncate of the default
/// namespace right after a write to it.
#[test]
fn a_truncate_of_the_default_namespace_after_a_put_matches_the_model() {
    run(0, vec![Op::Put(0, 0, 0), Op::Truncate(0)]).unwrap();
}
