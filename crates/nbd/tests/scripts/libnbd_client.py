"""libnbd (python3-libnbd) against the Granary NBD server: negotiation
(list, info, go), what the server advertises, read and write patterns,
unaligned IO, trim, write-zeroes, flush, FUA, out-of-range errors (the
client's own checks off, so the server answers), 64 requests in flight on
one handle, and two handles on one export.

Usage: libnbd_client.py PORT (exports "disk": 16 MiB in 4 KiB blocks, and
"small": 1 MiB in 64 KiB blocks, both zeroes). Exits non-zero on failure.
"""

import errno
import os
import sys

import nbd

port = sys.argv[1]
base = f"nbd://127.0.0.1:{port}"
MiB = 1 << 20


def expect_error(code, fn, *args, **kw):
    try:
        fn(*args, **kw)
    except nbd.Error as e:
        # libnbd names the errno ("EINVAL").
        assert e.errno in (code, errno.errorcode[code]), f"{fn.__name__}{args}: {e} (errno {e.errno}, wanted {code})"
        return
    raise AssertionError(f"{fn.__name__}{args} succeeded")


# Negotiation: list, info, an unknown export, go.
h = nbd.NBD()
h.set_opt_mode(True)
h.connect_uri(base)
listed = []
h.opt_list(lambda name, desc: listed.append((name, desc)) or 0)
assert [n for n, _ in listed] == ["disk", "small"], listed
h.set_export_name("small")
h.opt_info()
assert h.get_size() == MiB
assert h.get_block_size(nbd.SIZE_PREFERRED) == 64 * 1024
h.set_export_name("nope")
try:
    h.opt_info()
    raise AssertionError("info on an unknown export succeeded")
except nbd.Error:
    pass
h.set_export_name("disk")
# Ask for the name and description too (NBD_INFO_NAME, NBD_INFO_DESCRIPTION).
h.set_full_info(True)
h.opt_go()
assert h.get_size() == 16 * MiB
assert h.get_block_size(nbd.SIZE_MINIMUM) == 512
assert h.get_block_size(nbd.SIZE_PREFERRED) == 4096
assert h.get_block_size(nbd.SIZE_MAXIMUM) == 32 * MiB
assert not h.is_read_only()
assert h.can_flush() and h.can_fua() and h.can_trim() and h.can_zero()
assert h.can_fast_zero() and h.can_multi_conn()
assert not h.can_df() and not h.get_structured_replies_negotiated()
assert h.get_canonical_export_name() == "disk"
assert h.get_export_description() == "in-memory export"

# Patterns.
data = os.urandom(MiB)
h.pwrite(data, 2 * MiB)
assert h.pread(MiB, 2 * MiB) == data
assert h.pread(8192, 0) == bytes(8192)
# Unaligned to the block (aligned to the 512-byte minimum).
patch = os.urandom(4096 + 1536)
h.pwrite(patch, 2 * MiB + 512)
want = bytearray(data)
want[512:512 + len(patch)] = patch
assert h.pread(16384, 2 * MiB) == bytes(want[:16384])
# FUA and flush.
h.pwrite(b"\x11" * 4096, 0, nbd.CMD_FLAG_FUA)
h.flush()
assert h.pread(4096, 0) == b"\x11" * 4096
# Trim: whole blocks read back as zeroes.
h.trim(65536, 2 * MiB + 65536)
assert h.pread(65536, 2 * MiB + 65536) == bytes(65536)
# Write zeroes, with each flag, and unaligned to the block.
h.zero(8192, 2 * MiB + 200 * 1024 + 512)
h.zero(4096, 2 * MiB + 300 * 1024, nbd.CMD_FLAG_NO_HOLE)
h.zero(65536, 2 * MiB + 400 * 1024, nbd.CMD_FLAG_FAST_ZERO | nbd.CMD_FLAG_FUA)
for off, n in [(200 * 1024 + 512, 8192), (300 * 1024, 4096), (400 * 1024, 65536)]:
    assert h.pread(n, 2 * MiB + off) == bytes(n), off
    # The bytes either side kept.
    assert h.pread(512, 2 * MiB + off - 512) == data[off - 512:off], off
    assert h.pread(512, 2 * MiB + off + n) == data[off + n:off + n + 512], off

# Out of range and unaligned, the client's checks off: the server answers.
h.set_strict_mode(0)
expect_error(errno.EINVAL, h.pread, 8192, 16 * MiB - 4096)
expect_error(errno.ENOSPC, h.pwrite, b"x" * 8192, 16 * MiB - 4096)
expect_error(errno.EINVAL, h.trim, 8192, 16 * MiB)
expect_error(errno.ENOSPC, h.zero, 8192, 16 * MiB - 4096)
expect_error(errno.EINVAL, h.pread, 512, 100)
h.set_strict_mode(nbd.STRICT_MASK)
assert h.pread(4096, 16 * MiB - 4096) == bytes(4096)

# 64 writes in flight on one handle, then read back. (The test holds the
# first request on 8..9 MiB until a second runs: keep other requests off it.)
cookies = []
for i in range(64):
    cookies.append(h.aio_pwrite(bytes([i]) * 16384, 8 * MiB + i * 16384))
while h.aio_in_flight() > 0:
    h.poll(-1)
for c in cookies:
    assert h.aio_command_completed(c)
for i in range(64):
    assert h.pread(16384, 8 * MiB + i * 16384) == bytes([i]) * 16384, i

# Two handles: a write acknowledged on one is read on the other.
h2 = nbd.NBD()
h2.connect_uri(f"{base}/disk")
for i in range(20):
    blob = os.urandom(4096 * (i + 1))
    h.pwrite(blob, 12 * MiB + i * 4096)
    assert h2.pread(len(blob), 12 * MiB + i * 4096) == blob, i
h2.zero(4096, 12 * MiB)
h2.flush()
assert h.pread(4096, 12 * MiB) == bytes(4096)
h2.shutdown()
h.shutdown()
print("libnbd checks passed")
