/*
 * The C API's test, in C: compiled against include/granary.h, linked with
 * libgranary_capi.a and run by tests/c_api.rs, which passes a fresh folder
 * for the file-backed store as argv[1]. Every check prints what failed;
 * the program exits 1 if any did, and prints "N passed, 0 failed" if none.
 */
#include "granary.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int passed, failed;

#define CHECK(cond)                                                            \
    do {                                                                       \
        if (cond) {                                                            \
            passed++;                                                          \
        } else {                                                               \
            failed++;                                                          \
            fprintf(stderr, "%s:%d: check failed: %s (last error: %s)\n",     \
                    __FILE__, __LINE__, #cond,                                 \
                    granary_last_error_message(NULL));                         \
        }                                                                      \
    } while (0)

/* A status check that names both statuses when it fails. */
#define EXPECT(call, want)                                                     \
    do {                                                                       \
        granary_status got_ = (call);                                          \
        if (got_ == (want)) {                                                  \
            passed++;                                                          \
        } else {                                                               \
            failed++;                                                          \
            fprintf(stderr, "%s:%d: %s returned %s, expected %s (%s)\n",       \
                    __FILE__, __LINE__, #call, granary_status_name(got_),      \
                    granary_status_name(want),                                 \
                    granary_last_error_message(NULL));                         \
        }                                                                      \
    } while (0)

#define S(text) (const uint8_t *)(text), strlen(text)

static int last_error_contains(const char *part) {
    size_t len = 0;
    const char *msg = granary_last_error_message(&len);
    return msg != NULL && strlen(msg) == len && strstr(msg, part) != NULL;
}

/* Whether `key` holds exactly `want` in the default namespace. */
static int holds(granary_store *s, const char *key, const char *want) {
    char buf[256];
    size_t len = sizeof buf;
    if (granary_get(s, S(key), (uint8_t *)buf, &len) != GRANARY_OK) return 0;
    return len == strlen(want) && memcmp(buf, want, len) == 0;
}

static void test_null_arguments(void) {
    granary_store *s = (granary_store *)1;
    EXPECT(granary_create_memory(8 << 20, NULL, NULL), GRANARY_EINVAL);
    CHECK(last_error_contains("NULL"));
    EXPECT(granary_create_memory(1000, NULL, &s), GRANARY_EINVAL);
    CHECK(s == NULL);
    /* More memory than any machine has: an error, not an abort. */
    EXPECT(granary_create_memory((uint64_t)1 << 62, NULL, &s), GRANARY_ENOSPACE);
    /* A handle's out-parameter is NULL after any failure. */
    s = (granary_store *)1;
    EXPECT(granary_create(NULL, 4, 1 << 20, NULL, &s), GRANARY_EINVAL);
    CHECK(s == NULL);
    s = (granary_store *)1;
    EXPECT(granary_open(NULL, 0, NULL, &s), GRANARY_EINVAL);
    CHECK(s == NULL && last_error_contains("path is empty"));
    size_t len = 0;
    EXPECT(granary_get(NULL, S("k"), NULL, &len), GRANARY_EINVAL);
    EXPECT(granary_put(NULL, S("k"), S("v"), GRANARY_PUT_UPSERT), GRANARY_EINVAL);
    EXPECT(granary_delete(NULL, S("k")), GRANARY_EINVAL);
    EXPECT(granary_close(NULL), GRANARY_EINVAL);
    EXPECT(granary_options_init(NULL), GRANARY_EINVAL);
    EXPECT(granary_ns_get(NULL, S("k"), NULL, &len), GRANARY_EINVAL);
    EXPECT(granary_batch_commit(NULL, NULL), GRANARY_EINVAL);
    EXPECT(granary_stats_get(NULL, NULL), GRANARY_EINVAL);
    /* The functions that free take NULL as free() does. */
    granary_free(NULL);
    granary_ns_close(NULL);
    granary_batch_abort(NULL);
    CHECK(granary_batch_len(NULL) == 0);
}

static void test_status_names(void) {
    CHECK(strcmp(granary_status_name(GRANARY_OK), "GRANARY_OK") == 0);
    CHECK(strcmp(granary_status_name(GRANARY_ETOOSMALL), "GRANARY_ETOOSMALL") == 0);
    CHECK(strcmp(granary_status_name(12345), "GRANARY_UNKNOWN") == 0);
}

static void test_put_get_delete(granary_store *s) {
    EXPECT(granary_put(s, S("alpha"), S("one"), GRANARY_PUT_UPSERT), GRANARY_OK);
    CHECK(holds(s, "alpha", "one"));
    EXPECT(granary_put(s, S("alpha"), S("uno"), GRANARY_PUT_UPSERT), GRANARY_OK);
    CHECK(holds(s, "alpha", "uno"));

    /* Values are bytes: NULs inside are kept. */
    const uint8_t bin[5] = {0, 1, 0, 2, 0};
    EXPECT(granary_put(s, S("bin"), bin, sizeof bin, GRANARY_PUT_UPSERT), GRANARY_OK);
    uint8_t *v = NULL;
    size_t vlen = 0;
    EXPECT(granary_get_alloc(s, S("bin"), &v, &vlen), GRANARY_OK);
    CHECK(v != NULL && vlen == sizeof bin && memcmp(v, bin, vlen) == 0);
    granary_free(v);

    /* An empty value is a value; get_alloc still returns a pointer. */
    EXPECT(granary_put(s, S("empty"), NULL, 0, GRANARY_PUT_UPSERT), GRANARY_OK);
    v = NULL;
    vlen = 99;
    EXPECT(granary_get_alloc(s, S("empty"), &v, &vlen), GRANARY_OK);
    CHECK(v != NULL && vlen == 0);
    granary_free(v);

    /* Modes. */
    EXPECT(granary_put(s, S("alpha"), S("x"), GRANARY_PUT_CREATE_ONLY), GRANARY_EEXISTS);
    CHECK(holds(s, "alpha", "uno"));
    EXPECT(granary_put(s, S("beta"), S("x"), GRANARY_PUT_REPLACE_ONLY), GRANARY_ENOTFOUND);
    EXPECT(granary_put(s, S("beta"), S("two"), GRANARY_PUT_CREATE_ONLY), GRANARY_OK);
    EXPECT(granary_put(s, S("beta"), S("deux"), GRANARY_PUT_REPLACE_ONLY), GRANARY_OK);
    CHECK(holds(s, "beta", "deux"));
    EXPECT(granary_put(s, S("beta"), S("x"), 7), GRANARY_EINVAL);
    CHECK(last_error_contains("put mode 7"));

    /* Delete. */
    EXPECT(granary_delete(s, S("beta")), GRANARY_OK);
    EXPECT(granary_delete(s, S("beta")), GRANARY_ENOTFOUND);
    char buf[16];
    size_t len = sizeof buf;
    EXPECT(granary_get(s, S("beta"), (uint8_t *)buf, &len), GRANARY_ENOTFOUND);
    CHECK(len == sizeof buf); /* untouched */
    CHECK(last_error_contains("no value"));
    v = (uint8_t *)buf;
    EXPECT(granary_get_alloc(s, S("beta"), &v, &vlen), GRANARY_ENOTFOUND);
    CHECK(v == NULL && vlen == 0);

    /* Bad keys and buffers. */
    EXPECT(granary_put(s, NULL, 0, S("v"), GRANARY_PUT_UPSERT), GRANARY_EKEY);
    CHECK(last_error_contains("key of 0 bytes"));
    EXPECT(granary_put(s, NULL, 5, S("v"), GRANARY_PUT_UPSERT), GRANARY_EINVAL);
    CHECK(last_error_contains("key is NULL"));
    EXPECT(granary_put(s, S("k"), NULL, 3, GRANARY_PUT_UPSERT), GRANARY_EINVAL);
    EXPECT(granary_put(s, S("k"), (const uint8_t *)"v", SIZE_MAX, GRANARY_PUT_UPSERT), GRANARY_EINVAL);
    v = (uint8_t *)buf;
    vlen = 5;
    EXPECT(granary_get_alloc(s, NULL, 3, &v, &vlen), GRANARY_EINVAL);
    CHECK(v == NULL && vlen == 0);
    vlen = 5;
    EXPECT(granary_get_alloc(s, S("alpha"), NULL, &vlen), GRANARY_EINVAL);
    CHECK(vlen == 0);
    /* A NULL length still leaves the value NULL. */
    v = (uint8_t *)buf;
    EXPECT(granary_get_alloc(s, S("alpha"), &v, NULL), GRANARY_EINVAL);
    CHECK(v == NULL);
    EXPECT(granary_get(s, S("alpha"), NULL, NULL), GRANARY_EINVAL);
    len = 8;
    EXPECT(granary_get(s, S("alpha"), NULL, &len), GRANARY_EINVAL);
}

