//! The on-disk format of a loaderx store: every byte of a store directory,
//! documented here and nowhere else. A newcomer reads this file top to
//! bottom; each struct below carries its fields' offsets, and a comptime
//! block proves them (`assertLayout`: every offset, no padding, the size).
//! tests/_lxlayout.py (the test forger's struct formats) is generated from
//! this file by `zig build forger-layout` (src/gen_layout.zig).
//!
//! All integers are little-endian on every platform we ship; `magic` read
//! in the other byte order reveals a store written by a big-endian machine.
//! Offsets below are in bytes.
//!
//! ## The directory
//!
//!   meta    [0, 4096)         page 0: `Header` at 0 (112 bytes), then zeros.
//!                             Written once, at create; never changes.
//!           [4096, 8192)      page 1: `Commit` at 4096 (64 bytes), then
//!                             zeros. Rewritten in place (one positional
//!                             write of 64 bytes) by every mutation.
//!           [8192, 8192 + dict_size)   the zstd dictionary (zstd_dict
//!                             stores; a trained dictionary, zstd's magic
//!                             0xEC30A437 first), `Header.dict_size` bytes.
//!           then `Header.user_size` bytes: the type identity (`Identity`,
//!                             format 3; msgpack written by Python, format
//!                             2; empty for a plain byte store).
//!                             `Header.blob_checksum` covers dictionary and
//!                             identity together. The file may be longer
//!                             (never by our writer); the rest is ignored.
//!   index   the record table, no header. Table layout: `RecordLoc` i at
//!           i * 32. Fixed-width layout (`Header.fixed_size` != 0): a u32
//!           `storedChecksum` of record i at i * 4. Entries from
//!           `Commit.record_count` on are not records (a crash or a delete
//!           leaves stale ones there; the next append overwrites them).
//!   data    record bytes. Table layout: record i's `aux_size` aux bytes at
//!           `RecordLoc.offset`, then its `stored_size` payload bytes.
//!           Fixed-width layout: record i's `fixed_size` raw bytes at
//!           i * fixed_size, no aux. Records never overlap; bytes no live
//!           record covers (deleted records, a compact's parked copies past
//!           `Commit.data_size`) are free and reclaimed by compact.
//!   lock    empty (0 bytes). Its exclusive flock is the writer lock; a
//!           creator holds it while it writes meta.
//!   journal present only while a delete runs or after one was cut short:
//!           `JournalHeader` at 0 (96 bytes), then `entry_count`
//!           `JournalEntry`s (40 bytes each) from 96. See "The journal".
//!   meta.tmp  present only while a create runs (renamed to meta, complete).
//!   windows.idx  optional, derived: `WindowsIndex` at 0 (88 bytes), then
//!           `docs` u64 ends from 88. See `WindowsIndex`. While one is
//!           written: `windows.idx.<16 hex digits>.tmp`. Earlier loaderx
//!           versions wrote `windows-<itemsize>[-<separator>].idx`; they
//!           are never read, and a delete removes them with windows.idx.
//!
//! Nothing else may be in a store directory: a create refuses a directory
//! holding other files.
//!
//! ## A record's bytes
//!
//! aux: raw bytes the writer stores before the payload, at most 65535. A
//! RaggedStore writes none for a 1-D record (its length is raw_size /
//! itemsize) and u64 words [ndim, dim_0, ..., dim_{ndim-1}] otherwise
//! (ndim <= 32); dense and byte stores write none. The engine never reads
//! them; it checksums them with the payload.
//!
//! payload, by `RecordLoc.codec`:
//! - raw: the record's bytes, `stored_size == raw_size`.
//! - zstd / zstd_dict: one zstd frame (RFC 8878) with its content size and
//!   zstd's content checksum, decoding to `raw_size` bytes (zstd_dict: with
//!   the store's dictionary); or, for a record longer than
//!   `Header.frame_size` (when non-zero), the seekable format below. The
//!   writer stores a record raw when compressing would not make it smaller.
//!
//! Seekable records (zstd's contrib/seekable_format): independent zstd
//! frames of `frame_size` decoded bytes each (the last one shorter), then a
//! skippable frame holding the seek table, byte by byte:
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
//!
//! ## Checksums
//!
//! Every checksum is XXH64 (or, for short records, XXH3-64) with a seed of
//! its own (`seeds`), so bytes of one kind never pass as another's:
//! `Header.checksum`, `Commit.checksum`, `Header.blob_checksum`,
//! `RecordLoc.checksum` (`storedChecksum`), `JournalHeader.checksum` and
//! `.entries_checksum`, `WindowsIndex.checksum` and `.ends_checksum`. zstd
//! frames add zstd's own content checksum (the low 32 bits of XXH64, seed 0,
//! of the decoded bytes).
//!
//! ## Publication order (what makes a kill -9 safe)
//!
//! An append writes data bytes, then table entries, then the commit. A reader
//! trusts only records below `Commit.record_count`, so a crash at any instant
//! leaves a committed prefix. `sync` fsyncs data, table, then meta after a
//! commit that records what is durable (`Commit.durable_*`).
//!
//! ## The journal
//!
//! A delete's table writes (and, fixed width, its record moves), made durable
//! (file and directory fsync) before any is applied, so an interrupted delete
//! is replayed in full by the next writable open instead of leaving
//! duplicates. Entry k says: table entry `index` becomes `loc` (fixed width:
//! copy `fixed_size` data bytes from `loc.offset` to `index * fixed_size`, and
//! the u32 at `index * 4` becomes `loc.checksum`). The header is written
//! last: a journal without a valid header is ignored. Its commit's generation
//! is the published commit's plus one: a journal whose generation is not
//! above the published one was already applied (its removal was lost) and is
//! discarded, never replayed over later commits.
//!
//! ## Versions
//!
//! `format_version` 3 (written by this library) stores the type identity as
//! the native `Identity`; 2 stored it as msgpack (Python wrote it, and reads
//! it still; nothing else differs). Both are read; older versions (1, a
//! pre-release) are refused, and newer ones are refused as such.
const std = @import("std");
const assert = std.debug.assert;

