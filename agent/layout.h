/* The PMF tree's layout around the checkpoints: the folders
 * (data/checkpoints, data/initialisation), the model's identity (producer,
 * name, id), the training configuration file at the top, the initialisation
 * (a file or another PMF tree), data/build_parameters.yaml. A pass
 * (agent/scan.h) calls these in order; each brings its part of DIR and of
 * the metadata being built up to date, and changes nothing when nothing
 * changed. */
#ifndef CK_LAYOUT_H
#define CK_LAYOUT_H

#include "agent/config.h"
#include "agent/state.h"
#include "common/buf.h"
#include "common/fsutil.h"
#include "common/yamlutil.h"
#include "writers/pmf.h"

#include <stdbool.h>

/* metadata.yaml is read whole; a bigger one is refused. */
#define CK_METADATA_MAX (256u << 20)

/* data/build_parameters.yaml as the last pass left it, kept by a long-lived
 * caller (the watcher, in its ck_scan_memo). While the file is the one that
 * pass wrote or read (the same ck_file_id) and the config's
 * model.build_parameters is the same, the keys before ckptd's own section
 * are taken from here instead of reading and parsing the file again (at
 * 10,000 checkpoints it is 1.5 MB of YAML, and its parse was half a new
 * checkpoint's cost). Anyone else's write (the deploy stage's archives
 * list, a user) gives a new id, and the file is read again. */
struct ck_layout_memo {
    bool valid;
    struct ck_file_id id;
    char *cfg_yaml;      /* the model.build_parameters it was made with (NULL: none) */
    struct ck_buf head;  /* the file's text before `ckptd:` (ckptd's section is last) */
    struct ck_buf bytes; /* the whole file */
};
void ck_layout_memo_release(struct ck_layout_memo *m);

struct ck_layout {
    const char *dir;             /* the model root */
    const struct ck_config *cfg; /* model.* */
    struct ck_state *st;         /* the hash cache and the model id's copy */
    struct ck_pmf_meta *meta;    /* the metadata being built (updated in place) */
    struct ck_layout_memo *memo; /* NULL: build_parameters.yaml is read each pass */
};

/* Reads DIR/data/build_parameters.yaml for a rewrite that keeps what others
 * put there: path gets its name, text and doc hold it (release both), *root
 * is its mapping or NULL when the file is absent or empty. CK_EFORMAT naming
 * the file and line when it is not a mapping. Both writers of the file (the
 * layout's own section, the deploy stage's archives) start here. */
int ck_layout_read_build_parameters(const char *dir, char *path, struct ck_buf *text,
                                    struct ck_yaml_doc *doc, yaml_node_t **root);

/* data/checkpoints and data/initialisation exist. */
int ck_layout_ensure(const struct ck_layout *l);
/* producer (ours, or another producer's kept), name, id (fresh: a new tree). */
int ck_layout_identity(const struct ck_layout *l, bool fresh);
/* The training configuration at the top of the tree: model.configuration,
 * else a common name found in DIR, else a placeholder ckptd writes. */
int ck_layout_configuration(const struct ck_layout *l);
/* model.initialisation: a file under data/initialisation, or a PMF tree
 * linked there without its checkpoints. Nothing when not configured. */
int ck_layout_initialisation(const struct ck_layout *l);
/* data/build_parameters.yaml: others' keys kept, model.build_parameters,
 * and ckptd's section (sha256 and size of each registered checkpoint). */
int ck_layout_build_parameters(const struct ck_layout *l);
/* Reads and parses a metadata.yaml. */
int ck_layout_read_meta(const char *path, struct ck_pmf_meta *m);

#endif