static void test_buffer_too_small(granary_store *s) {
    const char *big = "a value of thirty-two bytes long";
    EXPECT(granary_put(s, S("big"), S(big), GRANARY_PUT_UPSERT), GRANARY_OK);
    char buf[64];
    memset(buf, '#', sizeof buf);
    size_t len = 4;
    EXPECT(granary_get(s, S("big"), (uint8_t *)buf, &len), GRANARY_ETOOSMALL);
    CHECK(len == strlen(big));
    CHECK(buf[0] == '#' && buf[3] == '#'); /* untouched */
    CHECK(last_error_contains("buffer"));
    /* Asking the length only. */
    len = 0;
    EXPECT(granary_get(s, S("big"), NULL, &len), GRANARY_ETOOSMALL);
    CHECK(len == strlen(big));
    /* Exactly large enough. */
    EXPECT(granary_get(s, S("big"), (uint8_t *)buf, &len), GRANARY_OK);
    CHECK(len == strlen(big) && memcmp(buf, big, len) == 0 && buf[len] == '#');
}

struct listing {
    int count;
    int saw_default, saw_users;
};

static int32_t visit_ns(void *ctx, const granary_ns_info *info) {
    struct listing *l = ctx;
    l->count++;
    if (info->name_len == 7 && memcmp(info->name, "default", 7) == 0) l->saw_default = 1;
    if (info->name_len == 5 && memcmp(info->name, "users", 5) == 0 && info->keys == 1 &&
        info->mode == GRANARY_NS_STORE && info->max_keys == 10)
        l->saw_users = 1;
    return 0;
}

static int32_t stop_at_first(void *ctx, const granary_ns_info *info) {
    (void)info;
    ++*(int *)ctx;
    return 1;
}

static void test_namespaces(granary_store *s) {
    granary_ns_options o = {0};
    o.mode = GRANARY_NS_STORE;
    o.max_keys = 10;
    granary_ns *users = NULL;
    EXPECT(granary_ns_create(s, S("users"), &o, &users), GRANARY_OK);
    CHECK(users != NULL);
    granary_ns *again = (granary_ns *)1;
    EXPECT(granary_ns_create(s, S("users"), NULL, &again), GRANARY_ENAMESPACEEXISTS);
    CHECK(again == NULL);
    EXPECT(granary_ns_create(s, S("bad name!"), NULL, &again), GRANARY_EBADNAMESPACE);
    EXPECT(granary_ns_create(s, (const uint8_t *)"\xff", 1, NULL, &again), GRANARY_EINVAL);
    CHECK(last_error_contains("UTF-8"));
    o.mode = 9;
    EXPECT(granary_ns_create(s, S("other"), &o, &again), GRANARY_EINVAL);

    /* Keys of a namespace are apart from the default namespace's. */
    EXPECT(granary_ns_put(users, S("alice"), S("admin"), GRANARY_PUT_UPSERT), GRANARY_OK);
    char buf[32];
    size_t len = sizeof buf;
    EXPECT(granary_ns_get(users, S("alice"), (uint8_t *)buf, &len), GRANARY_OK);
    CHECK(len == 5 && memcmp(buf, "admin", 5) == 0);
    len = sizeof buf;
    EXPECT(granary_get(s, S("alice"), (uint8_t *)buf, &len), GRANARY_ENOTFOUND);
    uint8_t *v = NULL;
    size_t vlen = 0;
    EXPECT(granary_ns_get_alloc(users, S("alice"), &v, &vlen), GRANARY_OK);
    CHECK(vlen == 5 && memcmp(v, "admin", 5) == 0);
    granary_free(v);

    /* A second handle sees the same keys. */
    granary_ns *users2 = NULL;
    EXPECT(granary_ns_open(s, S("users"), &users2), GRANARY_OK);
    len = sizeof buf;
    EXPECT(granary_ns_get(users2, S("alice"), (uint8_t *)buf, &len), GRANARY_OK);
    granary_ns *missing = (granary_ns *)1;
    EXPECT(granary_ns_open(s, S("nobody"), &missing), GRANARY_ENONAMESPACE);
    CHECK(missing == NULL);

    granary_ns_info info;
    EXPECT(granary_ns_stats(users, &info), GRANARY_OK);
    CHECK(info.keys == 1 && info.name_len == 5 && memcmp(info.name, "users", 5) == 0);
    CHECK(info.mode == GRANARY_NS_STORE && info.max_keys == 10 && info.max_bytes == 0);

    struct listing l = {0};
    EXPECT(granary_ns_list(s, visit_ns, &l), GRANARY_OK);
    CHECK(l.count == 2 && l.saw_default && l.saw_users);
    int calls = 0;
    EXPECT(granary_ns_list(s, stop_at_first, &calls), GRANARY_OK);
    CHECK(calls == 1);
    EXPECT(granary_ns_list(s, NULL, NULL), GRANARY_EINVAL);

    /* Quota: ten keys at most. */
    for (int i = 0; i < 9; i++) {
        char key[16];
        snprintf(key, sizeof key, "q%d", i);
        EXPECT(granary_ns_put(users, S(key), S("v"), GRANARY_PUT_UPSERT), GRANARY_OK);
    }
    EXPECT(granary_ns_put(users, S("one-too-many"), S("v"), GRANARY_PUT_UPSERT), GRANARY_EQUOTA);

    EXPECT(granary_ns_delete(users, S("alice")), GRANARY_OK);
    EXPECT(granary_ns_delete(users, S("alice")), GRANARY_ENOTFOUND);

    /* Truncate: empty at once, the handle still valid, the quota free again. */
    EXPECT(granary_ns_truncate(s, S("users")), GRANARY_OK);
    len = sizeof buf;
    EXPECT(granary_ns_get(users, S("q1"), (uint8_t *)buf, &len), GRANARY_ENOTFOUND);
    EXPECT(granary_ns_stats(users, &info), GRANARY_OK);
    CHECK(info.keys == 0);
    for (int i = 0; i < 9; i++) {
        char key[16];
        snprintf(key, sizeof key, "q%d", i);
        EXPECT(granary_ns_put(users, S(key), S("v"), GRANARY_PUT_UPSERT), GRANARY_OK);
    }
    EXPECT(granary_ns_truncate(s, S("nobody")), GRANARY_ENONAMESPACE);

    /* Drop: handles on it refuse calls, and the name is free again. */
    EXPECT(granary_ns_drop(s, S("users")), GRANARY_OK);
    len = sizeof buf;
    EXPECT(granary_ns_get(users, S("q1"), (uint8_t *)buf, &len), GRANARY_ENONAMESPACE);
    EXPECT(granary_ns_drop(s, S("users")), GRANARY_ENONAMESPACE);
    granary_ns *fresh = NULL;
    EXPECT(granary_ns_create(s, S("users"), NULL, &fresh), GRANARY_OK);
    len = sizeof buf;
    EXPECT(granary_ns_get(fresh, S("q1"), (uint8_t *)buf, &len), GRANARY_ENOTFOUND);
    granary_ns_close(fresh);
    granary_ns_close(users2);
    granary_ns_close(users);
    EXPECT(granary_ns_drop(s, S("users")), GRANARY_OK);
}

