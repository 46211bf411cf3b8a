/* Optimizer state by each source's naming (model/optstate.h). */
#include "model/optstate.h"
#include "model/weightsel.h"

#include "common/error.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define TF_SLOT "/.OPTIMIZER_SLOT/"
#define TF_VALUE "/.ATTRIBUTES/VARIABLE_VALUE"

static const char *const tf1_slots[] = {"Adam",      "Adam_1",  "Momentum", "RMSProp",
                                        "RMSProp_1", "Adagrad", "Adadelta", "Adadelta_1",
                                        "Ftrl",      "Ftrl_1",  NULL};

struct found {
    size_t tensor, order, group;
    char *param, *key;
};

struct list {
    struct found *v;
    size_t n, cap;
};

static int push(struct list *l, size_t tensor, const char *param, size_t plen, const char *key,
                size_t klen)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 16;
        struct found *v = realloc(l->v, cap * sizeof *v);
        if (!v)
            return ck_error(CK_ENOMEM, "out of memory");
        l->v = v;
        l->cap = cap;
    }
    struct found *f = &l->v[l->n];
    f->tensor = tensor;
    f->order = l->n;
    f->param = strndup(param, plen);
    f->key = strndup(key, klen);
    if (!f->param || !f->key) {
        free(f->param), free(f->key);
        return ck_error(CK_ENOMEM, "out of memory");
    }
    l->n++;
    return 0;
}

static bool same_shape(const struct ck_tensor *a, const struct ck_tensor *b)
{
    if (a->rank != b->rank)
        return false;
    for (int d = 0; d < a->rank; d++)
        if (a->dims[d] != b->dims[d])
            return false;
    return true;
}

