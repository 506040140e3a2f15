//! CRC32C (Castagnoli), the checksum of every on-device structure.
//!
//! Superblocks and segment headers use a plain CRC32C (seed 0). Records use a
//! per-device seed derived from the device UUID ([`record_seed`]), so a value
//! that happens to contain the bytes of a well-formed record, or a record left
//! by another store on the same disk, never passes as a record of this store.
//!
//! Two implementations compute the same function: `crc32c` (the CRC
//! instruction on three interleaved streams) for inputs shorter than
//! [`FOLD_MIN_BYTES`], and `crc-fast` (carry-less multiply folding, with
//! AVX-512 where the CPU has it) from there on, where it is several times
//! faster on record-sized inputs (`cargo run --release -p granary-bench
//! --example costs` measures it). A test checks that they agree on every length and seed.

/// Inputs of at least this many bytes go to the folding implementation.
pub const FOLD_MIN_BYTES: usize = 256;

/// CRC32C of `data` with seed 0.
pub fn crc32c(data: &[u8]) -> u32 {
    crc32c_append(0, data)
}

/// Continue a CRC32C over more bytes.
#[inline]
pub fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    if data.len() < FOLD_MIN_BYTES {
        crc32c::crc32c_append(crc, data)
    } else {
        folded_append(crc, data)
    }
}

/// [`crc32c_append`] by carry-less multiply folding.
fn folded_append(crc: u32, data: &[u8]) -> u32 {
    // The digest's state is the register before the final inversion, so
    // continuing a finished CRC starts from its complement.
    let mut d = crc_fast::Digest::new_with_init_state(crc_fast::CrcAlgorithm::Crc32Iscsi, u64::from(!crc));
    d.update(data);
    d.finalize() as u32
}

/// The record checksum seed of a device: CRC32C of its 16-byte UUID.
pub fn record_seed(uuid: &[u8; 16]) -> u32 {
    crc32c(uuid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// CRC32C check value from RFC 3720 (iSCSI), appendix B.4.
    #[test]
    fn crc32c_golden_value() {
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
        assert_eq!(folded_append(0, b"123456789"), 0xE306_9283);
        // RFC 3720 B.4: 32 bytes of 0xFF.
        assert_eq!(crc32c(&[0xFFu8; 32]), 0x62A8_AB43);
    }

    #[test]
    fn append_equals_whole() {
        let whole = crc32c(b"hello world");
        let parts = crc32c_append(crc32c(b"hello "), b"world");
        assert_eq!(whole, parts);
        let long: Vec<u8> = (0..10_000u32).map(|i| (i * 31 + 7) as u8).collect();
        assert_eq!(crc32c(&long), crc32c_append(crc32c(&long[..1234]), &long[1234..]));
    }

    /// The two implementations agree on every length around the threshold
    /// and the vector widths, at odd offsets, with any seed.
    #[test]
    fn implementations_agree_on_every_length() {
        let data: Vec<u8> = (0..9000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        for len in (0..1100).chain([4000, 4064, 4095, 4096, 4097, 8191, 8192, 8999]) {
            for off in [0usize, 1, 7] {
                let Some(d) = data.get(off..off + len) else { continue };
                for seed in [0u32, 1, 0xDEAD_BEEF, u32::MAX] {
                    assert_eq!(
                        crc32c::crc32c_append(seed, d),
                        folded_append(seed, d),
                        "len {len} off {off} seed {seed:#x}"
                    );
                }
            }
        }
    }

    proptest! {
        #[test]
        fn implementations_agree(seed: u32, data in proptest::collection::vec(any::<u8>(), 0..20_000)) {
            prop_assert_eq!(crc32c::crc32c_append(seed, &data), folded_append(seed, &data));
            prop_assert_eq!(crc32c::crc32c_append(seed, &data), crc32c_append(seed, &data));
        }
    }
}
