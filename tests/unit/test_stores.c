/* stores: key encoding, URL handling, backoff and Retry-After, S3 XML,
 * store specs, and the upload queue's state transitions (a real SQLite
 * database in a scratch folder). Expected values come from RFC 3986,
 * RFC 4648 and the S3 documentation, not from the code under test. */
#include "tests/unit/test_main.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "stores/net.h"
#include "stores/queue.h"
#include "stores/store.h"
#include "stores/uploader.h"
#include "common/codec.h"

#include <dirent.h>
#include <sqlite3.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static void key_encoding(void **state)
{
    char out[256];
    assert_int_equal(ck_store_encode(out, sizeof out, "step=100/model.safetensors", true), 0);
    assert_string_equal(out, "step%3D100/model.safetensors");
    assert_int_equal(ck_store_encode(out, sizeof out, "a b+c~d_e-f.g", true), 0);
    assert_string_equal(out, "a%20b%2Bc~d_e-f.g");
    assert_int_equal(ck_store_encode(out, sizeof out, "a/b", false), 0);
    assert_string_equal(out, "a%2Fb");
    /* UTF-8 bytes each become %XX, upper-case hex */
    assert_int_equal(ck_store_encode(out, sizeof out, "\xc3\xa9", true), 0);
    assert_string_equal(out, "%C3%A9");
    /* an upload id with '=' and '+' (canonical query values) */
    assert_int_equal(ck_store_encode(out, sizeof out, "ab+/=", false), 0);
    assert_string_equal(out, "ab%2B%2F%3D");
    /* does not fit: an error, never a truncated name */
    assert_int_equal(ck_store_encode(out, 6, "a b c", true), CK_ESIZE);
    assert_int_equal(ck_store_encode(out, 4, "abcd", true), CK_ESIZE);
}

static void join_and_redact(void **state)
{
    char out[256];
    assert_int_equal(ck_store_join_key(out, sizeof out, "prefix/", "/a/b"), 0);
    assert_string_equal(out, "prefix/a/b");
    assert_int_equal(ck_store_join_key(out, sizeof out, "", "a"), 0);
    assert_string_equal(out, "a");
    assert_int_equal(ck_store_join_key(out, sizeof out, NULL, "a"), 0);
    assert_string_equal(out, "a");
    ck_store_url_redact(out, sizeof out, "https://user:pw@host/x/y?X-Amz-Signature=abc");
    assert_string_equal(out, "https://host/x/y?...");
    assert_null(strstr(out, "pw"));
    assert_null(strstr(out, "abc"));
    ck_store_url_redact(out, sizeof out, "sftp://root@127.0.0.1:22/data");
    assert_string_equal(out, "sftp://root@127.0.0.1:22/data");
}

static void base64_and_hex(void **state)
{
    /* RFC 4648 test vectors */
    char out[64];
    ck_codec_base64(out, (const unsigned char *)"f", 1);
    assert_string_equal(out, "Zg==");
    ck_codec_base64(out, (const unsigned char *)"fo", 2);
    assert_string_equal(out, "Zm8=");
    ck_codec_base64(out, (const unsigned char *)"foobar", 6);
    assert_string_equal(out, "Zm9vYmFy");
    unsigned char bin[16];
    /* MD5("") = d41d8cd98f00b204e9800998ecf8427e; Content-MD5 of an empty body is
     * 1B2M2Y8AsgTpgAmY7PhCfg== (RFC 1864 form, as the S3 documentation shows) */
    assert_int_equal(ck_codec_unhex(bin, sizeof bin, "d41d8cd98f00b204e9800998ecf8427e"), 16);
    ck_codec_base64(out, bin, 16);
    assert_string_equal(out, "1B2M2Y8AsgTpgAmY7PhCfg==");
    assert_int_equal(ck_codec_unhex(bin, sizeof bin, "zz"), -1);
    assert_int_equal(ck_codec_unhex(bin, sizeof bin, "abc"), -1);
}

static void backoff(void **state)
{
    /* base 0.5 s doubling, capped at 60 s, jitter in the upper half */
    assert_true(ck_backoff_delay(0, 0.5, 60, 0, 0.0) >= 0.25);
    assert_true(ck_backoff_delay(0, 0.5, 60, 0, 0.999) <= 0.5);
    assert_true(ck_backoff_delay(3, 0.5, 60, 0, 0.0) >= 2.0);
    assert_true(ck_backoff_delay(3, 0.5, 60, 0, 0.999) <= 4.0);
    assert_true(ck_backoff_delay(20, 0.5, 60, 0, 0.999) <= 60.0);
    assert_true(ck_backoff_delay(20, 0.5, 60, 0, 0.0) >= 30.0);
    /* a server's Retry-After wins when longer */
    assert_true(ck_backoff_delay(0, 0.5, 60, 7, 0.5) == 7.0);
    /* huge exponents do not overflow */
    double d = ck_backoff_delay(1000, 0.5, 60, 0, 0.5);
    assert_true(d >= 30.0 && d <= 60.0);
}

