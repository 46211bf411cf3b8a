#include "model/weightsel.h"
#include "common/error.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const containers[] = {
    "state_dict", "model_state_dict", "model",          "module",    "net",    "network", "ema",
    "model_ema",  "ema_state_dict",   "state_dict_ema", "ema_model", "params", "weights",
};

/* Top-level keys of training state: tensors there are never the model's. */
static const char *const training_state[] = {
    "optimizer",
    "optimizer_states",
    "optimizer_state_dict",
    "optimizer_state",
    "optim",
    "optimizers",
    "lr_scheduler",
    "lr_schedulers",
    "scheduler",
    "schedulers",
    "scheduler_state_dict",
    "lr_scheduler_state_dict",
    "scaler",
    "grad_scaler",
    "amp",
    "callbacks",
    "loops",
    "rng_state",
    "rng_states",
    "hyper_parameters",
    "hparams",
    "args",
    "config",
    "metrics",
    "epoch",
    "global_step",
    "step",
    "iteration",
    "best_metric",
    "best_score",
    "loss",
    "datamodule_hyper_parameters",
};

static const char *const wrappers[] = {"model.", "module.", "_orig_mod."};

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

static bool in_list(const char *const *list, size_t n, const char *s, size_t len)
{
    for (size_t i = 0; i < n; i++)
        if (strlen(list[i]) == len && !memcmp(list[i], s, len))
            return true;
    return false;
}

static bool is_numeric(const struct ck_tensor *t)
{
    return t->dtype != CK_DT_STRING && t->dtype != CK_DT_INVALID;
}

/* Tensors whose name starts with prefix. */
static size_t count_under(const struct ck_tensor_set *s, const char *prefix)
{
    size_t n = 0, pl = strlen(prefix);
    for (size_t i = 0; i < s->ntensors; i++)
        if (!strncmp(s->tensors[i].name, prefix, pl) && is_numeric(&s->tensors[i]))
            n++;
    return n;
}

/* Appends the wrappers every tensor under out->prefix shares. */
static void strip_wrappers(const struct ck_tensor_set *s, struct ck_weightsel *out)
{
    for (;;) {
        size_t pl = strlen(out->prefix), total = count_under(s, out->prefix);
        bool more = false;
        for (size_t w = 0; w < NELEM(wrappers) && total && !more; w++) {
            char next[CK_WEIGHTSEL_PREFIX_MAX];
            if (pl + strlen(wrappers[w]) >= sizeof next)
                continue;
            snprintf(next, sizeof next, "%s%s", out->prefix, wrappers[w]);
            if (count_under(s, next) == total) {
                memcpy(out->prefix, next, strlen(next) + 1);
                more = true;
            }
        }
        if (!more)
            return;
    }
}

