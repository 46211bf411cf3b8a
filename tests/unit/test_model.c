/* The model layer: op names, ck_model_check, conversion to float32/64, the
 * layer list, shape inference and the NNabla mapping. Expected values come
 * from IEEE 754 bit patterns worked out by hand, from the shapes the layer
 * arithmetic gives on paper, and from FORMAT-FACTS section 4.4 for the real
 * LeNet, never from the code under test. */
#include "test_main.h"

#include "common/error.h"
#include "model/convert.h"
#include "model/layers.h"
#include "model/model.h"
#include "model/shape.h"
#include "model/tensor.h"
#include "readers/nnp_model.h"
#include "readers/reader.h"

#include <fcntl.h>
#include <unistd.h>

#include <math.h>
#include <stdbool.h>

/* ---- helpers ---- */

static struct ck_tensor mk(enum ck_dtype dt, const void *data, uint64_t nbytes, int rank,
                           const int64_t *dims)
{
    struct ck_tensor t;
    memset(&t, 0, sizeof t);
    t.name = (char *)"t";
    t.dtype = dt;
    t.rank = rank;
    for (int i = 0; i < rank; i++)
        t.dims[i] = dims[i];
    t.data = data;
    t.nbytes = nbytes;
    return t;
}

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ---- conversion ---- */

static void convert_f16_bit_patterns(void **state)
{
    (void)state;
    /* little-endian halves: 1, -2, 2^-24 (smallest subnormal), 65504 (largest),
     * +inf, -inf, quiet NaN, -0, 2^-14 (smallest normal), 1023 * 2^-24 */
    static const uint16_t h[] = {0x3c00, 0xc000, 0x0001, 0x7bff, 0x7c00,
                                 0xfc00, 0x7e00, 0x8000, 0x0400, 0x03ff};
    unsigned char le[sizeof h], be[sizeof h];
    for (size_t i = 0; i < 10; i++) {
        le[2 * i] = (unsigned char)h[i], le[2 * i + 1] = (unsigned char)(h[i] >> 8);
        be[2 * i] = (unsigned char)(h[i] >> 8), be[2 * i + 1] = (unsigned char)h[i];
    }
    int64_t dims[] = {10};
    float want[] = {1.0f,      -2.0f, 0x1p-24f, 65504.0f, INFINITY,
                    -INFINITY, NAN,   -0.0f,    0x1p-14f, 1023 * 0x1p-24f};
    for (int pass = 0; pass < 2; pass++) {
        struct ck_tensor t = mk(CK_DT_F16, pass ? be : le, 20, 1, dims);
        t.big_endian = pass;
        float out[10];
        struct ck_convert_report rep = {0};
        assert_int_equal(ck_tensor_read_f32(&t, 0, 10, out, &rep), 0);
        for (int i = 0; i < 10; i++) {
            if (isnan(want[i]))
                assert_true(isnan(out[i]));
            else
                assert_int_equal(f32_bits(out[i]), f32_bits(want[i]));
        }
        assert_true(signbit(out[7]));
        assert_int_equal(rep.converted, 10);
        assert_int_equal(rep.inexact, 0);
        assert_int_equal(rep.nonfinite, 3);
        assert_false(ck_convert_lossy(&rep));
    }
    assert_int_equal(ck_convert_kind_f32(CK_DT_F16), CK_CONVERT_EXACT);
}

static void convert_bf16_f32_f64(void **state)
{
    (void)state;
    /* bfloat16 0x3f80 = 1.0, 0xc049 = -3.140625, 0x7f80 = +inf */
    unsigned char bf[] = {0x80, 0x3f, 0x49, 0xc0, 0x80, 0x7f};
    int64_t d3[] = {3};
    struct ck_tensor t = mk(CK_DT_BF16, bf, 6, 1, d3);
    float out[3];
    assert_int_equal(ck_tensor_read_f32(&t, 0, 3, out, NULL), 0);
    assert_true(out[0] == 1.0f && out[1] == -3.140625f && isinf(out[2]));

    /* big-endian float32 3f800000 = 1.0, c0490fdb = -pi (float) */
    unsigned char f32be[] = {0x3f, 0x80, 0, 0, 0xc0, 0x49, 0x0f, 0xdb};
    int64_t d2[] = {2};
    t = mk(CK_DT_F32, f32be, 8, 1, d2);
    t.big_endian = true;
    assert_int_equal(ck_tensor_read_f32(&t, 0, 2, out, NULL), 0);
    assert_int_equal(f32_bits(out[0]), 0x3f800000u);
    assert_int_equal(f32_bits(out[1]), 0xc0490fdbu);

    /* float64 LE: 1.0 (exact), 0.1 = 0x3fb999999999999a (float 0x3dcccccd, inexact),
     * 1e300 (overflows to inf), -0.5 (exact) */
    uint64_t dv[] = {0x3ff0000000000000u, 0x3fb999999999999au, 0x7e37e43c8800759cu,
                     0xbfe0000000000000u};
    unsigned char f64[32];
    for (int i = 0; i < 4; i++)
        for (int b = 0; b < 8; b++)
            f64[8 * i + b] = (unsigned char)(dv[i] >> (8 * b));
    int64_t d4[] = {4};
    t = mk(CK_DT_F64, f64, 32, 1, d4);
    struct ck_convert_report rep = {0};
    float o4[4];
    assert_int_equal(ck_tensor_read_f32(&t, 0, 4, o4, &rep), 0);
    assert_int_equal(f32_bits(o4[0]), 0x3f800000u);
    assert_int_equal(f32_bits(o4[1]), 0x3dcccccdu);
    assert_true(isinf(o4[2]) && o4[2] > 0);
    assert_int_equal(f32_bits(o4[3]), 0xbf000000u);
    assert_int_equal(rep.inexact, 2);
    assert_int_equal(rep.nonfinite, 1);
    assert_true(ck_convert_lossy(&rep));
    /* the same as float64: exact */
    double od[4];
    memset(&rep, 0, sizeof rep);
    assert_int_equal(ck_tensor_read_f64(&t, 1, 2, od, &rep), 0);
    assert_true(od[0] == 0.1 && od[1] == 1e300);
    assert_int_equal(rep.inexact, 0);
    assert_int_equal(rep.converted, 2);
}