/// "LXSTORE\x01" read as a little-endian u64.
pub const magic: u64 = 0x0145524F5453584C;
pub const magic_swapped: u64 = @byteSwap(magic);
/// The on-disk format version this library writes; independent of the
/// package version.
/// 2: the commit records what the last sync made durable (durable_data_size,
/// durable_live_bytes), so the first open after a crash can check the
/// records appended since then; the delete journal carries its commit's
/// generation, so a journal older than the published commit is never replayed.
/// 3: the type identity is the native `Identity` (2: msgpack).
pub const format_version: u32 = 3;
/// The oldest format version this library reads.
pub const format_version_min: u32 = 2;

pub const page_size: u64 = 4096;
pub const header_offset: u64 = 0;
pub const commit_offset: u64 = page_size;
pub const blob_offset: u64 = 2 * page_size;
/// Bytes of meta mapped by every handle (header + commit pages).
pub const meta_map_size: u64 = 2 * page_size;

/// The seed of each checksum of the format (see "Checksums").
pub const seeds = struct {
    pub const header: u64 = 0x4C58;
    pub const commit: u64 = 0x4C59;
    pub const record: u64 = 0x4C5A;
    pub const journal: u64 = 0x4C5B;
    pub const blob: u64 = 0x4C5C;
    pub const windows_index: u64 = 0x4C5D;
    pub const windows_ends: u64 = 0x4C5E;
    pub const journal_entries: u64 = 0;
};

/// The store directory's file names (see "The directory").
pub const file_names = struct {
    pub const meta = "meta";
    pub const index = "index";
    pub const data = "data";
    pub const lock = "lock";
    pub const journal = "journal";
    pub const meta_tmp = "meta.tmp";
};

pub const Codec = enum(u8) {
    raw = 0,
    zstd = 1,
    zstd_dict = 2,
};

/// meta page 0. Written once at create (in `meta.tmp`, fsynced, renamed to
/// `meta`), never rewritten.
pub const Header = extern struct {
    /// 0: `magic` ("LXSTORE\x01").
    magic: u64,
    /// 8: `format_version` of the writer (2 or 3 are read).
    format_version: u32,
    /// 12: 112, the size of this struct as written; a reader refuses a
    /// layout it does not know.
    header_size: u32,
    /// 16: the store's `Codec` for new records (a record may still be
    /// stored raw). Fixed-width stores: raw.
    codec: u8,
    /// 17: written 0, ignored.
    _reserved0: [3]u8,
    /// 20: zstd level of new records (zstd's range, not 0; raw stores keep
    /// the level they were asked for, unused).
    level: i32,
    /// 24: compatible flags: bits a reader may ignore. None are defined;
    /// written 0, ignored.
    flags: u64,
    /// 32: bytes of the dictionary at meta offset 8192 (0 unless zstd_dict).
    dict_size: u64,
    /// 40: bytes of the type identity after the dictionary (0: none).
    user_size: u64,
    /// 48: XXH64 (seeds.blob) of the dictionary followed by the identity.
    blob_checksum: u64,
    /// 56: non-zero: the fixed-width raw layout. Every record is exactly
    /// this many raw bytes with no aux, record i lives at data offset
    /// i * fixed_size, and `index` holds only a u32 checksum per record
    /// (4 bytes, not 32): a dense raw store computes locations instead of
    /// looking them up. Needs codec raw.
    fixed_size: u64,
    /// 64: random at create, never 0 (0 in stores written before it
    /// existed): binds derived files such as windows.idx to this store.
    uid: u64,
    /// 72: non-zero (zstd codecs only, 64 B to 1 GiB): zstd records longer
    /// than this many raw bytes are written seekable (see "A record's
    /// bytes"), so a reader can decode part of one. 0: one frame each.
    frame_size: u64,
    /// 80: written 0, ignored.
    _reserved1: [3]u64,
    /// 104: XXH64 (seeds.header) of bytes [0, 104).
    checksum: u64,

    comptime {
        assertLayout(Header, 112, .{
            .magic = 0,
            .format_version = 8,
            .header_size = 12,
            .codec = 16,
            ._reserved0 = 17,
            .level = 20,
            .flags = 24,
            .dict_size = 32,
            .user_size = 40,
            .blob_checksum = 48,
            .fixed_size = 56,
            .uid = 64,
            .frame_size = 72,
            ._reserved1 = 80,
            .checksum = 104,
        });
        assert(@alignOf(Header) == 8);
        assert(@sizeOf(Header) <= page_size);
    }

    pub fn computeChecksum(h: *const Header) u64 {
        const bytes = std.mem.asBytes(h);
        return std.hash.XxHash64.hash(seeds.header, bytes[0 .. @sizeOf(Header) - 8]);
    }
};

