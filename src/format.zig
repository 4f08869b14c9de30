//! On-disk format of a loaderx store. A store is a directory of four files:
//!
//!   meta   page 0: `Header` (identity, written once at create, checksummed)
//!          page 1: `Commit` (the published state, rewritten by every mutation)
//!          from `blob_offset`: the zstd dictionary, then the user blob (identity
//!          of the typed store, msgpack written by Python), both covered by the
//!          header checksum.
//!   index  the record table: `RecordLoc` i at byte i * 32, no header (or,
//!          for a fixed-width raw store, a u32 checksum i at byte i * 4).
//!   data   record bytes: for each record its aux bytes (raw) then its payload
//!          (raw or a zstd frame). Records never overlap; gaps are reclaimable.
//!   lock   empty; its exclusive file lock is the writer lock.
//!
//! and, when a TokenWindows has read it, a fifth (optional, derived):
//!
//!   windows.idx  `WindowsIndex` then u64 `ends[docs]`: ends[d] is the number
//!          of decoded payload bytes of records 0..d (a running sum of
//!          `RecordLoc.raw_size`), so the tokens before record d are
//!          ends[d - 1] / itemsize. It covers a durable prefix of the records
//!          and is bound to the store (`Header.uid`, the header checksum) and
//!          checksummed. It can only describe records the store still holds:
//!          a delete (the one operation that changes a record in place)
//!          removes it, durably, before its journal is written; compact and
//!          appends leave every covered record as it was. Written atomically
//!          (a temporary `windows.idx.<random>.tmp`, fsync, rename, directory
//!          fsync) and read by copying it into memory, never mapped. See
//!          windows.zig for how it is validated and extended.
//!
//! Publication order (what makes a kill -9 safe): data bytes, then table
//! entries, then the commit. A reader trusts only records below
//! `Commit.record_count`, so a crash at any instant leaves a committed prefix.
//! All integers are little-endian on every platform we ship; `magic` read in
//! the other byte order reveals a store written by a big-endian machine.
//!
//! Seekable records. A zstd record longer than `Header.frame_size` (when that
//! is non-zero) is stored in the zstd seekable format (zstd's
//! contrib/seekable_format): independent zstd frames of `frame_size` decoded
//! bytes each (the last one shorter), then a skippable frame holding the seek
//! table, byte by byte:
//!
//!   u32 0x184D2A5E        skippable frame magic
//!   u32 frame_size        bytes that follow in this frame: 8 * n + 9
//!   n x { u32 compressed, u32 decompressed }   one entry per frame, in order
//!   u32 n                 Number_Of_Frames
//!   u8  0                 Seek_Table_Descriptor (no per-frame checksums:
//!                         every frame carries zstd's content checksum)
//!   u32 0x8F92EAB1        seekable magic: the record's last four bytes
//!
//! A decoder that knows nothing of it (zstd itself, an older loaderx that
//! decodes whole records) decodes the frames back to back and skips the
//! table, so the record is an ordinary zstd payload. A reader that needs part
//! of a record (a token window) decodes only the frames that hold that part.
//! The writer never stores a single-frame record that would parse as a seek
//! table, so the table's presence is unambiguous (`SeekTable.parse`).
const std = @import("std");
const assert = std.debug.assert;

/// "LXSTORE\x01" read as a little-endian u64.
pub const magic: u64 = 0x0145524F5453584C;
pub const magic_swapped: u64 = @byteSwap(magic);
/// The on-disk format version; independent of the package version.
/// 2: the commit records what the last sync made durable (durable_data_size,
/// durable_live_bytes), so the first open after a crash can check the
/// records appended since then; the delete journal carries its commit's
/// generation, so a journal older than the published commit is never replayed.
pub const format_version: u32 = 2;

pub const page_size: u64 = 4096;
pub const commit_offset: u64 = page_size;
pub const blob_offset: u64 = 2 * page_size;
/// Bytes of meta mapped by every handle (header + commit pages).
pub const meta_map_size: u64 = 2 * page_size;

pub const Codec = enum(u8) {
    raw = 0,
    zstd = 1,
    zstd_dict = 2,
};