static void convert_integers_and_rounding(void **state)
{
    (void)state;
    /* int64 LE: 2^24+1 (rounds to 2^24), INT64_MAX (rounds to 2^63), -5 */
    int64_t iv[] = {16777217, INT64_MAX, -5};
    unsigned char i64[24];
    for (int i = 0; i < 3; i++)
        for (int b = 0; b < 8; b++)
            i64[8 * i + b] = (unsigned char)((uint64_t)iv[i] >> (8 * b));
    int64_t d3[] = {3};
    struct ck_tensor t = mk(CK_DT_I64, i64, 24, 1, d3);
    float out[3];
    struct ck_convert_report rep = {0};
    assert_int_equal(ck_tensor_read_f32(&t, 0, 3, out, &rep), 0);
    assert_true(out[0] == 16777216.0f && out[1] == 0x1p63f && out[2] == -5.0f);
    assert_int_equal(rep.inexact, 2);
    /* float64 holds 2^24+1 exactly but not INT64_MAX */
    double od[3];
    memset(&rep, 0, sizeof rep);
    assert_int_equal(ck_tensor_read_f64(&t, 0, 3, od, &rep), 0);
    assert_true(od[0] == 16777217.0 && od[1] == 0x1p63 && od[2] == -5.0);
    assert_int_equal(rep.inexact, 1);

    /* uint64 max rounds to 2^64 */
    unsigned char u64[8];
    memset(u64, 0xff, 8);
    int64_t d1[] = {1};
    t = mk(CK_DT_U64, u64, 8, 1, d1);
    memset(&rep, 0, sizeof rep);
    assert_int_equal(ck_tensor_read_f32(&t, 0, 1, out, &rep), 0);
    assert_true(out[0] == 0x1p64f);
    assert_int_equal(rep.inexact, 1);

    /* big-endian int32 fffffffe = -2, 01000001 = 2^24+1 (inexact) */
    unsigned char i32[] = {0xff, 0xff, 0xff, 0xfe, 0x01, 0x00, 0x00, 0x01};
    int64_t d2[] = {2};
    t = mk(CK_DT_I32, i32, 8, 1, d2);
    t.big_endian = true;
    memset(&rep, 0, sizeof rep);
    assert_int_equal(ck_tensor_read_f32(&t, 0, 2, out, &rep), 0);
    assert_true(out[0] == -2.0f && out[1] == 16777216.0f);
    assert_int_equal(rep.inexact, 1);

    /* bool: any non-zero byte is 1; uint8 255; int8 -128; uint16 LE 0xffff */
    unsigned char b[] = {0, 2, 1};
    t = mk(CK_DT_BOOL, b, 3, 1, d3);
    assert_int_equal(ck_tensor_read_f32(&t, 0, 3, out, NULL), 0);
    assert_true(out[0] == 0.0f && out[1] == 1.0f && out[2] == 1.0f);
    unsigned char u8[] = {255, 0x80};
    t = mk(CK_DT_U8, u8, 2, 1, d2);
    assert_int_equal(ck_tensor_read_f32(&t, 0, 2, out, NULL), 0);
    assert_true(out[0] == 255.0f && out[1] == 128.0f);
    t = mk(CK_DT_I8, u8, 2, 1, d2);
    assert_int_equal(ck_tensor_read_f32(&t, 0, 2, out, NULL), 0);
    assert_true(out[0] == -1.0f && out[1] == -128.0f);
    unsigned char u16[] = {0xff, 0xff};
    t = mk(CK_DT_U16, u16, 2, 1, d1);
    assert_int_equal(ck_tensor_read_f32(&t, 0, 1, out, NULL), 0);
    assert_true(out[0] == 65535.0f);
    /* big-endian 16-bit: int16 fffe = -2, uint16 0100 = 256; little-endian int16 fffe = -257 */
    unsigned char be16[] = {0xff, 0xfe};
    t = mk(CK_DT_I16, be16, 2, 1, d1);
    t.big_endian = true;
    assert_int_equal(ck_tensor_read_f32(&t, 0, 1, out, NULL), 0);
    assert_true(out[0] == -2.0f);
    t.big_endian = false;
    assert_int_equal(ck_tensor_read_f32(&t, 0, 1, out, NULL), 0);
    assert_true(out[0] == -257.0f);
    unsigned char b256[] = {0x01, 0x00};
    t = mk(CK_DT_U16, b256, 2, 1, d1);
    t.big_endian = true;
    assert_int_equal(ck_tensor_read_f32(&t, 0, 1, out, NULL), 0);
    assert_true(out[0] == 256.0f);
    /* quantized: the raw integer, said so by the kind */
    t = mk(CK_DT_QI8, u8, 2, 1, d2);
    assert_int_equal(ck_tensor_read_f32(&t, 0, 2, out, NULL), 0);
    assert_true(out[0] == -1.0f);
    assert_int_equal(ck_convert_kind_f32(CK_DT_QI8), CK_CONVERT_RAW);
    assert_int_equal(ck_convert_kind_f32(CK_DT_I64), CK_CONVERT_ROUNDS);
    assert_int_equal(ck_convert_kind_f32(CK_DT_F32), CK_CONVERT_SAME);
    assert_int_equal(ck_convert_kind_f32(CK_DT_STRING), CK_CONVERT_NONE);
}

static void convert_complex_and_float8(void **state)
{
    (void)state;
    /* complex64 (1.5, 2.0) and (-1, 0): real parts, one imaginary part dropped */
    float c[] = {1.5f, 2.0f, -1.0f, 0.0f};
    int64_t d2[] = {2};
    struct ck_tensor t = mk(CK_DT_C64, c, 16, 1, d2);
    float out[4];
    struct ck_convert_report rep = {0};
    assert_int_equal(ck_tensor_read_f32(&t, 0, 2, out, &rep), 0);
    assert_true(out[0] == 1.5f && out[1] == -1.0f);
    assert_int_equal(rep.imag_dropped, 1);
    assert_true(ck_convert_lossy(&rep));
    /* float8: e4m3fn 0x38 = 1.0, 0x7f = NaN, 0xc0 = -2; e5m2 0x3c = 1.0, 0x7c = inf */
    unsigned char e4[] = {0x38, 0x7f, 0xc0}, e5[] = {0x3c, 0x7c};
    int64_t d3[] = {3};
    t = mk(CK_DT_F8_E4M3, e4, 3, 1, d3);
    assert_int_equal(ck_tensor_read_f32(&t, 0, 3, out, NULL), 0);
    assert_true(out[0] == 1.0f && isnan(out[1]) && out[2] == -2.0f);
    t = mk(CK_DT_F8_E5M2, e5, 2, 1, d2);
    assert_int_equal(ck_tensor_read_f32(&t, 0, 2, out, NULL), 0);
    assert_true(out[0] == 1.0f && isinf(out[1]));
}

static void convert_fortran_order_and_ranges(void **state)
{
    (void)state;
    /* a [2,3] int16 array stored column-major: C-order element k holds k */
    int16_t colmajor[] = {0, 3, 1, 4, 2, 5};
    int64_t dims[] = {2, 3};
    struct ck_tensor t = mk(CK_DT_I16, colmajor, 12, 2, dims);
    t.fortran_order = true;
    float out[6];
    assert_int_equal(ck_tensor_read_f32(&t, 0, 6, out, NULL), 0);
    for (int i = 0; i < 6; i++)
        assert_true(out[i] == (float)i);
    /* a range starting mid-row crosses into the next row */
    assert_int_equal(ck_tensor_read_f32(&t, 2, 3, out, NULL), 0);
    assert_true(out[0] == 2.0f && out[1] == 3.0f && out[2] == 4.0f);
    /* [2,2,2] float32: C (i,j,k) at Fortran offset i + 2j + 4k */
    float f3[8];
    int64_t d3[] = {2, 2, 2};
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++)
            for (int k = 0; k < 2; k++)
                f3[i + 2 * j + 4 * k] = (float)(4 * i + 2 * j + k);
    t = mk(CK_DT_F32, f3, 32, 3, d3);
    t.fortran_order = true;
    double od[8];
    assert_int_equal(ck_tensor_read_f64(&t, 1, 7, od, NULL), 0);
    for (int i = 0; i < 7; i++)
        assert_true(od[i] == (double)(i + 1));

    /* errors name the tensor */
    assert_int_equal(ck_tensor_read_f32(&t, 7, 2, out, NULL), CK_ESIZE);
    assert_non_null(strstr(ck_error_msg(), "'t'"));
    assert_int_equal(ck_tensor_read_f32(&t, 9, 0, out, NULL), CK_ESIZE);
    t.data = NULL;
    assert_int_equal(ck_tensor_read_f32(&t, 0, 1, out, NULL), CK_ENOENT);
    t = mk(CK_DT_STRING, colmajor, 12, 2, dims);
    assert_int_equal(ck_tensor_read_f32(&t, 0, 1, out, NULL), CK_EFORMAT);
    /* data shorter than the shape */
    t = mk(CK_DT_F32, f3, 28, 3, d3);
    assert_int_equal(ck_tensor_read_f32(&t, 0, 1, out, NULL), CK_EFORMAT);
}

struct sink {
    size_t calls, n;
    double sum;
    size_t maxchunk;
};

static int sink_fn(void *ctx, const float *v, size_t n)
{
    struct sink *s = ctx;
    s->calls++;
    s->n += n;
    if (n > s->maxchunk)
        s->maxchunk = n;
    for (size_t i = 0; i < n; i++)
        s->sum += v[i];
    return s->calls == 100 ? CK_EIO : 0;
}

static void convert_stream_in_chunks(void **state)
{
    (void)state;
    /* 1000 halves of value k % 7 (exact small integers): sum = sum of k%7 */
    enum { N = 1000 };
    static const uint16_t seven[] = {0x0000, 0x3c00, 0x4000, 0x4200, 0x4400, 0x4500, 0x4600};
    uint16_t h[N];
    double want = 0;
    for (int k = 0; k < N; k++) {
        h[k] = seven[k % 7];
        want += k % 7;
    }
    int64_t dims[] = {10, 100};
    struct ck_tensor t = mk(CK_DT_F16, h, sizeof h, 2, dims);
    float buf[64];
    struct sink s = {0};
    struct ck_convert_report rep = {0};
    assert_int_equal(ck_tensor_stream_f32(NULL, &t, buf, 64, sink_fn, &s, &rep), 0);
    assert_int_equal(s.n, N);
    assert_int_equal(s.calls, (N + 63) / 64);
    assert_int_equal(s.maxchunk, 64);
    assert_true(s.sum == want);
    assert_int_equal(rep.converted, N);
    /* a sink error stops the stream and comes back */
    int64_t big[] = {1000, 100};
    static uint16_t many[100000];
    t = mk(CK_DT_F16, many, sizeof many, 2, big);
    memset(&s, 0, sizeof s);
    assert_int_equal(ck_tensor_stream_f32(NULL, &t, buf, 64, sink_fn, &s, NULL), CK_EIO);
    assert_int_equal(s.calls, 100);
}

