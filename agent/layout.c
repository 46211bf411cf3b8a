#include "agent/layout.h"
#include "common/buf.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/hash.h"
#include "common/log.h"
#include "common/yamlutil.h"

#include <dirent.h>
#include <inttypes.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#define PRODUCER "ckptd"

/* Names a training configuration file commonly has, most specific first. */
static const char *const config_names[] = {
    "config.yaml",  "config.yml", "config.json", "hparams.yaml",       "hparams.yml",
    "hparams.json", "config.py",  "config.toml", "training_args.json", "train_config.yaml",
    "params.yaml",  "args.json",  "args.yaml",
};

#define FALLBACK_CONFIG "configuration.yaml"

static int path_in(const struct ck_layout *l, char *out, const char *rel)
{
    return ck_path_join(out, PATH_MAX, l->dir, rel);
}

static int set_str(char **field, const char *v)
{
    char *p = v ? strdup(v) : NULL;
    if (v && !p)
        return ck_error(CK_ENOMEM, "out of memory");
    free(*field);
    *field = p;
    return 0;
}

/* ---- identity ---- */

int ck_layout_identity(const struct ck_layout *l, bool fresh)
{
    struct ck_pmf_meta *m = l->meta;
    int err;
    if (fresh) {
        if ((err = set_str(&m->producer_name, PRODUCER)) < 0 ||
            (err = set_str(&m->producer_version_format, "py_pa")) < 0)
            return err;
    }
    /* Keep another producer's identity; keep ours current. */
    if (!strcmp(m->producer_name, PRODUCER) &&
        (err = set_str(&m->producer_version, CKPTD_VERSION)) < 0)
        return err;

    if (l->cfg->model_name) {
        if ((err = set_str(&m->name, l->cfg->model_name)) < 0)
            return err;
    } else if (fresh) {
        char real[PATH_MAX];
        const char *base = realpath(l->dir, real) ? ck_basename(real) : ck_basename(l->dir);
        if ((err = set_str(&m->name, base[0] ? base : "model")) < 0)
            return err;
    }

    char *id = NULL;
    if ((err = ck_state_get(l->st, "model_id", &id)) < 0)
        return err;
    if (m->id) {
        /* metadata.yaml is the authority; the state keeps a copy in case it is deleted */
        if (!id || strcmp(id, m->id))
            err = ck_state_set(l->st, "model_id", m->id);
    } else if (id) {
        err = set_str(&m->id, id);
    } else {
        unsigned char rnd[16];
        char hex[33];
        if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) {
            free(id);
            return ck_error_os(CK_EIO, "cannot generate a model id");
        }
        ck_hex(hex, rnd, sizeof rnd);
        if ((err = set_str(&m->id, hex)) == 0)
            err = ck_state_set(l->st, "model_id", hex);
    }
    free(id);
    return err;
}

/* ---- the training configuration file ---- */

static int write_fallback_config(char *path)
{
    static const char text[] =
        "# Written by ckptd: no training configuration file was found in this folder.\n"
        "# Name it with model.configuration in ckptd.yaml, or save one as config.yaml.\n"
        "producer: ckptd\n";
    if (ck_exists(path))
        return 0;
    return ck_write_file_atomic(path, text, sizeof text - 1, 0644);
}

/* The real configuration appeared after ours stood in for it: ours goes,
 * unless someone edited it (then it is theirs). */
static void remove_fallback_config(const struct ck_layout *l)
{
    char path[PATH_MAX];
    struct ck_buf b = CK_BUF_INIT;
    if (path_in(l, path, FALLBACK_CONFIG) == 0 && ck_read_file(path, 4096, &b) == 0 &&
        strstr(ck_buf_str(&b), "# Written by ckptd: no training configuration") == ck_buf_str(&b))
        unlink(path);
    ck_buf_release(&b);
}