static void test_batches(granary_store *s) {
    granary_ns *ns = NULL;
    EXPECT(granary_ns_create(s, S("orders"), NULL, &ns), GRANARY_OK);
    EXPECT(granary_put(s, S("gone"), S("soon"), GRANARY_PUT_UPSERT), GRANARY_OK);

    /* Abort discards everything. */
    granary_batch *b = NULL;
    EXPECT(granary_batch_begin(s, &b), GRANARY_OK);
    EXPECT(granary_batch_put(b, NULL, S("b1"), S("v1"), GRANARY_PUT_UPSERT), GRANARY_OK);
    EXPECT(granary_batch_put(b, ns, S("o1"), S("w1"), GRANARY_PUT_UPSERT), GRANARY_OK);
    EXPECT(granary_batch_delete(b, NULL, S("gone")), GRANARY_OK);
    CHECK(granary_batch_len(b) == 3);
    /* The store cannot close under an open batch. */
    EXPECT(granary_close(s), GRANARY_EBUSY);
    CHECK(last_error_contains("batch"));
    granary_batch_abort(b);
    char buf[16];
    size_t len = sizeof buf;
    EXPECT(granary_get(s, S("b1"), (uint8_t *)buf, &len), GRANARY_ENOTFOUND);
    len = sizeof buf;
    EXPECT(granary_ns_get(ns, S("o1"), (uint8_t *)buf, &len), GRANARY_ENOTFOUND);
    CHECK(holds(s, "gone", "soon"));

    /* Commit applies everything. */
    EXPECT(granary_batch_begin(s, &b), GRANARY_OK);
    EXPECT(granary_batch_put(b, NULL, S("b1"), S("v1"), GRANARY_PUT_UPSERT), GRANARY_OK);
    EXPECT(granary_batch_put(b, ns, S("o1"), S("w1"), GRANARY_PUT_CREATE_ONLY), GRANARY_OK);
    EXPECT(granary_batch_delete(b, NULL, S("gone")), GRANARY_OK);
    EXPECT(granary_batch_commit(b, NULL), GRANARY_OK);
    CHECK(holds(s, "b1", "v1"));
    CHECK(!holds(s, "gone", "soon"));
    len = sizeof buf;
    EXPECT(granary_ns_get(ns, S("o1"), (uint8_t *)buf, &len), GRANARY_OK);
    CHECK(len == 2 && memcmp(buf, "w1", 2) == 0);

    /* A failed condition applies nothing and says which operation. */
    EXPECT(granary_batch_begin(s, &b), GRANARY_OK);
    EXPECT(granary_batch_put(b, NULL, S("b2"), S("v2"), GRANARY_PUT_UPSERT), GRANARY_OK);
    EXPECT(granary_batch_put(b, ns, S("o1"), S("w2"), GRANARY_PUT_CREATE_ONLY), GRANARY_OK);
    size_t failed_op = 99;
    EXPECT(granary_batch_commit(b, &failed_op), GRANARY_ECONFLICT);
    CHECK(failed_op == 1);
    CHECK(last_error_contains("operation 1"));
    len = sizeof buf;
    EXPECT(granary_get(s, S("b2"), (uint8_t *)buf, &len), GRANARY_ENOTFOUND);

    /* A key twice is refused at commit, nothing applied. */
    EXPECT(granary_batch_begin(s, &b), GRANARY_OK);
    EXPECT(granary_batch_put(b, NULL, S("b3"), S("x"), GRANARY_PUT_UPSERT), GRANARY_OK);
    EXPECT(granary_batch_put(b, NULL, S("b3"), S("y"), GRANARY_PUT_UPSERT), GRANARY_OK);
    EXPECT(granary_batch_commit(b, NULL), GRANARY_EBATCH);
    CHECK(!holds(s, "b3", "x") && !holds(s, "b3", "y"));

    /* Bad arguments to a batch. */
    EXPECT(granary_batch_begin(s, NULL), GRANARY_EINVAL);
    EXPECT(granary_batch_begin(s, &b), GRANARY_OK);
    EXPECT(granary_batch_put(b, NULL, NULL, 3, S("v"), GRANARY_PUT_UPSERT), GRANARY_EINVAL);
    EXPECT(granary_batch_put(b, NULL, S("k"), S("v"), 3), GRANARY_EINVAL);
    EXPECT(granary_batch_put(NULL, NULL, S("k"), S("v"), GRANARY_PUT_UPSERT), GRANARY_EINVAL);
    /* Sizes past the store's are refused as the op is added, not copied. */
    granary_stats st;
    EXPECT(granary_stats_get(s, &st), GRANARY_OK);
    size_t big_len = (size_t)st.value_bytes_max + 1, key_max = 65536;
    uint8_t *big = calloc(1, big_len > key_max + 1 ? big_len : key_max + 1);
    CHECK(big != NULL);
    EXPECT(granary_batch_put(b, NULL, S("k"), big, big_len, GRANARY_PUT_UPSERT), GRANARY_ETOOLARGE);
    EXPECT(granary_batch_put(b, NULL, big, key_max + 1, S("v"), GRANARY_PUT_UPSERT), GRANARY_EKEY);
    EXPECT(granary_batch_delete(b, NULL, big, key_max + 1), GRANARY_EKEY);
    EXPECT(granary_batch_put(b, NULL, S("k"), big, big_len - 100, GRANARY_PUT_UPSERT), GRANARY_OK);
    CHECK(granary_batch_len(b) == 1);
    free(big);
    granary_batch_abort(b);
    EXPECT(granary_batch_begin(s, &b), GRANARY_OK);
    CHECK(granary_batch_len(b) == 0);
    granary_batch_abort(b);

    granary_ns_close(ns);
}