static void convert_f32_to_16_bits(void **state)
{
    (void)state;
    assert_int_equal(ck_f32_to_f16(1.0f), 0x3c00);
    assert_int_equal(ck_f32_to_f16(-2.0f), 0xc000);
    assert_int_equal(ck_f32_to_f16(65504.0f), 0x7bff);
    assert_int_equal(ck_f32_to_f16(65519.0f), 0x7bff); /* below the halfway point */
    assert_int_equal(ck_f32_to_f16(65520.0f), 0x7c00); /* halfway: to even, infinity */
    assert_int_equal(ck_f32_to_f16(0x1p-24f), 0x0001);
    assert_int_equal(ck_f32_to_f16(0x1p-25f), 0x0000);     /* tie to even: 0 */
    assert_int_equal(ck_f32_to_f16(3 * 0x1p-25f), 0x0002); /* 1.5 ulp: to even, 2 */
    assert_int_equal(ck_f32_to_f16(0x1p-14f), 0x0400);
    assert_int_equal(ck_f32_to_f16(1.0f + 0x1p-11f), 0x3c00);     /* tie: stays even */
    assert_int_equal(ck_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02); /* tie: up to even */
    assert_int_equal(ck_f32_to_f16(-INFINITY), 0xfc00);
    uint16_t n = ck_f32_to_f16(NAN);
    assert_true((n & 0x7c00) == 0x7c00 && (n & 0x3ff) != 0);
    assert_int_equal(ck_f32_to_bf16(1.0f), 0x3f80);
    assert_int_equal(ck_f32_to_bf16(bits_f32(0x3f808000u)), 0x3f80); /* tie: even */
    assert_int_equal(ck_f32_to_bf16(bits_f32(0x3f818000u)), 0x3f82); /* tie: up to even */
    assert_int_equal(ck_f32_to_bf16(bits_f32(0x3f808001u)), 0x3f81);
    n = ck_f32_to_bf16(NAN);
    assert_true((n & 0x7f80) == 0x7f80 && (n & 0x7f) != 0);
    /* every half survives a round trip through float32 */
    for (uint32_t b = 0; b < 0x10000; b++) {
        if ((b & 0x7c00) == 0x7c00 && (b & 0x3ff))
            continue;
        uint16_t hb = (uint16_t)b;
        int64_t d1[] = {1};
        struct ck_tensor t = mk(CK_DT_F16, &hb, 2, 1, d1);
        float f;
        assert_int_equal(ck_tensor_read_f32(&t, 0, 1, &f, NULL), 0);
        assert_int_equal(ck_f32_to_f16(f), hb);
        /* and equals IEEE 754's definition: (-1)^s 2^(e-15) 1.m, or 2^-14 0.m */
        int e = (b >> 10) & 0x1f, mant = b & 0x3ff;
        double want = e ? ldexp(1024 + mant, e - 25) : ldexp(mant, -24);
        if (e == 31)
            want = INFINITY;
        if (b & 0x8000)
            want = -want;
        assert_true((double)f == want);
    }
}

/* ---- op names and ck_model_check ---- */

static void op_names_round_trip(void **state)
{
    (void)state;
    for (int op = 1; op < CK_OP_COUNT; op++) {
        const char *n = ck_op_name((enum ck_op)op);
        assert_string_not_equal(n, "invalid");
        assert_int_equal(ck_op_from_name(n), op);
        for (int k = 1; k < op; k++)
            assert_string_not_equal(n, ck_op_name((enum ck_op)k));
    }
    assert_int_equal(ck_op_from_name("Affine"), CK_OP_INVALID);
    assert_int_equal(ck_op_from_name(NULL), CK_OP_INVALID);
    assert_string_equal(ck_op_name(CK_OP_COUNT), "invalid");
}

/* A set of float32 tensors named and shaped as given ("name", rank, dims...),
 * each filled with 0.5. */
static struct ck_tensor_set *weights(const char *path, int count, ...)
{
    struct ck_tensor_set *s = ck_tensor_set_new("safetensors", path);
    va_list ap;
    assert_non_null(s);
    va_start(ap, count);
    for (int i = 0; i < count; i++) {
        struct ck_tensor t;
        memset(&t, 0, sizeof t);
        t.name = (char *)va_arg(ap, const char *);
        t.dtype = CK_DT_F32;
        t.rank = va_arg(ap, int);
        uint64_t n = 1;
        for (int k = 0; k < t.rank; k++)
            n *= (uint64_t)(t.dims[k] = va_arg(ap, int));
        void *p;
        assert_int_equal(ck_tensor_set_alloc(s, n * 4, &p), 0);
        for (uint64_t k = 0; k < n; k++)
            ((float *)p)[k] = 0.5f;
        t.data = p;
        t.nbytes = n * 4;
        assert_int_equal(ck_tensor_set_add(s, &t, NULL), 0);
    }
    va_end(ap);
    return s;
}

static void model_check_errors(void **state)
{
    (void)state;
    struct ck_model *m;
    struct ck_model_node *n;
    int64_t dims[] = {-1, 4};
    assert_int_equal(ck_model_new(weights("w", 1, "W", 2, 3, 4), "test", &m), 0);
    assert_int_equal(ck_model_check(m), CK_EFORMAT); /* no input */
    assert_non_null(strstr(ck_error_msg(), "no graph input"));
    assert_int_equal(ck_model_add_io(m, false, "x", CK_DT_F32, 2, dims), 0);
    assert_int_equal(ck_model_add_io(m, true, "y", CK_DT_F32, 0, NULL), 0);
    assert_int_equal(ck_model_check(m), CK_EFORMAT); /* y produced by nothing */
    assert_non_null(strstr(ck_error_msg(), "graph output 'y'"));
    assert_int_equal(ck_model_add_node(m, "fc", CK_OP_DENSE, &n), 0);
    assert_int_equal(ck_model_node_add_input(n, "x"), 0);
    assert_int_equal(ck_model_node_add_output(n, "y"), 0);
    assert_int_equal(ck_model_check(m), CK_EFORMAT); /* dense needs W */
    assert_non_null(strstr(ck_error_msg(), "node 0 'fc' (dense): 1 inputs, expected 2 to 3"));
    assert_int_equal(ck_model_node_add_input(m->nodes, "nope"), 0);
    assert_int_equal(ck_model_check(m), CK_EFORMAT);
    assert_non_null(strstr(ck_error_msg(), "input 'nope' is neither"));
    free(m->nodes[0].inputs[1]);
    m->nodes[0].inputs[1] = strdup("W");
    assert_int_equal(ck_model_check(m), 0);
    /* x [-1, 4] times W [3, 4] stored [in, out]: 3 != 4 */
    struct ck_model_shapes sh;
    assert_int_equal(ck_model_infer_shapes(m, &sh), CK_EFORMAT);
    assert_non_null(strstr(ck_error_msg(), "node 0 'fc' (dense): weight 'W' [3, 4] expects 3 "
                                           "input features, input 'x' gives 4"));
    m->nodes[0].p.trans_w = true; /* [out, in]: 4 in, 3 out */
    assert_int_equal(ck_model_infer_shapes(m, &sh), 0);
    const struct ck_shape *y = ck_model_shape_of(&sh, "y");
    assert_non_null(y);
    assert_int_equal(y->rank, 2);
    assert_true(y->dims[0] == -1 && y->dims[1] == 3);
    assert_null(ck_model_shape_of(&sh, "z"));
    ck_model_shapes_release(&sh);
    ck_model_free(m);
}

/* fuzz_graph finding: an expand (one input) whose shape does not broadcast
 * with its input made the shape rule's message name input 1 (a null
 * pointer); a where that does not broadcast names its three inputs. */