pub const Header = extern struct {
    magic: u64,
    format_version: u32,
    /// Size of this struct as written; lets a reader refuse a layout it does not know.
    header_size: u32,
    /// The store's codec for new records (a record may still be stored raw).
    codec: u8,
    _reserved0: [3]u8,
    /// zstd level used for new records.
    level: i32,
    flags: u64,
    dict_size: u64,
    user_size: u64,
    /// xxhash64 of the dictionary followed by the user blob.
    blob_checksum: u64,
    /// Non-zero: the fixed-width raw layout. Every record is exactly this many
    /// raw bytes with no aux, record i lives at data offset i * fixed_size, and
    /// `index` holds only a u32 checksum per record (4 bytes, not 32): a dense
    /// raw store computes locations instead of looking them up.
    fixed_size: u64,
    /// Random at create (0 in stores written before it existed): binds
    /// derived files such as windows.idx to this store and no other.
    uid: u64,
    /// Non-zero: zstd records longer than this many raw bytes are written
    /// seekable (see "Seekable records" above), so a reader can decode part
    /// of one. 0: every record is one frame.
    frame_size: u64,
    _reserved1: [3]u64,
    /// xxhash64 of every byte above.
    checksum: u64,

    comptime {
        assert(@sizeOf(Header) == 112);
        assert(@alignOf(Header) == 8);
        assert(@sizeOf(Header) <= page_size);
    }

    pub fn computeChecksum(h: *const Header) u64 {
        const bytes = std.mem.asBytes(h);
        return std.hash.XxHash64.hash(0x4C58, bytes[0 .. @sizeOf(Header) - 8]);
    }
};

/// The published state. Rewritten (one positional write) after the data and the
/// table entries it covers are written.
pub const Commit = extern struct {
    /// Live records: 0..record_count. Read atomically by other handles.
    record_count: u64,
    /// Bytes of the data file in use; appends go here.
    data_size: u64,
    /// Stored bytes (aux + payload) of live records.
    live_bytes: u64,
    /// record_count at the last completed sync() (or delete/compact, which
    /// sync): records below it survived a power loss; records from it up to
    /// record_count are checked by the first open after a writer died.
    durable_count: u64,
    /// Bumped by every commit.
    generation: u64,
    /// data_size and live_bytes when durable_count was made durable.
    durable_data_size: u64,
    durable_live_bytes: u64,
    /// xxhash64 of every byte above.
    checksum: u64,

    comptime {
        assert(@sizeOf(Commit) == 64);
        assert(@alignOf(Commit) == 8);
    }

    pub fn computeChecksum(c: *const Commit) u64 {
        const bytes = std.mem.asBytes(c);
        return std.hash.XxHash64.hash(0x4C59, bytes[0 .. @sizeOf(Commit) - 8]);
    }

    /// The invariants every commit keeps, on disk and in memory.
    pub fn consistent(c: *const Commit) bool {
        return c.live_bytes <= c.data_size and c.durable_count <= c.record_count and
            c.durable_data_size <= c.data_size and c.durable_live_bytes <= c.durable_data_size;
    }
};

/// One record-table entry.
pub const RecordLoc = extern struct {
    /// Offset in the data file of the record's aux bytes; the payload follows them.
    offset: u64,
    /// Payload bytes as stored (after the codec).
    stored_size: u64,
    /// Payload bytes after decoding.
    raw_size: u64,
    /// recordChecksum of aux bytes ++ stored payload, xor indexTweak of the
    /// record's index.
    checksum: u32,
    /// `Codec` of this record's payload (raw or the store's codec).
    codec: u8,
    _reserved: u8,
    /// Raw bytes stored before the payload (shapes of ragged records).
    aux_size: u16,

    comptime {
        assert(@sizeOf(RecordLoc) == 32);
        assert(@alignOf(RecordLoc) == 8);
    }

    /// Byte just past this record in the data file (a trusted entry).
    pub fn end(loc: RecordLoc) u64 {
        return loc.offset + loc.aux_size + loc.stored_size;
    }

    /// `end()` of an entry read from disk: null when it overflows.
    pub fn checkedEnd(loc: RecordLoc) ?u64 {
        const total = std.math.add(u64, loc.aux_size, loc.stored_size) catch return null;
        return std.math.add(u64, loc.offset, total) catch null;
    }

    pub fn storedTotal(loc: RecordLoc) u64 {
        return loc.aux_size + loc.stored_size;
    }
};

/// Low 32 bits of a 64-bit hash of aux ++ stored: XXH3 for small records
/// without aux (its short-input path is fastest there), XXH64 otherwise (Zig's
/// XXH3 long-input path runs at ~0.35 GB/s on the baseline x86-64 target we
/// ship, XXH64 at ~5 GB/s). The choice depends only on the sizes, so it is
/// part of the format.
/// What is stored for record `index`: its bytes' checksum bound to its index,
/// so a table entry (or a fixed-width checksum) written at the wrong index —
/// a misdirected write, a copied entry — fails verify() instead of reading
/// another record's bytes as its own. Moving a record (delete) only re-binds
/// the checksum: `sum ^ indexTweak(from) ^ indexTweak(to)`, no bytes read.
pub fn storedChecksum(aux: []const u8, stored: []const u8, index: u64) u32 {
    return recordChecksum(aux, stored) ^ indexTweak(index);
}

