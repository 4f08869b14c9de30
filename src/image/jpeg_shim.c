/* The one place C meets libjpeg: libjpeg reports errors by calling an
 * `error_exit` that must not return, which in C means longjmp back to a
 * setjmp in a frame that is still live. Zig has neither, so every call into
 * libjpeg goes through an entry point here that sets the jump target first;
 * the jump only ever unwinds libjpeg's own C frames, never a Zig one.
 *
 * The calls go through a table of function pointers (`lxj_api`): either the
 * libjpeg-turbo compiled into this library (lxj_builtin_api) or one with SIMD
 * that src/image/jpeg.zig loaded at run time. Both speak the libjpeg 6b ABI
 * (JPEG_LIB_VERSION 62); jpeg_CreateDecompress checks the version and the
 * struct size, so a library of another ABI fails its first call cleanly.
 *
 * Warnings that mean the data is damaged (truncated, bad Huffman codes) are
 * errors here: a record that decodes to grey padding is not an image. */
#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "jpeglib.h"

typedef struct lxj_api {
  struct jpeg_error_mgr *(*std_error)(struct jpeg_error_mgr *);
  void (*create_decompress)(j_decompress_ptr, int, size_t);
  void (*destroy_decompress)(j_decompress_ptr);
  void (*mem_src)(j_decompress_ptr, const unsigned char *, unsigned long);
  int (*read_header)(j_decompress_ptr, boolean);
  boolean (*start_decompress)(j_decompress_ptr);
  void (*crop_scanline)(j_decompress_ptr, JDIMENSION *, JDIMENSION *);
  JDIMENSION (*skip_scanlines)(j_decompress_ptr, JDIMENSION);
  JDIMENSION (*read_scanlines)(j_decompress_ptr, JSAMPARRAY, JDIMENSION);
} lxj_api;

/* The header of an image: its size and what its samples are. */
typedef struct lxj_header {
  uint32_t width;
  uint32_t height;
  /* 1: greyscale, 3: RGB or YCbCr, 4: CMYK or YCCK. */
  uint32_t components;
  /* 1 when the file is progressive (its whole coefficient array is buffered). */
  uint32_t progressive;
} lxj_header;

/* What lxj_start made of a request: the columns really decoded (a crop
 * starts on an iMCU boundary, so x0 may be left of the asked start and the
 * width wider), the rows of the scaled image, and samples per pixel. */
typedef struct lxj_region {
  uint32_t x0;
  uint32_t width;
  uint32_t height;
  uint32_t channels;
} lxj_region;

#define LXJ_MESSAGE_SIZE 200

typedef struct lxj_state {
  struct jpeg_decompress_struct cinfo;
  struct jpeg_error_mgr err;
  jmp_buf jump;
  const lxj_api *api;
  int created;
  char message[LXJ_MESSAGE_SIZE];
} lxj_state;

size_t lxj_state_size(void) { return sizeof(lxj_state); }

static void lxj_error_exit(j_common_ptr cinfo) {
  lxj_state *s = (lxj_state *)cinfo->client_data;
  char text[JMSG_LENGTH_MAX];
  cinfo->err->format_message(cinfo, text);
  snprintf(s->message, sizeof s->message, "%s", text);
  longjmp(s->jump, 1);
}

/* Damage that libjpeg reports as a warning and pads over with grey. The
 * texts are libjpeg's own (format_message), the same in every version, so
 * the check holds for a library loaded at run time too. */
static int lxj_is_damage(const char *text) {
  static const char *damage[] = {
      "Premature end of JPEG file",
      "premature end of data segment",
      "bad Huffman code",
      "bad arithmetic code",
      "Invalid SOS parameters",
      "Inconsistent progression sequence",
      "Corrupt JPEG data: found marker",
  };
  for (size_t i = 0; i < sizeof damage / sizeof damage[0]; i++) {
    if (strstr(text, damage[i]) != NULL) return 1;
  }
  return 0;
}

static void lxj_emit_message(j_common_ptr cinfo, int level) {
  if (level >= 0) return; /* trace messages */
  char text[JMSG_LENGTH_MAX];
  cinfo->err->format_message(cinfo, text);
  if (!lxj_is_damage(text)) return; /* benign (extraneous bytes, odd JFIF) */
  lxj_state *s = (lxj_state *)cinfo->client_data;
  snprintf(s->message, sizeof s->message, "%s", text);
  longjmp(s->jump, 1);
}

