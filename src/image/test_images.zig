//! Small JPEGs made for this project (src/image/testdata, written by Pillow
//! from a synthetic pattern): every chroma subsampling, greyscale,
//! progressive and CMYK. jpeg.zig decodes them with a library found at run
//! time and with the built-in decoder before it trusts the former, and the
//! tests decode them.
pub const width_max: u32 = 64;

pub const s420 = @embedFile("testdata/s420.jpg");
pub const s422 = @embedFile("testdata/s422.jpg");
pub const s444 = @embedFile("testdata/s444.jpg");
pub const gray = @embedFile("testdata/gray.jpg");
pub const progressive = @embedFile("testdata/prog.jpg");
pub const cmyk = @embedFile("testdata/cmyk.jpg");

pub const all = [_][]const u8{ s420, s422, s444, gray, progressive, cmyk };

/// PNGs of every colour type, depth and interlacing, with their RGB.
pub const pngs = @import("testdata/pngs.zig").all;