/* Flags, expiry and CAS values on single operations. */
static void test_items(granary_store *s) {
    granary_item in = {0}, out = {0};
    uint64_t cas1 = 0, cas2 = 0;
    char buf[64];
    size_t len = sizeof buf;
    uint32_t later = (uint32_t)time(NULL) + 3600;

    in.flags = 0xdeadbeef;
    in.expires = later;
    EXPECT(granary_put_item(s, S("item"), S("one"), GRANARY_PUT_UPSERT, &in, &cas1), GRANARY_OK);
    CHECK(cas1 != 0);
    EXPECT(granary_get_item(s, S("item"), (uint8_t *)buf, &len, &out), GRANARY_OK);
    CHECK(len == 3 && memcmp(buf, "one", 3) == 0);
    CHECK(out.flags == 0xdeadbeef && out.expires == later && out.cas == cas1);
    /* The plain calls see the same value. */
    CHECK(holds(s, "item", "one"));
    /* A buffer too small still tells the metadata. */
    memset(&out, 0, sizeof out);
    len = 1;
    EXPECT(granary_get_item(s, S("item"), (uint8_t *)buf, &len, &out), GRANARY_ETOOSMALL);
    CHECK(len == 3 && out.cas == cas1 && out.flags == 0xdeadbeef);

    /* CAS: the right value writes (and changes the CAS value), a stale
       one is refused with EEXISTS, a missing key with ENOTFOUND. */
    in.flags = 7;
    in.expires = 0;
    in.cas = cas1;
    EXPECT(granary_put_item(s, S("item"), S("two"), GRANARY_PUT_CAS, &in, &cas2), GRANARY_OK);
    CHECK(cas2 != 0 && cas2 != cas1);
    uint64_t untouched = 12345;
    EXPECT(granary_put_item(s, S("item"), S("three"), GRANARY_PUT_CAS, &in, &untouched), GRANARY_EEXISTS);
    CHECK(untouched == 12345 && last_error_contains("CAS"));
    CHECK(holds(s, "item", "two"));
    EXPECT(granary_put_item(s, S("no-such-item"), S("x"), GRANARY_PUT_CAS, &in, NULL), GRANARY_ENOTFOUND);
    /* GRANARY_PUT_CAS needs an item (its cas); the plain put has none. */
    EXPECT(granary_put_item(s, S("item"), S("x"), GRANARY_PUT_CAS, NULL, NULL), GRANARY_EINVAL);
    EXPECT(granary_put(s, S("item"), S("x"), GRANARY_PUT_CAS), GRANARY_EINVAL);
    EXPECT(granary_put_item(s, S("item"), S("x"), 4, &in, NULL), GRANARY_EINVAL);
    CHECK(holds(s, "item", "two"));

    /* The other modes with an item; NULL item: flags 0, no expiry. */
    EXPECT(granary_put_item(s, S("item"), S("x"), GRANARY_PUT_CREATE_ONLY, &in, NULL), GRANARY_EEXISTS);
    EXPECT(granary_put_item(s, S("item-new"), S("x"), GRANARY_PUT_REPLACE_ONLY, NULL, NULL), GRANARY_ENOTFOUND);
    EXPECT(granary_put_item(s, S("item-new"), S("x"), GRANARY_PUT_CREATE_ONLY, NULL, &cas1), GRANARY_OK);
    uint8_t *v = NULL;
    memset(&out, 0xff, sizeof out);
    EXPECT(granary_get_item_alloc(s, S("item-new"), &v, &len, &out), GRANARY_OK);
    CHECK(v != NULL && len == 1 && v[0] == 'x');
    CHECK(out.flags == 0 && out.expires == 0 && out.cas == cas1);
    granary_free(v);
    /* granary_put also gives flags 0. */
    EXPECT(granary_put(s, S("item-new"), S("y"), GRANARY_PUT_UPSERT), GRANARY_OK);
    len = 0;
    EXPECT(granary_get_item(s, S("item-new"), NULL, &len, &out), GRANARY_ETOOSMALL);
    CHECK(out.flags == 0 && out.cas != cas1);

    /* An expiry in the past: stored, but reads as absent at once. */
    in.expires = 1;
    EXPECT(granary_put_item(s, S("expired"), S("x"), GRANARY_PUT_UPSERT, &in, NULL), GRANARY_OK);
    len = sizeof buf;
    EXPECT(granary_get_item(s, S("expired"), (uint8_t *)buf, &len, &out), GRANARY_ENOTFOUND);
    CHECK(len == sizeof buf);
    /* ... and counts as absent for the conditions. */
    EXPECT(granary_put_item(s, S("expired"), S("y"), GRANARY_PUT_CREATE_ONLY, NULL, NULL), GRANARY_OK);
    CHECK(holds(s, "expired", "y"));

    /* Delete by CAS value. */
    EXPECT(granary_get_item(s, S("item"), (uint8_t *)buf, &len, &out), GRANARY_OK);
    EXPECT(granary_delete_cas(s, S("item"), out.cas + 1), GRANARY_EEXISTS);
    CHECK(holds(s, "item", "two"));
    EXPECT(granary_delete_cas(s, S("item"), out.cas), GRANARY_OK);
    CHECK(!holds(s, "item", "two"));
    EXPECT(granary_delete_cas(s, S("item"), out.cas), GRANARY_ENOTFOUND);

    /* Bad arguments. */
    EXPECT(granary_get_item(s, S("item-new"), NULL, &len, NULL), GRANARY_EINVAL);
    /* The outputs are cleared on every error, a bad handle's or item's too,
       so freeing *value after any call is safe. */
    v = (uint8_t *)&len;
    len = 99;
    EXPECT(granary_get_item_alloc(s, S("item-new"), &v, &len, NULL), GRANARY_EINVAL);
    CHECK(v == NULL && len == 0);
    v = (uint8_t *)&len;
    len = 99;
    EXPECT(granary_get_alloc(NULL, S("item-new"), &v, &len), GRANARY_EINVAL);
    CHECK(v == NULL && len == 0);
    v = (uint8_t *)&len;
    len = 99;
    EXPECT(granary_ns_get_alloc(NULL, S("item-new"), &v, &len), GRANARY_EINVAL);
    CHECK(v == NULL && len == 0);
    v = (uint8_t *)&len;
    len = 99;
    EXPECT(granary_ns_get_item_alloc(NULL, S("item-new"), &v, &len, &out), GRANARY_EINVAL);
    CHECK(v == NULL && len == 0);
    EXPECT(granary_get_item(NULL, S("k"), NULL, &len, &out), GRANARY_EINVAL);
    EXPECT(granary_put_item(NULL, S("k"), S("v"), GRANARY_PUT_UPSERT, NULL, NULL), GRANARY_EINVAL);
    EXPECT(granary_delete_cas(NULL, S("k"), 1), GRANARY_EINVAL);
    EXPECT(granary_put_item(s, NULL, 0, S("v"), GRANARY_PUT_UPSERT, NULL, NULL), GRANARY_EKEY);

    /* The same calls on a namespace handle, whose default TTL applies to
       items without an expiry. */
    granary_ns_options o = {0};
    o.default_ttl_secs = 3600;
    granary_ns *ns = NULL;
    EXPECT(granary_ns_create(s, S("items"), &o, &ns), GRANARY_OK);
    in.flags = 42;
    in.expires = 0;
    uint32_t before = (uint32_t)time(NULL);
    EXPECT(granary_ns_put_item(ns, S("k"), S("v"), GRANARY_PUT_UPSERT, &in, &cas1), GRANARY_OK);
    len = sizeof buf;
    EXPECT(granary_ns_get_item(ns, S("k"), (uint8_t *)buf, &len, &out), GRANARY_OK);
    CHECK(len == 1 && out.flags == 42 && out.cas == cas1);
    CHECK(out.expires >= before + 3600 && out.expires <= (uint32_t)time(NULL) + 3600);
    in.cas = cas1;
    EXPECT(granary_ns_put_item(ns, S("k"), S("w"), GRANARY_PUT_CAS, &in, &cas2), GRANARY_OK);
    EXPECT(granary_ns_get_item_alloc(ns, S("k"), &v, &len, &out), GRANARY_OK);
    CHECK(len == 1 && v[0] == 'w' && out.cas == cas2);
    granary_free(v);
    /* The key is the namespace's only. */
    len = sizeof buf;
    EXPECT(granary_get(s, S("k"), (uint8_t *)buf, &len), GRANARY_ENOTFOUND);
    EXPECT(granary_ns_delete_cas(ns, S("k"), cas1), GRANARY_EEXISTS);
    EXPECT(granary_ns_delete_cas(ns, S("k"), cas2), GRANARY_OK);
    EXPECT(granary_ns_drop(s, S("items")), GRANARY_OK);
    granary_ns_close(ns);
}

