/* data/build_parameters.yaml, `archives:`: one entry per archive the pack
 * stage wrote (format, checkpoint, size, sha256, verification). The file is
 * free-form YAML others write too (agent/layout.c keeps every key it does
 * not own, and owns only `ckptd:`), so everything else is copied as read and
 * the result stays one mapping. */
#include "agent/deploy.h"
#include "agent/layout.h"
#include "common/buf.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/yamlutil.h"

#include <limits.h>
#include <stdlib.h>
#include <stdbool.h>
#include <string.h>

static const char *scalar(yaml_node_t *n)
{
    return n && n->type == YAML_SCALAR_NODE ? (const char *)n->data.scalar.value : "";
}

/* The value of key in mapping m (the last, as the loops that read it always
 * took), or NULL when m is not a mapping or has no such key. */
static yaml_node_t *map_value(struct ck_yaml_doc *doc, yaml_node_t *m, const char *key)
{
    yaml_node_t *v = NULL;
    for (yaml_node_pair_t *p = m && m->type == YAML_MAPPING_NODE ? m->data.mapping.pairs.start
                                                                 : NULL;
         p && p < m->data.mapping.pairs.top; p++)
        if (!strcmp(scalar(ck_yaml_node(doc, p->key)), key))
            v = ck_yaml_node(doc, p->value);
    return v;
}

static bool in_fields(const char *k, const char *const *fields, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(fields[2 * i], k))
            return true;
    return false;
}

static void put_fields(struct ck_yaml_out *o, const char *const *fields, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (!fields[2 * i + 1])
            continue; /* NULL: the key goes */
        ck_yaml_str(o, fields[2 * i]);
        /* sizes and durations are numbers to whoever reads the file */
        char *end;
        const char *k = fields[2 * i], *v = fields[2 * i + 1];
        if (!strcmp(k, "size")) {
            long long iv = strtoll(v, &end, 10);
            if (iv >= 0 && *v && !*end) {
                ck_yaml_int(o, iv);
                continue;
            }
        } else if (!strcmp(k, "verification_seconds")) {
            double d = strtod(v, &end);
            if (*v && !*end && d >= 0) {
                ck_yaml_float(o, d);
                continue;
            }
        }
        ck_yaml_str(o, v);
    }
}

/* the entry `name`: what it had that fields do not replace, then fields */
static void put_entry(struct ck_yaml_out *o, struct ck_yaml_doc *d, yaml_node_t *old,
                      const char *const *fields, size_t n)
{
    ck_yaml_map_begin(o);
    if (old && old->type == YAML_MAPPING_NODE)
        for (yaml_node_pair_t *p = old->data.mapping.pairs.start; p < old->data.mapping.pairs.top;
             p++) {
            yaml_node_t *k = ck_yaml_node(d, p->key);
            if (in_fields(scalar(k), fields, n))
                continue;
            ck_yaml_copy(o, d, k);
            ck_yaml_copy(o, d, ck_yaml_node(d, p->value));
        }
    put_fields(o, fields, n);
    ck_yaml_map_end(o);
}

static void put_archives(struct ck_yaml_out *o, struct ck_yaml_doc *d, yaml_node_t *old,
                         const char *name, const char *const *fields, size_t n)
{
    yaml_node_t *mine = NULL;
    ck_yaml_map_begin(o);
    if (old && old->type == YAML_MAPPING_NODE)
        for (yaml_node_pair_t *p = old->data.mapping.pairs.start; p < old->data.mapping.pairs.top;
             p++) {
            yaml_node_t *k = ck_yaml_node(d, p->key);
            if (!strcmp(scalar(k), name)) {
                mine = ck_yaml_node(d, p->value);
                continue;
            }
            ck_yaml_copy(o, d, k);
            ck_yaml_copy(o, d, ck_yaml_node(d, p->value));
        }
    ck_yaml_str(o, name);
    put_entry(o, d, mine, fields, n);
    ck_yaml_map_end(o);
}