/// XXH64 of the dictionary followed by the identity (`Header.blob_checksum`).
pub fn blobChecksum(dict: []const u8, user: []const u8) u64 {
    var h = std.hash.XxHash64.init(seeds.blob);
    h.update(dict);
    h.update(user);
    return h.final();
}

/// meta page 1: the published state. Rewritten (one positional write) after
/// the data and the table entries it covers are written.
pub const Commit = extern struct {
    /// 0: live records: 0..record_count. Read atomically by other handles.
    record_count: u64,
    /// 8: bytes of the data file in use; appends go here. Fixed width:
    /// exactly record_count * fixed_size.
    data_size: u64,
    /// 16: stored bytes (aux + payload) of live records, <= data_size.
    live_bytes: u64,
    /// 24: record_count at the last completed sync() (or delete/compact,
    /// which sync): records below it survived a power loss; records from it
    /// up to record_count are checked by the first open after a writer died.
    /// <= record_count.
    durable_count: u64,
    /// 32: bumped by every commit.
    generation: u64,
    /// 40, 48: data_size and live_bytes when durable_count was made durable
    /// (durable_live_bytes <= durable_data_size <= data_size).
    durable_data_size: u64,
    durable_live_bytes: u64,
    /// 56: XXH64 (seeds.commit) of bytes [0, 56).
    checksum: u64,

    comptime {
        assertLayout(Commit, 64, .{
            .record_count = 0,
            .data_size = 8,
            .live_bytes = 16,
            .durable_count = 24,
            .generation = 32,
            .durable_data_size = 40,
            .durable_live_bytes = 48,
            .checksum = 56,
        });
        assert(@alignOf(Commit) == 8);
    }

    pub fn computeChecksum(c: *const Commit) u64 {
        const bytes = std.mem.asBytes(c);
        return std.hash.XxHash64.hash(seeds.commit, bytes[0 .. @sizeOf(Commit) - 8]);
    }

    /// The invariants every commit keeps, on disk and in memory.
    pub fn consistent(c: *const Commit) bool {
        return c.live_bytes <= c.data_size and c.durable_count <= c.record_count and
            c.durable_data_size <= c.data_size and c.durable_live_bytes <= c.durable_data_size;
    }
};