/* CAS conditions in batches, and the CAS values a commit gives. */
static void test_cas_batches(granary_store *s) {
    granary_ns *ns = NULL;
    EXPECT(granary_ns_create(s, S("accounts"), NULL, &ns), GRANARY_OK);
    granary_batch *b = NULL;
    granary_item it = {0};
    uint64_t cas[4] = {0};

    EXPECT(granary_batch_begin(s, &b), GRANARY_OK);
    it.flags = 9;
    EXPECT(granary_batch_put_item(b, ns, S("alice"), S("100"), GRANARY_PUT_CREATE_ONLY, &it), GRANARY_OK);
    EXPECT(granary_batch_put_item(b, ns, S("bob"), S("50"), GRANARY_PUT_UPSERT, NULL), GRANARY_OK);
    EXPECT(granary_batch_check_absent(b, ns, S("carol")), GRANARY_OK);
    EXPECT(granary_batch_commit_cas(b, cas, 4, NULL), GRANARY_OK);
    CHECK(cas[0] != 0 && cas[1] != 0 && cas[0] != cas[1] && cas[2] == 0);
    granary_item out = {0};
    char buf[16];
    size_t len = sizeof buf;
    EXPECT(granary_ns_get_item(ns, S("alice"), (uint8_t *)buf, &len, &out), GRANARY_OK);
    CHECK(len == 3 && out.cas == cas[0] && out.flags == 9);
    uint64_t alice = cas[0], bob = cas[1];

    /* A transfer under CAS conditions: applied when both still hold the
       CAS values read. */
    EXPECT(granary_batch_begin(s, &b), GRANARY_OK);
    it.cas = alice;
    EXPECT(granary_batch_put_item(b, ns, S("alice"), S("90"), GRANARY_PUT_CAS, &it), GRANARY_OK);
    it.cas = bob;
    EXPECT(granary_batch_put_item(b, ns, S("bob"), S("60"), GRANARY_PUT_CAS, &it), GRANARY_OK);
    uint64_t two[2] = {0};
    EXPECT(granary_batch_commit_cas(b, two, 2, NULL), GRANARY_OK);
    CHECK(two[0] != alice && two[1] != bob);

    /* The same transfer again: stale CAS values, nothing applied. */
    EXPECT(granary_batch_begin(s, &b), GRANARY_OK);
    it.cas = two[0];
    EXPECT(granary_batch_put_item(b, ns, S("alice"), S("80"), GRANARY_PUT_CAS, &it), GRANARY_OK);
    it.cas = bob;
    EXPECT(granary_batch_put_item(b, ns, S("bob"), S("70"), GRANARY_PUT_CAS, &it), GRANARY_OK);
    size_t failed_op = 99;
    uint64_t kept[2] = {5, 5};
    EXPECT(granary_batch_commit_cas(b, kept, 2, &failed_op), GRANARY_ECONFLICT);
    CHECK(failed_op == 1 && kept[0] == 5 && kept[1] == 5);
    len = sizeof buf;
    EXPECT(granary_ns_get(ns, S("alice"), (uint8_t *)buf, &len), GRANARY_OK);
    CHECK(len == 2 && memcmp(buf, "90", 2) == 0);

    /* A check alone fails a batch; a delete by CAS value. */
    EXPECT(granary_batch_begin(s, &b), GRANARY_OK);
    EXPECT(granary_batch_check_cas(b, ns, S("bob"), bob), GRANARY_OK);
    EXPECT(granary_batch_delete(b, ns, S("alice")), GRANARY_OK);
    EXPECT(granary_batch_commit(b, &failed_op), GRANARY_ECONFLICT);
    CHECK(failed_op == 0);
    EXPECT(granary_batch_begin(s, &b), GRANARY_OK);
    EXPECT(granary_batch_check_absent(b, ns, S("bob")), GRANARY_OK);
    EXPECT(granary_batch_commit(b, &failed_op), GRANARY_ECONFLICT);
    EXPECT(granary_batch_begin(s, &b), GRANARY_OK);
    EXPECT(granary_batch_check_cas(b, ns, S("bob"), two[1]), GRANARY_OK);
    EXPECT(granary_batch_delete_cas(b, ns, S("alice"), two[0]), GRANARY_OK);
    /* A short cas array gets the first values only. */
    uint64_t one[1] = {7};
    EXPECT(granary_batch_commit_cas(b, one, 1, NULL), GRANARY_OK);
    CHECK(one[0] == 0);
    len = sizeof buf;
    EXPECT(granary_ns_get(ns, S("alice"), (uint8_t *)buf, &len), GRANARY_ENOTFOUND);
    EXPECT(granary_batch_begin(s, &b), GRANARY_OK);
    EXPECT(granary_batch_delete_cas(b, ns, S("bob"), bob), GRANARY_OK);
    EXPECT(granary_batch_commit(b, &failed_op), GRANARY_ECONFLICT);

    /* Bad arguments. */
    EXPECT(granary_batch_begin(s, &b), GRANARY_OK);
    EXPECT(granary_batch_put_item(b, ns, S("k"), S("v"), GRANARY_PUT_CAS, NULL), GRANARY_EINVAL);
    EXPECT(granary_batch_put(b, ns, S("k"), S("v"), GRANARY_PUT_CAS), GRANARY_EINVAL);
    EXPECT(granary_batch_check_cas(NULL, ns, S("k"), 1), GRANARY_EINVAL);
    EXPECT(granary_batch_check_absent(b, ns, NULL, 2), GRANARY_EINVAL);
    CHECK(granary_batch_len(b) == 0);
    EXPECT(granary_batch_put(b, ns, S("k"), S("v"), GRANARY_PUT_UPSERT), GRANARY_OK);
    EXPECT(granary_batch_commit_cas(b, NULL, 1, NULL), GRANARY_EINVAL);
    EXPECT(granary_batch_commit_cas(NULL, cas, 4, NULL), GRANARY_EINVAL);

    EXPECT(granary_ns_drop(s, S("accounts")), GRANARY_OK);
    granary_ns_close(ns);
}

/* Whether the scan gives every key named `prefix`N (N < n) exactly once
   and no key named `other`...; `*total` counts every key it gives. */
static int scan_gives(granary_scan *sc, const char *prefix, int n, const char *other, int *total) {
    char *seen = calloc((size_t)n, 1);
    const uint8_t *k = (const uint8_t *)"x";
    size_t klen = 99;
    int ok = seen != NULL, steps = 0;
    size_t plen = strlen(prefix), olen = strlen(other);
    granary_status st;
    *total = 0;
    /* Bounded: a scan gives each key once. */
    while ((st = granary_scan_next(sc, &k, &klen)) == GRANARY_OK && ++steps < 1000000) {
        ++*total;
        if (olen > 0 && klen >= olen && memcmp(k, other, olen) == 0) ok = 0;
        if (klen > plen && klen < plen + 16 && memcmp(k, prefix, plen) == 0) {
            char digits[16] = {0};
            memcpy(digits, k + plen, klen - plen);
            int i = atoi(digits);
            if (ok && i >= 0 && i < n) {
                if (seen[i]) ok = 0;
                seen[i] = 1;
            }
        }
    }
    if (st != GRANARY_ENOTFOUND || k != NULL || klen != 0) ok = 0;
    for (int i = 0; ok && i < n; i++)
        if (!seen[i]) ok = 0;
    free(seen);
    return ok;
}