static void select_shapes_that_do_not_broadcast(void **state)
{
    (void)state;
    struct ck_model *m;
    struct ck_model_node *n;
    struct ck_model_shapes sh;
    int64_t dims[] = {2, 3}, shape[] = {4, 5, 3};
    assert_int_equal(ck_model_new(weights("w", 1, "c", 2, 4, 1), "test", &m), 0);
    assert_int_equal(ck_model_add_io(m, false, "x", CK_DT_F32, 2, dims), 0);
    assert_int_equal(ck_model_add_io(m, true, "y", CK_DT_F32, 0, NULL), 0);
    assert_int_equal(ck_model_add_node(m, "e", CK_OP_EXPAND, &n), 0);
    assert_int_equal(ck_model_node_add_input(n, "x"), 0);
    assert_int_equal(ck_model_node_add_output(n, "y"), 0);
    assert_int_equal(ck_model_node_set_ints(n, shape, 3), 0);
    assert_int_equal(ck_model_infer_shapes(m, &sh), CK_EFORMAT);
    assert_non_null(strstr(ck_error_msg(), "(expand): input 'x' [2, 3] does not broadcast with "
                                           "the shape [4, 5, 3]"));
    shape[1] = 1; /* [4, 1, 3] with [2, 3]: [4, 2, 3] */
    assert_int_equal(ck_model_node_set_ints(&m->nodes[0], shape, 3), 0);
    assert_int_equal(ck_model_infer_shapes(m, &sh), 0);
    const struct ck_shape *y = ck_model_shape_of(&sh, "y");
    assert_true(y->rank == 3 && y->dims[0] == 4 && y->dims[1] == 2 && y->dims[2] == 3);
    ck_model_shapes_release(&sh);
    m->nodes[0].op = CK_OP_WHERE; /* (x, c [4, 1], x): [2, 3] against [4, 1] */
    assert_int_equal(ck_model_node_add_input(&m->nodes[0], "c"), 0);
    assert_int_equal(ck_model_node_add_input(&m->nodes[0], "x"), 0);
    assert_int_equal(ck_model_infer_shapes(m, &sh), CK_EFORMAT);
    assert_non_null(strstr(ck_error_msg(), "(where): condition 'x' [2, 3], 'c' [4, 1] and 'x' "
                                           "[2, 3] do not broadcast"));
    ck_model_free(m);
}

/* ---- layer lists ---- */

static int build(struct ck_tensor_set *w, const char *yaml, struct ck_model **m)
{
    return ck_layers_parse(w, "g.yaml", yaml, strlen(yaml), m);
}

static struct ck_tensor_set *mlp_weights(int hidden_in)
{
    return weights("mlp.safetensors", 4, "fc1.weight", 2, 128, 784, "fc1.bias", 1, 128,
                   "fc2.weight", 2, 10, hidden_in, "fc2.bias", 1, 10);
}

static void layers_mlp_bare_list(void **state)
{
    (void)state;
    struct ck_model *m;
    int err = build(mlp_weights(128),
                    "- {op: dense, weight: fc1.weight, bias: fc1.bias}\n"
                    "- {op: relu}\n"
                    "- {op: linear, weight: fc2.weight, bias: fc2.bias}\n"
                    "- {op: softmax, axis: -1}\n",
                    &m);
    assert_int_equal(err, 0);
    assert_string_equal(m->source, "layers");
    assert_int_equal(m->nnodes, 4);
    assert_int_equal(m->nodes[0].op, CK_OP_DENSE);
    assert_true(m->nodes[0].p.trans_w); /* torch's [out, in] by default */
    assert_int_equal(m->nodes[0].ninputs, 3);
    assert_string_equal(m->nodes[0].inputs[0], "input");
    assert_string_equal(m->nodes[0].inputs[1], "fc1.weight");
    assert_string_equal(m->nodes[0].inputs[2], "fc1.bias");
    assert_string_equal(m->nodes[1].inputs[0], m->nodes[0].outputs[0]);
    assert_int_equal(m->nodes[2].op, CK_OP_DENSE);
    assert_int_equal(m->nodes[3].p.axis, -1);
    /* inferred from fc1.weight [128, 784]: [-1, 784] in, [-1, 10] out */
    assert_int_equal(m->ninputs, 1);
    assert_int_equal(m->inputs[0].rank, 2);
    assert_true(m->inputs[0].dims[0] == -1 && m->inputs[0].dims[1] == 784);
    assert_int_equal(m->noutputs, 1);
    assert_string_equal(m->outputs[0].name, "output");
    assert_string_equal(m->nodes[3].outputs[0], "output");
    assert_int_equal(m->outputs[0].rank, 2);
    assert_true(m->outputs[0].dims[0] == -1 && m->outputs[0].dims[1] == 10);
    assert_int_equal(ck_model_check(m), 0);
    ck_model_free(m);

    /* layout in_out: W [in, out] */
    err = build(weights("w", 2, "W", 2, 6, 3, "b", 1, 3),
                "input: {name: x, shape: [-1, 6]}\n"
                "output: y\n"
                "layers: [{op: dense, weight: W, bias: b, layout: in_out}]\n",
                &m);
    assert_int_equal(err, 0);
    assert_false(m->nodes[0].p.trans_w);
    assert_string_equal(m->outputs[0].name, "y");
    assert_true(m->outputs[0].dims[1] == 3);
    ck_model_free(m);
}

static void layers_cnn_with_shapes(void **state)
{
    (void)state;
    struct ck_model *m;
    struct ck_tensor_set *w =
        weights("cnn.safetensors", 9, "c1.weight", 4, 16, 1, 5, 5, "c1.bias", 1, 16, "bn.weight", 1,
                16, "bn.bias", 1, 16, "bn.running_mean", 1, 16, "bn.running_var", 1, 16,
                "c2.weight", 4, 32, 16, 3, 3, "fc.weight", 2, 10, 1568, "fc.bias", 1, 10);
    int err = build(w,
                    "input: {name: x, shape: [-1, 1, 28, 28]}\n"
                    "layers:\n"
                    "  - {op: conv2d, weight: c1.weight, bias: c1.bias, padding: 2}\n"
                    "  - {op: maxpool, kernel: 2}\n"
                    "  - {op: batchnorm, weight: bn.weight, bias: bn.bias,\n"
                    "     mean: bn.running_mean, var: bn.running_var, eps: 1e-3}\n"
                    "  - {op: relu}\n"
                    "  - {op: conv2d, weight: c2.weight, stride: 2, padding: [1, 1]}\n"
                    "  - {op: flatten}\n"
                    "  - {op: dense, weight: fc.weight, bias: fc.bias}\n",
                    &m);
    assert_int_equal(err, 0);
    assert_int_equal(m->nnodes, 7);
    const struct ck_op_params *p = &m->nodes[0].p;
    assert_true(p->pad[0] == 2 && p->pad[1] == 2 && p->pad[2] == 2 && p->pad[3] == 2);
    assert_true(p->stride[0] == 1 && p->groups == 1);
    p = &m->nodes[1].p; /* the stride defaults to the kernel */
    assert_true(p->kernel[0] == 2 && p->kernel[1] == 2 && p->stride[0] == 2 && p->stride[1] == 2);
    assert_true(fabsf(m->nodes[2].p.eps - 1e-3f) < 1e-9f); /* "1e-3" is a YAML 1.1 string */
    assert_string_equal(m->nodes[2].inputs[1], "bn.weight");
    assert_string_equal(m->nodes[2].inputs[4], "bn.running_var");
    assert_true(m->nodes[4].p.stride[0] == 2 && m->nodes[4].p.pad[3] == 1);
    /* on paper: 28 -conv5 pad2-> 28 -pool2-> 14 -conv3 s2 p1-> 7; 32*7*7 = 1568 -> 10 */
    struct ck_model_shapes sh;
    assert_int_equal(ck_model_infer_shapes(m, &sh), 0);
    const struct ck_shape *s0 = ck_model_shape_of(&sh, "layer0");
    const struct ck_shape *s1 = ck_model_shape_of(&sh, "layer1");
    const struct ck_shape *s4 = ck_model_shape_of(&sh, "layer4");
    const struct ck_shape *s5 = ck_model_shape_of(&sh, "layer5");
    char buf[100];
    assert_string_equal(ck_shape_text(s0, buf, sizeof buf), "[-1, 16, 28, 28]");
    assert_string_equal(ck_shape_text(s1, buf, sizeof buf), "[-1, 16, 14, 14]");
    assert_string_equal(ck_shape_text(s4, buf, sizeof buf), "[-1, 32, 7, 7]");
    assert_string_equal(ck_shape_text(s5, buf, sizeof buf), "[-1, 1568]");
    assert_true(m->outputs[0].dims[1] == 10);
    ck_model_shapes_release(&sh);
    ck_model_free(m);
}