int ck_layout_configuration(const struct ck_layout *l)
{
    struct ck_pmf_meta *m = l->meta;
    const struct ck_config *cfg = l->cfg;
    char src[PATH_MAX], dst[PATH_MAX];
    const char *name = NULL;
    int err;

    if (cfg->model_configuration) {
        if (cfg->model_configuration[0] == '/')
            snprintf(src, sizeof src, "%s", cfg->model_configuration);
        else if ((err = path_in(l, src, cfg->model_configuration)) < 0)
            return err;
        if (!ck_exists(src))
            return ck_error(CK_ECONFIG, "model.configuration: '%s' does not exist", src);
        name = ck_basename(src);
        if ((err = path_in(l, dst, name)) < 0)
            return err;
        /* PMF wants the configuration at the top of the tree. */
        if ((err = ck_place_file(src, dst)) < 0)
            return ck_error_wrap(err, "model.configuration");
    } else {
        for (size_t i = 0; i < sizeof config_names / sizeof *config_names && !name; i++) {
            if ((err = path_in(l, dst, config_names[i])) < 0)
                return err;
            if (ck_exists(dst))
                name = config_names[i];
        }
        if (!name && m->config_path && strcmp(m->config_path, FALLBACK_CONFIG) &&
            path_in(l, dst, m->config_path) == 0 && ck_exists(dst))
            name = m->config_path; /* someone named it in metadata.yaml: keep it */
        if (!name) {
            name = FALLBACK_CONFIG;
            if ((err = path_in(l, dst, name)) < 0 || (err = write_fallback_config(dst)) < 0)
                return err;
        }
    }
    struct ck_hash_entry h;
    if ((err = ck_state_hash_file(l->st, dst, &h, NULL)) < 0)
        return err;
    if (!m->config_path || strcmp(m->config_path, name) || strcmp(m->config_md5, h.md5)) {
        if (m->config_path)
            ck_info("configuration.changed", "path=%s md5=%s", name, h.md5);
        if (m->config_path && !strcmp(m->config_path, FALLBACK_CONFIG) &&
            strcmp(name, FALLBACK_CONFIG))
            remove_fallback_config(l);
        if ((err = set_str(&m->config_path, name)) < 0)
            return err;
        memcpy(m->config_md5, h.md5, 33);
    }
    return 0;
}

/* ---- initialisation ---- */

static int copy_tree(const char *src, const char *dst, int depth, bool skip_checkpoints);

static int init_file(const struct ck_layout *l)
{
    const struct ck_config *cfg = l->cfg;
    char src[PATH_MAX], dst[PATH_MAX], rel[PATH_MAX];
    int err;
    if (cfg->init_path[0] == '/')
        snprintf(src, sizeof src, "%s", cfg->init_path);
    else if ((err = path_in(l, src, cfg->init_path)) < 0)
        return err;
    if (!ck_exists(src))
        return ck_error(CK_ECONFIG, "model.initialisation: '%s' does not exist", src);
    snprintf(rel, sizeof rel, "data/initialisation/%s", ck_basename(src));
    if ((err = path_in(l, dst, rel)) < 0 || (err = ck_place_file(src, dst)) < 0)
        return err;
    struct ck_hash_entry h;
    if ((err = ck_state_hash_file(l->st, dst, &h, NULL)) < 0)
        return err;
    struct ck_pmf_init *in = &l->meta->init;
    if (in->kind == CK_PMF_INIT_FILE && in->path && !strcmp(in->path, rel) &&
        !strcmp(in->md5, h.md5))
        return 0;
    free(in->name);
    free(in->path);
    free(in->id);
    ck_pmf_ref_release(&in->checkpoint);
    memset(in, 0, sizeof *in);
    in->kind = CK_PMF_INIT_FILE;
    memcpy(in->md5, h.md5, 33);
    if ((err = set_str(&in->path, rel)) < 0)
        return err;
    return set_str(&in->name, cfg->init_name ? cfg->init_name : ck_basename(src));
}

int ck_layout_read_meta(const char *path, struct ck_pmf_meta *m)
{
    struct ck_buf b = CK_BUF_INIT;
    int err = ck_read_file(path, CK_METADATA_MAX, &b);
    if (err == 0)
        err = ck_pmf_parse(m, path, ck_buf_str(&b), b.len);
    ck_buf_release(&b);
    return err;
}

