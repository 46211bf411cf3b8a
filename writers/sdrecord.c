/* A recorded test set appended under a SameDiff tag (writers/sdrecord.h). */
#include "writers/sdrecord.h"

#include "common/fsutil.h"
#include "common/buf.h"
#include "common/error.h"
#include "common/log.h"
#include "writers/fbbuild.h"
#include "writers/sdarray.h"
#include "writers/zipapp.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#define TAGS_MAX (1u << 24) /* tags.txt, as the SameDiff writer */
#define MAX_SETS 100000u

/* The tag as tags.txt spells it: want (case-insensitively) or the last one. */
static int find_tag(struct ck_zipapp *z, const char *want, char *tag, size_t tagsz)
{
    struct ck_zipapp_entry *e = ck_zipapp_find(z, "tags.txt");
    struct ck_buf b;
    int err;
    if (!e)
        return ck_error(CK_EFORMAT, "'%s': a zip without tags.txt is not a SameDiff archive",
                        z->path);
    ck_buf_init(&b, TAGS_MAX + 1);
    if ((err = ck_zipapp_read(z, e, TAGS_MAX, &b)) < 0)
        goto out;
    tag[0] = 0;
    for (char *p = b.data, *end = b.data + b.len; p && p < end;) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t n = (size_t)((nl ? nl : end) - p);
        if (n && p[n - 1] == '\r')
            n--;
        if (n && n < tagsz && !memchr(p, 0, n) && !memchr(p, '/', n) &&
            (!want || (strlen(want) == n && !strncasecmp(want, p, n)))) {
            memcpy(tag, p, n);
            tag[n] = 0;
            if (want)
                break;
        }
        p = nl ? nl + 1 : end;
    }
    if (!tag[0])
        err = want ? ck_error(CK_ENOENT, "'%s': no tag '%s'", z->path, want)
                   : ck_error(CK_EFORMAT, "'%s': tags.txt lists no tag", z->path);
out:
    ck_buf_release(&b);
    return err;
}

/* The first recN no member <tag>/tests/recN/... uses. */
static int next_set(struct ck_zipapp *z, const char *prefix, char *set, size_t setsz)
{
    size_t plen = strlen(prefix);
    unsigned next = 0;
    for (size_t i = 0; i < z->nents; i++) {
        const char *name = z->ents[i].name;
        if (z->ents[i].dropped || strncasecmp(name, prefix, plen) ||
            strncasecmp(name + plen, "rec", 3))
            continue;
        const char *d = name + plen + 3;
        size_t n = strspn(d, "0123456789");
        if (n == 0 || n > 5 || d[n] != '/')
            continue;
        unsigned v = (unsigned)strtoul(d, NULL, 10);
        if (v >= next)
            next = v + 1;
    }
    if (next >= MAX_SETS)
        return ck_error(CK_ESIZE, "'%s': %s holds %u test sets already", z->path, prefix, next);
    snprintf(set, setsz, "rec%u", next);
    return 0;
}

static int add_array(struct ck_zipapp *z, const char *member, const struct ck_tensor *t)
{
    struct ck_fbb b;
    float scale;
    int err;
    char label[4600];
    snprintf(label, sizeof label, "%s: %s", z->path, member);
    ck_fbb_init(&b);
    if ((err = ck_sdarray_file(&b, t, CK_DT_INVALID, label, &scale)) >= 0) {
        err = ck_zipapp_add(z, member, b.p, b.len);
    }
    ck_fbb_release(&b);
    return err;
}

static int set_text(struct ck_buf *txt, const struct ck_tensor *in, size_t nin,
                    const struct ck_tensor *out, size_t nout, double tolerance)
{
    int err = ck_buf_printf(txt, "ckptd-test 1\ntolerance %.17g\n", tolerance);
    for (size_t k = 0; k < nin + nout && err >= 0; k++) {
        const struct ck_tensor *t = k < nin ? &in[k] : &out[k - nin];
        if (!t->name || !t->name[0] || strpbrk(t->name, "\r\n"))
            return ck_error(CK_EFORMAT, "graph value '%s' has a name set.txt cannot hold",
                            t->name ? t->name : "");
        err = ck_buf_printf(txt, "%s %zu %s\n", k < nin ? "input" : "output", k < nin ? k : k - nin,
                            t->name);
    }
    return err;
}

int ck_sdrecord_add(const char *spec, const struct ck_tensor *in, size_t nin,
                    const struct ck_tensor *out, size_t nout, double tolerance,
                    struct ck_sdrecord_result *res)
{
    char file[4096], prefix[512], member[600];
    const char *want;
    struct ck_zipapp z;
    struct ck_buf txt;
    int err;
    ck_path_split_part(spec, file, sizeof file, &want);
    if (!nin || !nout || nin > 4096 || nout > 4096)
        return ck_error(CK_EUSAGE, "'%s': a test set takes 1 to 4096 inputs and outputs", file);
    if ((err = ck_zipapp_open(&z, file)) < 0)
        return err;
    ck_buf_init(&txt, 1u << 20);
    if (z.fresh) {
        err = ck_error(CK_ENOENT, "'%s': no such SameDiff archive", file);
        goto fail;
    }
    if ((err = find_tag(&z, want, res->tag, sizeof res->tag)) < 0)
        goto fail;
    snprintf(prefix, sizeof prefix, "%s/tests/", res->tag);
    if ((err = next_set(&z, prefix, res->set, sizeof res->set)) < 0 ||
        (err = set_text(&txt, in, nin, out, nout, tolerance)) < 0)
        goto fail;
    for (size_t k = 0; k < nin + nout && err >= 0; k++) {
        snprintf(member, sizeof member, "%s%s/%s/%zu.fb", prefix, res->set,
                 k < nin ? "inputs" : "outputs", k < nin ? k : k - nin);
        err = add_array(&z, member, k < nin ? &in[k] : &out[k - nin]);
    }
    if (err < 0)
        goto fail;
    snprintf(member, sizeof member, "%s%s/set.txt", prefix, res->set);
    if ((err = ck_zipapp_add(&z, member, txt.data, txt.len)) < 0)
        goto fail;
    ck_buf_release(&txt);
    if ((err = ck_zipapp_commit(&z)) < 0) /* releases z, restores the old archive on failure */
        return err;
    ck_info("samediff.test_recorded", "archive='%s' tag='%s' set='%s' inputs=%zu outputs=%zu", file,
            res->tag, res->set, nin, nout);
    return 0;
fail:
    ck_buf_release(&txt);
    ck_zipapp_abort(&z);
    return err;
}