static void layers_residual_block(void **state)
{
    (void)state;
    struct ck_model *m;
    struct ck_tensor_set *w = weights("res.safetensors", 3, "a.weight", 4, 8, 8, 3, 3, "b.weight",
                                      4, 8, 8, 3, 3, "fc.weight", 2, 5, 8);
    int err = build(w,
                    "input: {name: x, shape: [-1, 8, 6, 6]}\n"
                    "layers:\n"
                    "  - {op: conv2d, weight: a.weight, padding: 1}\n"
                    "  - {op: relu, name: mid}\n"
                    "  - {op: conv2d, weight: b.weight, padding: 1}\n"
                    "  - {op: add, from: [-1, x]}\n"
                    "  - {op: add, inputs: [-1, mid]}\n"
                    "  - {op: relu}\n"
                    "  - {op: global_avgpool}\n"
                    "  - {op: flatten}\n"
                    "  - {op: dense, weight: fc.weight}\n"
                    "  - {op: mul, scalar: 2}\n",
                    &m);
    assert_int_equal(err, 0);
    assert_int_equal(m->nnodes, 10);
    assert_string_equal(m->nodes[1].name, "mid");
    assert_string_equal(m->nodes[1].outputs[0], "mid");
    assert_int_equal(m->nodes[3].ninputs, 2);
    assert_string_equal(m->nodes[3].inputs[0], "layer2");
    assert_string_equal(m->nodes[3].inputs[1], "x");
    assert_string_equal(m->nodes[4].inputs[0], "layer3");
    assert_string_equal(m->nodes[4].inputs[1], "mid");
    assert_true(m->nodes[9].p.has_scalar && m->nodes[9].p.scalar == 2.0f);
    assert_true(m->outputs[0].rank == 2 && m->outputs[0].dims[1] == 5);
    ck_model_free(m);
}

struct bad {
    const char *yaml;
    const char *msg;
};

static void layers_errors_name_layer_and_tensor(void **state)
{
    (void)state;
    static const struct bad cases[] = {
        {"- {op: dense, weight: fc1.weight, bias: fc1.bias}\n- {op: relu}\n"
         "- {op: dense, weight: fc2.weight}\n",
         "'g.yaml': layer 2 (dense): weight 'fc2.weight' [10, 64] expects 64 input features, "
         "layer 1 gives 128"},
        {"- {op: dense, weight: nope}\n", "line 1: layer 0 (dense): weight 'nope' is not a tensor"},
        {"- {op: dense, weight: fc1.weight}\n- {op: frobnicate}\n",
         "layer 1 (frobnicate): unknown op 'frobnicate'"},
        {"- {op: dense, wieght: fc1.weight}\n", "layer 0 (dense): unknown key 'wieght'"},
        {"- {op: dense, weight: fc1.weight}\n- {op: relu, stride: 2}\n",
         "layer 1 (relu): 'stride' does not apply to relu"},
        {"- {op: dense, weight: fc1.weight}\n", NULL},
        {"- {op: dense}\n", "layer 0 (dense): needs 'weight'"},
        {"- {op: dense, weight: fc1.weight, bias: fc2.bias}\n",
         "layer 0 (dense): bias 'fc2.bias' [10] has 10 values, the layer has 128 outputs"},
        {"- {op: dense, weight: fc1.weight, layout: rows}\n", "'layout' is out_in"},
        {"- {op: dense, weight: fc1.weight}\n- {op: add, from: [-1, 5]}\n",
         "layer 1 (add): 'from' 5 is not an earlier layer"},
        {"- {op: dense, weight: fc1.weight}\n- {op: add, from: [-1, ghost]}\n",
         "layer 1 (add): 'ghost' is neither"},
        {"- {op: dense, weight: fc1.weight}\n- {op: add}\n", "needs a second operand"},
        {"- {op: relu}\n", "'g.yaml': the input's shape is unknown"},
        {"[]\n", "the layer list is empty"},
        {"- {op: dense, weight: fc1.weight\n", "'g.yaml'"},
        {"input: {name: x, shape: [-1, 784]}\nlayerz: []\n", "unknown key 'layerz'"},
        {"- {op: dense, weight: fc1.weight}\n- {op: reshape, shape: [-1, 7]}\n", NULL},
        {"input: {name: x, shape: [2, 784]}\n"
         "layers: [{op: dense, weight: fc1.weight}, {op: reshape, shape: [3, -1]}]\n",
         "layer 1 (reshape): cannot reshape 'layer0' [2, 128] (256 elements) to [3, -1]"},
        {"input: {name: x, shape: [-1, 784]}\n"
         "layers: [{op: dense, weight: fc1.weight}, {op: add, weight: fc2.bias}]\n",
         "layer 1 (add): shapes [-1, 128] ('layer0') and [10] ('fc2.bias') do not broadcast"},
        {"- {op: dense, weight: fc1.weight, name: a}\n- {op: relu, name: a}\n",
         "layer 1 (relu): name 'a' is already used"},
        {"input: {name: x, shape: [-1, 784]}\n"
         "layers: [{op: dense, weight: fc1.weight}, {op: softmax, axis: 2}]\n",
         "layer 1 (softmax): axis 2 is out of range for rank 2"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        struct ck_model *m = NULL;
        int err = build(weights("w.safetensors", 4, "fc1.weight", 2, 128, 784, "fc1.bias", 1, 128,
                                "fc2.weight", 2, 10, 64, "fc2.bias", 1, 10),
                        cases[i].yaml, &m);
        if (!cases[i].msg) {
            if (err < 0)
                fail_msg("case %zu: %s", i, ck_error_msg());
            ck_model_free(m);
            continue;
        }
        if (err != CK_EFORMAT || !strstr(ck_error_msg(), cases[i].msg))
            fail_msg("case %zu: err %d, message \"%s\", expected \"%s\"", i, err, ck_error_msg(),
                     cases[i].msg);
        assert_null(m);
    }
}

static void layers_conv_and_batchnorm_errors(void **state)
{
    (void)state;
    static const struct bad cases[] = {
        {"input: {name: x, shape: [-1, 3, 8, 8]}\nlayers: [{op: conv2d, weight: c.weight}]\n",
         "layer 0 (conv2d): weight 'c.weight' [4, 2, 3, 3] expects 2 input channels, input 'x' "
         "gives 3"},
        {"input: {name: x, shape: [-1, 2, 8, 8]}\n"
         "layers: [{op: conv2d, weight: c.weight}, {op: batchnorm, weight: g, bias: g, mean: g, "
         "var: v5}]\n",
         "layer 1 (batchnorm): var 'v5' [5] has 5 values, layer 0 gives 4 channels"},
        {"input: {name: x, shape: [-1, 2, 2, 2]}\nlayers: [{op: conv2d, weight: c.weight}]\n",
         "layer 0 (conv2d): height: kernel 3 (dilated 3) is larger than the padded input 2"},
        {"input: {name: x, shape: [-1, 2, 8]}\nlayers: [{op: conv2d, weight: c.weight}]\n",
         "input 'x' [-1, 2, 8] is not NCHW"},
        {"input: {name: x, shape: [-1, 2, 8, 8]}\nlayers: [{op: maxpool}]\n",
         "layer 0 (maxpool): needs 'kernel'"},
        {"input: {name: x, shape: [-1, 2, 8, 8]}\nlayers: [{op: batchnorm, weight: g}]\n",
         "layer 0 (batchnorm): needs 'bias'"},
        {"input: {name: x, shape: [-1, 2, 8, 8]}\nlayers: [{op: conv2d, weight: c.weight, groups: "
         "3}]\n",
         "groups 3 does not divide the 4 output channels"},
        /* hostile numbers: overflowing arithmetic is refused, never wrapped */
        {"input: {name: x, shape: [-1, 2, 8, 8]}\n"
         "layers: [{op: conv2d, weight: c.weight, padding: 9223372036854775807}]\n",
         "height: kernel, stride, dilation or padding out of range"},
        {"input: {name: x, shape: [-1, 2, 8, 8]}\n"
         "layers: [{op: pad, pads: [0, 0, 9223372036854775807, 9223372036854775807]}]\n",
         "padding overflows axis 1"},
        {"input: {name: x, shape: [-1, 9223372036854775807]}\n"
         "layers: [{op: concat, from: [x, x], axis: 1}]\n",
         "graph input 'x': dimension 1 (9223372036854775807) makes a shape larger than"},
    };
    struct ck_model *m;
    struct ck_tensor_set *w = weights("d.safetensors", 0);
    struct ck_tensor t;
    memset(&t, 0, sizeof t);
    t.name = (char *)"nodata";
    t.dtype = CK_DT_F32;
    t.rank = 2;
    t.dims[0] = t.dims[1] = 2;
    assert_int_equal(ck_tensor_set_add(w, &t, NULL), 0);
    assert_int_equal(build(w, "- {op: dense, weight: nodata}\n", &m), CK_EFORMAT);
    assert_non_null(strstr(ck_error_msg(), "weight 'nodata' has no data in 'd.safetensors'"));
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        m = NULL;
        int err =
            build(weights("c.safetensors", 3, "c.weight", 4, 4, 2, 3, 3, "g", 1, 4, "v5", 1, 5),
                  cases[i].yaml, &m);
        if (err != CK_EFORMAT || !strstr(ck_error_msg(), cases[i].msg))
            fail_msg("case %zu: err %d, message \"%s\", expected \"%s\"", i, err, ck_error_msg(),
                     cases[i].msg);
        assert_null(m);
    }
    /* slices as ONNX writes them: INT64_MAX ends, negative steps, huge steps */
    assert_int_equal(build(weights("s", 0),
                           "input: {name: x, shape: [4, 10]}\n"
                           "layers: [{op: slice, slices: [[1, 9223372036854775807], "
                           "[-1, -9223372036854775807, -3]]},\n"
                           "         {op: slice, slices: [[0, 3, 9223372036854775807]], from: x,"
                           " name: b}]\n",
                           &m),
                     0);
    struct ck_model_shapes sl;
    char sb[64];
    assert_int_equal(ck_model_infer_shapes(m, &sl), 0);
    /* rows 1..3 = 3; columns 9, 6, 3, 0 = 4; one row (0) of step 2^63-1 */
    assert_string_equal(ck_shape_text(ck_model_shape_of(&sl, "layer0"), sb, sizeof sb), "[3, 4]");
    assert_string_equal(ck_shape_text(ck_model_shape_of(&sl, "b"), sb, sizeof sb), "[1, 10]");
    ck_model_shapes_release(&sl);
    ck_model_free(m);
    /* pooling arithmetic: ceil_mode (torch's rule), explicit stride and padding */
    assert_int_equal(build(weights("p", 0),
                           "input: {name: x, shape: [1, 1, 5, 5]}\n"
                           "layers: [{op: maxpool, kernel: 2, ceil_mode: true, name: a},\n"
                           "         {op: avgpool, kernel: 3, stride: 1, padding: 1, from: x},\n"
                           "         {op: concat, from: [a, a], axis: 1}]\n",
                           &m),
                     0);
    struct ck_model_shapes sh;
    char buf[64];
    assert_int_equal(ck_model_infer_shapes(m, &sh), 0);
    /* ceil((5-2)/2)+1 = 3; (5+2-3)/1+1 = 5; concat of [1,1,3,3] twice on axis 1 */
    assert_string_equal(ck_shape_text(ck_model_shape_of(&sh, "a"), buf, sizeof buf),
                        "[1, 1, 3, 3]");
    assert_string_equal(ck_shape_text(ck_model_shape_of(&sh, "layer1"), buf, sizeof buf),
                        "[1, 1, 5, 5]");
    assert_string_equal(ck_shape_text(ck_model_shape_of(&sh, "output"), buf, sizeof buf),
                        "[1, 2, 3, 3]");
    assert_true(m->nodes[1].p.count_include_pad); /* torch's default */
    assert_false(m->nodes[0].p.count_include_pad);
    ck_model_shapes_release(&sh);
    ck_model_free(m);
}