static int init_pmf(const struct ck_layout *l)
{
    const struct ck_config *cfg = l->cfg;
    char src[PATH_MAX], meta_path[PATH_MAX], dst[PATH_MAX];
    struct ck_pmf_meta other;
    int err;
    if (cfg->init_path[0] == '/')
        snprintf(src, sizeof src, "%s", cfg->init_path);
    else if ((err = path_in(l, src, cfg->init_path)) < 0)
        return err;
    if ((err = ck_path_join(meta_path, sizeof meta_path, src, "metadata.yaml")) < 0)
        return err;
    if ((err = ck_layout_read_meta(meta_path, &other)) < 0)
        return ck_error_wrap(CK_ECONFIG, "model.initialisation.pmf");
    /* The reference must exist in that tree, with the type it has there. */
    struct ck_pmf_ref ref = {false, 0, cfg->init_checkpoint};
    ptrdiff_t at = ck_pmf_find(&other, &ref);
    if (at < 0) {
        char *end;
        long long v = strtoll(cfg->init_checkpoint, &end, 10);
        struct ck_pmf_ref iref = {true, v, NULL};
        if (!*end && cfg->init_checkpoint[0])
            at = ck_pmf_find(&other, &iref);
    }
    if (at < 0) {
        ck_pmf_meta_release(&other);
        return ck_error(CK_ECONFIG, "model.initialisation: checkpoint '%s' is not in '%s'",
                        cfg->init_checkpoint, meta_path);
    }
    struct ck_pmf_init *in = &l->meta->init;
    struct ck_pmf_init fresh = {0};
    fresh.kind = CK_PMF_INIT_PMF;
    if ((err = ck_pmf_ref_copy(&fresh.checkpoint, &other.checkpoints[at].ref)) < 0 ||
        (err = set_str(&fresh.id, other.id)) < 0 ||
        (err = set_str(&fresh.path, "data/initialisation")) < 0 ||
        (err = set_str(&fresh.name, cfg->init_name ? cfg->init_name : other.name)) < 0) {
        ck_pmf_meta_release(&other);
        return err;
    }
    ck_pmf_meta_release(&other);
    if ((err = path_in(l, dst, "data/initialisation")) < 0 ||
        (err = copy_tree(src, dst, 0, true)) < 0) {
        free(fresh.name), free(fresh.path), free(fresh.id), ck_pmf_ref_release(&fresh.checkpoint);
        return err;
    }
    free(in->name), free(in->path), free(in->id), ck_pmf_ref_release(&in->checkpoint);
    *in = fresh;
    return 0;
}

/* Links a PMF tree into dst, without its data/checkpoints (PMF's rule for an
 * initialisation tree). */
static int copy_tree(const char *src, const char *dst, int depth, bool skip_checkpoints)
{
    int err = ck_mkdirs(dst, 0755);
    if (err < 0)
        return err;
    if (depth > 16)
        return ck_error(CK_ESIZE, "'%s' is nested too deep", src);
    DIR *d = opendir(src);
    if (!d)
        return ck_error_os(CK_EIO, "cannot list '%s'", src);
    struct dirent *e;
    while (err == 0 && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || !strcmp(e->d_name, ".ckptd"))
            continue;
        char a[PATH_MAX], b[PATH_MAX];
        struct stat st;
        if ((err = ck_path_join(a, sizeof a, src, e->d_name)) < 0 ||
            (err = ck_path_join(b, sizeof b, dst, e->d_name)) < 0)
            break;
        if (lstat(a, &st) < 0)
            continue;
        if (S_ISDIR(st.st_mode)) {
            bool is_ckpts = skip_checkpoints && depth == 1 && !strcmp(e->d_name, "checkpoints");
            if (!is_ckpts)
                err = copy_tree(a, b, depth + 1, skip_checkpoints);
        } else if (S_ISREG(st.st_mode)) {
            err = ck_place_file(a, b);
        }
    }
    closedir(d);
    return err;
}

/* ---- build_parameters.yaml ---- */

