/*
 * Granary from C: create a store in a file, write and read a few keys,
 * use a namespace and an atomic batch, then close and reopen it.
 *
 * Build (from the repository root):
 *   cargo build -p granary-capi --release
 *   cc -Icrates/capi/include crates/capi/examples/example.c \
 *      target/release/libgranary_capi.a -lgcc_s -lutil -lrt -lpthread -lm -ldl -o example
 *   ./example /tmp/example.granary
 */
#include "granary.h"

#include <stdio.h>
#include <string.h>

/* Print the failed call's message and leave. */
static int fail(const char *what, granary_status st) {
    fprintf(stderr, "%s: %s: %s\n", what, granary_status_name(st), granary_last_error_message(NULL));
    return 1;
}

#define TRY(call)                                                              \
    do {                                                                       \
        granary_status st_ = (call);                                           \
        if (st_ != GRANARY_OK) return fail(#call, st_);                        \
    } while (0)

#define S(text) (const uint8_t *)(text), strlen(text)

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s PATH (a new file)\n", argv[0]);
        return 2;
    }
    const char *path = argv[1];
    granary_store *store = NULL;
    TRY(granary_create(S(path), 64 << 20, NULL, &store));

    TRY(granary_put(store, S("greeting"), S("hello, world"), GRANARY_PUT_UPSERT));

    /* Read into a buffer of our own; a value larger than it says how
     * large a buffer it needs. */
    char small[4];
    size_t len = sizeof small;
    granary_status st = granary_get(store, S("greeting"), (uint8_t *)small, &len);
    if (st == GRANARY_ETOOSMALL) printf("greeting needs %zu bytes\n", len);

    /* Or let the library allocate it. */
    uint8_t *value = NULL;
    TRY(granary_get_alloc(store, S("greeting"), &value, &len));
    printf("greeting = %.*s\n", (int)len, (const char *)value);
    granary_free(value);

    /* A namespace: keys apart from the default namespace's. */
    granary_ns *users = NULL;
    TRY(granary_ns_create(store, S("users"), NULL, &users));
    TRY(granary_ns_put(users, S("alice"), S("admin"), GRANARY_PUT_UPSERT));

    /* An atomic batch across namespaces: all of it or nothing. */
    granary_batch *batch = NULL;
    TRY(granary_batch_begin(store, &batch));
    TRY(granary_batch_put(batch, users, S("bob"), S("reader"), GRANARY_PUT_CREATE_ONLY));
    TRY(granary_batch_put(batch, NULL, S("user-count"), S("2"), GRANARY_PUT_UPSERT));
    size_t failed_op = 0;
    st = granary_batch_commit(batch, &failed_op); /* frees the batch */
    if (st == GRANARY_ECONFLICT) printf("operation %zu failed; nothing applied\n", failed_op);
    else if (st != GRANARY_OK) return fail("granary_batch_commit", st);

    granary_ns_close(users);
    TRY(granary_close(store));

    /* Reopen: everything written is there. */
    TRY(granary_open(S(path), NULL, &store));
    TRY(granary_ns_open(store, S("users"), &users));
    char buf[64];
    len = sizeof buf;
    TRY(granary_ns_get(users, S("bob"), (uint8_t *)buf, &len));
    printf("after reopen: users/bob = %.*s\n", (int)len, buf);
    granary_ns_info info;
    TRY(granary_ns_stats(users, &info));
    printf("users holds %llu keys\n", (unsigned long long)info.keys);
    granary_ns_close(users);

    granary_stats stats;
    TRY(granary_stats_get(store, &stats));
    printf("the store holds %llu keys of %llu bytes max\n", (unsigned long long)stats.keys,
           (unsigned long long)stats.value_bytes_max);
    TRY(granary_close(store));
    return 0;
}