/* The complete example of docs/model.md builds, with the shapes its comments give. */
static void docs_example_builds(void **state)
{
    (void)state;
    char path[4096];
    snprintf(path, sizeof path, "%s/docs/model.md", CK_SOURCE_DIR);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    static char doc[200000];
    size_t len = fread(doc, 1, sizeof doc - 1, f);
    fclose(f);
    doc[len] = 0;
    char *start = strstr(doc, "```yaml\n");
    assert_non_null(start);
    start += 8;
    char *end = strstr(start, "```");
    assert_non_null(end);
    *end = 0;
    struct ck_tensor_set *w = weights(
        "model.safetensors", 10, "conv1.weight", 4, 8, 1, 3, 3, "conv1.bias", 1, 8, "bn1.weight", 1,
        8, "bn1.bias", 1, 8, "bn1.running_mean", 1, 8, "bn1.running_var", 1, 8, "conv2.weight", 4,
        8, 8, 3, 3, "fc.weight", 2, 10, 1568, "fc.bias", 1, 10, "unused", 1, 1);
    struct ck_model *m;
    int err = build(w, start, &m);
    if (err < 0)
        fail_msg("%s", ck_error_msg());
    assert_int_equal(m->nnodes, 10);
    assert_string_equal(m->inputs[0].name, "x");
    assert_string_equal(m->outputs[0].name, "logits");
    assert_true(m->outputs[0].rank == 2 && m->outputs[0].dims[1] == 10);
    assert_string_equal(m->nodes[5].inputs[1], "block_in");
    ck_model_free(m);
}

/* ---- the NNabla mapping ---- */

static const char *shared(char *buf, size_t len, const char *rel)
{
    const char *d = getenv("CK_SHARED_DATA");
    if (!d || !*d)
        return NULL;
    snprintf(buf, len, "%s/%s", d, rel);
    return access(buf, R_OK) == 0 ? buf : NULL;
}

static void nnp_real_lenet_maps_completely(void **state)
{
    (void)state;
    char path[4096];
    if (!shared(path, sizeof path, "nnabla/lenet_010000.nnp"))
        skip();
    struct ck_model *m;
    int err = ck_reader_open_model(path, NULL, NULL, &m);
    if (err < 0)
        fail_msg("%s", ck_error_msg());
    /* FORMAT-FACTS 4.4: MulScalar, conv, pool, relu, conv, pool, relu, affine, relu, affine */
    static const enum ck_op want[] = {CK_OP_MUL,    CK_OP_CONV2D,  CK_OP_MAXPOOL, CK_OP_RELU,
                                      CK_OP_CONV2D, CK_OP_MAXPOOL, CK_OP_RELU,    CK_OP_DENSE,
                                      CK_OP_RELU,   CK_OP_DENSE};
    assert_int_equal(m->nnodes, 10);
    for (size_t i = 0; i < 10; i++)
        assert_int_equal(m->nodes[i].op, want[i]);
    assert_string_equal(m->source, "nnp");
    assert_true(m->nodes[0].p.has_scalar);
    assert_true(fabsf(m->nodes[0].p.scalar - 1.0f / 255) < 1e-9f);
    const struct ck_op_params *cp = &m->nodes[1].p;
    assert_true(cp->stride[0] == 1 && cp->pad[0] == 0 && cp->dilation[1] == 1 && cp->groups == 1);
    assert_string_equal(m->nodes[1].inputs[1], "conv1/conv/W");
    assert_string_equal(m->nodes[1].inputs[2], "conv1/conv/b");
    const struct ck_op_params *pp = &m->nodes[2].p;
    assert_true(pp->kernel[0] == 2 && pp->kernel[1] == 2 && pp->stride[0] == 2 && !pp->ceil_mode);
    assert_false(m->nodes[7].p.trans_w); /* NNabla's W is [in, out] */
    assert_int_equal(ck_op_axis(&m->nodes[7].p, 1), 1);
    assert_string_equal(m->nodes[9].inputs[1], "fc4/affine/W");
    assert_string_equal(m->nodes[9].outputs[0], "y");
    /* the weights: the 8 parameters, all with data, no graph buffers */
    assert_int_equal(m->weights->ntensors, 8);
    for (size_t i = 0; i < m->weights->ntensors; i++)
        assert_non_null(m->weights->tensors[i].data);
    for (size_t i = 0; i < m->nnodes; i++)
        for (size_t k = 1; k < m->nodes[i].ninputs; k++)
            assert_non_null(ck_model_weight(m, m->nodes[i].inputs[k]));
    assert_int_equal(m->ninputs, 1);
    assert_string_equal(m->inputs[0].name, "x");
    assert_int_equal(m->inputs[0].rank, 4);
    assert_true(m->inputs[0].dims[0] == -1 && m->inputs[0].dims[1] == 1 &&
                m->inputs[0].dims[2] == 28 && m->inputs[0].dims[3] == 28);
    assert_int_equal(m->noutputs, 1);
    assert_string_equal(m->outputs[0].name, "y");
    assert_true(m->outputs[0].rank == 2 && m->outputs[0].dims[1] == 10);
    struct ck_model_shapes sh;
    char buf[64];
    assert_int_equal(ck_model_infer_shapes(m, &sh), 0);
    assert_string_equal(ck_shape_text(ck_model_shape_of(&sh, "Convolution_Output"), buf, 64),
                        "[-1, 16, 24, 24]");
    assert_string_equal(ck_shape_text(ck_model_shape_of(&sh, "MaxPooling_2_Output"), buf, 64),
                        "[-1, 16, 4, 4]");
    assert_string_equal(ck_shape_text(ck_model_shape_of(&sh, "y"), buf, 64), "[-1, 10]");
    ck_model_shapes_release(&sh);
    ck_model_free(m);
}

