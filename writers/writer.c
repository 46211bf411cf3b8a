#include "writers/writer.h"
#include "writers/mldef.h"
#include "common/error.h"
#include "writers/samediff.h"

#include <stddef.h>
#include <string.h>

/* One row per deployment format (writers/<name>.c). */
const struct ck_writer_ops *const ck_writers[] = {
    &ck_writer_mldef,
    &ck_writer_samediff,
    NULL,
};

const struct ck_writer_ops *ck_writer_find(const char *name)
{
    for (size_t i = 0; name && ck_writers[i]; i++)
        if (strcmp(ck_writers[i]->name, name) == 0)
            return ck_writers[i];
    return NULL;
}

int ck_writer_open(const struct ck_writer_ops *ops, const char *path,
                   const struct ck_writer_opts *o, struct ck_writer **out)
{
    *out = NULL;
    int err = ops->open(path, o, out);
    if (err < 0)
        return err;
    (*out)->ops = ops;
    return 0;
}

int ck_writer_add(struct ck_writer *w, const struct ck_model *m)
{
    return w->ops->add(w, m);
}

int ck_writer_finish(struct ck_writer *w)
{
    return w->ops->finish(w);
}

void ck_writer_free(struct ck_writer *w)
{
    if (w)
        w->ops->free(w);
}