static void retry_after(void **state)
{
    assert_true(ck_parse_retry_after("120", 0) == 120.0);
    assert_true(ck_parse_retry_after(" 3", 0) == 3.0);
    /* RFC 9110's example date: Sun, 06 Nov 1994 08:49:37 GMT = 784111777 */
    assert_true(ck_parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", 784111777 - 30) == 30.0);
    assert_true(ck_parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", 784111777 + 30) == 0.0);
    assert_true(ck_parse_retry_after("soon", 0) < 0);
    assert_true(ck_parse_retry_after("", 0) < 0);
}

static void retryable(void **state)
{
    assert_true(ck_net_is_retryable(500, NULL));
    assert_true(ck_net_is_retryable(503, "SlowDown"));
    assert_true(ck_net_is_retryable(400, "RequestTimeout"));
    assert_true(ck_net_is_retryable(429, NULL));
    assert_true(ck_net_is_retryable(0, NULL)); /* no answer: connection failed */
    assert_false(ck_net_is_retryable(404, "NoSuchKey"));
    assert_false(ck_net_is_retryable(400, "InvalidArgument"));
    /* a conditional write: another in flight is retried, the key taken is final */
    assert_true(ck_net_is_retryable(409, "ConditionalRequestConflict"));
    assert_false(ck_net_is_retryable(409, "BucketAlreadyExists"));
    assert_false(ck_net_is_retryable(412, "PreconditionFailed"));
}

static void xml(void **state)
{
    char out[64];
    const char *body =
        "<?xml version=\"1.0\"?><InitiateMultipartUploadResult><Bucket>b</Bucket>"
        "<Key>k</Key><UploadId>a&amp;b&lt;c</UploadId></InitiateMultipartUploadResult>";
    assert_true(ck_xml_tag(body, "UploadId", out, sizeof out));
    assert_string_equal(out, "a&b<c");
    assert_false(ck_xml_tag(body, "Code", out, sizeof out));
    assert_false(ck_xml_tag("<Code>unterminated", "Code", out, sizeof out));
    /* a value longer than the buffer is not reported as complete */
    assert_false(ck_xml_tag("<Code>0123456789</Code>", "Code", out, 4));
}

static void spec_checks(void **state)
{
    struct ck_store_spec s = {0};
    assert_int_equal(ck_store_spec_set(&s, "url", "s3://bucket/prefix"), 0);
    assert_int_equal(ck_store_spec_set(&s, "endpoint", "http://127.0.0.1:9000"), 0);
    assert_int_equal(ck_store_check(&s), 0);
    assert_int_equal(ck_store_spec_set(&s, "credentials", "AKIAEXAMPLE:secret"), 0);
    assert_int_equal(ck_store_check(&s), CK_ECONFIG);
    assert_null(strstr(ck_error_msg(), "secret"));
    assert_int_equal(ck_store_spec_set(&s, "credentials", "file:/etc/ckptd/aws"), 0);
    assert_int_equal(ck_store_check(&s), 0);
    assert_int_equal(ck_store_spec_set(&s, "url", "s3://Bad_Bucket/x"), 0);
    assert_int_equal(ck_store_check(&s), CK_ECONFIG);
    assert_int_equal(ck_store_spec_set(&s, "url", "gopher://x/y"), 0);
    assert_int_equal(ck_store_check(&s), CK_ECONFIG);
    assert_int_equal(ck_store_spec_set(&s, "url", "sftp://root@host/data"), 0);
    assert_int_equal(ck_store_check(&s), CK_ECONFIG); /* no key, no pinned host key */
    assert_int_equal(ck_store_spec_set(&s, "key", "/k"), 0);
    assert_int_equal(
        ck_store_spec_set(&s, "host_key", "SHA256:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU"), 0);
    assert_int_equal(ck_store_spec_set(&s, "credentials", "env:PASSPHRASE"), 0);
    assert_int_equal(ck_store_check(&s), 0);
    assert_int_equal(ck_store_spec_set(&s, "url", "http://user:pw@host/x"), 0);
    assert_int_equal(ck_store_check(&s), CK_ECONFIG);
    assert_int_equal(ck_store_spec_set(&s, "url", "file://relative"), 0);
    assert_int_equal(ck_store_check(&s), CK_ECONFIG);
    assert_int_equal(ck_store_spec_set(&s, "compress", "gzip"), CK_ECONFIG);
    assert_int_equal(ck_store_spec_set(&s, "nonsense", "1"), CK_ENOENT);
    ck_store_spec_release(&s);
}

/* ---- the queue ---- */

static sqlite3 *open_db(char *dir)
{
    char path[4200];
    sqlite3 *db;
    ck_test_tmpdir(dir, "queue");
    snprintf(path, sizeof path, "%s/state.db", dir);
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    sqlite3_exec(db, "PRAGMA journal_mode=WAL; PRAGMA foreign_keys=ON", NULL, NULL, NULL);
    assert_int_equal(ck_queue_init(db), 0);
    assert_int_equal(ck_queue_init(db), 0); /* idempotent */
    return db;
}

static void write_file(const char *path, const char *data)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(data, f);
    fclose(f);
}

static int64_t store_row(sqlite3 *db, const char *url)
{
    struct ck_store_spec s = {0};
    int64_t id;
    ck_store_spec_set(&s, "url", url);
    assert_int_equal(ck_queue_store_put(db, &s, &id), 0);
    ck_store_spec_release(&s);
    return id;
}

/* Every path that gives up a multipart upload id of a job not done records
 * it for an abort; a done job's id (a completed upload) never. */
static size_t abandoned_ids(sqlite3 *db, char out[][16], size_t max)
{
    struct ck_abandoned *v;
    size_t n;
    assert_int_equal(ck_queue_abandoned(db, 100, &v, &n), 0);
    for (size_t i = 0; i < n && i < max; i++)
        snprintf(out[i], 16, "%s", v[i].upload_id);
    ck_queue_abandoned_release(v, n);
    return n;
}

static void queue_records_abandoned_uploads(void **state)
{
    (void)state;
    char dir[4096], a[4200], b[4200], c[4200], ids[8][16];
    sqlite3 *db = open_db(dir);
    snprintf(a, sizeof a, "%s/a.bin", dir);
    snprintf(b, sizeof b, "%s/b.bin", dir);
    snprintf(c, sizeof c, "%s/c.bin", dir);
    write_file(a, "aaaa");
    write_file(b, "bbbb");
    write_file(c, "cccc");
    int64_t sid = store_row(db, "s3://bkt/p"), ja, jb, jc;
    bool added;
    assert_int_equal(ck_queue_add(db, sid, a, "a.bin", 0, CK_JOB_FILE, &ja, &added), 0);
    assert_int_equal(ck_queue_add(db, sid, b, "b.bin", 0, CK_JOB_FILE, &jb, &added), 0);
    assert_int_equal(ck_queue_add(db, sid, c, "c.bin", 0, CK_JOB_FILE, &jc, &added), 0);
    /* begun, then the file changed: the source reset drops the id */
    assert_int_equal(ck_queue_set_upload(db, ja, "UPA", 5u << 20), 0);
    assert_int_equal(abandoned_ids(db, ids, 8), 0);
    assert_int_equal(ck_queue_reset_source(db, ja, 5, 1), 0);
    assert_int_equal(abandoned_ids(db, ids, 8), 1);
    assert_string_equal(ids[0], "UPA");
    /* a new upload of the same job, completed: its id stays off the list,
     * and so does a done job sent again (the store lost it) */
    assert_int_equal(ck_queue_set_upload(db, ja, "UPA2", 5u << 20), 0);
    assert_int_equal(ck_queue_done(db, ja, "", "md5"), 0);
    bool redone;
    assert_int_equal(ck_queue_redo(db, sid, "a.bin", &redone), 0);
    assert_true(redone);
    assert_int_equal(abandoned_ids(db, ids, 8), 1);
    /* a pending job replaced by another file under its key: deleted with its id */
    assert_int_equal(ck_queue_set_upload(db, jb, "UPB", 5u << 20), 0);
    write_file(b, "bbbbbbbb");
    int64_t jb2;
    assert_int_equal(ck_queue_add(db, sid, b, "b.bin", 0, CK_JOB_FILE, &jb2, &added), 0);
    assert_true(jb2 != jb);
    assert_int_equal(abandoned_ids(db, ids, 8), 2);
    assert_string_equal(ids[1], "UPB");
    /* a gone job pruned with its id */
    assert_int_equal(ck_queue_set_upload(db, jc, "UPC", 5u << 20), 0);
    assert_int_equal(ck_queue_gone(db, jc, "removed"), 0);
    assert_int_equal(ck_queue_prune(db, -10), 0);
    assert_int_equal(abandoned_ids(db, ids, 8), 3);
    assert_string_equal(ids[2], "UPC");
    /* settled: a failed abort counted, an aborted one forgotten */
    struct ck_abandoned *v;
    size_t n;
    assert_int_equal(ck_queue_abandoned(db, 100, &v, &n), 0);
    assert_int_equal(ck_queue_abandoned_settle(db, v[0].id, false), 0);
    assert_int_equal(ck_queue_abandoned_settle(db, v[1].id, true), 0);
    ck_queue_abandoned_release(v, n);
    assert_int_equal(ck_queue_abandoned(db, 100, &v, &n), 0);
    assert_int_equal(n, 2);
    assert_string_equal(v[0].upload_id, "UPA");
    assert_int_equal(v[0].attempts, 1);
    assert_string_equal(v[1].upload_id, "UPC");
    ck_queue_abandoned_release(v, n);
    sqlite3_close(db);
}

static void queue_transitions(void **state)
{
    char dir[4096], a[4200], meta[4200];
    sqlite3 *db = open_db(dir);
    snprintf(a, sizeof a, "%s/a.bin", dir);
    snprintf(meta, sizeof meta, "%s/metadata.yaml", dir);
    write_file(a, "aaaa");
    write_file(meta, "m: 1\n");
    int64_t sid = store_row(db, "file:///tmp/x"), ja, jm, again;
    bool added;
    assert_int_equal(ck_queue_add(db, sid, meta, "metadata.yaml", 1, CK_JOB_FILE, &jm, &added), 0);
    assert_true(added);
    assert_int_equal(ck_queue_add(db, sid, a, "a.bin", 0, CK_JOB_FILE, &ja, &added), 0);
    assert_true(added);
    /* the same file again: not queued twice */
    assert_int_equal(ck_queue_add(db, sid, a, "a.bin", 0, CK_JOB_FILE, &again, &added), 0);
    assert_false(added);
    assert_true(again == ja);

    /* data first, even though metadata was queued first... */
    struct ck_job j;
    sqlite3_exec(db, "PRAGMA synchronous=FULL", NULL, NULL, NULL);
    assert_int_equal(ck_queue_claim(db, &j), 0);
    assert_true(j.id == ja);
    assert_int_equal(j.state, CK_JOB_RUNNING);
    ck_job_release(&j);
    /* the claim's own commit is not synced, but the connection is left as
     * it was: every later commit is synced again */
    sqlite3_stmt *q;
    assert_int_equal(sqlite3_prepare_v2(db, "PRAGMA synchronous", -1, &q, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(q), SQLITE_ROW);
    assert_int_equal(sqlite3_column_int(q, 0), 2);
    sqlite3_finalize(q);
    /* ...and metadata waits while a.bin is running */
    assert_int_equal(ck_queue_claim(db, &j), CK_ENOENT);
    /* a crash: running goes back to pending, with multipart state kept */
    assert_int_equal(ck_queue_set_upload(db, ja, "UP1", 5u << 20), 0);
    struct ck_part p = {.number = 2,
                        .size = 5u << 20,
                        .etag = "\"e2\"",
                        .sha256_b64 = "s2",
                        .md5 = "00112233445566778899aabbccddeeff"};
    assert_int_equal(ck_queue_add_part(db, ja, &p), 0);
    p.number = 1;
    assert_int_equal(ck_queue_add_part(db, ja, &p), 0);
    assert_int_equal(ck_queue_recover(db), 0);
    assert_int_equal(ck_queue_claim(db, &j), 0);
    assert_true(j.id == ja);
    assert_string_equal(j.upload_id, "UP1");
    ck_job_release(&j);
    struct ck_part *parts;
    size_t n;
    assert_int_equal(ck_queue_parts(db, ja, &parts, &n), 0);
    assert_int_equal(n, 2);
    assert_int_equal(parts[0].number, 1);
    assert_int_equal(parts[1].number, 2);
    assert_string_equal(parts[1].etag, "\"e2\"");
    free(parts);

    /* a failure that may be retried: pending again but not before next_try */
    assert_int_equal(ck_queue_fail(db, ja, "HTTP 500", false, 3600, 3), 0);
    assert_int_equal(ck_queue_claim(db, &j), CK_ENOENT);
    int counts[CK_JOB_NSTATES];
    ck_queue_counts(db, counts);
    assert_int_equal(counts[CK_JOB_PENDING], 2);
    /* permanent failure: failed; metadata stays held back */
    sqlite3_exec(db, "UPDATE upload_jobs SET next_try = 0", NULL, NULL, NULL);
    assert_int_equal(ck_queue_claim(db, &j), 0);
    ck_job_release(&j);
    assert_int_equal(ck_queue_fail(db, ja, "HTTP 403", true, 0, 3), 0);
    assert_int_equal(ck_queue_claim(db, &j), CK_ENOENT);
    ck_queue_counts(db, counts);
    assert_int_equal(counts[CK_JOB_FAILED], 1);
    /* queueing the same file again puts the failed job back, parts kept */
    int64_t again2;
    assert_int_equal(ck_queue_add(db, sid, a, "a.bin", 0, CK_JOB_FILE, &again2, &added), 0);
    assert_true(added);
    assert_true(again2 == ja);
    assert_int_equal(ck_queue_parts(db, ja, &parts, &n), 0);
    assert_int_equal(n, 2);
    free(parts);
    assert_int_equal(ck_queue_claim(db, &j), 0);
    ck_job_release(&j);
    assert_int_equal(ck_queue_fail(db, ja, "HTTP 403", true, 0, 3), 0);
    /* retry: back to pending, attempts reset, multipart state kept */
    int nr;
    assert_int_equal(ck_queue_retry(db, 0, &nr), 0);
    assert_int_equal(nr, 1);
    assert_int_equal(ck_queue_claim(db, &j), 0);
    assert_true(j.id == ja);
    assert_int_equal(j.attempts, 0);
    assert_string_equal(j.upload_id, "UP1");
    ck_job_release(&j);
    assert_int_equal(ck_queue_done(db, ja, "abc", "size"), 0);
    /* now metadata runs */
    assert_int_equal(ck_queue_claim(db, &j), 0);
    assert_true(j.id == jm);
    assert_int_equal(j.phase, 1);
    ck_job_release(&j);
    assert_int_equal(ck_queue_done(db, jm, "", "size"), 0);
    assert_int_equal(ck_queue_claim(db, &j), CK_ENOENT);

    /* done and unchanged: not queued again; changed: queued anew */
    assert_int_equal(ck_queue_add(db, sid, a, "a.bin", 0, CK_JOB_FILE, &again, &added), 0);
    assert_false(added);
    write_file(a, "changed, longer");
    assert_int_equal(ck_queue_add(db, sid, a, "a.bin", 0, CK_JOB_FILE, &again, &added), 0);
    assert_true(added);
    assert_true(again != ja);
    sqlite3_close(db);
}

static void queue_metadata_after_new_data(void **state)
{
    /* metadata queued, then a new checkpoint and a new metadata: the replaced
     * metadata job must wait for the new checkpoint too */
    char dir[4096], a[4200], b[4200], meta[4200];
    sqlite3 *db = open_db(dir);
    snprintf(a, sizeof a, "%s/a", dir);
    snprintf(b, sizeof b, "%s/b", dir);
    snprintf(meta, sizeof meta, "%s/metadata.yaml", dir);
    write_file(a, "a");
    write_file(meta, "v1");
    int64_t sid = store_row(db, "file:///tmp/y"), ja, jb, jm, jm2;
    bool added;
    ck_queue_add(db, sid, a, "a", 0, CK_JOB_FILE, &ja, &added);
    ck_queue_add(db, sid, meta, "metadata.yaml", 1, CK_JOB_FILE, &jm, &added);
    write_file(b, "b");
    ck_queue_add(db, sid, b, "b", 0, CK_JOB_FILE, &jb, &added);
    write_file(meta, "v2 is longer");
    ck_queue_add(db, sid, meta, "metadata.yaml", 1, CK_JOB_FILE, &jm2, &added);
    assert_true(added);
    assert_true(jm2 > jb);
    struct ck_job j;
    assert_int_equal(ck_queue_claim(db, &j), 0);
    assert_true(j.id == ja);
    ck_job_release(&j);
    ck_queue_done(db, ja, "", "size");
    assert_int_equal(ck_queue_claim(db, &j), 0);
    assert_true(j.id == jb);
    ck_job_release(&j);
    /* b running: the metadata waits */
    assert_int_equal(ck_queue_claim(db, &j), CK_ENOENT);
    ck_queue_done(db, jb, "", "size");
    assert_int_equal(ck_queue_claim(db, &j), 0);
    assert_true(j.id == jm2);
    ck_job_release(&j);
    int counts[CK_JOB_NSTATES];
    ck_queue_counts(db, counts);
    assert_int_equal(counts[CK_JOB_PENDING] + counts[CK_JOB_RUNNING] + counts[CK_JOB_DONE], 3);
    sqlite3_close(db);
}

static void queue_newer_schema_refused(void **state)
{
    char dir[4096];
    sqlite3 *db = open_db(dir);
    sqlite3_exec(db, "UPDATE upload_schema SET version = 99", NULL, NULL, NULL);
    assert_int_equal(ck_queue_init(db), CK_ESTATE);
    sqlite3_close(db);
}

/* A queue a ckptd of schema 1 left (upload_stores without profile), with a
 * job in it: the next ckptd adds the column and the store reads back. */
static void queue_schema_1_migrated(void **state)
{
    (void)state;
    char dir[4096], path[4200];
    sqlite3 *db;
    ck_test_tmpdir(dir, "queue1");
    snprintf(path, sizeof path, "%s/state.db", dir);
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    assert_int_equal(
        sqlite3_exec(db,
                     "CREATE TABLE upload_schema(version INTEGER NOT NULL);"
                     "INSERT INTO upload_schema VALUES(1);"
                     "CREATE TABLE upload_stores(id INTEGER PRIMARY KEY, url TEXT NOT NULL UNIQUE,"
                     " endpoint TEXT, region TEXT, credentials TEXT, auth TEXT, key_file TEXT,"
                     " host_key TEXT, compress INTEGER NOT NULL DEFAULT 0,"
                     " bundle INTEGER NOT NULL DEFAULT 0, no_move INTEGER NOT NULL DEFAULT 0);"
                     "INSERT INTO upload_stores(url, region) VALUES('s3://b/p', 'eu-west-1');",
                     NULL, NULL, NULL),
        SQLITE_OK);
    assert_int_equal(ck_queue_init(db), 0);
    assert_int_equal(ck_queue_init(db), 0); /* and only once */
    struct ck_store_spec got;
    assert_int_equal(ck_queue_store_get(db, 1, &got), 0);
    assert_string_equal(got.region, "eu-west-1");
    assert_null(got.profile);
    ck_store_spec_release(&got);
    /* the new column round trips */
    struct ck_store_spec s = {0};
    int64_t id;
    ck_store_spec_set(&s, "url", "s3://b/p");
    ck_store_spec_set(&s, "profile", "trainer");
    ck_store_spec_set(&s, "commit", "multipart");
    assert_int_equal(ck_queue_store_put(db, &s, &id), 0);
    assert_int_equal(id, 1);
    assert_int_equal(ck_queue_store_get(db, id, &got), 0);
    assert_string_equal(got.profile, "trainer");
    assert_true(got.commit_multipart); /* schema 4's column, added to the old table */
    ck_store_spec_release(&got);
    ck_store_spec_release(&s);
    sqlite3_close(db);
}

static void queue_same_bytes_new_mtime_not_requeued(void **state)
{
    char dir[4096], a[4200];
    sqlite3 *db = open_db(dir);
    snprintf(a, sizeof a, "%s/a.bin", dir);
    write_file(a, "abc");
    int64_t sid = store_row(db, "file:///tmp/z"), id, id2;
    bool added;
    assert_int_equal(ck_queue_add(db, sid, a, "a.bin", 0, CK_JOB_FILE, &id, &added), 0);
    struct ck_job j;
    assert_int_equal(ck_queue_claim(db, &j), 0);
    ck_job_release(&j);
    /* SHA-256("abc"), FIPS 180-2 appendix B.1 */
    assert_int_equal(
        ck_queue_done(db, id, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad", "sha256"),
        0);
    struct timespec ts[2] = {{0, UTIME_NOW}, {12345, 0}};
    assert_int_equal(utimensat(AT_FDCWD, a, ts, 0), 0);
    assert_int_equal(ck_queue_add(db, sid, a, "a.bin", 0, CK_JOB_FILE, &id2, &added), 0);
    assert_false(added);
    write_file(a, "abd"); /* same size, other bytes, another mtime */
    ts[1].tv_sec = 23456;
    assert_int_equal(utimensat(AT_FDCWD, a, ts, 0), 0);
    assert_int_equal(ck_queue_add(db, sid, a, "a.bin", 0, CK_JOB_FILE, &id2, &added), 0);
    assert_true(added);
    sqlite3_close(db);
}

static int pending_rows(const char *path)
{
    sqlite3 *db;
    sqlite3_stmt *st;
    int n = -1;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    assert_int_equal(
        sqlite3_prepare_v2(db, "SELECT count(*) FROM upload_jobs WHERE state = 0", -1, &st, NULL),
        SQLITE_OK);
    if (sqlite3_step(st) == SQLITE_ROW)
        n = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    sqlite3_close(db);
    return n;
}

/* A batch is one transaction: another connection sees none of its jobs
 * until it ends; an add that fails inside it undoes itself only; a batch
 * ended with an error leaves nothing queued. */
static void queue_batch_is_one_transaction(void **state)
{
    char dir[4096], a[4200], b[4200], gone[4200], path[4200];
    sqlite3 *db = open_db(dir);
    snprintf(path, sizeof path, "%s/state.db", dir);
    snprintf(a, sizeof a, "%s/a.bin", dir);
    snprintf(b, sizeof b, "%s/b.bin", dir);
    snprintf(gone, sizeof gone, "%s/gone.bin", dir);
    write_file(a, "aaaa");
    write_file(b, "bbbb");
    int64_t sid = store_row(db, "file:///tmp/z"), id;
    bool added;
    for (int round = 0; round < 2; round++) {
        assert_int_equal(ck_queue_batch_begin(db), 0);
        assert_int_equal(ck_queue_add(db, sid, a, "a.bin", 0, CK_JOB_FILE, &id, &added), 0);
        assert_int_equal(ck_queue_add(db, sid, gone, "gone.bin", 0, CK_JOB_FILE, &id, &added),
                         CK_ENOENT);
        assert_int_equal(ck_queue_add(db, sid, b, "b.bin", 0, CK_JOB_FILE, &id, &added), 0);
        assert_true(added);
        assert_int_equal(pending_rows(path), 0);
        if (round == 0) {
            assert_int_equal(ck_queue_batch_end(db, CK_EIO), CK_EIO);
            assert_int_equal(pending_rows(path), 0);
        } else {
            assert_int_equal(ck_queue_batch_end(db, 0), 0);
            assert_int_equal(pending_rows(path), 2);
        }
    }
    sqlite3_close(db);
}

static void uploader_file_store_end_to_end(void **state)
{
    /* a real run against the file:// store: tree order, checksums, dedupe */
    char dir[4096], src[4200], dst[4200], url[4300], path[4400];
    sqlite3 *db = open_db(dir);
    snprintf(src, sizeof src, "%s/tree", dir);
    snprintf(dst, sizeof dst, "%s/remote", dir);
    mkdir(src, 0755);
    snprintf(path, sizeof path, "%s/checkpoints", src);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/checkpoints/epoch=1.bin", src);
    write_file(path, "weights");
    snprintf(path, sizeof path, "%s/metadata.yaml", src);
    write_file(path, "checkpoints: {}\n");
    snprintf(url, sizeof url, "file://%s", dst);
    struct ck_store_spec s = {0};
    ck_store_spec_set(&s, "url", url);
    int queued;
    assert_int_equal(ck_uploader_enqueue_tree(db, &s, 1, src, NULL, 0, &queued), 0);
    assert_int_equal(queued, 2);
    struct ck_upload_opts o;
    struct ck_upload_ctl ctl;
    struct ck_upload_report rep;
    struct ck_uploader_run_opts ro = {0};
    ck_upload_opts_init(&o);
    ck_upload_ctl_init(&ctl, 1);
    char spool[4300];
    snprintf(spool, sizeof spool, "%s/spool", dir);
    assert_int_equal(ck_uploader_run(db, &o, spool, &ctl, &ro, &rep), 0);
    assert_int_equal(rep.done, 2);
    assert_int_equal(rep.failed, 0);
    snprintf(path, sizeof path, "%s/checkpoints/epoch=1.bin", dst);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    char buf[32] = {0};
    assert_int_equal(fread(buf, 1, sizeof buf, f), 7);
    fclose(f);
    assert_string_equal(buf, "weights");
    assert_int_equal(ck_uploader_enqueue_tree(db, &s, 1, src, NULL, 0, &queued), 0);
    assert_int_equal(queued, 0);
    ck_store_spec_release(&s);
    sqlite3_close(db);
}

/* One conditional put of text to key of the file store at url. */
static int put_if_absent(const char *url, const char *dir, const char *text, const char *key,
                         bool *same)
{
    char src[4300];
    snprintf(src, sizeof src, "%s/src.yaml", dir);
    write_file(src, text);
    struct ck_store_spec spec = {0};
    struct ck_upload_opts o;
    struct ck_upload_ctl ctl;
    struct ck_net net;
    struct ck_store *st = NULL;
    struct ck_xfer x;
    memset(&x, 0, sizeof x);
    x.id = 7;
    x.path = src;
    x.key = key;
    x.size = strlen(text);
    x.if_absent = true;
    ck_upload_opts_init(&o);
    ck_upload_ctl_init(&ctl, 1);
    assert_int_equal(ck_store_spec_set(&spec, "url", url), 0);
    assert_int_equal(ck_net_init(&net, &o, &ctl), 0);
    assert_int_equal(ck_store_open(&st, &spec, &net), 0);
    int err = ck_store_put(st, &x);
    *same = x.same_bytes;
    ck_store_free(st);
    ck_net_release(&net);
    ck_store_spec_release(&spec);
    return err;
}

/* The file store's conditional write: link(2), refused when the name is
 * taken (CK_EEXIST, whether the bytes there are the same said), the first
 * content kept, no temporary left; http cannot, and says so. */
static void file_store_if_absent(void **state)
{
    char dir[4096], url[4200], path[4300], buf[64] = {0};
    bool same = true;
    (void)state;
    ck_test_tmpdir(dir, "ifabsent");
    snprintf(url, sizeof url, "file://%s/store", dir);
    assert_int_equal(put_if_absent(url, dir, "parts: 4\n", "commits/s100.yaml", &same), 0);
    assert_false(same);
    assert_int_equal(put_if_absent(url, dir, "parts: 3\n", "commits/s100.yaml", &same), CK_EEXIST);
    assert_false(same);
    assert_non_null(strstr(ck_error_msg(), "'commits/s100.yaml': already exists"));
    assert_int_equal(put_if_absent(url, dir, "parts: 4\n", "commits/s100.yaml", &same), CK_EEXIST);
    assert_true(same);
    snprintf(path, sizeof path, "%s/store/commits/s100.yaml", dir);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    assert_int_equal(fread(buf, 1, sizeof buf, f), 9);
    fclose(f);
    assert_string_equal(buf, "parts: 4\n");
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0644);
    assert_int_equal((int)st.st_nlink, 1); /* the temporary is gone */
    snprintf(path, sizeof path, "%s/store/commits", dir);
    DIR *d = opendir(path);
    assert_non_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += e->d_name[0] != '.' || strstr(e->d_name, "ckptd") != NULL;
    closedir(d);
    assert_int_equal(n, 1);
    assert_int_equal(put_if_absent("http://127.0.0.1:9/x", dir, "a", "k", &same),
                     CK_ERR);
}

/* A ListObjectsV2 page as S3 writes it, and hostile ones: keys outside the
 * store's prefix, sizes that do not parse, a block too long, entities. */
static void s3_list_objects_parse(void **state)
{
    struct ck_remote_list l = {0};
    bool more;
    char next[64];
    (void)state;
    const char *page =
        "<?xml version=\"1.0\"?><ListBucketResult><Name>b</Name><Prefix>runs/r1/c/</Prefix>"
        "<KeyCount>5</KeyCount><MaxKeys>100</MaxKeys><IsTruncated>true</IsTruncated>"
        "<NextContinuationToken>1ue/x+y==</NextContinuationToken>"
        "<Contents><Key>runs/r1/c/a&amp;b.yaml</Key><LastModified>2026-11-28T15:00:00.000Z"
        "</LastModified><ETag>&quot;0CC175B9C0F1B6A831C399E269772661&quot;</ETag>"
        "<Size>1</Size></Contents>"
        "<Contents><Key>runs/r1/c/big.bin</Key><ETag>\"9b2cf535f27731c974343645a3985328-3\""
        "</ETag><Size>20971520</Size></Contents>"
        "<Contents><Key>runs/r2/c/other</Key><Size>4</Size></Contents>"      /* not ours */
        "<Contents><Key>runs/r1/c/neg</Key><Size>-4</Size></Contents>"       /* bad size */
        "<Contents><Key>runs/r1/c/huge</Key><Size>99999999999999999999</Size></Contents>"
        "<Contents><Key>runs/r1/</Key><Size>0</Size></Contents>"             /* the prefix */
        "<Contents><Size>3</Size></Contents>"                                /* no key */
        "</ListBucketResult>";
    assert_int_equal(ck_s3_list_objects_parse(page, "runs/r1/", &l, &more, next, sizeof next), 0);
    assert_int_equal((int)l.n, 2);
    assert_string_equal(l.v[0].key, "c/a&b.yaml");
    assert_int_equal(l.v[0].size, 1);
    assert_string_equal(l.v[0].md5, "0cc175b9c0f1b6a831c399e269772661");
    assert_string_equal(l.v[1].key, "c/big.bin");
    assert_int_equal(l.v[1].size, 20971520);
    assert_string_equal(l.v[1].md5, ""); /* a multipart ETag is no MD5 */
    assert_true(more);
    assert_string_equal(next, "1ue/x+y==");
    ck_remote_list_release(&l);
    /* the last page; a truncated one without a token is refused */
    assert_int_equal(ck_s3_list_objects_parse("<ListBucketResult><IsTruncated>false</IsTruncated>"
                                              "</ListBucketResult>", "", &l, &more, next,
                                              sizeof next), 0);
    assert_false(more);
    assert_int_equal((int)l.n, 0);
    assert_int_equal(ck_s3_list_objects_parse("<IsTruncated>true</IsTruncated>", "", &l, &more,
                                              next, sizeof next), CK_EFORMAT);
    /* an unterminated block and one longer than any real entry are skipped */
    char *big = malloc(20000);
    assert_non_null(big);
    strcpy(big, "<Contents><Key>");
    memset(big + 15, 'k', 15000);
    strcpy(big + 15015, "</Key><Size>1</Size></Contents><Contents><Key>x</Key>");
    assert_int_equal(ck_s3_list_objects_parse(big, "", &l, &more, next, sizeof next), 0);
    assert_int_equal((int)l.n, 0);
    free(big);
}

/* The file store lists the files under a folder, sorted, its temporaries
 * and symbolic links left out; a missing folder lists nothing. */
static void file_store_list(void **state)
{
    char dir[4096], url[4200], path[4300];
    bool same;
    (void)state;
    ck_test_tmpdir(dir, "filelist");
    snprintf(url, sizeof url, "file://%s/store", dir);
    assert_int_equal(put_if_absent(url, dir, "b", "parts/s100/node-1-of-2.yaml", &same), 0);
    assert_int_equal(put_if_absent(url, dir, "aa", "parts/s100/node-0-of-2.yaml", &same), 0);
    assert_int_equal(put_if_absent(url, dir, "c", "parts/s200/node-0-of-2.yaml", &same), 0);
    assert_int_equal(put_if_absent(url, dir, "d", "commits/s100.yaml", &same), 0);
    snprintf(path, sizeof path, "%s/store/parts/s100/.node-1-of-2.yaml.ckptd-7-abcdef.part", dir);
    write_file(path, "half");
    snprintf(path, sizeof path, "%s/store/parts/s100/link", dir);
    assert_int_equal(symlink("/etc/passwd", path), 0);
    struct ck_store_spec spec = {0};
    struct ck_upload_opts o;
    struct ck_upload_ctl ctl;
    struct ck_net net;
    struct ck_store *st = NULL;
    struct ck_remote_list l;
    ck_upload_opts_init(&o);
    ck_upload_ctl_init(&ctl, 1);
    assert_int_equal(ck_store_spec_set(&spec, "url", url), 0);
    assert_int_equal(ck_net_init(&net, &o, &ctl), 0);
    assert_int_equal(ck_store_open(&st, &spec, &net), 0);
    assert_int_equal(ck_store_list(st, "parts/", &l), 0);
    assert_int_equal((int)l.n, 3);
    assert_string_equal(l.v[0].key, "parts/s100/node-0-of-2.yaml");
    assert_int_equal(l.v[0].size, 2);
    assert_string_equal(l.v[1].key, "parts/s100/node-1-of-2.yaml");
    assert_string_equal(l.v[2].key, "parts/s200/node-0-of-2.yaml");
    ck_remote_list_release(&l);
    assert_int_equal(ck_store_list(st, "", &l), 0);
    assert_int_equal((int)l.n, 4);
    assert_string_equal(l.v[0].key, "commits/s100.yaml");
    ck_remote_list_release(&l);
    assert_int_equal(ck_store_list(st, "nothing/here", &l), 0);
    assert_int_equal((int)l.n, 0);
    ck_store_free(st);
    ck_net_release(&net);
    ck_store_spec_release(&spec);
}

/* The stores a run gave up (nobody answered there) are skipped by the claim,
 * their jobs left pending; the other stores' jobs are claimed as before. */
static void queue_claim_skips_given_up_stores(void **state)
{
    char dir[4096], a[4200], b[4200], skipped[CK_QUEUE_IDS_JSON_MAX];
    (void)state;
    sqlite3 *db = open_db(dir);
    snprintf(a, sizeof a, "%s/a.bin", dir);
    snprintf(b, sizeof b, "%s/b.bin", dir);
    write_file(a, "aaaa");
    write_file(b, "bbbb");
    int64_t dead = store_row(db, "file:///tmp/dead"), live = store_row(db, "file:///tmp/live");
    int64_t ja, jb;
    bool added;
    assert_int_equal(ck_queue_add(db, dead, a, "a.bin", 0, CK_JOB_FILE, &ja, &added), 0);
    assert_int_equal(ck_queue_add(db, live, b, "b.bin", 0, CK_JOB_FILE, &jb, &added), 0);
    struct ck_job j;
    int64_t gone[] = {dead};
    assert_int_equal(ck_queue_claim_except(db, gone, 1, &j), 0);
    assert_true(j.id == jb); /* a.bin came first, but its store is skipped */
    ck_job_release(&j);
    assert_int_equal(ck_queue_claim_except(db, gone, 1, &j), CK_ENOENT);
    int counts[CK_JOB_NSTATES];
    ck_queue_counts(db, counts);
    assert_int_equal(counts[CK_JOB_PENDING], 1);
    assert_int_equal(ck_queue_claim(db, &j), 0); /* the next run takes it */
    assert_true(j.id == ja);
    ck_job_release(&j);
    /* the list as SQLite's json_each reads it; as many ids as fit, still JSON */
    int64_t ids[] = {3, 12, 7};
    ck_queue_ids_json(skipped, sizeof skipped, ids, 3);
    assert_string_equal(skipped, "[3,12,7]");
    ck_queue_ids_json(skipped, sizeof skipped, NULL, 0);
    assert_string_equal(skipped, "[]");
    char small[26];
    ck_queue_ids_json(small, sizeof small, ids, 3);
    assert_string_equal(small, "[3]");
    sqlite3_close(db);
}

/* The digests the agent's hash cache holds for exactly one file (device,
 * inode, size, mtime): what an S3 single PUT sends instead of reading the
 * file for them (issue 36). */
static void queue_known_digests(void **state)
{
    char dir[4096], a[4200], sql[512], sha[65], md5[33];
    static const char *md5_abc = "900150983cd24fb0d6963f7d28e17f72"; /* RFC 1321 */
    static const char *sha_abc =
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"; /* FIPS 180-2 */
    struct stat st, other;
    (void)state;
    sqlite3 *db = open_db(dir);
    snprintf(a, sizeof a, "%s/a.bin", dir);
    write_file(a, "abc");
    assert_int_equal(stat(a, &st), 0);
    /* a queue of its own (ckptd upload): no hash cache, nothing known */
    assert_false(ck_queue_known_digests(db, &st, sha, md5));
    assert_string_equal(sha, "");
    assert_string_equal(md5, "");
    /* the agent's table (agent/state.c) with its row for this very file */
    assert_int_equal(sqlite3_exec(db,
                                  "CREATE TABLE hash_cache (dev INTEGER NOT NULL, ino INTEGER NOT"
                                  " NULL, size INTEGER NOT NULL, mtime_ns INTEGER NOT NULL, md5"
                                  " TEXT NOT NULL, sha256 TEXT NOT NULL DEFAULT '', PRIMARY KEY"
                                  " (dev, ino))",
                                  NULL, NULL, NULL),
                     SQLITE_OK);
    snprintf(sql, sizeof sql, "INSERT INTO hash_cache VALUES (%lld, %lld, 3, %lld, '%s', '%s')",
             (long long)st.st_dev, (long long)st.st_ino, (long long)ck_mtime_ns(&st), md5_abc,
             sha_abc);
    assert_int_equal(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
    assert_true(ck_queue_known_digests(db, &st, sha, md5));
    assert_string_equal(sha, sha_abc);
    assert_string_equal(md5, md5_abc);
    /* another mtime, inode or size: another file as far as the cache knows */
    other = st;
    other.st_mtim.tv_nsec = (other.st_mtim.tv_nsec + 1) % 1000000000;
    assert_false(ck_queue_known_digests(db, &other, sha, md5));
    assert_string_equal(md5, "");
    other = st;
    other.st_ino++;
    assert_false(ck_queue_known_digests(db, &other, sha, md5));
    other = st;
    other.st_size = 4;
    assert_false(ck_queue_known_digests(db, &other, sha, md5));
    /* an MD5 that is not one: the SHA-256 alone */
    assert_int_equal(sqlite3_exec(db, "UPDATE hash_cache SET md5 = 'x'", NULL, NULL, NULL),
                     SQLITE_OK);
    assert_true(ck_queue_known_digests(db, &st, sha, md5));
    assert_string_equal(sha, sha_abc);
    assert_string_equal(md5, "");
    /* no SHA-256 (a row from before sha256 was taken): nothing known */
    assert_int_equal(sqlite3_exec(db, "UPDATE hash_cache SET md5 = '900150983cd24fb0d6963f7d28e17f72'"
                                      ", sha256 = ''", NULL, NULL, NULL),
                     SQLITE_OK);
    assert_false(ck_queue_known_digests(db, &st, sha, md5));
    assert_string_equal(md5, "");
    sqlite3_close(db);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(key_encoding),
    cmocka_unit_test(join_and_redact),
    cmocka_unit_test(base64_and_hex),
    cmocka_unit_test(backoff),
    cmocka_unit_test(retry_after),
    cmocka_unit_test(retryable),
    cmocka_unit_test(xml),
    cmocka_unit_test(spec_checks),
    cmocka_unit_test(queue_transitions),
    cmocka_unit_test(queue_records_abandoned_uploads),
    cmocka_unit_test(queue_claim_skips_given_up_stores),
    cmocka_unit_test(queue_metadata_after_new_data),
    cmocka_unit_test(queue_newer_schema_refused),
    cmocka_unit_test(queue_schema_1_migrated),
    cmocka_unit_test(queue_same_bytes_new_mtime_not_requeued),
    cmocka_unit_test(queue_batch_is_one_transaction),
    cmocka_unit_test(uploader_file_store_end_to_end),
    cmocka_unit_test(file_store_if_absent),
    cmocka_unit_test(s3_list_objects_parse),
    cmocka_unit_test(file_store_list),
    cmocka_unit_test(queue_known_digests),
};
CK_TEST_MAIN(tests)