/* A declared variable of a hand-made NNabla set (data NULL unless given). */
static void var(struct ck_tensor_set *s, const char *name, const float *data, int rank, ...)
{
    struct ck_tensor t;
    va_list ap;
    memset(&t, 0, sizeof t);
    t.name = (char *)name;
    t.dtype = CK_DT_F32;
    t.rank = rank;
    t.role = data ? "parameter" : "buffer";
    uint64_t n = 1;
    va_start(ap, rank);
    for (int i = 0; i < rank; i++)
        n *= (uint64_t)(t.dims[i] = va_arg(ap, int));
    va_end(ap);
    t.data = (const unsigned char *)data;
    t.nbytes = data ? n * 4 : 0;
    assert_int_equal(ck_tensor_set_add(s, &t, NULL), 0);
}

static void fn(struct ck_graph *g, const char *name, const char *op, const char *ins,
               const char *outs, const char *const *attrs)
{
    struct ck_graph_node *n;
    char buf[256], *save, *tok;
    assert_int_equal(ck_graph_add_node(g, name, op, &n), 0);
    snprintf(buf, sizeof buf, "%s", ins);
    for (tok = strtok_r(buf, " ", &save); tok; tok = strtok_r(NULL, " ", &save))
        assert_int_equal(ck_graph_node_add_input(n, tok), 0);
    snprintf(buf, sizeof buf, "%s", outs);
    for (tok = strtok_r(buf, " ", &save); tok; tok = strtok_r(NULL, " ", &save))
        assert_int_equal(ck_graph_node_add_output(n, tok), 0);
    for (size_t i = 0; attrs && attrs[i]; i += 2)
        assert_int_equal(ck_graph_node_add_attr(n, attrs[i], attrs[i + 1]), 0);
}

/* A hand-made NNabla set: variables as data-less tensors, a graph. */
static struct ck_tensor_set *nnp_set(const char *op, const char *const *attrs, int64_t h,
                                     int64_t oh)
{
    struct ck_tensor_set *s = ck_tensor_set_new("nnp", "t.nnp");
    struct ck_tensor t;
    memset(&t, 0, sizeof t);
    t.dtype = CK_DT_F32;
    t.rank = 4;
    t.name = (char *)"x";
    t.role = "buffer";
    t.dims[0] = -1, t.dims[1] = 1, t.dims[2] = h, t.dims[3] = h;
    assert_int_equal(ck_tensor_set_add(s, &t, NULL), 0);
    t.name = (char *)"y";
    t.dims[2] = t.dims[3] = oh;
    assert_int_equal(ck_tensor_set_add(s, &t, NULL), 0);
    s->graph = ck_graph_new();
    struct ck_graph_node *n;
    assert_int_equal(ck_graph_add_node(s->graph, "Pool", op, &n), 0);
    assert_int_equal(ck_graph_node_add_input(n, "x"), 0);
    assert_int_equal(ck_graph_node_add_output(n, "y"), 0);
    for (size_t i = 0; attrs && attrs[i]; i += 2)
        assert_int_equal(ck_graph_node_add_attr(n, attrs[i], attrs[i + 1]), 0);
    assert_int_equal(ck_graph_add_io(s->graph, false, "x"), 0);
    assert_int_equal(ck_graph_add_io(s->graph, true, "y"), 0);
    return s;
}

static void nnp_mapping_rules_and_errors(void **state)
{
    (void)state;
    struct ck_model *m;
    /* NNabla without ignore_border: ceil((5 + 0) / 2) = 3 windows, the last
     * one over the border: one extra row and column of padding */
    static const char *const pool[] = {"kernel", "[2,2]", "stride", "[2,2]", "ignore_border",
                                       "false",  "pad",   "[0,0]",  NULL};
    assert_int_equal(ck_nnp_to_model(nnp_set("MaxPooling", pool, 5, 3), &m), 0);
    const struct ck_op_params *p = &m->nodes[0].p;
    assert_true(p->pad[0] == 0 && p->pad[1] == 0 && p->pad[2] == 1 && p->pad[3] == 1);
    assert_int_equal(m->weights->ntensors, 0);
    ck_model_free(m);
    /* a declared output shape that the arithmetic contradicts */
    assert_int_equal(ck_nnp_to_model(nnp_set("MaxPooling", pool, 5, 2), &m), CK_EFORMAT);
    assert_non_null(strstr(ck_error_msg(), "graph output 'y' is declared [-1, 1, 2, 2], the graph "
                                           "computes [-1, 1, 3, 3]"));
    /* no mapping: the op and the node are named */
    assert_int_equal(ck_nnp_to_model(nnp_set("Frobnicate", NULL, 5, 5), &m), CK_EFORMAT);
    assert_non_null(strstr(ck_error_msg(), "'t.nnp': node 'Pool': NNabla function 'Frobnicate' "
                                           "has no mapping"));
    assert_null(m);
    static const char *const cl[] = {"kernel", "[2,2]", "channel_last", "true", NULL};
    assert_int_equal(ck_nnp_to_model(nnp_set("MaxPooling", cl, 4, 2), &m), CK_EFORMAT);
    assert_non_null(strstr(ck_error_msg(), "node 'Pool' (MaxPooling): channel_last"));
    static const char *const bad[] = {"kernel", "[2,x]", NULL};
    assert_int_equal(ck_nnp_to_model(nnp_set("MaxPooling", bad, 4, 2), &m), CK_EFORMAT);
    assert_non_null(strstr(ck_error_msg(), "parameter kernel = '[2,x]'"));
    /* a function with the wrong number of inputs */
    assert_int_equal(ck_nnp_to_model(nnp_set("Add2", NULL, 4, 4), &m), CK_EFORMAT);
    assert_non_null(strstr(ck_error_msg(), "node 'Pool' (Add2): 1 inputs, the op takes 2"));
    assert_int_equal(ck_nnp_to_model(nnp_set("Affine", NULL, 4, 4), &m), CK_EFORMAT);
    assert_non_null(strstr(ck_error_msg(), "node 'Pool' (Affine): 1 inputs, the op takes 2 to 3"));
    /* every listed type is in the table (an unknown one would fail as above) */
    for (size_t i = 0; ck_nnp_mapped_types[i]; i++) {
        int err = ck_nnp_to_model(nnp_set(ck_nnp_mapped_types[i], NULL, 4, 4), &m);
        assert_true(err == 0 || !strstr(ck_error_msg(), "has no mapping"));
        ck_model_free(m);
    }
    /* a network whose parameter has no values (a bare network.nntxt) */
    struct ck_tensor_set *np = nnp_set("ReLU", NULL, 4, 4);
    var(np, "w", NULL, 2, 2, 2);
    np->tensors[np->ntensors - 1].role = "parameter";
    assert_int_equal(ck_nnp_to_model(np, &m), CK_EFORMAT);
    assert_non_null(strstr(ck_error_msg(), "'t.nnp': parameter 'w' has no values"));
    /* parameters only: no network */
    struct ck_tensor_set *s = nnp_set("ReLU", NULL, 4, 4);
    ck_graph_free(s->graph);
    s->graph = NULL;
    assert_int_equal(ck_nnp_to_model(s, &m), CK_EUSAGE);
}

