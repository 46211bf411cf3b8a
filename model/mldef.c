#include "model/mldef.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define P(key, kind, field)                                                                        \
    {                                                                                              \
        key, kind, offsetof(struct ck_op_params, field)                                            \
    }

const struct ck_mldef_param ck_mldef_params[] = {
    P("Kernel", CK_MLDEF_P_INT2, kernel),
    P("Stride", CK_MLDEF_P_INT2, stride),
    P("Dilation", CK_MLDEF_P_INT2, dilation),
    P("Pad", CK_MLDEF_P_INT4, pad),
    P("Groups", CK_MLDEF_P_INT, groups),
    P("Axis", CK_MLDEF_P_AXIS, axis),
    P("TransW", CK_MLDEF_P_BOOL, trans_w),
    P("CeilMode", CK_MLDEF_P_BOOL, ceil_mode),
    P("CountIncludePad", CK_MLDEF_P_BOOL, count_include_pad),
    P("KeepDims", CK_MLDEF_P_BOOL, keepdims),
    P("ApproxTanh", CK_MLDEF_P_BOOL, approx_tanh),
    P("Scalar", CK_MLDEF_P_SCALAR, scalar),
    P("ScalarFirst", CK_MLDEF_P_BOOL, scalar_first),
    P("Alpha", CK_MLDEF_P_FLOAT, alpha),
    P("Beta", CK_MLDEF_P_FLOAT, beta),
    P("Eps", CK_MLDEF_P_FLOAT, eps),
    P("Min", CK_MLDEF_P_BOUND, min),
    P("Max", CK_MLDEF_P_BOUND, max),
    P("Ints", CK_MLDEF_P_INTS, ints),
    {NULL, 0, 0},
};

bool ck_mldef_param_is_set(const struct ck_mldef_param *d, const struct ck_op_params *p)
{
    struct ck_op_params def;
    ck_op_params_init(&def);
    const char *a = (const char *)p + d->offset, *b = (const char *)&def + d->offset;
    switch (d->kind) {
    case CK_MLDEF_P_INT2:
        return memcmp(a, b, 2 * sizeof(int64_t)) != 0;
    case CK_MLDEF_P_INT4:
        return memcmp(a, b, 4 * sizeof(int64_t)) != 0;
    case CK_MLDEF_P_INT:
    case CK_MLDEF_P_AXIS:
        return memcmp(a, b, sizeof(int64_t)) != 0;
    case CK_MLDEF_P_BOOL:
        return *(const bool *)a != *(const bool *)b;
    case CK_MLDEF_P_FLOAT:
        return memcmp(a, b, sizeof(float)) != 0;
    case CK_MLDEF_P_SCALAR:
        return p->has_scalar;
    case CK_MLDEF_P_BOUND:
        return !isinf(*(const float *)a);
    case CK_MLDEF_P_INTS:
        return p->nints > 0;
    }
    return false;
}

static bool portable_char(char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || c == '.';
}

const char *ck_mldef_path_rule(const char *path, char *why, size_t whysz)
{
    if (!*path || path[0] == '/' || strchr(path, '\\') ||
        (((path[0] | 0x20) >= 'a' && (path[0] | 0x20) <= 'z') && path[1] == ':')) {
        snprintf(why, whysz, "not a relative path");
        return "path.escape";
    }
    if (strcmp(path, CK_MLDEF_SIGNATURE) == 0)
        return NULL;
    int depth = 0;
    for (const char *p = path; *p;) {
        const char *e = strchr(p, '/');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n == 0 || (n == 1 && p[0] == '.') || (n == 2 && p[0] == '.' && p[1] == '.')) {
            snprintf(why, whysz, "component '%.*s' could leave its folder", (int)n, p);
            return "path.escape";
        }
        for (size_t i = 0; i < n; i++)
            if (!portable_char(p[i])) {
                snprintf(why, whysz, "character '%c' is not one of [0-9a-z.]", p[i]);
                return "name.charset";
            }
        if (n > CK_MLDEF_MAX_COMPONENT) {
            snprintf(why, whysz, "'%.*s' has %zu characters (at most %d)", (int)n, p, n,
                     CK_MLDEF_MAX_COMPONENT);
            return "name.length";
        }
        p += n;
        if (*p == '/') {
            p++;
            if (*p && ++depth > CK_MLDEF_MAX_DEPTH) {
                snprintf(why, whysz, "more than %d folders deep", CK_MLDEF_MAX_DEPTH);
                return "path.depth";
            }
        }
    }
    return NULL;
}

void ck_mldef_capabilities(enum ck_op op, size_t ninputs, bool has_scalar, bool output, char *out,
                           size_t outsz)
{
    const char *w = "elementwise";
    switch (op) {
    case CK_OP_DENSE:
    case CK_OP_MATMUL:
        w = "dense";
        break;
    case CK_OP_CONV2D:
        w = "convolutional";
        break;
    case CK_OP_MAXPOOL:
    case CK_OP_AVGPOOL:
    case CK_OP_GLOBAL_AVGPOOL:
    case CK_OP_GLOBAL_MAXPOOL:
        w = "pool";
        break;
    case CK_OP_RELU:
    case CK_OP_LEAKY_RELU:
    case CK_OP_SIGMOID:
    case CK_OP_TANH:
    case CK_OP_GELU:
    case CK_OP_SOFTMAX:
    case CK_OP_LOG_SOFTMAX:
    case CK_OP_CLIP:
        w = "activation";
        break;
    case CK_OP_BATCHNORM:
    case CK_OP_LAYERNORM:
        w = "normalization";
        break;
    case CK_OP_ADD:
        w = (ninputs == 2 && !has_scalar) ? "residual,merge" : "elementwise";
        break;
    case CK_OP_SUB:
    case CK_OP_MUL:
    case CK_OP_DIV:
        w = (ninputs == 2 && !has_scalar) ? "merge" : "elementwise";
        break;
    case CK_OP_CONCAT:
        w = "merge";
        break;
    case CK_OP_RESHAPE:
    case CK_OP_FLATTEN:
    case CK_OP_TRANSPOSE:
    case CK_OP_SQUEEZE:
    case CK_OP_UNSQUEEZE:
    case CK_OP_SLICE:
    case CK_OP_SPLIT:
    case CK_OP_PAD:
    case CK_OP_GATHER:
        w = "shape";
        break;
    case CK_OP_REDUCE_MEAN:
    case CK_OP_REDUCE_SUM:
        w = "reduce";
        break;
    default:
        break;
    }
    snprintf(out, outsz, "feed-forward,%s%s", w, output ? ",output" : "");
}
