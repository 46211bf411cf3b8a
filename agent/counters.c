#include "agent/counters.h"
#include "infer/sandbox.h"
#include "common/buf.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "readers/jsonin.h"
#include "readers/reader.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define TRAINER_STATE_MAX (64u << 20)

static const char *meta_get(const struct ck_tensor_set *s, const char *key)
{
    for (size_t i = 0; i < s->nmeta; i++)
        if (!strcmp(s->meta[i].key, key))
            return s->meta[i].value;
    return NULL;
}

/* A non-negative decimal integer (what the pt reader writes for an int). */
static bool parse_count(const char *v, int64_t *out)
{
    char *end;
    if (!v || *v < '0' || *v > '9')
        return false;
    errno = 0;
    long long n = strtoll(v, &end, 10);
    if (errno || *end)
        return false;
    *out = n;
    return true;
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

static int lightning(const char *path, struct ck_counters *out)
{
    const struct ck_reader_ops *ops;
    struct ck_tensor_set *s = NULL;
    if (ck_reader_detect(path, &ops) < 0 || ops != &ck_reader_pt) {
        ck_error_clear();
        return 0; /* not a torch.save archive: nothing recorded that we read */
    }
    int err = ck_reader_open(path, "pt", &s);
    if (err < 0)
        return err;
    if (meta_get(s, "pytorch-lightning_version")) {
        const char *e = meta_get(s, "epoch"), *g = meta_get(s, "global_step");
        out->has_epoch = parse_count(e, &out->epoch);
        out->has_step = parse_count(g, &out->step);
        if ((e && !out->has_epoch) || (g && !out->has_step))
            err = ck_error(
                CK_EFORMAT, "'%s': a Lightning checkpoint whose %s is not a count ('%s')", path,
                e && !out->has_epoch ? "epoch" : "global_step", e && !out->has_epoch ? e : g);
        else if (out->has_epoch || out->has_step)
            out->source = "lightning";
    }
    ck_tensor_set_free(s);
    return err;
}

static int trainer_state(const char *path, struct ck_counters *out)
{
    struct ck_buf b = CK_BUF_INIT;
    struct ck_jin_doc *doc = NULL;
    const struct ck_jin *root = NULL, *v;
    uint64_t u;
    int err = ck_read_file(path, TRAINER_STATE_MAX, &b);
    if (err < 0)
        return err;
    if ((err = ck_jin_parse(ck_buf_str(&b), b.len, &doc, &root)) < 0) {
        err = ck_error_wrap(CK_EFORMAT, "'%s'", path);
        goto out;
    }
    if ((v = ck_jin_get(root, "global_step"))) {
        if (!ck_jin_uint(v, &u) || u > INT64_MAX) {
            err = ck_error(CK_EFORMAT, "'%s': global_step is not a count", path);
            goto out;
        }
        out->has_step = true;
        out->step = (int64_t)u;
    }
    if ((v = ck_jin_get(root, "epoch")) && v->type != CK_JIN_NULL) {
        char *end;
        double e = v->type == CK_JIN_NUMBER ? strtod(v->str, &end) : -1;
        if (!(e >= 0 && e < 9e15)) {
            err = ck_error(CK_EFORMAT, "'%s': epoch is not a number of epochs", path);
            goto out;
        }
        out->has_epoch = true;
        out->epoch = (int64_t)floor(e);
    }
    if (out->has_epoch || out->has_step)
        out->source = "trainer_state.json";
out:
    ck_jin_free(doc);
    ck_buf_release(&b);
    return err;
}

/* What the child answers: the counters without the source's pointer. */
struct answer {
    bool has_epoch, has_step, has_source;
    int64_t epoch, step;
};

struct job {
    const char *path;
    int (*read)(const char *path, struct ck_counters *out);
};

static int read_child(void *arg, int fd)
{
    const struct job *j = arg;
    struct ck_counters c;
    memset(&c, 0, sizeof c);
    int err = j->read(j->path, &c);
    if (err < 0)
        return err;
    struct answer a = {c.has_epoch, c.has_step, c.source != NULL, c.epoch, c.step};
    return ck_write_all(fd, &a, sizeof a) < 0 ? ck_error_os(CK_EIO, "cannot answer") : 0;
}

/* read(path) in a child process (infer/sandbox): the watcher reads a file
 * the trainer wrote with the pickle and JSON readers, and a reader that
 * crashes on it must cost that checkpoint's counters, not the watcher. */
static int read_isolated(const char *path, int (*read)(const char *, struct ck_counters *),
                         const char *source, struct ck_counters *out)
{
    struct job j = {path, read};
    struct answer a;
    int err = ck_sandbox_call_fixed(read_child, &j, "the checkpoint's reader", path, &a, sizeof a);
    if (err == 0) {
        out->has_epoch = a.has_epoch;
        out->has_step = a.has_step;
        out->epoch = a.epoch;
        out->step = a.step;
        out->source = a.has_source ? source : NULL;
    }
    return err;
}

int ck_counters_read(const char *dir, const struct ck_candidate *c, struct ck_counters *out)
{
    char path[PATH_MAX], rel[PATH_MAX];
    int err;
    memset(out, 0, sizeof *out);
    if (c->kind == CK_CAND_FILE && c->nfiles == 1 && ends_with(c->files[0], ".ckpt")) {
        if ((err = ck_path_join(path, sizeof path, dir, c->files[0])) < 0)
            return err;
        err = read_isolated(path, lightning, "lightning", out);
    } else if (c->kind == CK_CAND_DIR) {
        bool has = false;
        for (size_t i = 0; i < c->nfiles && !has; i++)
            has = !strcmp(c->files[i] + strlen(c->rel), "/trainer_state.json");
        if (!has)
            return 0;
        if (snprintf(rel, sizeof rel, "%s/trainer_state.json", c->rel) >= (int)sizeof rel ||
            (err = ck_path_join(path, sizeof path, dir, rel)) < 0)
            return ck_error(CK_ESIZE, "path too long: '%s'", c->rel);
        err = read_isolated(path, trainer_state, "trainer_state.json", out);
    } else {
        return 0;
    }
    if (err < 0)
        memset(out, 0, sizeof *out);
    return err;
}
