/* The RocksDB peer of `granary-bench txn`: commits WriteBatches of BATCH
 * puts of VALUE_BYTES-byte values, one at a time, each with sync (the
 * write-ahead log fsynced before the commit returns), for SECS seconds,
 * and prints one JSON line: commits, seconds, and the median and 99th
 * percentile commit latency in microseconds.
 *
 * Built by the benchmark with the system's librocksdb (Debian's
 * librocksdb-dev): cc -O2 rocksdb_batch.c -lrocksdb
 * Usage: rocksdb_batch DIR BATCH VALUE_BYTES SECS KEYS */
#include <rocksdb/c.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: %s DIR BATCH VALUE_BYTES SECS KEYS\n", argv[0]);
        return 2;
    }
    const char *dir = argv[1];
    long batch = atol(argv[2]), value_bytes = atol(argv[3]), keys = atol(argv[5]);
    double secs = atof(argv[4]);
    char *err = NULL;
    rocksdb_options_t *o = rocksdb_options_create();
    rocksdb_options_set_create_if_missing(o, 1);
    rocksdb_t *db = rocksdb_open(o, dir, &err);
    if (err) {
        fprintf(stderr, "rocksdb_open: %s\n", err);
        return 1;
    }
    rocksdb_writeoptions_t *wo = rocksdb_writeoptions_create();
    rocksdb_writeoptions_set_sync(wo, 1);
    rocksdb_writebatch_t *wb = rocksdb_writebatch_create();
    char *value = malloc(value_bytes);
    memset(value, 'v', value_bytes);
    size_t cap = 1 << 20, n = 0;
    uint64_t *lat = malloc(cap * sizeof(uint64_t));
    uint64_t start = now_ns(), end = start + (uint64_t)(secs * 1e9), x = 88172645463325252ull;
    while (now_ns() < end) {
        rocksdb_writebatch_clear(wb);
        for (long i = 0; i < batch; i++) {
            char key[32];
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            int kl = snprintf(key, sizeof key, "key-%012llu", (unsigned long long)(x % (uint64_t)keys));
            rocksdb_writebatch_put(wb, key, kl, value, value_bytes);
        }
        uint64_t t = now_ns();
        rocksdb_write(db, wo, wb, &err);
        if (err) {
            fprintf(stderr, "rocksdb_write: %s\n", err);
            return 1;
        }
        if (n == cap) {
            cap *= 2;
            lat = realloc(lat, cap * sizeof(uint64_t));
        }
        lat[n++] = now_ns() - t;
    }
    double took = (now_ns() - start) / 1e9;
    qsort(lat, n, sizeof(uint64_t), cmp_u64);
    printf("{\"batch\":%ld,\"commits\":%zu,\"secs\":%.3f,\"p50_us\":%.1f,\"p99_us\":%.1f}\n", batch, n, took,
           n ? lat[n / 2] / 1e3 : 0.0, n ? lat[(size_t)(n * 0.99)] / 1e3 : 0.0);
    rocksdb_writebatch_destroy(wb);
    rocksdb_writeoptions_destroy(wo);
    rocksdb_close(db);
    rocksdb_options_destroy(o);
    return 0;
}