static void test_scans(granary_store *s) {
    enum { N = 1500 };
    granary_ns *ns = NULL;
    EXPECT(granary_ns_create(s, S("scanned"), NULL, &ns), GRANARY_OK);
    char key[32];
    for (int i = 0; i < N; i++) {
        snprintf(key, sizeof key, "scan-d-%d", i);
        EXPECT(granary_put(s, S(key), S("v"), GRANARY_PUT_UPSERT), GRANARY_OK);
        snprintf(key, sizeof key, "scan-n-%d", i);
        EXPECT(granary_ns_put(ns, S(key), S("v"), GRANARY_PUT_UPSERT), GRANARY_OK);
    }
    /* Deleted keys do not come. */
    EXPECT(granary_ns_put(ns, S("scan-gone"), S("v"), GRANARY_PUT_UPSERT), GRANARY_OK);
    EXPECT(granary_ns_delete(ns, S("scan-gone")), GRANARY_OK);

    granary_scan *sc = NULL;
    int total = 0;
    EXPECT(granary_ns_scan_open(ns, &sc), GRANARY_OK);
    CHECK(scan_gives(sc, "scan-n-", N, "scan-gone", &total));
    CHECK(total == N);
    /* A complete scan stays complete. */
    const uint8_t *k = NULL;
    size_t klen = 0;
    EXPECT(granary_scan_next(sc, &k, &klen), GRANARY_ENOTFOUND);
    CHECK(last_error_contains("no more keys"));
    granary_scan_close(sc);

    /* The default namespace's scan: its keys, none of the namespace's. */
    EXPECT(granary_scan_open(s, &sc), GRANARY_OK);
    CHECK(scan_gives(sc, "scan-d-", N, "scan-n-", &total));
    CHECK(total >= N);
    granary_scan_close(sc);

    /* A scan outlives its namespace handle, not its namespace. */
    EXPECT(granary_ns_scan_open(ns, &sc), GRANARY_OK);
    granary_ns_close(ns);
    EXPECT(granary_scan_next(sc, &k, &klen), GRANARY_OK);
    CHECK(klen > 7 && memcmp(k, "scan-n-", 7) == 0);
    EXPECT(granary_ns_drop(s, S("scanned")), GRANARY_OK);
    /* Not even the keys of the page read before the drop come. */
    EXPECT(granary_scan_next(sc, &k, &klen), GRANARY_ENONAMESPACE);
    granary_scan_close(sc);
    granary_scan_close(NULL);

    /* An empty namespace. */
    EXPECT(granary_ns_create(s, S("empty"), NULL, &ns), GRANARY_OK);
    EXPECT(granary_ns_scan_open(ns, &sc), GRANARY_OK);
    EXPECT(granary_scan_next(sc, &k, &klen), GRANARY_ENOTFOUND);
    CHECK(k == NULL && klen == 0);
    granary_scan_close(sc);
    EXPECT(granary_ns_drop(s, S("empty")), GRANARY_OK);
    granary_ns_close(ns);

    /* Bad arguments. */
    sc = (granary_scan *)1;
    EXPECT(granary_scan_open(NULL, &sc), GRANARY_EINVAL);
    CHECK(sc == NULL);
    EXPECT(granary_scan_open(s, NULL), GRANARY_EINVAL);
    EXPECT(granary_ns_scan_open(NULL, &sc), GRANARY_EINVAL);
    EXPECT(granary_scan_next(NULL, &k, &klen), GRANARY_EINVAL);
    EXPECT(granary_scan_open(s, &sc), GRANARY_OK);
    EXPECT(granary_scan_next(sc, NULL, &klen), GRANARY_EINVAL);
    EXPECT(granary_scan_next(sc, &k, NULL), GRANARY_EINVAL);
    granary_scan_close(sc);

    /* A complete scan stays complete after its store is closed. */
    granary_store *other = NULL;
    EXPECT(granary_create_memory(16 << 20, NULL, &other), GRANARY_OK);
    EXPECT(granary_scan_open(other, &sc), GRANARY_OK);
    EXPECT(granary_scan_next(sc, &k, &klen), GRANARY_ENOTFOUND);
    EXPECT(granary_close(other), GRANARY_OK);
    EXPECT(granary_scan_next(sc, &k, &klen), GRANARY_ENOTFOUND);
    granary_scan_close(sc);

    /* A scan outliving its store: GRANARY_ECLOSED. */
    EXPECT(granary_create_memory(16 << 20, NULL, &other), GRANARY_OK);
    EXPECT(granary_put(other, S("k"), S("v"), GRANARY_PUT_UPSERT), GRANARY_OK);
    EXPECT(granary_scan_open(other, &sc), GRANARY_OK);
    EXPECT(granary_close(other), GRANARY_OK);
    EXPECT(granary_scan_next(sc, &k, &klen), GRANARY_ECLOSED);
    granary_scan_close(sc);
    /* ... even with keys of a page read before the close left. */
    EXPECT(granary_create_memory(16 << 20, NULL, &other), GRANARY_OK);
    EXPECT(granary_put(other, S("k1"), S("v"), GRANARY_PUT_UPSERT), GRANARY_OK);
    EXPECT(granary_put(other, S("k2"), S("v"), GRANARY_PUT_UPSERT), GRANARY_OK);
    EXPECT(granary_scan_open(other, &sc), GRANARY_OK);
    EXPECT(granary_scan_next(sc, &k, &klen), GRANARY_OK);
    EXPECT(granary_close(other), GRANARY_OK);
    EXPECT(granary_scan_next(sc, &k, &klen), GRANARY_ECLOSED);
    granary_scan_close(sc);
}

struct exports {
    int count, saw_disk;
};

static int32_t visit_export(void *ctx, const granary_ns_info *info) {
    struct exports *e = ctx;
    e->count++;
    if (info->name_len == 4 && memcmp(info->name, "disk", 4) == 0 && info->export_bytes == (1 << 20) &&
        info->block_bytes == 4096 && info->mode == GRANARY_NS_STORE)
        e->saw_disk = 1;
    return 0;
}

static int32_t visit_kinds(void *ctx, const granary_ns_info *info) {
    /* Namespaces of keys and values have no export size. */
    if (!(info->name_len == 4 && memcmp(info->name, "disk", 4) == 0) && (info->export_bytes || info->block_bytes))
        ++*(int *)ctx;
    return 0;
}

static void test_exports(granary_store *s) {
    struct exports e = {0};
    EXPECT(granary_export_list(s, visit_export, &e), GRANARY_OK);
    CHECK(e.count == 0);
    granary_ns *disk = NULL;
    EXPECT(granary_export_create(s, S("disk"), 1 << 20, 4096, &disk), GRANARY_OK);
    CHECK(disk != NULL);
    granary_ns *plain = NULL;
    EXPECT(granary_ns_create(s, S("plain"), NULL, &plain), GRANARY_OK);
    EXPECT(granary_export_list(s, visit_export, &e), GRANARY_OK);
    CHECK(e.count == 1 && e.saw_disk);
    int wrong = 0;
    EXPECT(granary_ns_list(s, visit_kinds, &wrong), GRANARY_OK);
    CHECK(wrong == 0);
    granary_ns_info info;
    EXPECT(granary_ns_stats(disk, &info), GRANARY_OK);
    CHECK(info.export_bytes == (1 << 20) && info.block_bytes == 4096);
    EXPECT(granary_ns_stats(plain, &info), GRANARY_OK);
    CHECK(info.export_bytes == 0 && info.block_bytes == 0);

    /* Refused: a block size that is not a power of two, a size that is
       not a multiple of it, a name taken. */
    granary_ns *bad = (granary_ns *)1;
    EXPECT(granary_export_create(s, S("bad"), 1 << 20, 1000, &bad), GRANARY_EBADNAMESPACE);
    CHECK(bad == NULL);
    EXPECT(granary_export_create(s, S("bad"), 5000, 4096, &bad), GRANARY_EBADNAMESPACE);
    EXPECT(granary_export_create(s, S("disk"), 1 << 20, 4096, &bad), GRANARY_ENAMESPACEEXISTS);
    EXPECT(granary_export_create(NULL, S("x"), 1 << 20, 4096, &bad), GRANARY_EINVAL);
    EXPECT(granary_export_list(s, NULL, NULL), GRANARY_EINVAL);

    /* Dropped as any namespace. */
    EXPECT(granary_ns_drop(s, S("disk")), GRANARY_OK);
    EXPECT(granary_ns_drop(s, S("plain")), GRANARY_OK);
    e.count = 0;
    EXPECT(granary_export_list(s, visit_export, &e), GRANARY_OK);
    CHECK(e.count == 0);
    granary_ns_close(disk);
    granary_ns_close(plain);
}

