/* The model layer: op names, ck_model_check, conversion to float32/64, the
 * layer list, shape inference and the NNabla mapping. Expected values come
 * from IEEE 754 bit patterns worked out by hand, from the shapes the layer
 * arithmetic gives on paper, and from FORMAT-FACTS section 4.4 for the real
 * LeNet, never from the code under test. */
#include "test_main.h"

#include "common/error.h"
#include "model/convert.h"
#include "model/model.h"
#include "model/tensor.h"

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
    float want[] = {1.0f, -2.0f, 0x1p-24f, 65504.0f, INFINITY, -INFINITY, NAN, -0.0f, 0x1p-14f,
                    1023 * 0x1p-24f};
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
    }
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(convert_f16_bit_patterns),
    cmocka_unit_test(convert_bf16_f32_f64),
    cmocka_unit_test(convert_integers_and_rounding),
    cmocka_unit_test(convert_complex_and_float8),
    cmocka_unit_test(convert_fortran_order_and_ranges),
    cmocka_unit_test(convert_stream_in_chunks),
    cmocka_unit_test(convert_f32_to_16_bits),
};

CK_TEST_MAIN(tests)
