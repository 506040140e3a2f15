//! Byte sizes and counts on the command line: sizes as `4096`, `64K`,
//! `64KiB`, `1G`, `1.5GiB` (binary units: K = 1024; a fraction of a unit
//! rounds down to whole bytes, a fraction of a byte is refused); counts
//! as `1000`, `100K`, `50M` (decimal units: K = 1000).

/// Parse a size of at least one byte; a clear message on bad input.
pub fn parse(s: &str) -> Result<u64, String> {
    match parse_or_zero(s)? {
        0 => Err(format!("size {s:?} is out of range")),
        n => Ok(n),
    }
}

/// [`parse`], where zero (`0`, `0M`, ...) is a size too.
pub fn parse_or_zero(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        u => return Err(format!("unknown size unit {u:?} in {s:?} (use K, M, G or T)")),
    };
    let n: f64 = num.parse().map_err(|_| format!("{s:?} is not a size (examples: 4096, 64M, 1G)"))?;
    let bytes = n * mult as f64;
    if !(bytes.is_finite() && bytes >= 0.0 && bytes < u64::MAX as f64) {
        return Err(format!("size {s:?} is out of range"));
    }
    // A fraction of a unit is rounded down to whole bytes (0.1G); a
    // fraction of a byte is a mistake (1.9 meant 1.9 of some unit).
    if mult == 1 && bytes.fract() != 0.0 {
        return Err(format!("size {s:?} is not a whole number of bytes (add a unit: K, M, G or T)"));
    }
    Ok(bytes as u64)
}

/// A count with an optional decimal suffix: 50M = 50,000,000.
pub fn count(s: &str) -> Result<u64, String> {
    let (num, mult) = match s.trim().to_ascii_uppercase().as_str() {
        t if t.ends_with('K') => (t[..t.len() - 1].to_string(), 1_000),
        t if t.ends_with('M') => (t[..t.len() - 1].to_string(), 1_000_000),
        t if t.ends_with('G') => (t[..t.len() - 1].to_string(), 1_000_000_000),
        t => (t.to_string(), 1),
    };
    let n: u64 = num.parse().map_err(|_| format!("{s:?} is not a count (examples: 1000, 50M)"))?;
    match n.checked_mul(mult) {
        Some(v) if v > 0 => Ok(v),
        _ => Err(format!("count {s:?} is out of range")),
    }
}

/// Render bytes with a binary unit.
pub fn human(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse("4096"), Ok(4096));
        assert_eq!(parse("64M"), Ok(64 << 20));
        assert_eq!(parse("1GiB"), Ok(1 << 30));
        assert_eq!(parse("1.5k"), Ok(1536));
        assert!(parse("12Q").unwrap_err().contains("unknown size unit"));
        assert!(parse("").is_err());
        assert!(parse("0").is_err());
        assert!(parse("0M").is_err());
        assert_eq!(parse_or_zero("0M"), Ok(0));
        assert_eq!(parse_or_zero("0"), Ok(0));
        assert!(parse("1.9").unwrap_err().contains("whole number of bytes"));
        assert_eq!(parse("0.3K"), Ok(307), "a fraction of a unit rounds down");
        assert_eq!(parse("0.5K"), Ok(512));
        assert_eq!(human(1536), "1.5 KiB");
        assert_eq!(human(10), "10 B");
        assert_eq!(count("50M"), Ok(50_000_000));
        assert_eq!(count("100k"), Ok(100_000));
        assert!(count("0").is_err());
        assert!(count("x").unwrap_err().contains("not a count"));
    }
}