/* A namespace handle of one store is refused by another store's batch. */
static void test_foreign_namespace(granary_store *s) {
    granary_store *other = NULL;
    EXPECT(granary_create_memory(16 << 20, NULL, &other), GRANARY_OK);
    granary_ns *ns = NULL;
    EXPECT(granary_ns_create(other, S("theirs"), NULL, &ns), GRANARY_OK);
    granary_batch *b = NULL;
    EXPECT(granary_batch_begin(s, &b), GRANARY_OK);
    EXPECT(granary_batch_put(b, ns, S("k"), S("v"), GRANARY_PUT_UPSERT), GRANARY_EINVAL);
    CHECK(last_error_contains("another store"));
    granary_batch_abort(b);
    EXPECT(granary_close(other), GRANARY_OK);
    /* The handle outlived its store: calls are refused, not a crash. */
    size_t len = 0;
    EXPECT(granary_ns_get(ns, S("k"), NULL, &len), GRANARY_ECLOSED);
    EXPECT(granary_ns_put(ns, S("k"), S("v"), GRANARY_PUT_UPSERT), GRANARY_ECLOSED);
    granary_ns_info info;
    EXPECT(granary_ns_stats(ns, &info), GRANARY_ECLOSED);
    granary_scan *sc = (granary_scan *)&info;
    EXPECT(granary_ns_scan_open(ns, &sc), GRANARY_ECLOSED);
    CHECK(sc == NULL);
    granary_ns_close(ns);
}

static int32_t find_keys(void *ctx, const char *name, size_t name_len, const char *value, size_t value_len) {
    if (name_len == 4 && memcmp(name, "keys", 4) == 0 && value_len < 32) {
        char text[32];
        memcpy(text, value, value_len);
        text[value_len] = 0;
        *(long long *)ctx = atoll(text);
        return 1;
    }
    return 0;
}

static void test_stats_and_verify(granary_store *s) {
    granary_stats st;
    EXPECT(granary_stats_get(s, &st), GRANARY_OK);
    CHECK(st.keys > 0 && st.puts > 0 && st.gets > 0 && st.device_bytes == (64 << 20));
    CHECK(st.value_bytes_max > 0 && st.segments_free <= st.segments);
    long long keys = -1;
    EXPECT(granary_stats_each(s, find_keys, &keys), GRANARY_OK);
    CHECK(keys == (long long)st.keys);
    EXPECT(granary_stats_each(s, NULL, NULL), GRANARY_EINVAL);
    granary_verify_report r;
    memset(&r, 0xff, sizeof r);
    EXPECT(granary_verify(s, &r), GRANARY_OK);
    CHECK(r.errors == 0 && r.entries_checked > 0 && r.segments_scanned > 0);
    EXPECT(granary_verify(s, NULL), GRANARY_OK);
    EXPECT(granary_sync(s), GRANARY_OK);
}

#define THREADS 4
#define KEYS_PER_THREAD 200

struct worker {
    granary_store *s;
    int id;
    int errors;
};

static void *work(void *arg) {
    struct worker *w = arg;
    for (int i = 0; i < KEYS_PER_THREAD; i++) {
        char key[32], value[32], buf[32];
        int n = snprintf(key, sizeof key, "t%d-%d", w->id, i);
        int m = snprintf(value, sizeof value, "value %d of %d", i, w->id);
        if (granary_put(w->s, (const uint8_t *)key, n, (const uint8_t *)value, m, GRANARY_PUT_UPSERT) != GRANARY_OK) {
            w->errors++;
            continue;
        }
        size_t len = sizeof buf;
        if (granary_get(w->s, (const uint8_t *)key, n, (uint8_t *)buf, &len) != GRANARY_OK || len != (size_t)m ||
            memcmp(buf, value, len) != 0)
            w->errors++;
        /* Each thread's failures have their own message. */
        if (granary_delete(w->s, (const uint8_t *)"never-written", 13) != GRANARY_ENOTFOUND ||
            !last_error_contains("no value"))
            w->errors++;
    }
    return NULL;
}

static void test_threads(granary_store *s) {
    pthread_t t[THREADS];
    struct worker w[THREADS];
    for (int i = 0; i < THREADS; i++) {
        w[i] = (struct worker){s, i, 0};
        CHECK(pthread_create(&t[i], NULL, work, &w[i]) == 0);
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        CHECK(w[i].errors == 0);
    }
}

/* A writer that puts keys w<id>-<n> through a namespace handle until the
   store is closed under it. */
struct racer {
    granary_ns *ns;
    int id;
    int ok;    /* puts acknowledged: keys 0..ok-1 */
    int other; /* statuses other than OK and ECLOSED */
};

static void *race(void *arg) {
    struct racer *r = arg;
    for (int n = 0; n < 1000000; n++) {
        char key[32];
        snprintf(key, sizeof key, "w%d-%d", r->id, n);
        granary_status st = granary_ns_put(r->ns, S(key), S("v"), GRANARY_PUT_UPSERT);
        if (st == GRANARY_OK) {
            r->ok++;
        } else {
            if (st != GRANARY_ECLOSED) r->other++;
            break;
        }
    }
    return NULL;
}

/* Namespace handles' calls racing granary_close: each is acknowledged
   (and then kept, and counted in the namespace's figures after a reopen)
   or refused with GRANARY_ECLOSED; the close waits for those under way. */