/// One record-table entry (`index`, table layout): entry i at i * 32.
pub const RecordLoc = extern struct {
    /// 0: offset in the data file of the record's aux bytes; the payload
    /// follows them. A record of no bytes may point anywhere inside the data.
    offset: u64,
    /// 8: payload bytes as stored (after the codec).
    stored_size: u64,
    /// 16: payload bytes after decoding (raw: == stored_size).
    raw_size: u64,
    /// 24: `storedChecksum(aux, payload, i)` of the entry's own index i.
    checksum: u32,
    /// 28: `Codec` of this record's payload (raw or the store's codec).
    codec: u8,
    /// 29: written 0, ignored.
    _reserved: u8,
    /// 30: raw bytes stored before the payload (shapes of ragged records).
    aux_size: u16,

    comptime {
        assertLayout(RecordLoc, 32, .{
            .offset = 0,
            .stored_size = 8,
            .raw_size = 16,
            .checksum = 24,
            .codec = 28,
            ._reserved = 29,
            .aux_size = 30,
        });
        assert(@alignOf(RecordLoc) == 8);
    }

    /// Byte just past this record in the data file (a trusted entry).
    pub fn end(loc: RecordLoc) u64 {
        assert(loc.checkedEnd() != null); // trusted: checked against the data first
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

/// Bytes of one entry of `index` in the fixed-width layout (a u32 checksum).
pub const fixed_entry_size: u64 = @sizeOf(u32);

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

/// Records up to this many bytes, without aux, are hashed with XXH3.
pub const record_xxh3_max: usize = 240;

/// Low 32 bits of a 64-bit hash (seeds.record) of aux ++ stored: XXH3 for
/// small records without aux (its short-input path is fastest there), XXH64
/// otherwise (Zig's XXH3 long-input path runs at ~0.35 GB/s on the baseline
/// x86-64 target we ship, XXH64 at ~5 GB/s). The choice depends only on the
/// sizes, so it is part of the format.
pub fn recordChecksum(aux: []const u8, stored: []const u8) u32 {
    if (aux.len == 0 and stored.len <= record_xxh3_max) {
        return @truncate(std.hash.XxHash3.hash(seeds.record, stored));
    }
    var h = std.hash.XxHash64.init(seeds.record);
    h.update(aux);
    h.update(stored);
    return @truncate(h.final());
}

/// The delete journal's header (file `journal`, see "The journal").
pub const JournalHeader = extern struct {
    /// 0: `magic_value` ("\x01\x00LNRJXL" read as bytes).
    magic: u64,
    /// 8: entries that follow the header: (index u64, RecordLoc) pairs.
    entry_count: u64,
    /// 16: the commit to publish after the entries are applied; its
    /// generation is the published one's plus one, and it is durable
    /// (durable_* equal the rest). Its own checksum is sealed.
    commit: Commit,
    /// 80: XXH64 (seeds.journal_entries) of the entries.
    entries_checksum: u64,
    /// 88: XXH64 (seeds.journal) of bytes [0, 88).
    checksum: u64,

    pub const magic_value: u64 = 0x4C584A524E4C0001;

    comptime {
        assertLayout(JournalHeader, 96, .{
            .magic = 0,
            .entry_count = 8,
            .commit = 16,
            .entries_checksum = 80,
            .checksum = 88,
        });
    }

    pub fn computeChecksum(j: *const JournalHeader) u64 {
        const bytes = std.mem.asBytes(j);
        return std.hash.XxHash64.hash(seeds.journal, bytes[0 .. @sizeOf(JournalHeader) - 8]);
    }

    pub fn entriesChecksum(entries: []const JournalEntry) u64 {
        return std.hash.XxHash64.hash(seeds.journal_entries, std.mem.sliceAsBytes(entries));
    }
};

/// One journal entry: table entry `index` becomes `loc` (see "The journal").
pub const JournalEntry = extern struct {
    /// 0: the record index written (below the journal commit's record_count).
    index: u64,
    /// 8: its new entry, checksum already re-bound to `index`.
    loc: RecordLoc,

    comptime {
        assertLayout(JournalEntry, 40, .{ .index = 0, .loc = 8 });
    }
};

/// What a store holds, in `Identity.kind`.
pub const Kind = enum(u8) {
    /// Byte strings of any length (Zrecord).
    bytes = 0,
    /// Records of one dtype and one item shape (DenseStore).
    dense = 1,
    /// Arrays of one dtype, each of its own shape (RaggedStore).
    ragged = 2,
};

/// The type identity of a store (meta, after the dictionary; format 3):
/// what its records are, so a reader builds the right arrays. Written once
/// at create, checked in full at every open (`Identity.parse`) and at
/// create. This struct, then `descr_size` bytes of dtype description, then
/// `name_size` bytes of dtype name, nothing after (`Header.user_size` is
/// the sum). Covered by `Header.blob_checksum`.
///
/// The dtype description is numpy's array-protocol description of the
/// dtype (`numpy.lib.format.dtype_to_descr`), written as a Python literal in
/// printable ASCII: the text a .npy file's header holds after `'descr':`,
/// e.g. `'<f4'` or `[('id', '<u8'), ('pos', '<f4', (3,))]`. Python parses
/// it (loaderx/identity.py, `ast.literal_eval`); the engine checks only its
/// bounds and alphabet. The name is numpy's `dtype.name` (`float32`,
/// `bfloat16`), printable ASCII.
pub const Identity = extern struct {
    /// 0: `magic_value` ("LXIDENT\x01").
    magic: u64,
    /// 8: `version_value` of the writer. A newer version is refused as such.
    version: u32,
    /// 12: 296, the size of this struct as written.
    header_size: u32,
    /// 16: `Kind`.
    kind: u8,
    /// 17: dimensions of a dense record, <= ndim_max; 0 for other kinds.
    ndim: u8,
    /// 18: `Flags` bits; unknown bits are refused.
    flags: u16,
    /// 20: written 0; refused when not.
    _reserved0: u32,
    /// 24: bytes of one dtype element (numpy's itemsize; may be 0 for an
    /// empty structured dtype); 0 for kind bytes.
    itemsize: u64,
    /// 32: bytes of the dtype description after this struct (1 to
    /// descr_size_max; 0 for kind bytes).
    descr_size: u32,
    /// 36: bytes of the dtype name after the description (0 to
    /// name_size_max; at least 1 with Flags.dtype_by_name).
    name_size: u32,
    /// 40: a dense record's shape: item_shape[0..ndim], then zeros. Each
    /// dimension and the product of max(dimension, 1) and max(itemsize, 1)
    /// is at most 2^63 - 1 (numpy's limit), and for a fixed-width store
    /// itemsize * product == `Header.fixed_size`.
    item_shape: [ndim_max]u64,

    /// "LXIDENT\x01" read as a little-endian u64.
    pub const magic_value: u64 = 0x01544E454449584C;
    pub const version_value: u32 = 1;
    pub const ndim_max = 32;
    pub const descr_size_max: u32 = 1 << 20;
    pub const name_size_max: u32 = 255;
    /// numpy's largest element count times item size.
    pub const size_max: u64 = std.math.maxInt(i64);

    pub const Flags = struct {
        /// The description alone does not give the dtype back: it is a
        /// scalar type a Python package registers by name (ml_dtypes'
        /// bfloat16 describes itself as raw bytes, '<V2'; float8_e5m2 as
        /// '<f1', which numpy cannot parse). A reader builds it from `name`
        /// when the package is there, else reads raw bytes of `itemsize`.
        pub const dtype_by_name: u16 = 1 << 0;
        pub const all: u16 = dtype_by_name;
    };

    /// How a store keeps its identity (lx_identity's `encoding`).
    pub const Encoding = enum(u8) {
        /// No identity: a plain byte store.
        none = 0,
        /// This struct (format 3).
        native = 1,
        /// msgpack written by Python (format 2): the engine does not read
        /// it; Python decodes and checks it.
        msgpack = 2,
    };

    /// An identity with its two texts: what a create takes and an open finds.
    pub const Full = struct {
        head: Identity,
        descr: []const u8 = "",
        name: []const u8 = "",

        /// Bytes of the stored form.
        pub fn size(f: Full) usize {
            return @sizeOf(Identity) + f.descr.len + f.name.len;
        }

        /// Writes the stored form into `out` (exactly `size()` bytes).
        pub fn write(f: Full, out: []u8) void {
            assert(out.len == f.size());
            assert(f.head.descr_size == f.descr.len);
            assert(f.head.name_size == f.name.len);
            @memcpy(out[0..@sizeOf(Identity)], std.mem.asBytes(&f.head));
            @memcpy(out[@sizeOf(Identity)..][0..f.descr.len], f.descr);
            @memcpy(out[@sizeOf(Identity) + f.descr.len ..], f.name);
        }
    };

    /// What `parse` made of a stored identity.
    pub const Parsed = union(enum) {
        ok: Full,
        /// Written by a newer identity version than this library reads.
        newer: u32,
        /// Damaged or hostile: why, in words.
        bad: []const u8,
    };

    comptime {
        assertLayout(Identity, 296, .{
            .magic = 0,
            .version = 8,
            .header_size = 12,
            .kind = 16,
            .ndim = 17,
            .flags = 18,
            ._reserved0 = 20,
            .itemsize = 24,
            .descr_size = 32,
            .name_size = 36,
            .item_shape = 40,
        });
        assert(@alignOf(Identity) == 8);
    }

    /// An identity of `kind` with every other field 0 and its sizes set.
    pub fn init(kind: Kind, descr_size: u32, name_size: u32) Identity {
        var id = std.mem.zeroes(Identity);
        id.magic = magic_value;
        id.version = version_value;
        id.header_size = @sizeOf(Identity);
        id.kind = @backingInt(kind);
        id.descr_size = descr_size;
        id.name_size = name_size;
        return id;
    }

    /// Checks stored identity bytes in full: its own fields, its texts and
    /// their sizes. O(size). Never reads past `stored`.
    pub fn parse(stored: []const u8) Parsed {
        if (stored.len < 16) return .{ .bad = "it is shorter than its header" };
        var id: Identity = std.mem.zeroes(Identity);
        const head_len = @min(stored.len, @sizeOf(Identity));
        @memcpy(std.mem.asBytes(&id)[0..head_len], stored[0..head_len]);
        if (id.magic != magic_value) return .{ .bad = "it has no identity magic number" };
        if (id.version > version_value) return .{ .newer = id.version };
        if (id.version < 1) return .{ .bad = "it names version 0" };
        if (id.header_size != @sizeOf(Identity) or stored.len < @sizeOf(Identity)) {
            return .{ .bad = "its header has a bad size" };
        }
        if (id.fieldProblem()) |why| return .{ .bad = why };
        const want = @as(u64, @sizeOf(Identity)) + id.descr_size + id.name_size;
        if (stored.len != want) return .{ .bad = "its size disagrees with its text sizes" };
        const descr = stored[@sizeOf(Identity)..][0..id.descr_size];
        const name = stored[@sizeOf(Identity) + descr.len ..];
        assert(name.len == id.name_size);
        if (!printable(descr)) return .{ .bad = "its dtype description is not printable ASCII" };
        if (!printable(name)) return .{ .bad = "its dtype name is not printable ASCII" };
        return .{ .ok = .{ .head = id, .descr = descr, .name = name } };
    }

    /// The first rule a header's own fields break (see each field), or null.
    fn fieldProblem(id: *const Identity) ?[]const u8 {
        const kind = std.enums.fromInt(Kind, id.kind) orelse return "it names an unknown kind";
        if (id.flags & ~Flags.all != 0) return "it sets unknown flags";
        if (id._reserved0 != 0) return "its reserved field is set";
        if (id.ndim > ndim_max) return "its item shape has too many dimensions";
        for (id.item_shape[id.ndim..]) |d| {
            if (d != 0) return "its item shape has dimensions past ndim";
        }
        if (kind != .dense and id.ndim != 0) return "only a dense store has an item shape";
        if (kind == .bytes) {
            if (id.itemsize != 0 or id.descr_size != 0 or id.name_size != 0 or id.flags != 0) {
                return "a byte store's identity names a dtype";
            }
            return null;
        }
        if (id.descr_size == 0 or id.descr_size > descr_size_max) {
            return "its dtype description has a bad size";
        }
        if (id.name_size > name_size_max) return "its dtype name is too long";
        if (id.flags & Flags.dtype_by_name != 0 and id.name_size == 0) {
            return "its dtype is named, but the name is empty";
        }
        _ = id.recordSize() orelse return "its item shape is too large for any array";
        return null;
    }

    /// Bytes of one dense record (itemsize times the item shape's product),
    /// or null when the shape breaks numpy's size limit (see `item_shape`).
    pub fn recordSize(id: *const Identity) ?u64 {
        assert(id.ndim <= ndim_max);
        var bound: u128 = @max(id.itemsize, 1);
        var size: u128 = id.itemsize;
        for (id.item_shape[0..id.ndim]) |d| {
            if (d > size_max) return null;
            bound *= @max(d, 1);
            size *= d;
            if (bound > size_max) return null;
        }
        assert(size <= bound);
        return @intCast(size);
    }

    /// The first way the identity disagrees with its store's header, or null:
    /// a fixed-width store is a dense one of exactly its record size.
    pub fn layoutProblem(id: *const Identity, h: *const Header) ?[]const u8 {
        if (h.fixed_size == 0) return null;
        if (id.kind != @backingInt(Kind.dense)) return "a fixed-width store is not a dense one";
        const size = id.recordSize() orelse return "its item shape is too large for any array";
        if (size != h.fixed_size) return "its record size differs from the store's fixed width";
        return null;
    }

    fn printable(text: []const u8) bool {
        for (text) |ch| {
            if (ch < 0x20 or ch > 0x7E) return false;
        }
        return true;
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
        assert(k < t.count());
        return std.mem.readInt(u32, t.entries[k * entry_size ..][0..4], .little);
    }

    pub fn decompressed(t: SeekTable, k: usize) u32 {
        assert(k < t.count());
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
        const t: SeekTable = .{
            .entries = stored[start + 8 ..][0..@intCast(n * entry_size)],
            .frames_size = start,
        };
        assert(t.count() == n);
        assert(t.frames_size + table_size == stored.len);
        return t;
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
        assert(n > 0);
        assert(n <= std.math.maxInt(u32));
        assert(out.len == sizeFor(n));
        std.mem.writeInt(u32, out[0..4], skippable_magic, .little);
        std.mem.writeInt(u32, out[4..8], @intCast(out.len - 8), .little);
        const foot = out[out.len - footer_size ..];
        std.mem.writeInt(u32, foot[0..4], @intCast(n), .little);
        foot[4] = 0;
        std.mem.writeInt(u32, foot[5..9], seekable_magic, .little);
    }

    /// Writes entry `k` of the table in `out` (as `writeFrame` laid it out).
    pub fn putEntry(out: []u8, k: usize, packed_size: u32, raw_size: u32) void {
        // Inside the entries of the table writeFrame laid out in `out`.
        assert(8 + (k + 1) * entry_size + footer_size <= out.len);
        // No frame is empty (check refuses a table with one).
        assert(packed_size > 0);
        assert(raw_size > 0);
        const e = out[8 + k * entry_size ..][0..entry_size];
        std.mem.writeInt(u32, e[0..4], packed_size, .little);
        std.mem.writeInt(u32, e[4..8], raw_size, .little);
    }

    pub fn sizeFor(n: usize) usize {
        return n * entry_size + overhead;
    }
};

/// The header of `windows.idx`: the running sums of a durable prefix of the
/// store's records' decoded sizes, for TokenWindows. After it (from byte 88)
/// `docs` u64 ends: ends[d] is the number of decoded payload bytes of records
/// 0..d (a running sum of `RecordLoc.raw_size`, non-decreasing), so the
/// tokens before record d are ends[d - 1] / itemsize. Derived data: a file
/// that fails any check is ignored and rebuilt from the record table.
///
/// It can only describe records the store still holds: a delete (the one
/// operation that changes a record in place) removes it, durably, before its
/// journal is written; compact and appends leave every covered record as it
/// was. Written atomically (a temporary `windows.idx.<random>.tmp`, fsync,
/// rename, directory fsync) and read by copying it into memory, never mapped.
/// See windows.zig for how it is validated and extended.
pub const WindowsIndex = extern struct {
    /// 0: `magic_value` ("LXWIDX\x00\x01").
    magic: u64,
    /// 8: `version_value`; any other is ignored (rebuilt).
    version: u32,
    /// 12: 88, the size of this struct.
    header_size: u32,
    /// 16, 24: `Header.uid` and `Header.checksum` of the store it describes.
    store_uid: u64,
    store_header_checksum: u64,
    /// 32: records covered: a prefix of the store's, durable when it was
    /// built (1 <= docs <= durable_count).
    docs: u64,
    /// 40, 48, 56: the commit it was built from: generation and what was
    /// durable then. A store shows the same or later values (a delete removes
    /// the file), so an index from the future of this store (or of another)
    /// is refused.
    generation: u64,
    durable_count: u64,
    durable_data_size: u64,
    /// 64: XXH64 (seeds.windows_ends) of the `docs` ends that follow.
    ends_checksum: u64,
    /// 72: written 0, ignored.
    _reserved: u64,
    /// 80: XXH64 (seeds.windows_index) of bytes [0, 80).
    checksum: u64,

    /// "LXWIDX\x00\x01" read as a little-endian u64.
    pub const magic_value: u64 = 0x0100_5844_4957_584C;
    pub const version_value: u32 = 1;
    pub const file_name = "windows.idx";

    comptime {
        assertLayout(WindowsIndex, 88, .{
            .magic = 0,
            .version = 8,
            .header_size = 12,
            .store_uid = 16,
            .store_header_checksum = 24,
            .docs = 32,
            .generation = 40,
            .durable_count = 48,
            .durable_data_size = 56,
            .ends_checksum = 64,
            ._reserved = 72,
            .checksum = 80,
        });
        assert(@alignOf(WindowsIndex) == 8);
    }

    pub fn computeChecksum(w: *const WindowsIndex) u64 {
        const bytes = std.mem.asBytes(w);
        return std.hash.XxHash64.hash(seeds.windows_index, bytes[0 .. @sizeOf(WindowsIndex) - 8]);
    }

    pub fn endsChecksum(ends: []const u64) u64 {
        return std.hash.XxHash64.hash(seeds.windows_ends, std.mem.sliceAsBytes(ends));
    }
};

/// The structs of the format, by the names the generated forger layout uses.
pub const structs = .{
    .{ "HEADER", Header },
    .{ "COMMIT", Commit },
    .{ "LOC", RecordLoc },
    .{ "JOURNAL_HEADER", JournalHeader },
    .{ "JOURNAL_ENTRY", JournalEntry },
    .{ "WINDOWS_INDEX", WindowsIndex },
    .{ "IDENTITY", Identity },
};

/// Proves at compile time that extern struct `T` is exactly `size` bytes of
/// the fields named in `offsets` (a struct literal: field name = offset), at
/// those offsets, in that order, with no padding anywhere.
fn assertLayout(comptime T: type, comptime size: usize, comptime offsets: anytype) void {
    const info = @typeInfo(T).@"struct";
    if (info.field_names.len != @typeInfo(@TypeOf(offsets)).@"struct".field_names.len) {
        @compileError(@typeName(T) ++ ": the offset list does not name every field");
    }
    var end: usize = 0;
    for (info.field_names, info.field_types) |name, F| {
        if (@offsetOf(T, name) != @field(offsets, name)) {
            @compileError(@typeName(T) ++ "." ++ name ++ " is not at its documented offset");
        }
        if (@offsetOf(T, name) != end) {
            @compileError(@typeName(T) ++ "." ++ name ++ " follows padding");
        }
        end += @sizeOf(F);
    }
    if (end != size or @sizeOf(T) != size) {
        @compileError(@typeName(T) ++ " is not its documented size (or ends in padding)");
    }
}

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
    inline for (structs) |entry| {
        const T = entry[1];
        var size: usize = 0;
        inline for (@typeInfo(T).@"struct".field_types) |F| size += @sizeOf(F);
        try std.testing.expectEqual(@sizeOf(T), size);
    }
}

fn testIdentity(buf: []u8, kind: Kind, shape: []const u64, descr: []const u8) []u8 {
    var head = Identity.init(kind, @intCast(descr.len), 7);
    head.itemsize = 4;
    head.ndim = @intCast(shape.len);
    @memcpy(head.item_shape[0..shape.len], shape);
    const full: Identity.Full = .{ .head = head, .descr = descr, .name = "float32" };
    full.write(buf[0..full.size()]);
    return buf[0..full.size()];
}

test "an identity round-trips through its stored form" {
    var buf: [512]u8 = undefined;
    const stored = testIdentity(&buf, .dense, &.{ 2, 3 }, "'<f4'");
    const full = Identity.parse(stored).ok;
    try std.testing.expectEqual(@backingInt(Kind.dense), full.head.kind);
    try std.testing.expectEqualSlices(u64, &.{ 2, 3 }, full.head.item_shape[0..full.head.ndim]);
    try std.testing.expectEqualStrings("'<f4'", full.descr);
    try std.testing.expectEqualStrings("float32", full.name);
    try std.testing.expectEqual(@as(?u64, 24), full.head.recordSize());
    var h = std.mem.zeroes(Header);
    h.fixed_size = 24;
    try std.testing.expect(full.head.layoutProblem(&h) == null);
    h.fixed_size = 25;
    try std.testing.expect(full.head.layoutProblem(&h) != null);
}

test "a damaged or hostile identity is refused, a newer one named as such" {
    var buf: [512]u8 = undefined;
    const good = testIdentity(&buf, .dense, &.{ 2, 3 }, "'<f4'");
    const Edit = struct { offset: usize, bytes: []const u8 };
    const u64_max: [8]u8 = @splat(0xFF);
    const edits = [_]Edit{
        .{ .offset = 0, .bytes = "X" }, // magic
        .{ .offset = 12, .bytes = "\x00" }, // header_size
        .{ .offset = 16, .bytes = "\x03" }, // kind
        .{ .offset = 17, .bytes = "\x21" }, // ndim 33
        .{ .offset = 18, .bytes = "\x02" }, // an unknown flag
        .{ .offset = 20, .bytes = "\x01" }, // reserved
        .{ .offset = 40 + 2 * 8, .bytes = "\x01" }, // a dimension past ndim
        .{ .offset = 40, .bytes = &u64_max }, // a dimension past numpy's limit
        .{ .offset = 32, .bytes = "\x00\x00\x00\x00" }, // no description
        .{ .offset = 32, .bytes = "\x06" }, // sizes disagree with the bytes
        .{ .offset = @sizeOf(Identity) + 1, .bytes = "\x7F" }, // not printable
        .{ .offset = @sizeOf(Identity) + 6, .bytes = "\xC3" }, // not ASCII
    };
    for (edits) |e| {
        var bad: [512]u8 = undefined;
        @memcpy(bad[0..good.len], good);
        @memcpy(bad[e.offset..][0..e.bytes.len], e.bytes);
        try std.testing.expect(Identity.parse(bad[0..good.len]) == .bad);
    }
    try std.testing.expect(Identity.parse(good[0..15]) == .bad);
    try std.testing.expect(Identity.parse(good[0 .. good.len - 1]) == .bad);
    var newer: [512]u8 = undefined;
    @memcpy(newer[0..good.len], good);
    newer[8] = 2;
    try std.testing.expectEqual(@as(u32, 2), Identity.parse(newer[0..good.len]).newer);
    // Huge dimensions whose product overflows (each one alone is allowed).
    var head = Identity.parse(good).ok.head;
    head.item_shape[0] = 1 << 40;
    head.item_shape[1] = 1 << 30;
    try std.testing.expect(head.recordSize() == null);
    head.item_shape[1] = 0; // a zero dimension does not hide the other
    head.item_shape[0] = 1 << 62;
    try std.testing.expect(head.recordSize() == null);
    // A byte store names no dtype.
    var bytes_buf: [512]u8 = undefined;
    const bytes_id = testIdentity(&bytes_buf, .bytes, &.{}, "'|u1'");
    try std.testing.expect(Identity.parse(bytes_id) == .bad);
    const plain: Identity.Full = .{ .head = Identity.init(.bytes, 0, 0) };
    plain.write(bytes_buf[0..plain.size()]);
    try std.testing.expect(Identity.parse(bytes_buf[0..plain.size()]) == .ok);
}

test "magic reveals byte order" {
    try std.testing.expect(magic != magic_swapped);
    const bytes = std.mem.toBytes(std.mem.nativeToLittle(u64, magic));
    try std.testing.expectEqualStrings("LXSTORE\x01", &bytes);
}