static void lxj_output_message(j_common_ptr cinfo) { (void)cinfo; }

/* Creates a decompressor over `data` and reads its header. Returns 0, or -1
 * with lxj_message(s) set; either way the caller ends with lxj_end(s).
 * `memory_max`: the most libjpeg may allocate for whole-image buffers (a
 * progressive file's coefficients); more is an error, never a huge allocation. */
int lxj_begin(lxj_state *s, const lxj_api *api, const uint8_t *data, size_t len,
              long memory_max, lxj_header *out) {
  memset(s, 0, sizeof *s);
  s->api = api;
  s->cinfo.err = api->std_error(&s->err);
  s->err.error_exit = lxj_error_exit;
  s->err.emit_message = lxj_emit_message;
  s->err.output_message = lxj_output_message;
  s->cinfo.client_data = s;
  if (setjmp(s->jump)) return -1;
  api->create_decompress(&s->cinfo, JPEG_LIB_VERSION, sizeof s->cinfo);
  s->created = 1;
  s->cinfo.mem->max_memory_to_use = memory_max;
  api->mem_src(&s->cinfo, data, (unsigned long)len);
  api->read_header(&s->cinfo, TRUE);
  out->width = s->cinfo.image_width;
  out->height = s->cinfo.image_height;
  out->components = (uint32_t)s->cinfo.num_components;
  out->progressive = s->cinfo.progressive_mode ? 1 : 0;
  return 0;
}

/* Starts decoding at scale `scale_num`/8 (1..8) and positions at a window of
 * the scaled image: columns from `x` for `w` (widened to iMCU boundaries, see
 * lxj_region), rows from `y`. Greyscale, RGB and YCbCr files come out RGB;
 * CMYK and YCCK files come out CMYK (4 channels) for the caller to convert. */
int lxj_start(lxj_state *s, uint32_t scale_num, uint32_t x, uint32_t w, uint32_t y,
              lxj_region *out) {
  if (setjmp(s->jump)) return -1;
  j_decompress_ptr c = &s->cinfo;
  c->scale_num = scale_num;
  c->scale_denom = 8;
  c->dct_method = JDCT_ISLOW;
  c->do_fancy_upsampling = TRUE;
  int cmyk = c->jpeg_color_space == JCS_CMYK || c->jpeg_color_space == JCS_YCCK;
  c->out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
  s->api->start_decompress(c);
  JDIMENSION x0 = x, width = w;
  if (x0 != 0 || width != c->output_width) s->api->crop_scanline(c, &x0, &width);
  if (y > 0) s->api->skip_scanlines(c, y);
  out->x0 = x0;
  out->width = width;
  out->height = c->output_height;
  out->channels = (uint32_t)c->output_components;
  return 0;
}

/* Decodes the next row into `row` (width * channels bytes). */
int lxj_read(lxj_state *s, uint8_t *row) {
  if (setjmp(s->jump)) return -1;
  JSAMPROW rows[1] = {row};
  if (s->api->read_scanlines(&s->cinfo, rows, 1) != 1) {
    snprintf(s->message, sizeof s->message, "the decoder returned no row");
    return -1;
  }
  return 0;
}

/* Frees the decompressor (in any state: after an error too). */
void lxj_end(lxj_state *s) {
  if (!s->created) return;
  s->created = 0;
  if (setjmp(s->jump)) return;
  s->api->destroy_decompress(&s->cinfo);
}

const char *lxj_message(const lxj_state *s) { return s->message; }

/* The libjpeg-turbo compiled into this library. */
void lxj_builtin_api(lxj_api *out) {
  out->std_error = jpeg_std_error;
  out->create_decompress = jpeg_CreateDecompress;
  out->destroy_decompress = jpeg_destroy_decompress;
  out->mem_src = jpeg_mem_src;
  out->read_header = jpeg_read_header;
  out->start_decompress = jpeg_start_decompress;
  out->crop_scanline = jpeg_crop_scanline;
  out->skip_scanlines = jpeg_skip_scanlines;
  out->read_scanlines = jpeg_read_scanlines;
}
