#include "stores/pmftree.h"
#include "common/buf.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/yamlutil.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const char readme[] =
    "# Initialisation\n"
    "\n"
    "This model was trained from scratch: its metadata.yaml says `initialisation: null`.\n"
    "\n"
    "The PMF format requires this folder even then. Object stores keep no empty\n"
    "folders, and the usual download tools (aws s3 cp --recursive, rclone) drop\n"
    "folder markers, so ckptd put this file here to keep every copy of the model\n"
    "a valid PMF tree. PMF allows plain files in the initialisation folder of a\n"
    "model without initialisation; this one may be deleted locally at no cost.\n";

/* Whether YAML node n is null (a plain null, ~ or empty scalar). */
static bool is_null(yaml_node_t *n)
{
    if (!n || n->type != YAML_SCALAR_NODE || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
        return false;
    const char *v = (const char *)n->data.scalar.value;
    return !*v || !strcmp(v, "~") || !strcmp(v, "null") || !strcmp(v, "Null") || !strcmp(v, "NULL");
}

static yaml_node_t *child(struct ck_yaml_doc *d, yaml_node_t *n, const char *key)
{
    if (!n || n->type != YAML_MAPPING_NODE)
        return NULL;
    for (yaml_node_pair_t *p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top; p++) {
        yaml_node_t *k = ck_yaml_node(d, p->key);
        if (k && k->type == YAML_SCALAR_NODE && !strcmp((char *)k->data.scalar.value, key))
            return ck_yaml_node(d, p->value);
    }
    return NULL;
}

/* Whether metadata.yaml says initialisation: null; false when unreadable. */
static bool init_is_null(const char *root)
{
    char path[4200];
    struct ck_buf b = CK_BUF_INIT;
    struct ck_yaml_doc doc;
    snprintf(path, sizeof path, "%s/metadata.yaml", root);
    if (ck_read_file(path, 16u << 20, &b) < 0 ||
        ck_yaml_load(&doc, path, ck_buf_str(&b), b.len) < 0) {
        ck_buf_release(&b);
        ck_error_clear();
        return false;
    }
    yaml_node_t *model = child(&doc, ck_yaml_root(&doc), "model");
    bool yes = is_null(child(&doc, model, "initialisation"));
    ck_yaml_release(&doc);
    ck_buf_release(&b);
    return yes;
}

static bool is_empty_dir(const char *path)
{
    DIR *d = opendir(path);
    if (!d)
        return false;
    bool empty = true;
    for (struct dirent *e; empty && (e = readdir(d)) != NULL;)
        empty = !strcmp(e->d_name, ".") || !strcmp(e->d_name, "..");
    closedir(d);
    return empty;
}

int ck_pmftree_mark_empty_init(const char *root, bool *wrote)
{
    char data[4200], dir[4300], file[4300];
    int err;
    *wrote = false;
    snprintf(data, sizeof data, "%s/data", root);
    snprintf(dir, sizeof dir, "%s/data/initialisation", root);
    snprintf(file, sizeof file, "%s/" CK_PMFTREE_INIT_README, root);
    if (!ck_is_dir(data) || (ck_exists(dir) && !is_empty_dir(dir)) || !init_is_null(root))
        return 0;
    if ((err = ck_mkdirs(dir, 0755)) < 0 ||
        (err = ck_write_file_atomic(file, readme, sizeof readme - 1, 0644)) < 0)
        return err;
    *wrote = true;
    return 0;
}

void ck_pmftree_meta_source(const char *root, char *out, size_t outsz)
{
    snprintf(out, outsz, "%s/" CK_PMFTREE_REMOTE_META, root);
    if (!ck_exists(out))
        snprintf(out, outsz, "%s/metadata.yaml", root);
}

bool ck_pmftree_root_of_meta(const char *path, char *root, size_t rootsz)
{
    static const char *const tails[] = {"/" CK_PMFTREE_REMOTE_META, "/metadata.yaml"};
    size_t n = strlen(path);
    for (size_t i = 0; i < 2; i++) {
        size_t t = strlen(tails[i]);
        if (n > t && !strcmp(path + n - t, tails[i]) && n - t < rootsz) {
            snprintf(root, rootsz, "%.*s", (int)(n - t), path);
            return true;
        }
    }
    return false;
}

static int cmp_ckpt(const void *a, const void *b)
{
    return strcmp(((const struct ck_pmftree_ckpt *)a)->path,
                  ((const struct ck_pmftree_ckpt *)b)->path);
}

void ck_pmftree_checkpoints(const char *meta, struct ck_pmftree_ckpts *out)
{
    struct ck_buf b = CK_BUF_INIT;
    struct ck_yaml_doc doc;
    memset(out, 0, sizeof *out);
    if (ck_read_file(meta, 256u << 20, &b) < 0 || ck_yaml_load(&doc, meta, ck_buf_str(&b), b.len) < 0) {
        ck_buf_release(&b);
        ck_error_clear();
        return;
    }
    yaml_node_t *model = child(&doc, ck_yaml_root(&doc), "model");
    yaml_node_t *ck = child(&doc, child(&doc, model, "training"), "checkpoints");
    if (ck && ck->type == YAML_MAPPING_NODE) {
        size_t n = (size_t)(ck->data.mapping.pairs.top - ck->data.mapping.pairs.start);
        out->v = n ? calloc(n, sizeof *out->v) : NULL;
        for (yaml_node_pair_t *p = ck->data.mapping.pairs.start;
             out->v && p < ck->data.mapping.pairs.top; p++) {
            yaml_node_t *k = ck_yaml_node(&doc, p->key);
            yaml_node_t *path = child(&doc, ck_yaml_node(&doc, p->value), "path");
            if (!k || k->type != YAML_SCALAR_NODE || !path || path->type != YAML_SCALAR_NODE)
                continue;
            struct ck_pmftree_ckpt c = {strdup((char *)path->data.scalar.value),
                                        strdup((char *)k->data.scalar.value)};
            if (!c.path || !c.ref) {
                free(c.path);
                free(c.ref);
                continue;
            }
            size_t l = strlen(c.path);
            while (l > 1 && c.path[l - 1] == '/') /* a folder written with its slash */
                c.path[--l] = '\0';
            out->v[out->n++] = c;
        }
        if (out->n)
            qsort(out->v, out->n, sizeof *out->v, cmp_ckpt);
    }
    ck_yaml_release(&doc);
    ck_buf_release(&b);
}

static const char *find_path(const struct ck_pmftree_ckpts *c, const char *path)
{
    struct ck_pmftree_ckpt key = {(char *)path, NULL};
    const struct ck_pmftree_ckpt *hit =
        c->n ? bsearch(&key, c->v, c->n, sizeof *c->v, cmp_ckpt) : NULL;
    return hit ? hit->ref : NULL;
}

const char *ck_pmftree_checkpoint_of(const struct ck_pmftree_ckpts *c, const char *rel)
{
    char buf[4096];
    if (!c->n || snprintf(buf, sizeof buf, "%s", rel) >= (int)sizeof buf)
        return NULL;
    /* the file itself, else the nearest folder above it that is a checkpoint */
    for (;;) {
        const char *ref = find_path(c, buf);
        if (ref)
            return ref;
        char *slash = strrchr(buf, '/');
        if (!slash)
            return NULL;
        *slash = '\0';
    }
}

void ck_pmftree_checkpoints_release(struct ck_pmftree_ckpts *c)
{
    for (size_t i = 0; i < c->n; i++) {
        free(c->v[i].path);
        free(c->v[i].ref);
    }
    free(c->v);
    memset(c, 0, sizeof *c);
}
