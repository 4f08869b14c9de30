/* The copy limit of a random-row batch gather, in plain C: what two threads
 * reach copying 256 random 12 KiB rows of a 48 MiB array into a ring of four
 * 3 MiB batches (the loader bench's batch), with no sampler, no Python and
 * no hand-over between the threads: the ceiling the DataLoader's figure is
 * held against (docs/performance.md section 13).
 *
 *     python -m ziglang cc -O2 -mavx2 scripts/probe_copy_limit.c -o /tmp/copy_limit -lpthread
 *     /tmp/copy_limit METHOD THREADS     # METHOD: memcpy, rep-movsb, stream
 *
 * The source array is in 4 KiB pages where transparent huge pages are
 * "madvise" (as on the machines measured), like a store's memory-mapped file.
 * "stream" copies with non-temporal AVX stores: no read of a destination
 * line before it is written. Prints batches/s and GB/s; run the methods
 * alternately several times and compare medians (the figures move between
 * runs on a shared VM). */
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define REC (12 * 1024)
#define NREC 4096
#define BATCH 256
#define RING 4
#define BATCHES 3000

static uint8_t *src, *dst[RING];
static uint32_t *idx;
static int method, nthreads;

static void stream_copy(uint8_t *d, const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n; i += 64) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(s + i));
        __m256i b = _mm256_loadu_si256((const __m256i *)(s + i + 32));
        _mm256_stream_si256((__m256i *)(d + i), a);
        _mm256_stream_si256((__m256i *)(d + i + 32), b);
    }
}

static void rep_movsb(uint8_t *d, const uint8_t *s, size_t n) {
    __asm__ volatile("rep movsb" : "+D"(d), "+S"(s), "+c"(n) : : "memory");
}

static void *lane(void *arg) {
    int t = (int)(intptr_t)arg;
    for (long b = 0; b < BATCHES; b++) {
        uint8_t *d = dst[b % RING];
        const uint32_t *ix = idx + (b % 1024) * BATCH;
        for (int i = t; i < BATCH; i += nthreads) {
            uint8_t *to = d + (size_t)i * REC;
            const uint8_t *from = src + (size_t)ix[i] * REC;
            if (method == 0) memcpy(to, from, REC);
            else if (method == 1) rep_movsb(to, from, REC);
            else stream_copy(to, from, REC);
        }
        if (method == 2) _mm_sfence();
    }
    return 0;
}

int main(int argc, char **argv) {
    static const char *names[] = {"memcpy", "rep-movsb", "stream"};
    if (argc != 3) {
        fprintf(stderr, "usage: %s memcpy|rep-movsb|stream THREADS\n", argv[0]);
        return 2;
    }
    method = -1;
    for (int m = 0; m < 3; m++)
        if (strcmp(argv[1], names[m]) == 0) method = m;
    nthreads = atoi(argv[2]);
    if (method < 0 || nthreads < 1 || nthreads > 64) {
        fprintf(stderr, "usage: %s memcpy|rep-movsb|stream THREADS (1-64)\n", argv[0]);
        return 2;
    }
    src = aligned_alloc(64, (size_t)REC * NREC);
    memset(src, 1, (size_t)REC * NREC);
    for (int r = 0; r < RING; r++) {
        dst[r] = aligned_alloc(64, (size_t)REC * BATCH);
        memset(dst[r], 0, (size_t)REC * BATCH);  /* every page touched before timing */
    }
    idx = malloc(sizeof(uint32_t) * 1024 * BATCH);
    srand(1);
    for (int i = 0; i < 1024 * BATCH; i++) idx[i] = (uint32_t)(rand() % NREC);
    pthread_t th[64];
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int t = 0; t < nthreads; t++) pthread_create(&th[t], 0, lane, (void *)(intptr_t)t);
    for (int t = 0; t < nthreads; t++) pthread_join(th[t], 0);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    printf("%-9s threads=%d: %.0f batches/s, %.1f GB/s\n", names[method], nthreads, BATCHES / s,
           BATCHES * (double)REC * BATCH / s / 1e9);
    return 0;
}