int ck_weightsel_find(const struct ck_tensor_set *s, const char *choice, const char *key,
                      struct ck_weightsel *out)
{
    const char *file = s->path ? s->path : "the checkpoint";
    memset(out, 0, sizeof *out);
    if (choice) {
        size_t n = strlen(choice);
        while (n && choice[n - 1] == '.')
            n--;
        if (n + 2 > sizeof out->prefix)
            return ck_error(CK_EUSAGE, "%s '%.64s...' is too long", key, choice);
        snprintf(out->container, sizeof out->container, "%.*s", (int)n, choice);
        snprintf(out->prefix, sizeof out->prefix, "%.*s%s", (int)n, choice, n ? "." : "");
        if (!count_under(s, out->prefix))
            return ck_error(CK_EFORMAT, "'%s': %s '%s' holds no tensor of the file", file, key,
                            out->container);
        strip_wrappers(s, out);
        out->ntensors = count_under(s, out->prefix);
        return 0;
    }
    /* which containers hold tensors, and whether anything else at the top does */
    size_t found[NELEM(containers)] = {0};
    bool plain = false;
    for (size_t i = 0; i < s->ntensors; i++) {
        const char *name = s->tensors[i].name;
        size_t len = strcspn(name, ".");
        if (!is_numeric(&s->tensors[i]) || !name[len] ||
            in_list(training_state, NELEM(training_state), name, len)) {
            /* a top-level tensor with no dot is a plain state dict's own ("bias") */
            if (is_numeric(&s->tensors[i]) && !name[len] &&
                !in_list(training_state, NELEM(training_state), name, len))
                plain = true;
            continue;
        }
        size_t c = 0;
        while (c < NELEM(containers) &&
               !(strlen(containers[c]) == len && !memcmp(containers[c], name, len)))
            c++;
        if (c == NELEM(containers))
            plain = true;
        else
            found[c]++;
    }
    size_t nfound = 0, which = 0;
    for (size_t c = 0; c < NELEM(containers); c++)
        if (found[c]) {
            nfound++;
            which = nfound == 1 ? c : which;
        }
    if (!plain && nfound > 1) {
        char list[512] = "";
        size_t k = 0;
        for (size_t c = 0; c < NELEM(containers) && k < sizeof list; c++)
            if (found[c])
                k += (size_t)snprintf(list + k, sizeof list - k, "%s'%s' (%zu tensors)",
                                      k ? " or " : "", containers[c], found[c]);
        return ck_error(CK_EFORMAT,
                        "'%s': the model's weights could be under %s: choose one (%s; "
                        "pack.weights: %s in the config, --weights %s on the command line)",
                        file, list, key, containers[which], containers[which]);
    }
    if (!plain && nfound == 1) {
        snprintf(out->container, sizeof out->container, "%s", containers[which]);
        snprintf(out->prefix, sizeof out->prefix, "%s.", containers[which]);
    }
    strip_wrappers(s, out);
    out->ntensors = count_under(s, out->prefix);
    return 0;
}

/* Edit distance, capped at the lengths this is used with (names <= 4096). */
static size_t distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 512 || lb > 512)
        return SIZE_MAX;
    size_t *row = malloc((lb + 1) * sizeof *row);
    if (!row)
        return SIZE_MAX;
    for (size_t j = 0; j <= lb; j++)
        row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j];
            size_t best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    size_t d = row[lb];
    free(row);
    return d;
}

static bool ends_with_part(const char *s, const char *name)
{
    size_t n = strlen(s), k = strlen(name);
    return n > k && !strcmp(s + n - k, name) && s[n - k - 1] == '.';
}

void ck_weightsel_closest(const struct ck_tensor_set *s, const char *prefix, const char *name,
                          size_t n, char *out, size_t outsz)
{
    size_t pl = prefix ? strlen(prefix) : 0;
    enum { MAXN = 8 };
    size_t best[MAXN], score[MAXN], got = 0;
    if (n > MAXN)
        n = MAXN;
    out[0] = 0;
    for (size_t i = 0; i < s->ntensors && n; i++) {
        const char *t = s->tensors[i].name;
        if (pl && !strncmp(t, prefix, pl))
            t += pl; /* shown and compared as the layer list would write it */
        /* a name ending in .NAME first (a prefix away), then the nearest spelling */
        size_t sc = ends_with_part(t, name) ? strlen(t) - strlen(name) : 100000 + distance(t, name);
        size_t pos = got;
        while (pos > 0 && score[pos - 1] > sc)
            pos--;
        if (pos >= n)
            continue;
        size_t last = got < n ? got : n - 1;
        for (size_t k = last; k > pos; k--) {
            best[k] = best[k - 1];
            score[k] = score[k - 1];
        }
        best[pos] = i;
        score[pos] = sc;
        if (got < n)
            got++;
    }
    size_t k = 0;
    for (size_t i = 0; i < got && k < outsz; i++) {
        const char *t = s->tensors[best[i]].name;
        if (pl && !strncmp(t, prefix, pl))
            t += pl;
        k += (size_t)snprintf(out + k, outsz - k, "%s'%s'", i ? ", " : "", t);
    }
}