int ck_layout_read_build_parameters(const char *dir, char *path, struct ck_buf *text,
                                    struct ck_yaml_doc *doc, yaml_node_t **root)
{
    int err;
    *root = NULL;
    if ((err = ck_path_join(path, PATH_MAX, dir, "data/build_parameters.yaml")) < 0)
        return err;
    bool exists = ck_exists(path);
    if (exists && (err = ck_read_file(path, 64u << 20, text)) < 0)
        return err;
    if (exists && text->len && (err = ck_yaml_load(doc, path, ck_buf_str(text), text->len)) < 0)
        return err;
    *root = doc->loaded ? ck_yaml_root(doc) : NULL;
    if (*root && (*root)->type != YAML_MAPPING_NODE)
        return ck_error(CK_EFORMAT, "'%s' line %d: expected a mapping", path, ck_yaml_line(*root));
    return 0;
}

/* Checkpoint i's reference (in txt) and its state record; NULL when the
 * state has none (it is then left out of ckptd's section). */
static const char *record_of(const struct ck_layout *l, const struct ck_ckpt_briefs *recs,
                             size_t i, char txt[1024], const struct ck_ckpt_brief **r)
{
    const char *ref = ck_pmf_ref_str(&l->meta->checkpoints[i].ref, txt, 1024);
    *r = ck_ckpt_briefs_find(recs, ref);
    return *r ? ref : NULL;
}

/* ckptd's own section: the sha256, size, file count and source of each
 * registered checkpoint. Always the file's last key. */
static void emit_ckptd_section(struct ck_yaml_out *o, const struct ck_layout *l,
                               const struct ck_ckpt_briefs *recs)
{
    ck_yaml_str(o, "ckptd");
    ck_yaml_map_begin(o);
    ck_yaml_str(o, "version");
    ck_yaml_str(o, CKPTD_VERSION);
    ck_yaml_str(o, "checkpoints");
    ck_yaml_map_begin(o);
    for (size_t i = 0; i < l->meta->ncheckpoints; i++) {
        char txt[1024];
        const struct ck_ckpt_brief *r;
        const char *ref = record_of(l, recs, i, txt, &r);
        if (!ref)
            continue;
        ck_yaml_str(o, ref);
        ck_yaml_map_begin(o);
        ck_yaml_str(o, "sha256");
        ck_yaml_str(o, r->sha256);
        ck_yaml_str(o, "size");
        ck_yaml_int(o, (int64_t)r->size);
        ck_yaml_str(o, "files");
        ck_yaml_int(o, r->nfiles);
        ck_yaml_str(o, "source");
        ck_yaml_str(o, r->source);
        ck_yaml_map_end(o);
    }
    ck_yaml_map_end(o);
    ck_yaml_map_end(o);
}

/* The whole file from what is there now (root of doc, or NULL) and the
 * config's keys (croot of cdoc, or NULL), into out. */
static int emit_whole(const struct ck_layout *l, const struct ck_ckpt_briefs *recs,
                      struct ck_yaml_doc *doc, yaml_node_t *root, struct ck_yaml_doc *cdoc,
                      yaml_node_t *croot, struct ck_buf *out)
{
    struct ck_yaml_out o;
    int err;
    if ((err = ck_yaml_out_begin(&o, out)) < 0)
        return err;
    ck_yaml_map_begin(&o);
    /* existing keys, unless the config or ckptd overrides them */
    if (root) {
        for (yaml_node_pair_t *p = root->data.mapping.pairs.start; p < root->data.mapping.pairs.top;
             p++) {
            yaml_node_t *k = ck_yaml_node(doc, p->key);
            const char *ks = k->type == YAML_SCALAR_NODE ? (const char *)k->data.scalar.value : "";
            bool overridden = !strcmp(ks, "ckptd");
            if (croot)
                for (yaml_node_pair_t *q = croot->data.mapping.pairs.start;
                     q < croot->data.mapping.pairs.top; q++) {
                    yaml_node_t *ck = ck_yaml_node(cdoc, q->key);
                    if (ck->type == YAML_SCALAR_NODE &&
                        !strcmp((const char *)ck->data.scalar.value, ks))
                        overridden = true;
                }
            if (overridden)
                continue;
            ck_yaml_copy(&o, doc, k);
            ck_yaml_copy(&o, doc, ck_yaml_node(doc, p->value));
        }
    }
    if (croot)
        for (yaml_node_pair_t *q = croot->data.mapping.pairs.start;
             q < croot->data.mapping.pairs.top; q++) {
            ck_yaml_copy(&o, cdoc, ck_yaml_node(cdoc, q->key));
            ck_yaml_copy(&o, cdoc, ck_yaml_node(cdoc, q->value));
        }
    emit_ckptd_section(&o, l, recs);
    ck_yaml_map_end(&o);
    return ck_yaml_out_end(&o);
}