/// A 32-bit mix of a record index (splitmix64's finalizer, low half).
pub fn indexTweak(index: u64) u32 {
    var z = index +% 0x9E37_79B9_7F4A_7C15;
    z = (z ^ (z >> 30)) *% 0xBF58_476D_1CE4_E5B9;
    z = (z ^ (z >> 27)) *% 0x94D0_49BB_1331_11EB;
    return @truncate(z ^ (z >> 31));
}

pub fn recordChecksum(aux: []const u8, stored: []const u8) u32 {
    if (aux.len == 0 and stored.len <= 240) return @truncate(std.hash.XxHash3.hash(0x4C5A, stored));
    var h = std.hash.XxHash64.init(0x4C5A);
    h.update(aux);
    h.update(stored);
    return @truncate(h.final());
}

/// The delete journal (file `journal`): the table writes of one delete, made
/// durable (fsync) before any of them is applied, so an interrupted delete is
/// replayed in full on the next open instead of leaving duplicates. Its
/// commit's generation is the published commit's plus one: a journal whose
/// generation is not above the published one was already applied (its removal
/// was lost) and is discarded, never replayed over later commits.
pub const JournalHeader = extern struct {
    magic: u64,
    /// Entries that follow: (index u64, RecordLoc) pairs.
    entry_count: u64,
    /// The commit to publish after the entries are applied.
    commit: Commit,
    /// xxhash64 of the entries.
    entries_checksum: u64,
    /// xxhash64 of every byte above.
    checksum: u64,

    pub const magic_value: u64 = 0x4C584A524E4C0001;

    comptime {
        assert(@sizeOf(JournalHeader) == 96);
    }

    pub fn computeChecksum(j: *const JournalHeader) u64 {
        const bytes = std.mem.asBytes(j);
        return std.hash.XxHash64.hash(0x4C5B, bytes[0 .. @sizeOf(JournalHeader) - 8]);
    }
};

pub const JournalEntry = extern struct {
    index: u64,
    loc: RecordLoc,

    comptime {
        assert(@sizeOf(JournalEntry) == 40);
    }
};

/// The seek table of a seekable record (see "Seekable records").
pub const SeekTable = struct {
    /// The n entries (8 bytes each), inside the record's payload.
    entries: []const u8,
    /// Bytes of the frames before the table.
    frames_size: u64,

    pub const skippable_magic: u32 = 0x184D2A5E;
    pub const seekable_magic: u32 = 0x8F92EAB1;
    pub const footer_size: usize = 9;
    pub const entry_size: usize = 8;
    /// Bytes of the table frame around its entries.
    pub const overhead: usize = 8 + footer_size;

    pub fn count(t: SeekTable) usize {
        return t.entries.len / entry_size;
    }

    pub fn compressed(t: SeekTable, k: usize) u32 {
        return std.mem.readInt(u32, t.entries[k * entry_size ..][0..4], .little);
    }

    pub fn decompressed(t: SeekTable, k: usize) u32 {
        return std.mem.readInt(u32, t.entries[k * entry_size + 4 ..][0..4], .little);
    }

    /// The table at the end of `stored`, when it has a well-formed one: both
    /// magics, a frame size and a frame count that agree, the reserved bits
    /// clear, no per-frame checksums (we never write them). Null otherwise
    /// (an ordinary one-frame record). Checks only the table's own bytes, in
    /// O(1): callers check the entries against the record (`check`).
    pub fn parse(stored: []const u8) ?SeekTable {
        if (stored.len < overhead) return null;
        const foot = stored[stored.len - footer_size ..];
        if (std.mem.readInt(u32, foot[5..9], .little) != seekable_magic) return null;
        if (foot[4] != 0) return null;
        const n: u64 = std.mem.readInt(u32, foot[0..4], .little);
        const table_size = n * entry_size + overhead; // n < 2^32: no overflow
        if (n == 0 or table_size > stored.len) return null;
        const start = stored.len - @as(usize, @intCast(table_size));
        const head = stored[start..][0..8];
        if (std.mem.readInt(u32, head[0..4], .little) != skippable_magic) return null;
        if (std.mem.readInt(u32, head[4..8], .little) != table_size - 8) return null;
        return .{
            .entries = stored[start + 8 ..][0..@intCast(n * entry_size)],
            .frames_size = start,
        };
    }

    /// The entries add up to the record: compressed sizes to the frames'
    /// bytes, decompressed sizes to `raw_size`, no frame empty. O(frames).
    pub fn check(t: SeekTable, raw_size: u64) bool {
        var packed_total: u64 = 0;
        var raw_total: u64 = 0;
        for (0..t.count()) |k| {
            if (t.compressed(k) == 0 or t.decompressed(k) == 0) return false;
            packed_total += t.compressed(k);
            raw_total += t.decompressed(k);
        }
        return packed_total == t.frames_size and raw_total == raw_size;
    }

    /// Writes the magics, sizes and footer of a table of `n` frames into
    /// `out` (exactly `sizeFor(n)` bytes); `putEntry` writes the entries.
    pub fn writeFrame(out: []u8, n: usize) void {
        assert(out.len == sizeFor(n) and n > 0 and n <= std.math.maxInt(u32));
        std.mem.writeInt(u32, out[0..4], skippable_magic, .little);
        std.mem.writeInt(u32, out[4..8], @intCast(out.len - 8), .little);
        const foot = out[out.len - footer_size ..];
        std.mem.writeInt(u32, foot[0..4], @intCast(n), .little);
        foot[4] = 0;
        std.mem.writeInt(u32, foot[5..9], seekable_magic, .little);
    }

    /// Writes entry `k` of the table in `out` (as `writeFrame` laid it out).
    pub fn putEntry(out: []u8, k: usize, packed_size: u32, raw_size: u32) void {
        const e = out[8 + k * entry_size ..][0..entry_size];
        std.mem.writeInt(u32, e[0..4], packed_size, .little);
        std.mem.writeInt(u32, e[4..8], raw_size, .little);
    }

    pub fn sizeFor(n: usize) usize {
        return n * entry_size + overhead;
    }
};