static void nnp_batchnorm_matmul_reshape_concat(void **state)
{
    (void)state;
    static const float p4[4] = {1, 2, 3, 4}, w[4 * 6] = {0};
    struct ck_tensor_set *s = ck_tensor_set_new("nnp", "net.nnp");
    /* batch_size 32 written out in the declared shapes, as NNabla exports do */
    var(s, "x", NULL, 4, 32, 4, 3, 2);
    var(s, "bn/beta", p4, 4, 1, 4, 1, 1);
    var(s, "bn/gamma", p4, 4, 1, 4, 1, 1);
    var(s, "bn/mean", p4, 4, 1, 4, 1, 1);
    var(s, "bn/var", p4, 4, 1, 4, 1, 1);
    var(s, "w", w, 2, 4, 6);
    var(s, "h", NULL, 4, 32, 4, 3, 2);
    var(s, "r", NULL, 3, 32, 6, 4);
    var(s, "m", NULL, 3, 32, 6, 6);
    var(s, "c", NULL, 3, 32, 6, 10);
    var(s, "y", NULL, 3, 32, 6, 10);
    s->graph = ck_graph_new();
    assert_int_equal(ck_graph_add_attr(s->graph, "batch_size", "32"), 0);
    static const char *const bn[] = {"axes", "1", "eps", "1e-05", "batch_stat", "false", NULL};
    static const char *const rs[] = {"shape", "[32,6,4]", NULL};
    static const char *const mm[] = {"transpose_a", "false", "transpose_b", "true", NULL};
    fn(s->graph, "BN", "BatchNormalization", "x bn/beta bn/gamma bn/mean bn/var", "h", bn);
    fn(s->graph, "Reshape", "Reshape", "h", "r", rs);
    fn(s->graph, "BatchMatmul", "BatchMatmul", "r r", "m", mm);
    fn(s->graph, "Concat", "Concatenate", "m r", "c", NULL);
    fn(s->graph, "Softmax", "Softmax", "c", "y", NULL);
    assert_int_equal(ck_graph_add_io(s->graph, false, "x"), 0);
    assert_int_equal(ck_graph_add_io(s->graph, true, "y"), 0);
    struct ck_model *m;
    int err = ck_nnp_to_model(s, &m);
    if (err < 0)
        fail_msg("%s", ck_error_msg());
    /* NNabla's (x, beta, gamma, mean, variance) becomes (x, gamma, beta, mean, var) */
    const struct ck_model_node *n = &m->nodes[0];
    assert_int_equal(n->op, CK_OP_BATCHNORM);
    assert_string_equal(n->inputs[1], "bn/gamma");
    assert_string_equal(n->inputs[2], "bn/beta");
    assert_string_equal(n->inputs[4], "bn/var");
    assert_true(n->p.axis == 1 && fabsf(n->p.eps - 1e-5f) < 1e-12f);
    /* the batch size in Reshape's shape becomes "copy the batch" */
    n = &m->nodes[1];
    assert_int_equal(n->op, CK_OP_RESHAPE);
    assert_true(n->p.nints == 3 && n->p.ints[0] == 0 && n->p.ints[1] == 6 && n->p.ints[2] == 4);
    /* transpose_b: a transpose of the last two axes, then the matmul */
    assert_int_equal(m->nodes[2].op, CK_OP_TRANSPOSE);
    assert_true(m->nodes[2].p.nints == 3 && m->nodes[2].p.ints[0] == 0 &&
                m->nodes[2].p.ints[1] == 2 && m->nodes[2].p.ints[2] == 1);
    assert_int_equal(m->nodes[3].op, CK_OP_MATMUL);
    assert_string_equal(m->nodes[3].inputs[0], "r");
    assert_string_equal(m->nodes[3].inputs[1], m->nodes[2].outputs[0]);
    /* NNabla's default axes: the last */
    assert_int_equal(m->nodes[4].op, CK_OP_CONCAT);
    assert_int_equal(m->nodes[4].p.axis, -1);
    assert_int_equal(m->nodes[5].op, CK_OP_SOFTMAX);
    assert_int_equal(ck_op_axis(&m->nodes[5].p, -1), -1);
    /* the declared batch 32 is "any batch" */
    assert_true(m->inputs[0].dims[0] == -1 && m->outputs[0].dims[0] == -1);
    assert_int_equal(m->weights->ntensors, 5);
    ck_model_free(m);
}

static void open_model_weights_only_needs_a_graph(void **state)
{
    (void)state;
    char dir[4000], st[4100], g[4100];
    ck_test_tmpdir(dir, "model");
    snprintf(st, sizeof st, "%s/w.safetensors", dir);
    snprintf(g, sizeof g, "%s/g.yaml", dir);
    /* safetensors: u64 header length, JSON header, data (6 float32) */
    const char *hdr = "{\"W\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}";
    uint64_t hl = strlen(hdr);
    float data[6] = {1, 2, 3, 4, 5, 6};
    int fd = open(st, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, &hl, 8), 8);
    assert_int_equal(write(fd, hdr, hl), (ssize_t)hl);
    assert_int_equal(write(fd, data, 24), 24);
    close(fd);
    struct ck_model *m;
    assert_int_equal(ck_reader_open_model(st, NULL, NULL, &m), CK_EUSAGE);
    assert_non_null(strstr(ck_error_msg(), "w.safetensors' holds weights only: give its graph "
                                           "with --graph FILE (a layer list, docs/model.md)"));
    fd = open(g, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    const char *yaml = "- {op: dense, weight: W}\n- {op: sigmoid}\n";
    assert_int_equal(write(fd, yaml, strlen(yaml)), (ssize_t)strlen(yaml));
    close(fd);
    assert_int_equal(ck_reader_open_model(st, NULL, g, &m), 0);
    assert_int_equal(m->nnodes, 2);
    assert_true(m->inputs[0].dims[1] == 3 && m->outputs[0].dims[1] == 2);
    ck_model_free(m);
    /* the config's form: a YAML node */
    struct ck_yaml_doc d;
    const char *cfg = "pack:\n  graph:\n    - {op: dense, weight: W, layout: in_out}\n";
    assert_int_equal(ck_yaml_load(&d, "ckptd.yaml", cfg, strlen(cfg)), 0);
    yaml_node_t *root = ck_yaml_root(&d);
    yaml_node_t *pack = ck_yaml_node(&d, root->data.mapping.pairs.start->value);
    yaml_node_t *graph = ck_yaml_node(&d, pack->data.mapping.pairs.start->value);
    assert_int_equal(ck_reader_open_model_yaml(st, NULL, &d, graph, NULL, &m), 0);
    assert_true(m->inputs[0].dims[1] == 2 && m->outputs[0].dims[1] == 3);
    ck_model_free(m);
    ck_yaml_release(&d);
    /* the config's form kept as text */
    const char *txt = "layers: [{op: dense, weight: W}]\n";
    assert_int_equal(ck_reader_open_model_text(st, NULL, txt, strlen(txt), NULL, &m), 0);
    assert_true(m->inputs[0].dims[1] == 3 && m->outputs[0].dims[1] == 2);
    ck_model_free(m);
    txt = "layers: [{op: dense, weight: V}]\n";
    assert_int_equal(ck_reader_open_model_text(st, NULL, txt, strlen(txt), NULL, &m), CK_EFORMAT);
    assert_non_null(strstr(ck_error_msg(), "'pack.graph' line 1: layer 0 (dense): weight 'V' is "
                                           "not a tensor of"));
    assert_int_equal(ck_reader_open_model_text(st, NULL, NULL, 0, NULL, &m), CK_EUSAGE);
    /* a graph file that is missing is named */
    assert_true(ck_reader_open_model(st, NULL, "/nonexistent/g.yaml", &m) < 0);
    assert_non_null(strstr(ck_error_msg(), "/nonexistent/g.yaml"));
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(convert_f16_bit_patterns),
    cmocka_unit_test(convert_bf16_f32_f64),
    cmocka_unit_test(convert_integers_and_rounding),
    cmocka_unit_test(convert_complex_and_float8),
    cmocka_unit_test(convert_fortran_order_and_ranges),
    cmocka_unit_test(convert_stream_in_chunks),
    cmocka_unit_test(convert_f32_to_16_bits),
    cmocka_unit_test(op_names_round_trip),
    cmocka_unit_test(model_check_errors),
    cmocka_unit_test(select_shapes_that_do_not_broadcast),
    cmocka_unit_test(layers_mlp_bare_list),
    cmocka_unit_test(layers_cnn_with_shapes),
    cmocka_unit_test(layers_residual_block),
    cmocka_unit_test(layers_errors_name_layer_and_tensor),
    cmocka_unit_test(layers_conv_and_batchnorm_errors),
    cmocka_unit_test(docs_example_builds),
    cmocka_unit_test(nnp_real_lenet_maps_completely),
    cmocka_unit_test(nnp_mapping_rules_and_errors),
    cmocka_unit_test(nnp_batchnorm_matmul_reshape_concat),
    cmocka_unit_test(open_model_weights_only_needs_a_graph),
};

CK_TEST_MAIN(tests)
