//! CRC32C (Castagnoli), the checksum of every on-device structure.
//!
//! Superblocks and segment headers use a plain CRC32C (seed 0). Records use a
//! per-device seed derived from the device UUID ([`record_seed`]), so a value
//! that happens to contain the bytes of a well-formed record, or a record left
//! by another store on the same disk, never passes as a record of this store.

/// CRC32C of `data` with seed 0.
pub fn crc32c(data: &[u8]) -> u32 {
    crc32c::crc32c(data)
}

/// Continue a CRC32C over more bytes.
pub fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    crc32c::crc32c_append(crc, data)
}

/// The record checksum seed of a device: CRC32C of its 16-byte UUID.
pub fn record_seed(uuid: &[u8; 16]) -> u32 {
    crc32c::crc32c(uuid)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CRC32C check value from RFC 3720 (iSCSI), appendix B.4.
    #[test]
    fn crc32c_golden_value() {
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
    }

    #[test]
    fn append_equals_whole() {
        let whole = crc32c(b"hello world");
        let parts = crc32c_append(crc32c(b"hello "), b"world");
        assert_eq!(whole, parts);
    }
}
