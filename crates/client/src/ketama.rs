//! A ketama-compatible consistent-hash ring (last.fm's libketama, as
//! libmemcached, pylibmc and uhashring implement it with equal weights).
//!
//! Each server, named "host:port", gets 160 points on a 32-bit circle: for
//! `w` in 0..40, the MD5 digest of "host:port-w" gives four points, each
//! the little-endian u32 of four digest bytes. A key hashes to the
//! little-endian u32 of its MD5 digest's first four bytes and belongs to
//! the server of the first point at or after it, wrapping around. Adding or
//! removing one of N servers moves about 1/N of the keys.

use md5::{Digest, Md5};

/// Hash groups per server (each gives four points).
pub const GROUPS_PER_SERVER: u32 = 40;

/// The ring: points sorted, each naming a server by index.
#[derive(Debug, Clone)]
pub struct Ketama {
    points: Vec<(u32, usize)>,
    servers: usize,
}

fn digest(s: &[u8]) -> [u8; 16] {
    Md5::digest(s).into()
}

fn point(d: &[u8; 16], i: usize) -> u32 {
    u32::from_le_bytes([d[i * 4], d[i * 4 + 1], d[i * 4 + 2], d[i * 4 + 3]])
}

/// A key's position on the circle.
pub fn key_point(key: &[u8]) -> u32 {
    point(&digest(key), 0)
}

impl Ketama {
    /// The ring of servers named `names` (e.g. "10.0.0.1:11211"); a
    /// server's index is its position in `names`.
    pub fn new<S: AsRef<str>>(names: &[S]) -> Ketama {
        let mut points = Vec::with_capacity(names.len() * GROUPS_PER_SERVER as usize * 4);
        for (i, n) in names.iter().enumerate() {
            for w in 0..GROUPS_PER_SERVER {
                let d = digest(format!("{}-{w}", n.as_ref()).as_bytes());
                for r in 0..4 {
                    points.push((point(&d, r), i));
                }
            }
        }
        points.sort_unstable();
        Ketama { points, servers: names.len() }
    }

    pub fn servers(&self) -> usize {
        self.servers
    }

    /// The index of the server owning `key`; None for an empty ring.
    pub fn server_of(&self, key: &[u8]) -> Option<usize> {
        if self.points.is_empty() {
            return None;
        }
        let h = key_point(key);
        let i = self.points.partition_point(|&(p, _)| p < h);
        Some(self.points.get(i).unwrap_or(&self.points[0]).1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Computed with uhashring 2.x (`HashRing(nodes, hash_fn="ketama")`,
    /// 40 vnodes, weight 1), an independent ketama implementation.
    const VECTORS: &[(&str, &str, u32)] = &[
        ("key-0", "10.0.0.2:11211", 2123055796),
        ("key-1", "10.0.0.1:11211", 2339090209),
        ("key-2", "10.0.0.1:11211", 2354236092),
        ("key-3", "10.0.0.3:43345", 1029098844),
        ("key-4", "10.0.0.3:43345", 1026749339),
        ("key-5", "10.0.0.3:43345", 723936391),
        ("key-6", "10.0.0.3:43345", 1582856358),
        ("key-7", "10.0.0.1:11211", 1929485890),
        ("key-8", "10.0.0.3:43345", 1199951306),
        ("key-9", "10.0.0.3:43345", 3797840000),
        ("key-10", "10.0.0.3:43345", 2334596719),
        ("key-11", "10.0.0.1:11211", 3713236130),
        ("key-12", "10.0.0.2:11211", 2314397449),
        ("key-13", "10.0.0.2:11211", 2258684653),
        ("key-14", "10.0.0.3:43345", 3300629494),
        ("key-15", "10.0.0.1:11211", 3659626904),
        ("key-16", "10.0.0.2:11211", 373441630),
        ("key-17", "10.0.0.2:11211", 608617239),
        ("key-18", "10.0.0.3:43345", 3460634732),
        ("key-19", "10.0.0.2:11211", 392759119),
        ("key-20", "10.0.0.2:11211", 101738379),
        ("key-21", "10.0.0.1:11211", 2797981501),
        ("key-22", "10.0.0.2:11211", 1660557295),
        ("key-23", "10.0.0.1:11211", 909649301),
        ("", "10.0.0.2:11211", 3649838548),
        ("a", "10.0.0.3:43345", 3111502092),
        ("user:1000", "10.0.0.3:43345", 781738503),
        ("granary", "10.0.0.2:11211", 3628998996),
    ];

    #[test]
    fn matches_a_reference_implementation() {
        let names = ["10.0.0.1:11211", "10.0.0.2:11211", "10.0.0.3:43345"];
        let ring = Ketama::new(&names);
        assert_eq!(ring.points.len(), 3 * 160);
        for &(k, server, h) in VECTORS {
            assert_eq!(key_point(k.as_bytes()), h, "hash of {k:?}");
            assert_eq!(names[ring.server_of(k.as_bytes()).unwrap()], server, "server of {k:?}");
        }
    }

    #[test]
    fn adding_a_server_moves_about_a_share_of_keys() {
        let three = Ketama::new(&["a:1", "b:1", "c:1"]);
        let four = Ketama::new(&["a:1", "b:1", "c:1", "d:1"]);
        let n = 20_000;
        let mut moved = 0;
        let mut counts = [0usize; 3];
        for i in 0..n {
            let k = format!("k{i}");
            let (s3, s4) = (three.server_of(k.as_bytes()).unwrap(), four.server_of(k.as_bytes()).unwrap());
            counts[s3] += 1;
            if s3 != s4 {
                // A key only ever moves to the new server.
                assert_eq!(s4, 3, "{k} moved between old servers");
                moved += 1;
            }
        }
        // About a quarter moves; every server holds a fair share.
        assert!((n / 8..n / 2).contains(&moved), "moved {moved} of {n}");
        for c in counts {
            assert!((n / 6..n / 2).contains(&c), "share {c} of {n}");
        }
        assert_eq!(Ketama::new::<&str>(&[]).server_of(b"k"), None);
    }
}