static bool is_float(enum ck_dtype t)
{
    return t == CK_DT_F16 || t == CK_DT_BF16 || t == CK_DT_F32 || t == CK_DT_F64;
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

/* One tensor by the SameDiff/NNabla and TF conventions. */
static int classify(const struct ck_tensor_set *s, size_t i, struct ck_optstate *o, struct list *l)
{
    const struct ck_tensor *t = &s->tensors[i];
    const char *name = t->name, *cut;
    if (t->role && !strcmp(t->role, "updater")) {
        const char *last = NULL;
        for (const char *p = strstr(name, "/updater/"); p; p = strstr(p + 1, "/updater/"))
            last = p;
        o->is_state[i] = true;
        if (!last || last == name || !last[9]) {
            o->unmapped++;
            return 0;
        }
        /* tied only to a tensor of the set; an NNabla state array (not the
         * scalar step count) only when its shape is its parameter's */
        char *param = strndup(name, (size_t)(last - name));
        if (!param)
            return ck_error(CK_ENOMEM, "out of memory");
        const struct ck_tensor *v = ck_tensor_set_find(s, param);
        bool nnp = s->format && !strcmp(s->format, "nnp");
        int err = 0;
        if (!v || (v->role && !strcmp(v->role, "updater")) ||
            (nnp && t->rank > 0 && !same_shape(v, t)))
            o->unmapped++;
        else
            err = push(l, i, param, strlen(param), last + 9, strlen(last + 9));
        free(param);
        return err;
    }
    if (!s->format || strcmp(s->format, "tf-bundle"))
        return 0;
    if ((cut = strstr(name, TF_SLOT)) && ends_with(name, TF_VALUE)) {
        /* <v>/.OPTIMIZER_SLOT/<optimizer>/<key>/.ATTRIBUTES/VARIABLE_VALUE */
        const char *end = name + strlen(name) - strlen(TF_VALUE), *key = end;
        while (key > cut + strlen(TF_SLOT) && key[-1] != '/')
            key--;
        o->is_state[i] = true;
        size_t vlen = (size_t)(cut - name);
        char *param = malloc(vlen + sizeof TF_VALUE);
        if (!param)
            return ck_error(CK_ENOMEM, "out of memory");
        memcpy(param, name, vlen);
        memcpy(param + vlen, TF_VALUE, sizeof TF_VALUE);
        int err = 0;
        if (key == end || key == cut + strlen(TF_SLOT) || !vlen || !ck_tensor_set_find(s, param))
            o->unmapped++;
        else
            err = push(l, i, param, strlen(param), key, (size_t)(end - key));
        free(param);
        return err;
    }
    const char *slash = strrchr(name, '/');
    if (!slash || slash == name)
        return 0;
    for (const char *const *k = tf1_slots; *k; k++)
        if (!strcmp(slash + 1, *k)) {
            char *param = strndup(name, (size_t)(slash - name));
            if (!param)
                return ck_error(CK_ENOMEM, "out of memory");
            const struct ck_tensor *v = ck_tensor_set_find(s, param);
            int err = 0;
            if (v && v->dtype == t->dtype && same_shape(v, t)) {
                o->is_state[i] = true;
                err = push(l, i, param, strlen(param), *k, strlen(*k));
            }
            free(param);
            return err;
        }
    return 0;
}

/* "[0, 1, 2]" into ids (appended); false when it is not such a list. */
static bool parse_ids(const char *text, size_t **ids, size_t *n)
{
    const char *p = text;
    if (*p++ != '[')
        return false;
    while (*p == ' ')
        p++;
    while (*p != ']') {
        char *end;
        unsigned long long v = strtoull(p, &end, 10);
        if (end == p || v > SIZE_MAX / 2)
            return false;
        size_t *nv = realloc(*ids, (*n + 1) * sizeof *nv);
        if (!nv)
            return false;
        *ids = nv;
        (*ids)[(*n)++] = (size_t)v;
        p = end;
        while (*p == ' ' || *p == ',')
            p++;
        if (!*p)
            return false;
    }
    return p[1] == '\0';
}

/* PyTorch: "<P>state.<N>.<key>" tied through "<P>param_groups.<g>.params".
 * In a training checkpoint whose model tensors sit under a container
 * (model/weightsel.h: a Lightning .ckpt's state_dict), only those are the
 * variables: a callback's tensor outside it is not a parameter. */
static int torch_state(const struct ck_tensor_set *s, struct ck_optstate *o, struct list *l)
{
    struct ck_weightsel ws;
    const char *mp = NULL;
    if (ck_weightsel_find(s, NULL, "pack.weights", &ws) == 0 && ws.prefix[0])
        mp = ws.prefix;
    ck_error_clear(); /* two candidates: no container, every tensor counts as before */
    size_t mpl = mp ? strlen(mp) : 0;
    for (size_t m = 0; m < s->nmeta; m++) {
        const char *k = s->meta[m].key, *pg = strstr(k, "param_groups.");
        if (!pg || !ends_with(k, ".params") || (pg != k && pg[-1] != '.'))
            continue;
        size_t plen = (size_t)(pg - k);
        bool seen = plen == 0; /* the first group names the prefix; the rest follow it */
        for (size_t q = 0; q < m && !seen; q++)
            seen = !strncmp(s->meta[q].key, k, plen + 13) && ends_with(s->meta[q].key, ".params");
        if (seen)
            continue;
        /* every group's ids, in order */
        size_t *ids = NULL, nids = 0;
        bool ok = true;
        for (size_t q = m; q < s->nmeta && ok; q++) {
            const char *kq = s->meta[q].key;
            if (!strncmp(kq, k, plen + 13) && ends_with(kq, ".params"))
                ok = parse_ids(s->meta[q].value, &ids, &nids);
        }
        /* the variables model.parameters() lists, in file order */
        size_t *cand = calloc(s->ntensors + 1, sizeof *cand), ncand = 0;
        if (!cand) {
            free(ids);
            return ck_error(CK_ENOMEM, "out of memory");
        }
        for (size_t i = 0; i < s->ntensors; i++) {
            const struct ck_tensor *t = &s->tensors[i];
            if (!strncmp(t->name, k, plen) || (mp && strncmp(t->name, mp, mpl)) ||
                !is_float(t->dtype) || o->is_state[i] || ends_with(t->name, ".running_mean") ||
                ends_with(t->name, ".running_var"))
                continue;
            cand[ncand++] = i;
        }
        ok = ok && nids == ncand;
        size_t first = l->n;
        int err = 0;
        for (size_t i = 0; i < s->ntensors && err >= 0; i++) {
            const struct ck_tensor *t = &s->tensors[i];
            if (strncmp(t->name, k, plen) || strncmp(t->name + plen, "state.", 6))
                continue;
            o->is_state[i] = true;
            const char *p = t->name + plen + 6;
            char *end;
            unsigned long long id = strtoull(p, &end, 10);
            size_t pos = 0;
            while (pos < nids && ids[pos] != id)
                pos++;
            if (!ok || end == p || *end != '.' || !end[1] || pos == nids) {
                ok = false;
                continue;
            }
            const struct ck_tensor *v = &s->tensors[cand[pos]];
            if (t->rank > 0 && !same_shape(t, v)) {
                ok = false;
                continue;
            }
            err = push(l, i, v->name, strlen(v->name), end + 1, strlen(end + 1));
        }
        free(ids);
        free(cand);
        if (err < 0)
            return err;
        if (!ok) { /* not tied cleanly: none of it is */
            for (size_t f = first; f < l->n; f++)
                free(l->v[f].param), free(l->v[f].key);
            l->n = first;
            for (size_t i = 0; i < s->ntensors; i++)
                if (!strncmp(s->tensors[i].name, k, plen) &&
                    !strncmp(s->tensors[i].name + plen, "state.", 6))
                    o->unmapped++;
        }
    }
    return 0;
}

static int by_param(const void *a, const void *b)
{
    const struct found *x = a, *y = b;
    int c = strcmp(x->param, y->param);
    return c ? c : (x->order > y->order) - (x->order < y->order);
}

static int by_group(const void *a, const void *b)
{
    const struct found *x = a, *y = b;
    if (x->group != y->group)
        return (x->group > y->group) - (x->group < y->group);
    return (x->order > y->order) - (x->order < y->order);
}

int ck_optstate_find(const struct ck_tensor_set *s, struct ck_optstate *o)
{
    struct list l = {0};
    int err = 0;
    memset(o, 0, sizeof *o);
    if (!(o->is_state = calloc(s->ntensors + 1, sizeof *o->is_state)))
        return ck_error(CK_ENOMEM, "out of memory");
    for (size_t i = 0; i < s->ntensors && err >= 0; i++)
        err = classify(s, i, o, &l);
    if (err >= 0 && s->format && !strcmp(s->format, "pt"))
        err = torch_state(s, o, &l);
    if (err < 0) {
        for (size_t f = 0; f < l.n; f++)
            free(l.v[f].param), free(l.v[f].key);
        free(l.v);
        ck_optstate_release(o);
        return err;
    }
    /* grouped by variable, in order of first appearance */
    if (l.n) {
        qsort(l.v, l.n, sizeof *l.v, by_param);
        for (size_t f = 0; f < l.n; f++)
            l.v[f].group =
                f && !strcmp(l.v[f].param, l.v[f - 1].param) ? l.v[f - 1].group : l.v[f].order;
        qsort(l.v, l.n, sizeof *l.v, by_group);
    }
    if (l.n && !(o->v = calloc(l.n, sizeof *o->v))) {
        for (size_t f = 0; f < l.n; f++)
            free(l.v[f].param), free(l.v[f].key);
        free(l.v);
        ck_optstate_release(o);
        return ck_error(CK_ENOMEM, "out of memory");
    }
    for (size_t f = 0; f < l.n; f++)
        o->v[f] = (struct ck_optslot){l.v[f].tensor, l.v[f].param, l.v[f].key};
    o->n = l.n;
    free(l.v);
    return 0;
}

void ck_optstate_release(struct ck_optstate *o)
{
    if (!o)
        return;
    for (size_t i = 0; i < o->n; i++)
        free(o->v[i].param), free(o->v[i].key);
    free(o->v);
    free(o->is_state);
    memset(o, 0, sizeof *o);
}
