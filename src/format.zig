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
//! Publication order (what makes a kill -9 safe): data bytes, then table
//! entries, then the commit. A reader trusts only records below
//! `Commit.record_count`, so a crash at any instant leaves a committed prefix.
//! All integers are little-endian on every platform we ship; `magic` read in
//! the other byte order reveals a store written by a big-endian machine.
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
    _reserved1: [5]u64,
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

test "layout has no padding" {
    inline for (.{ Header, Commit, RecordLoc, JournalHeader, JournalEntry }) |T| {
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