/// The header of `windows.idx` (see the file comment), followed by
/// `docs` u64 running sums of the records' decoded sizes.
pub const WindowsIndex = extern struct {
    magic: u64,
    version: u32,
    header_size: u32,
    /// `Header.uid` and `Header.checksum` of the store it describes.
    store_uid: u64,
    store_header_checksum: u64,
    /// Records covered: a prefix of the store's, durable when it was built.
    docs: u64,
    /// The commit it was built from: generation and what was durable then.
    /// A store shows the same or later values (a delete removes the file),
    /// so an index from the future of this store (or of another) is refused.
    generation: u64,
    durable_count: u64,
    durable_data_size: u64,
    /// xxhash64 of the `docs` ends that follow.
    ends_checksum: u64,
    _reserved: u64,
    /// xxhash64 of every byte above.
    checksum: u64,

    /// "LXWIDX\x00\x01" read as a little-endian u64.
    pub const magic_value: u64 = 0x0100_5844_4957_584C;
    pub const version_value: u32 = 1;
    pub const file_name = "windows.idx";

    comptime {
        assert(@sizeOf(WindowsIndex) == 88);
        assert(@alignOf(WindowsIndex) == 8);
    }

    pub fn computeChecksum(w: *const WindowsIndex) u64 {
        const bytes = std.mem.asBytes(w);
        return std.hash.XxHash64.hash(0x4C5D, bytes[0 .. @sizeOf(WindowsIndex) - 8]);
    }

    pub fn endsChecksum(ends: []const u64) u64 {
        return std.hash.XxHash64.hash(0x4C5E, std.mem.sliceAsBytes(ends));
    }
};

test "a seek table round-trips and a damaged one is not one" {
    var rec: [64 + SeekTable.overhead + 3 * 8]u8 = @splat(0xAB);
    const table = rec[rec.len - SeekTable.sizeFor(3) ..];
    SeekTable.writeFrame(table, 3);
    for (0..3) |k| SeekTable.putEntry(table, k, @intCast(10 + k), 100);
    const t = SeekTable.parse(&rec).?;
    try std.testing.expectEqual(@as(usize, 3), t.count());
    try std.testing.expectEqual(@as(u32, 11), t.compressed(1));
    try std.testing.expectEqual(@as(u32, 100), t.decompressed(2));
    try std.testing.expectEqual(@as(u64, 64), t.frames_size);
    try std.testing.expect(!t.check(300)); // frames hold 10 + 11 + 12 bytes, not 64
    for (0..rec.len) |i| {
        var bad = rec;
        bad[i] ^= 0x40;
        if (i >= rec.len - SeekTable.sizeFor(3) + 8 and i < rec.len - SeekTable.footer_size) {
            continue; // an entry: parse takes it, check judges it
        }
        if (i >= rec.len - SeekTable.sizeFor(3)) {
            try std.testing.expect(SeekTable.parse(&bad) == null);
        }
    }
    try std.testing.expect(SeekTable.parse(rec[0..10]) == null);
}

test "layout has no padding" {
    inline for (.{ Header, Commit, RecordLoc, JournalHeader, JournalEntry, WindowsIndex }) |T| {
        var size: usize = 0;
        inline for (@typeInfo(T).@"struct".field_types) |F| size += @sizeOf(F);
        try std.testing.expectEqual(@sizeOf(T), size);
    }
}

test "magic reveals byte order" {
    try std.testing.expect(magic != magic_swapped);
    const bytes = std.mem.toBytes(std.mem.nativeToLittle(u64, magic));
    try std.testing.expectEqualStrings("LXSTORE\x01", &bytes);
}