int ck_deploy_record(const char *dir, const char *name, const char *const *fields, size_t n)
{
    char path[PATH_MAX];
    struct ck_buf old = CK_BUF_INIT, out = CK_BUF_INIT;
    struct ck_yaml_doc doc = {0};
    struct ck_yaml_out o;
    int err;
    yaml_node_t *root = NULL;
    if ((err = ck_layout_read_build_parameters(dir, path, &old, &doc, &root)) < 0)
        goto out;
    if ((err = ck_yaml_out_begin(&o, &out)) < 0)
        goto out;
    ck_yaml_map_begin(&o);
    yaml_node_t *archives = NULL;
    if (root)
        for (yaml_node_pair_t *p = root->data.mapping.pairs.start; p < root->data.mapping.pairs.top;
             p++) {
            yaml_node_t *k = ck_yaml_node(&doc, p->key);
            if (!strcmp(scalar(k), "archives")) {
                archives = ck_yaml_node(&doc, p->value);
                continue;
            }
            ck_yaml_copy(&o, &doc, k);
            ck_yaml_copy(&o, &doc, ck_yaml_node(&doc, p->value));
        }
    ck_yaml_str(&o, "archives");
    put_archives(&o, &doc, archives, name, fields, n);
    ck_yaml_map_end(&o);
    if ((err = ck_yaml_out_end(&o)) < 0)
        goto out;
    char data[PATH_MAX];
    ck_dirname(data, sizeof data, path);
    if ((err = ck_mkdirs(data, 0755)) == 0)
        err = ck_write_file_atomic(path, ck_buf_str(&out), out.len, 0644);
out:
    ck_yaml_release(&doc);
    ck_buf_release(&old);
    ck_buf_release(&out);
    return err;
}

int ck_deploy_record_get(const char *dir, const char *name, const char *key, char *out, size_t n)
{
    char path[PATH_MAX];
    struct ck_buf text = CK_BUF_INIT;
    struct ck_yaml_doc doc = {0};
    yaml_node_t *root = NULL;
    int err;
    out[0] = '\0';
    if ((err = ck_layout_read_build_parameters(dir, path, &text, &doc, &root)) < 0)
        goto out;
    yaml_node_t *entry = map_value(&doc, map_value(&doc, root, "archives"), name);
    yaml_node_t *value = map_value(&doc, entry, key);
    if (value)
        snprintf(out, n, "%s", scalar(value));
out:
    ck_yaml_release(&doc);
    ck_buf_release(&text);
    return err;
}

int ck_deploy_record_archives_of(const char *dir, const char *ref, struct ck_buf *out)
{
    char path[PATH_MAX];
    struct ck_buf text = CK_BUF_INIT;
    struct ck_yaml_doc doc = {0};
    yaml_node_t *root = NULL;
    int err;
    if ((err = ck_layout_read_build_parameters(dir, path, &text, &doc, &root)) < 0)
        goto out;
    yaml_node_t *archives = map_value(&doc, root, "archives");
    for (yaml_node_pair_t *p = archives && archives->type == YAML_MAPPING_NODE
                                   ? archives->data.mapping.pairs.start
                                   : NULL;
         p && p < archives->data.mapping.pairs.top && err == 0; p++) {
        const char *name = scalar(ck_yaml_node(&doc, p->key));
        yaml_node_t *entry = ck_yaml_node(&doc, p->value);
        const char *format = "", *ckpt = "", *key = "";
        for (yaml_node_pair_t *q = entry && entry->type == YAML_MAPPING_NODE
                                       ? entry->data.mapping.pairs.start
                                       : NULL;
             q && q < entry->data.mapping.pairs.top; q++) {
            const char *k = scalar(ck_yaml_node(&doc, q->key));
            const char *v = scalar(ck_yaml_node(&doc, q->value));
            if (!strcmp(k, "format"))
                format = v;
            else if (!strcmp(k, "checkpoint"))
                ckpt = v;
            else if (!strcmp(k, "path"))
                key = v;
        }
        if (!name[0] || !key[0] || strpbrk(name, "/\t\n") || strpbrk(key, "\t\n") ||
            (strcmp(ckpt, ref) && strcmp(format, "samediff")))
            continue;
        err = ck_buf_printf(out, "%s\t%s\n", name, key);
    }
out:
    ck_yaml_release(&doc);
    ck_buf_release(&text);
    return err;
}
