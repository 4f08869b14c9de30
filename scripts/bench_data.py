"""Synthetic data for the bench that compresses like real data, and the index plans.

Pure random bytes would make every compressed store look like a raw one (and
zstd's raw fallback would hide the codec); a constant would make it look free.
These generators aim at what ML data sets hold: image-like uint8 arrays with
flat regions and sparse sensor noise (zstd -3 ratio about 2.6), quantized
random-walk int16 features (about 2x), and Zipf-distributed token ids.
"""
from __future__ import annotations

import numpy as np

TOKEN_VOCAB = 50_257
TOKEN_LENGTH_MIN = 16
TOKEN_LENGTH_MAX = 2048
IMAGE_SIDE_MIN = 64
IMAGE_SIDE_MAX = 512


def image_like_hwc(rng: np.random.Generator, count: int, height: int, width: int, channels: int) -> np.ndarray:
    """(count, height, width, channels) uint8: 8x8 flat blocks plus noise on one pixel in five."""
    block = 8
    coarse = rng.integers(0, 256, (count, -(-height // block), -(-width // block), channels), dtype=np.uint8)
    images = np.repeat(np.repeat(coarse, block, axis=1), block, axis=2)[:, :height, :width]
    noise = (rng.random(images.shape, dtype=np.float32) < 0.2).view(np.uint8)
    images += noise  # uint8 wraps at 255; that is still valid image data
    return np.ascontiguousarray(images)


def random_walk_int16(rng: np.random.Generator, count: int, width: int) -> np.ndarray:
    """(count, width) int16 feature rows: a quantized random walk per row."""
    steps = rng.integers(-3, 4, (count, width), dtype=np.int16)
    return np.cumsum(steps, axis=1, dtype=np.int16) // 4 * 4


def dense_records(rng: np.random.Generator, count: int, dtype: np.dtype, item_shape: tuple) -> np.ndarray:
    if np.dtype(dtype) == np.int16 and len(item_shape) == 1:
        return random_walk_int16(rng, count, item_shape[0])
    assert np.dtype(dtype) == np.uint8 and len(item_shape) == 3, (dtype, item_shape)
    return image_like_hwc(rng, count, *item_shape)


def chunked_dense(rng: np.random.Generator, count: int, dtype: np.dtype, item_shape: tuple) -> np.ndarray:
    """dense_records in slices of ~32 MiB, so generating 128 MiB never holds 4x that in temporaries."""
    out = np.empty((count, *item_shape), dtype=dtype)
    per_slice = max(1, (32 << 20) // max(1, out[0].nbytes))
    for first in range(0, count, per_slice):
        last = min(count, first + per_slice)
        out[first:last] = dense_records(rng, last - first, dtype, item_shape)
    return out


def token_lengths(rng: np.random.Generator, count: int) -> np.ndarray:
    """Lognormal lengths (median ~150, mean ~250) clipped to 16..2048 tokens."""
    lengths = np.rint(rng.lognormal(mean=5.0, sigma=1.0, size=count))
    return np.clip(lengths, TOKEN_LENGTH_MIN, TOKEN_LENGTH_MAX).astype(np.int64)


def token_sequences(rng: np.random.Generator, count: int) -> list[np.ndarray]:
    """`count` int32 sequences of Zipf-distributed ids below TOKEN_VOCAB."""
    lengths = token_lengths(rng, count)
    flat = ((rng.zipf(1.3, int(lengths.sum())) - 1) % TOKEN_VOCAB).astype(np.int32)
    splits = np.concatenate([[0], np.cumsum(lengths)])
    return [flat[splits[i] : splits[i + 1]].copy() for i in range(count)]


def chw_images(rng: np.random.Generator, count: int) -> list[np.ndarray]:
    """`count` uint8 (3, H, W) images with H and W drawn independently from 64..512."""
    sides = rng.integers(IMAGE_SIDE_MIN, IMAGE_SIDE_MAX + 1, (count, 2))
    return [np.ascontiguousarray(image_like_hwc(rng, 1, int(h), int(w), 3)[0].transpose(2, 0, 1)) for h, w in sides]


def uniform_plan(rng: np.random.Generator, count: int, batch_size: int, batch_count: int) -> list[np.ndarray]:
    """`batch_count` int64 batches of uniform random indices (with replacement) in 0..count."""
    return [rng.integers(0, count, batch_size, dtype=np.int64) for _ in range(batch_count)]
