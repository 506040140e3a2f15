//! Entry points for the fuzz targets (`crates/fuzz`, `fuzz/`): RESP
//! requests framed from untrusted bytes as a connection frames them, with
//! the invariants the parser promises checked. Not part of the crate's API.
//!
//! Invariants checked: no panic; a command never spans more bytes than the
//! input holds and its arguments lie within it; the commands framed do not
//! depend on how the input was split into reads (the parser resumes a
//! partly framed command where it stopped).

use crate::parse::{split_args, Frame, Parser};

/// What a connection makes of the input: its commands (arguments as
/// bytes), and whether it ended on a protocol error.
fn run(data: &[u8], reads: &mut dyn Iterator<Item = usize>, bulk_max: usize) -> (Vec<Vec<Vec<u8>>>, bool) {
    let mut parser = Parser::default();
    let (mut input, mut fed, mut commands) = (Vec::new(), 0, Vec::new());
    loop {
        let mut pos = 0;
        while pos < input.len() {
            let buf = &input[pos..];
            match parser.next(buf, bulk_max) {
                Frame::Incomplete => break,
                Frame::Empty(n) => {
                    assert!(n > 0 && n <= buf.len());
                    pos += n;
                }
                Frame::Error(_) => return (commands, true),
                Frame::Multibulk { args, len } => {
                    assert!(len <= buf.len());
                    commands.push(args.iter().map(|&(a, b)| buf[a..b].to_vec()).collect());
                    assert!(args.iter().all(|&(a, b)| a <= b && b <= len));
                    pos += len;
                }
                Frame::Inline { args, len } => {
                    assert!(len > 0 && len <= buf.len() && !args.is_empty());
                    commands.push(args);
                    pos += len;
                }
            }
        }
        input.drain(..pos);
        if fed == data.len() {
            return (commands, false);
        }
        let n = reads.next().unwrap_or(usize::MAX).clamp(1, data.len() - fed);
        input.extend_from_slice(&data[fed..fed + n]);
        fed += n;
    }
}

/// Frame every command of `data` twice, in one read and in reads of sizes
/// drawn from its first bytes: both give the same commands.
pub fn frames(data: &[u8]) {
    let Some((&first, data)) = data.split_first() else { return };
    // A small bulk limit reaches its error with short inputs.
    let bulk_max = if first & 1 == 1 { 16 } else { 512 << 20 };
    let whole = run(data, &mut std::iter::empty(), bulk_max);
    let sizes: Vec<usize> = data.iter().take(16).map(|&b| (b as usize % 13) + 1).collect();
    let split = run(data, &mut sizes.iter().copied().cycle(), bulk_max);
    assert_eq!(whole, split);
}

/// Inline arguments (Redis's sdssplitargs): quoting never yields more
/// bytes than the line holds.
pub fn inline(data: &[u8]) {
    if data.contains(&0) {
        return;
    }
    if let Some(args) = split_args(data) {
        assert!(args.iter().map(Vec::len).sum::<usize>() <= data.len());
    }
}
