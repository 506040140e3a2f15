/*
 * The C API's test, in C: compiled against include/granary.h, linked with
 * libgranary_capi.a and run by tests/c_api.rs, which passes a fresh folder
 * for the file-backed store as argv[1]. Every check prints what failed;
 * the program exits 1 if any did, and prints "N passed, 0 failed" if none.
 */
#include "granary.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

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
    CHECK(granary_batch_len(b) == 0);
    granary_batch_abort(b);

    granary_ns_close(ns);
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
    granary_ns_close(ns);
    EXPECT(granary_verify(s, NULL), GRANARY_OK);
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
    test_threads(s);
    test_stats_and_verify(s);
    EXPECT(granary_close(s), GRANARY_OK);

    test_file_store(argv[1]);

    printf("c api: %d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