/* ckptd's section written directly, when every scalar in it is simple: 1
 * (out holds it), 0 (not simple: out is empty), or an error. libyaml's
 * emitter was most of a new checkpoint's cost at 10,000; the text is the
 * emitter's own, which the caller checks when it takes a memo (the whole
 * file, emitted by libyaml, must end with it). */
static int emit_tail_direct(const struct ck_layout *l, const struct ck_ckpt_briefs *recs,
                            struct ck_buf *out)
{
    int err = 0;
    if (l->meta->ncheckpoints == 0 || !ck_yaml_simple_plain(CKPTD_VERSION))
        return 0;
    if ((err = ck_buf_printf(out, "ckptd:\n  version: %s\n  checkpoints:\n", CKPTD_VERSION)) < 0)
        return err;
    size_t n = 0;
    for (size_t i = 0; i < l->meta->ncheckpoints; i++) {
        char txt[1024];
        const struct ck_ckpt_brief *r;
        const char *ref = record_of(l, recs, i, txt, &r);
        if (!ref)
            continue;
        if (strlen(ref) > 128 || !ck_yaml_simple_plain(ref) || !ck_yaml_simple_plain(r->sha256) ||
            !ck_yaml_simple_plain(r->source)) {
            ck_buf_reset(out);
            return 0;
        }
        if ((err = ck_buf_printf(out,
                                 "    %s:\n      sha256: %s\n      size: %" PRIu64
                                 "\n      files: %d\n      source: %s\n",
                                 ref, r->sha256, r->size, r->nfiles, r->source)) < 0)
            return err;
        n++;
    }
    if (n == 0) /* the emitter writes an empty mapping as {} */
        ck_buf_reset(out);
    return n ? 1 : 0;
}

/* ckptd's section alone, as a document of its own: in block style its text
 * is the same as at the end of the whole file. */
static int emit_tail(const struct ck_layout *l, const struct ck_ckpt_briefs *recs,
                     struct ck_buf *out)
{
    struct ck_yaml_out o;
    int err = emit_tail_direct(l, recs, out);
    if (err != 0)
        return err < 0 ? err : 0;
    if ((err = ck_yaml_out_begin(&o, out)) < 0)
        return err;
    ck_yaml_map_begin(&o);
    emit_ckptd_section(&o, l, recs);
    ck_yaml_map_end(&o);
    return ck_yaml_out_end(&o);
}

static bool same_str(const char *a, const char *b)
{
    return a == b || (a && b && !strcmp(a, b));
}

void ck_layout_memo_release(struct ck_layout_memo *m)
{
    free(m->cfg_yaml);
    ck_buf_release(&m->head);
    ck_buf_release(&m->bytes);
    memset(m, 0, sizeof *m);
}

/* Keeps every key someone else put there, the keys of model.build_parameters
 * from the config, and ckptd's own section (sha256 and size of each
 * checkpoint), last. With a memo that still describes the file, the text
 * before ckptd's section is reused (see struct ck_layout_memo). */