static void test_close_during_namespace_calls(const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/race.granary", dir);
    enum { WRITERS = 2, ROUNDS = 5 };
    granary_store *s = NULL;
    EXPECT(granary_create(S(path), 32 << 20, NULL, &s), GRANARY_OK);
    granary_ns *made = NULL;
    EXPECT(granary_ns_create(s, S("race"), NULL, &made), GRANARY_OK);
    granary_ns_close(made);
    EXPECT(granary_close(s), GRANARY_OK);
    uint64_t total = 0;
    for (int round = 0; round < ROUNDS; round++) {
        EXPECT(granary_open(S(path), NULL, &s), GRANARY_OK);
        if (s == NULL) return;
        pthread_t t[WRITERS];
        struct racer r[WRITERS];
        for (int i = 0; i < WRITERS; i++) {
            r[i] = (struct racer){NULL, round * WRITERS + i, 0, 0};
            EXPECT(granary_ns_open(s, S("race"), &r[i].ns), GRANARY_OK);
            CHECK(pthread_create(&t[i], NULL, race, &r[i]) == 0);
        }
        /* Close once every writer has had a put acknowledged. */
        for (int i = 0; i < WRITERS; i++) {
            char key[32];
            snprintf(key, sizeof key, "w%d-0", r[i].id);
            char buf[8];
            size_t len = sizeof buf;
            while (granary_ns_get(r[i].ns, S(key), (uint8_t *)buf, &len) == GRANARY_ENOTFOUND) len = sizeof buf;
        }
        EXPECT(granary_close(s), GRANARY_OK);
        for (int i = 0; i < WRITERS; i++) {
            pthread_join(t[i], NULL);
            CHECK(r[i].ok > 0 && r[i].other == 0);
            total += (uint64_t)r[i].ok;
            granary_ns_close(r[i].ns);
        }
        /* Reopened: every acknowledged key is there, and counted. */
        EXPECT(granary_open(S(path), NULL, &s), GRANARY_OK);
        if (s == NULL) return;
        granary_ns *ns = NULL;
        EXPECT(granary_ns_open(s, S("race"), &ns), GRANARY_OK);
        int kept = 1;
        for (int i = 0; i < WRITERS; i++) {
            for (int n = 0; n < r[i].ok; n++) {
                char key[32], buf[8];
                size_t len = sizeof buf;
                snprintf(key, sizeof key, "w%d-%d", r[i].id, n);
                kept &= granary_ns_get(ns, S(key), (uint8_t *)buf, &len) == GRANARY_OK;
            }
        }
        CHECK(kept);
        granary_ns_info info;
        EXPECT(granary_ns_stats(ns, &info), GRANARY_OK);
        if (info.keys != total)
            fprintf(stderr, "round %d: the namespace counts %llu keys, %llu were acknowledged\n", round,
                    (unsigned long long)info.keys, (unsigned long long)total);
        CHECK(info.keys == total);
        granary_ns_close(ns);
        EXPECT(granary_verify(s, NULL), GRANARY_OK);
        EXPECT(granary_close(s), GRANARY_OK);
    }
}

static void test_file_store(const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/store.granary", dir);
    granary_store *s = NULL;
    EXPECT(granary_open(S(path), NULL, &s), GRANARY_ENOTSTORE);
    CHECK(s == NULL && last_error_contains("no store"));

    granary_options o;
    EXPECT(granary_options_init(&o), GRANARY_OK);
    o.durability = GRANARY_DURABILITY_FLUSH;
    EXPECT(granary_create(S(path), 32 << 20, &o, &s), GRANARY_OK);
    for (int i = 0; i < 100; i++) {
        char key[16], value[16];
        snprintf(key, sizeof key, "key%d", i);
        snprintf(value, sizeof value, "val%d", i);
        EXPECT(granary_put(s, S(key), S(value), GRANARY_PUT_UPSERT), GRANARY_OK);
    }
    EXPECT(granary_delete(s, S("key7")), GRANARY_OK);
    granary_ns *ns = NULL;
    EXPECT(granary_ns_create(s, S("kept"), NULL, &ns), GRANARY_OK);
    EXPECT(granary_ns_put(ns, S("k"), S("in a namespace"), GRANARY_PUT_UPSERT), GRANARY_OK);
    granary_batch *b = NULL;
    EXPECT(granary_batch_begin(s, &b), GRANARY_OK);
    EXPECT(granary_batch_put(b, ns, S("batched"), S("yes"), GRANARY_PUT_CREATE_ONLY), GRANARY_OK);
    EXPECT(granary_batch_delete(b, NULL, S("key8")), GRANARY_OK);
    EXPECT(granary_batch_commit(b, NULL), GRANARY_OK);
    granary_ns_close(ns);
    EXPECT(granary_close(s), GRANARY_OK);

    /* Creating over it is refused; the store is untouched. */
    granary_store *dup = (granary_store *)1;
    CHECK(granary_create(S(path), 32 << 20, NULL, &dup) != GRANARY_OK);
    CHECK(dup == NULL);

    o.durability = 5;
    EXPECT(granary_open(S(path), &o, &s), GRANARY_EINVAL);
    o.durability = GRANARY_DURABILITY_DIRECT;
    EXPECT(granary_open(S(path), &o, &s), GRANARY_OK);
    /* One handle at a time: the file is locked while open. */
    granary_store *twice = (granary_store *)1;
    EXPECT(granary_open(S(path), NULL, &twice), GRANARY_EIO);
    CHECK(twice == NULL && last_error_contains("in use"));
    int intact = 1;
    for (int i = 0; i < 100; i++) {
        char key[16], value[16];
        snprintf(key, sizeof key, "key%d", i);
        snprintf(value, sizeof value, "val%d", i);
        if (i == 7 || i == 8) {
            char buf[16];
            size_t len = sizeof buf;
            intact &= granary_get(s, S(key), (uint8_t *)buf, &len) == GRANARY_ENOTFOUND;
        } else {
            intact &= holds(s, key, value);
        }
    }
    CHECK(intact);
    EXPECT(granary_ns_open(s, S("kept"), &ns), GRANARY_OK);
    char buf[32];
    size_t len = sizeof buf;
    EXPECT(granary_ns_get(ns, S("k"), (uint8_t *)buf, &len), GRANARY_OK);
    CHECK(len == 14 && memcmp(buf, "in a namespace", 14) == 0);
    len = sizeof buf;
    EXPECT(granary_ns_get(ns, S("batched"), (uint8_t *)buf, &len), GRANARY_OK);
    CHECK(len == 3 && memcmp(buf, "yes", 3) == 0);
    /* One buffer for the key and the value read. */
    memcpy(buf, "batched", 7);
    len = sizeof buf;
    EXPECT(granary_ns_get(ns, (const uint8_t *)buf, 7, (uint8_t *)buf, &len), GRANARY_OK);
    CHECK(len == 3 && memcmp(buf, "yes", 3) == 0);
    EXPECT(granary_verify(s, NULL), GRANARY_OK);
    /* Closed with a namespace handle still open: the file is let go all
       the same (the handle's calls are refused). */
    EXPECT(granary_close(s), GRANARY_OK);
    EXPECT(granary_ns_get(ns, S("k"), (uint8_t *)buf, &len), GRANARY_ECLOSED);
    EXPECT(granary_open(S(path), NULL, &s), GRANARY_OK);
    CHECK(holds(s, "key1", "val1"));
    granary_ns_close(ns);
    EXPECT(granary_close(s), GRANARY_OK);

    /* A path that holds something else is not a store. */
    snprintf(path, sizeof path, "%s/not-a-store", dir);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (f) {
        char junk[8192];
        memset(junk, 'x', sizeof junk);
        fwrite(junk, 1, sizeof junk, f);
        fclose(f);
    }
    o.buffered = 1;
    EXPECT(granary_open(S(path), &o, &s), GRANARY_ENOTSTORE);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s FOLDER\n", argv[0]);
        return 2;
    }
    test_null_arguments();
    test_status_names();

    granary_store *s = NULL;
    EXPECT(granary_create_memory(64 << 20, NULL, &s), GRANARY_OK);
    if (s == NULL) {
        fprintf(stderr, "no store: %s\n", granary_last_error_message(NULL));
        return 1;
    }
    test_put_get_delete(s);
    test_buffer_too_small(s);
    test_namespaces(s);
    test_batches(s);
    test_foreign_namespace(s);
    test_items(s);
    test_cas_batches(s);
    test_scans(s);
    test_exports(s);
    test_threads(s);
    test_stats_and_verify(s);
    EXPECT(granary_close(s), GRANARY_OK);

    test_file_store(argv[1]);
    test_close_during_namespace_calls(argv[1]);

    printf("c api: %d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