int ck_layout_build_parameters(const struct ck_layout *l)
{
    char path[PATH_MAX];
    struct ck_buf old = CK_BUF_INIT, out = CK_BUF_INIT, tail = CK_BUF_INIT, head = CK_BUF_INIT;
    struct ck_yaml_doc doc = {0}, cdoc = {0};
    struct ck_layout_memo *memo = l->memo;
    const char *cfg_yaml = l->cfg->build_parameters_yaml;
    struct ck_ckpt_briefs recs = {0};
    struct stat st;
    int err;
    if ((err = ck_path_join(path, PATH_MAX, l->dir, "data/build_parameters.yaml")) < 0 ||
        (err = ck_state_ckpt_briefs(l->st, &recs)) < 0)
        return err;
    /* stat'ed before it is read: a write meanwhile gives the next pass another id */
    bool exists = stat(path, &st) == 0;
    struct ck_file_id id = exists ? ck_file_id_of(&st) : (struct ck_file_id){0};
    if (memo && memo->valid && exists && ck_file_id_equal(&memo->id, &id) &&
        same_str(memo->cfg_yaml, cfg_yaml)) {
        /* the file as this process last wrote or read it */
        head = memo->head, old = memo->bytes;
        memo->head = (struct ck_buf)CK_BUF_INIT, memo->bytes = (struct ck_buf)CK_BUF_INIT;
        memo->valid = false;
        /* room for the last section and a new checkpoint's lines: a section
         * of MBs grown by doubling from nothing is copied a dozen times */
        if ((err = ck_buf_reserve(&tail, old.len - head.len + 4096)) < 0 ||
            (err = emit_tail(l, &recs, &tail)) < 0 ||
            (err = ck_buf_reserve(&out, head.len + tail.len)) < 0 ||
            (err = ck_buf_append(&out, head.data, head.len)) < 0 ||
            (err = ck_buf_append(&out, tail.data, tail.len)) < 0)
            goto out;
    } else {
        if (memo)
            memo->valid = false;
        yaml_node_t *root = NULL, *croot = NULL;
        if ((err = ck_layout_read_build_parameters(l->dir, path, &old, &doc, &root)) < 0)
            goto out;
        if (cfg_yaml &&
            (err = ck_yaml_load(&cdoc, "model.build_parameters", cfg_yaml, strlen(cfg_yaml))) < 0)
            goto out;
        croot = cdoc.loaded ? ck_yaml_root(&cdoc) : NULL;
        if ((err = emit_whole(l, &recs, &doc, root, &cdoc, croot, &out)) < 0)
            goto out;
        /* the head, when the whole ends with ckptd's section as emitted alone
         * (checked, not assumed: else no memo, and the next pass reads again) */
        if (memo && (err = emit_tail(l, &recs, &tail)) == 0 && out.len >= tail.len &&
            !memcmp(out.data + out.len - tail.len, tail.data, tail.len))
            err = ck_buf_append(&head, out.data, out.len - tail.len);
        else if (memo && err == 0)
            memo = NULL;
        if (err < 0)
            goto out;
    }
    /* unchanged: not rewritten (an absent file reads as empty, and out never is) */
    if (old.len != out.len || memcmp(ck_buf_str(&old), ck_buf_str(&out), out.len)) {
        if ((err = ck_write_file_atomic_stat(path, ck_buf_str(&out), out.len, 0644, &st)) < 0)
            goto out;
        id = ck_file_id_of(&st);
    }
    if (memo) {
        char *c = cfg_yaml ? strdup(cfg_yaml) : NULL;
        if (!cfg_yaml || c) {
            free(memo->cfg_yaml);
            ck_buf_release(&memo->head);
            ck_buf_release(&memo->bytes);
            memo->cfg_yaml = c;
            memo->head = head, memo->bytes = out;
            head = out = (struct ck_buf)CK_BUF_INIT;
            memo->id = id;
            memo->valid = true;
        }
    }
out:
    ck_ckpt_briefs_release(&recs);
    ck_yaml_release(&doc);
    ck_yaml_release(&cdoc);
    ck_buf_release(&old);
    ck_buf_release(&out);
    ck_buf_release(&tail);
    ck_buf_release(&head);
    return err;
}

int ck_layout_ensure(const struct ck_layout *l)
{
    char path[PATH_MAX];
    int err;
    if ((err = path_in(l, path, "data/checkpoints")) < 0 || (err = ck_mkdirs(path, 0755)) < 0 ||
        (err = path_in(l, path, "data/initialisation")) < 0 || (err = ck_mkdirs(path, 0755)) < 0)
        return err;
    return 0;
}

int ck_layout_initialisation(const struct ck_layout *l)
{
    if (l->cfg->init_kind == CK_INIT_FILE)
        return init_file(l);
    if (l->cfg->init_kind == CK_INIT_PMF)
        return init_pmf(l);
    return 0;
}
