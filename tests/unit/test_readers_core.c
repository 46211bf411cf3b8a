/* The tensor model, the protobuf wire decoder, CRC-32C and the reader table.
 * Expected values are from the standards (RFC 3720 CRC-32C check values,
 * IEEE 754 half/bfloat16 encodings, OCP float8 tables, the protobuf
 * encoding guide), not from this code. */
#include "test_main.h"
#include "common/crc32.h"

#include <zlib.h>

#include "common/error.h"
#include "common/crc32c.h"
#include "readers/jsonin.h"
#include "readers/pbwire.h"
#include "readers/reader.h"
#include "model/tensor.h"

#include <fcntl.h>
#include <math.h>
#include <stdbool.h>
#include <sys/wait.h>
#include <unistd.h>

static void crc32c_known_values(void **state)
{
    (void)state;
    /* RFC 3720 B.4 and the usual "123456789" check value. */
    assert_int_equal(ck_crc32c("123456789", 9), 0xe3069283u);
    unsigned char zeros[32] = {0}, ones[32], inc[32];
    memset(ones, 0xff, sizeof ones);
    for (int i = 0; i < 32; i++)
        inc[i] = (unsigned char)i;
    assert_int_equal(ck_crc32c(zeros, 32), 0x8a9136aau);
    assert_int_equal(ck_crc32c(ones, 32), 0x62a8ab43u);
    assert_int_equal(ck_crc32c(inc, 32), 0x46dd794eu);
    assert_int_equal(ck_crc32c_extend_sw(0, inc, 32), 0x46dd794eu);
    /* Extending equals one pass; hardware and table agree at every alignment. */
    unsigned char big[1031];
    for (size_t i = 0; i < sizeof big; i++)
        big[i] = (unsigned char)(i * 131 + 7);
    for (size_t off = 0; off < 9; off++) {
        uint32_t a = ck_crc32c(big + off, sizeof big - off);
        assert_int_equal(a, ck_crc32c_extend_sw(0, big + off, sizeof big - off));
        assert_int_equal(a, ck_crc32c_extend(ck_crc32c(big + off, 100), big + off + 100,
                                             sizeof big - off - 100));
    }
    /* The three-stream path (inputs of 3 x 4096 bytes and more) against the
     * table: lengths around each multiple of the block triple, every start
     * alignment mod 8, and a stream extended in uneven pieces. */
    size_t n = 5 * 12288 + 64;
    unsigned char *b = malloc(n);
    assert_non_null(b);
    for (size_t i = 0; i < n; i++)
        b[i] = (unsigned char)(i * 2654435761u >> 11);
    for (size_t k = 1; k <= 4; k++)
        for (size_t len = k * 12288 - 9; len <= k * 12288 + 9; len++)
            for (size_t off = 0; off < 8; off++)
                assert_int_equal(ck_crc32c(b + off, len), ck_crc32c_extend_sw(0, b + off, len));
    uint32_t c = 0;
    for (size_t at = 0, step = 1; at < n; at += step, step = step * 3 + 1)
        c = ck_crc32c_extend(c, b + at, at + step > n ? n - at : step);
    assert_int_equal(c, ck_crc32c_extend_sw(0, b, n));
    free(b);
    /* LevelDB's mask: mask(x) != x and unmask inverts it. */
    assert_int_not_equal(ck_crc32c_mask(0xe3069283u), 0xe3069283u);
    assert_int_equal(ck_crc32c_unmask(ck_crc32c_mask(0xe3069283u)), 0xe3069283u);
}

static void dtype_table(void **state)
{
    (void)state;
    for (int t = 1; t < CK_DT_COUNT; t++) {
        const char *n = ck_dtype_name((enum ck_dtype)t);
        assert_non_null(n);
        assert_int_equal(ck_dtype_from_name(n), t);
    }
    assert_int_equal(ck_dtype_size(CK_DT_BF16), 2);
    assert_int_equal(ck_dtype_size(CK_DT_C128), 16);
    assert_int_equal(ck_dtype_size(CK_DT_F8_E5M2), 1);
    assert_int_equal(ck_dtype_size(CK_DT_STRING), 0);
    assert_int_equal(ck_dtype_size((enum ck_dtype)999), 0);
    assert_int_equal(ck_dtype_from_name("nope"), CK_DT_INVALID);
    assert_string_equal(ck_dtype_name(CK_DT_F32), "float32");
}

static void numel_overflow(void **state)
{
    (void)state;
    struct ck_tensor t = {.name = "x", .dtype = CK_DT_F32, .rank = 3};
    uint64_t n;
    t.dims[0] = 2;
    t.dims[1] = 3;
    t.dims[2] = 4;
    assert_int_equal(ck_tensor_numel(&t, &n), 0);
    assert_int_equal(n, 24);
    t.nbytes = 96;
    assert_int_equal(ck_tensor_check_size(&t, "f"), 0);
    t.nbytes = 95;
    assert_int_equal(ck_tensor_check_size(&t, "f"), CK_EFORMAT);
    t.dims[0] = (int64_t)1 << 62;
    t.dims[1] = 4;
    t.dims[2] = 1;
    assert_int_equal(ck_tensor_numel(&t, &n), CK_ESIZE);
    t.dims[0] = (int64_t)1 << 62;
    t.dims[1] = 1;
    assert_int_equal(ck_tensor_numel(&t, &n), 0);                /* 2^62 elements fit ... */
    assert_int_equal(ck_tensor_check_size(&t, "f"), CK_EFORMAT); /* ... 4 * 2^62 bytes do not */
    t.dims[1] = -1;
    assert_int_equal(ck_tensor_numel(&t, &n), CK_ESIZE);
    t.rank = 0;
    assert_int_equal(ck_tensor_numel(&t, &n), 0);
    assert_int_equal(n, 1);
    t.rank = 1;
    t.dims[0] = 0;
    assert_int_equal(ck_tensor_numel(&t, &n), 0);
    assert_int_equal(n, 0);
}

static double get1(enum ck_dtype dt, const void *bytes, size_t len, bool be)
{
    struct ck_tensor t = {
        .name = "v", .dtype = dt, .rank = 1, .data = bytes, .nbytes = len, .big_endian = be};
    t.dims[0] = (int64_t)(len / ck_dtype_size(dt));
    return ck_tensor_get_f64(&t, 0);
}

static void get_f64_every_dtype(void **state)
{
    (void)state;
    const unsigned char h1[] = {0x00, 0x3c};   /* f16 1.0 LE */
    const unsigned char hm2[] = {0xc0, 0x00};  /* f16 -2.0 BE */
    const unsigned char hsub[] = {0x01, 0x00}; /* f16 smallest subnormal 2^-24 */
    const unsigned char hinf[] = {0x00, 0x7c};
    const unsigned char b1[] = {0x80, 0x3f};                    /* bf16 1.0 */
    const unsigned char bpi[] = {0x49, 0x40};                   /* bf16 3.140625 (0x4049 LE) */
    const unsigned char f32[] = {0x00, 0x00, 0xc0, 0x3f};       /* 1.5 */
    const unsigned char f32be[] = {0x3f, 0xc0, 0x00, 0x00};     /* 1.5 */
    const unsigned char f64[] = {0, 0, 0, 0, 0, 0, 0x04, 0x40}; /* 2.5 */
    const unsigned char i16be[] = {0xff, 0xfe};                 /* -2 */
    const unsigned char i32[] = {0xff, 0xff, 0xff, 0xff};
    const unsigned char i64[] = {0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    const unsigned char u64[] = {0, 0, 0, 0, 0, 0, 0, 0x80};
    const unsigned char e4[] = {0x38};    /* e4m3fn 1.0 */
    const unsigned char e4max[] = {0x7e}; /* 448 */
    const unsigned char e4nan[] = {0x7f};
    const unsigned char e5[] = {0x3c}; /* e5m2 1.0 */
    const unsigned char e5inf[] = {0xfc};
    const unsigned char e5max[] = {0x7b}; /* 57344 */
    const unsigned char i8[] = {0x80};
    const unsigned char bl[] = {0x01};
    const unsigned char c64[] = {0, 0, 0x80, 0x3f, 0, 0, 0, 0x40}; /* 1+2i */
    assert_true(get1(CK_DT_F16, h1, 2, false) == 1.0);
    assert_true(get1(CK_DT_F16, hm2, 2, true) == -2.0);
    assert_true(get1(CK_DT_F16, hsub, 2, false) == ldexp(1, -24));
    assert_true(isinf(get1(CK_DT_F16, hinf, 2, false)));
    assert_true(get1(CK_DT_BF16, b1, 2, false) == 1.0);
    assert_true(get1(CK_DT_BF16, bpi, 2, false) == 3.140625);
    assert_true(get1(CK_DT_F32, f32, 4, false) == 1.5);
    assert_true(get1(CK_DT_F32, f32be, 4, true) == 1.5);
    assert_true(get1(CK_DT_F64, f64, 8, false) == 2.5);
    assert_true(get1(CK_DT_I16, i16be, 2, true) == -2.0);
    assert_true(get1(CK_DT_I32, i32, 4, false) == -1.0);
    assert_true(get1(CK_DT_U32, i32, 4, false) == 4294967295.0);
    assert_true(get1(CK_DT_I64, i64, 8, false) == -2.0);
    assert_true(get1(CK_DT_U64, u64, 8, false) == ldexp(1, 63));
    assert_true(get1(CK_DT_F8_E4M3, e4, 1, false) == 1.0);
    assert_true(get1(CK_DT_F8_E4M3, e4max, 1, false) == 448.0);
    assert_true(isnan(get1(CK_DT_F8_E4M3, e4nan, 1, false)));
    assert_true(get1(CK_DT_F8_E5M2, e5, 1, false) == 1.0);
    assert_true(get1(CK_DT_F8_E5M2, e5max, 1, false) == 57344.0);
    assert_true(isinf(get1(CK_DT_F8_E5M2, e5inf, 1, false)) &&
                get1(CK_DT_F8_E5M2, e5inf, 1, false) < 0);
    assert_true(get1(CK_DT_I8, i8, 1, false) == -128.0);
    assert_true(get1(CK_DT_U8, i8, 1, false) == 128.0);
    assert_true(get1(CK_DT_BOOL, bl, 1, false) == 1.0);
    assert_true(get1(CK_DT_C64, c64, 8, false) == 1.0);
    /* Past the end, no data, strings: NaN. */
    struct ck_tensor t = {.name = "v", .dtype = CK_DT_F32, .rank = 1, .data = f32, .nbytes = 4};
    t.dims[0] = 1;
    assert_true(isnan(ck_tensor_get_f64(&t, 1)));
    t.dims[0] = 2; /* claims more than nbytes holds */
    assert_true(isnan(ck_tensor_get_f64(&t, 1)));
    t.data = NULL;
    assert_true(isnan(ck_tensor_get_f64(&t, 0)));
}

static void get_f64_fortran(void **state)
{
    (void)state;
    /* 2x3 matrix [[0,1,2],[3,4,5]] stored column-major: 0 3 1 4 2 5. */
    const int32_t col[] = {0, 3, 1, 4, 2, 5};
    struct ck_tensor t = {.name = "m",
                          .dtype = CK_DT_I32,
                          .rank = 2,
                          .data = (const unsigned char *)col,
                          .nbytes = sizeof col,
                          .fortran_order = true};
    t.dims[0] = 2;
    t.dims[1] = 3;
    for (int i = 0; i < 6; i++)
        assert_true(ck_tensor_get_f64(&t, (uint64_t)i) == (double)i);
}

static void set_lifecycle(void **state)
{
    (void)state;
    char dir[4096], path[4200];
    ck_test_tmpdir(dir, "readers_set");
    snprintf(path, sizeof path, "%s/empty", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fclose(f);
    struct ck_tensor_set *s = ck_tensor_set_new("test", path);
    assert_non_null(s);
    const unsigned char *base = NULL;
    uint64_t len = 99;
    assert_int_equal(ck_tensor_set_map_file(s, path, &base, &len), 0);
    assert_non_null(base);
    assert_int_equal(len, 0);
    snprintf(path, sizeof path, "%s/data", dir);
    f = fopen(path, "w");
    fwrite("\x00\x00\x80\x3f\x00\x00\x00\x40", 1, 8, f);
    fclose(f);
    assert_int_equal(ck_tensor_set_map_file(s, path, &base, &len), 0);
    assert_int_equal(len, 8);
    snprintf(path, sizeof path, "%s/missing", dir);
    assert_int_equal(ck_tensor_set_map_file(s, path, &base, &len), CK_ENOENT);
    assert_int_equal(ck_tensor_set_map_file(s, dir, &base, &len), CK_EFORMAT);
    snprintf(path, sizeof path, "%s/data", dir);
    assert_int_equal(ck_tensor_set_map_file(s, path, &base, &len), 0);
    struct ck_tensor t = {.name = "w", .dtype = CK_DT_F32, .rank = 1, .data = base, .nbytes = 8};
    t.dims[0] = 2;
    struct ck_tensor *st;
    for (int i = 0; i < 40; i++) { /* past the first growth */
        char name[16];
        snprintf(name, sizeof name, "w%d", i);
        t.name = name;
        assert_int_equal(ck_tensor_set_add(s, &t, &st), 0);
    }
    assert_string_equal(st->name, "w39");
    assert_non_null(ck_tensor_set_find(s, "w7"));
    assert_null(ck_tensor_set_find(s, "w40"));
    assert_true(ck_tensor_get_f64(ck_tensor_set_find(s, "w3"), 1) == 2.0);
    uint32_t crc;
    assert_int_equal(ck_tensor_crc32c(s, st, &crc), 0);
    assert_int_equal(crc, ck_crc32c("\x00\x00\x80\x3f\x00\x00\x00\x40", 8));
    ck_tensor_set_drop_pages(s, base, len); /* data stays readable */
    assert_true(ck_tensor_get_f64(st, 0) == 1.0);
    void *blk;
    assert_int_equal(ck_tensor_set_alloc(s, CK_TENSOR_ALLOC_MAX + 1, &blk), CK_ESIZE);
    assert_int_equal(ck_tensor_set_alloc(s, UINT64_MAX, &blk), CK_ESIZE);
    assert_int_equal(ck_tensor_set_alloc(s, 100, &blk), 0);
    assert_int_equal(((unsigned char *)blk)[99], 0);
    char *c = ck_tensor_set_strdup(s, "abcdef", 3);
    assert_string_equal(c, "abc");
    assert_int_equal(ck_tensor_set_add_meta(s, "k", "v"), 0);
    assert_int_equal(ck_tensor_set_add_meta(s, "k2", "v2"), 0);
    assert_int_equal(ck_tensor_set_add_meta(s, "k3", "v3"), 0);
    assert_string_equal(s->meta[2].value, "v3");
    t.name = "bad";
    t.rank = CK_TENSOR_MAX_RANK + 1;
    assert_int_equal(ck_tensor_set_add(s, &t, NULL), CK_EFORMAT);
    assert_int_equal(s->ntensors, 40);
    /* Strings: CRC over 8-byte LE length + bytes each. */
    struct ck_bytes strs[2] = {{(const unsigned char *)"ab", 2}, {(const unsigned char *)"c", 1}};
    struct ck_tensor ts = {.name = "s", .dtype = CK_DT_STRING, .rank = 1, .strings = strs};
    ts.dims[0] = 2;
    assert_int_equal(ck_tensor_crc32c(s, &ts, &crc), 0);
    assert_int_equal(crc, ck_crc32c("\2\0\0\0\0\0\0\0ab\1\0\0\0\0\0\0\0c", 19));
    ts.strings = NULL;
    assert_int_equal(ck_tensor_crc32c(s, &ts, &crc), CK_ENOENT);
    ck_tensor_set_free(s);
    ck_tensor_set_free(NULL);
}

static void graph_helpers(void **state)
{
    (void)state;
    struct ck_graph *g = ck_graph_new();
    struct ck_graph_node *n;
    assert_non_null(g);
    for (int i = 0; i < 5; i++) {
        assert_int_equal(ck_graph_add_node(g, "conv", "Convolution", &n), 0);
        assert_int_equal(ck_graph_node_add_input(n, "x"), 0);
        assert_int_equal(ck_graph_node_add_input(n, "w"), 0);
        assert_int_equal(ck_graph_node_add_input(n, "b"), 0);
        assert_int_equal(ck_graph_node_add_output(n, "y"), 0);
        assert_int_equal(ck_graph_node_add_attr(n, "pad", "1,1"), 0);
    }
    assert_int_equal(ck_graph_add_io(g, false, "x"), 0);
    assert_int_equal(ck_graph_add_io(g, true, "y"), 0);
    assert_int_equal(ck_graph_add_attr(g, "batch_size", "64"), 0);
    assert_int_equal(g->nnodes, 5);
    assert_int_equal(g->nodes[4].ninputs, 3);
    assert_string_equal(g->nodes[4].inputs[2], "b");
    assert_string_equal(g->nodes[0].attrs[0].value, "1,1");
    assert_string_equal(g->outputs[0], "y");
    ck_graph_free(g);
    ck_graph_free(NULL);
}

static void pbwire_decode(void **state)
{
    (void)state;
    /* field 1 varint 150 (08 96 01), field 2 string "testing", field 3
     * fixed32 1.0f, field 4 fixed64, field 5 packed varints 3 270 86942. */
    const unsigned char msg[] = {0x08, 0x96, 0x01, 0x12, 0x07, 't',  'e',  's',  't',
                                 'i',  'n',  'g',  0x1d, 0x00, 0x00, 0x80, 0x3f, 0x21,
                                 1,    0,    0,    0,    0,    0,    0,    0,    0x2a,
                                 0x06, 0x03, 0x8e, 0x02, 0x9e, 0xa7, 0x05};
    struct ck_pb r;
    struct ck_pb_field f;
    ck_pb_init(&r, msg, sizeof msg);
    assert_int_equal(ck_pb_next(&r, &f), 1);
    assert_int_equal(f.num, 1);
    assert_int_equal(f.v, 150);
    assert_int_equal(ck_pb_next(&r, &f), 1);
    assert_int_equal(f.wire, CK_PB_LEN);
    assert_int_equal(f.len, 7);
    assert_memory_equal(f.data, "testing", 7);
    assert_int_equal(ck_pb_next(&r, &f), 1);
    assert_true(ck_pb_float(&f) == 1.0f);
    assert_int_equal(ck_pb_next(&r, &f), 1);
    assert_int_equal(f.num, 4);
    assert_int_equal(f.v, 1);
    assert_int_equal(ck_pb_next(&r, &f), 1);
    size_t cnt, n = 0;
    uint64_t vals[3];
    assert_int_equal(ck_pb_varints_count(&f, &cnt), 0);
    assert_int_equal(cnt, 3);
    assert_int_equal(ck_pb_varints(&f, vals, 3, &n), 0);
    assert_int_equal(n, 3);
    assert_int_equal(vals[0], 3);
    assert_int_equal(vals[1], 270);
    assert_int_equal(vals[2], 86942);
    n = 1;
    assert_int_equal(ck_pb_varints(&f, vals, 3, &n), CK_ESIZE);
    assert_int_equal(ck_pb_next(&r, &f), 0);
    assert_true(ck_pb_at_end(&r));
    assert_int_equal(ck_pb_zigzag64(3), -2);
    assert_int_equal(ck_pb_zigzag64(4), 2);
    assert_int_equal(ck_pb_zigzag32(1), -1);

    /* Packed floats. */
    const unsigned char pf[] = {0x0a, 0x08, 0, 0, 0x80, 0x3f, 0, 0, 0, 0x40};
    ck_pb_init(&r, pf, sizeof pf);
    assert_int_equal(ck_pb_next(&r, &f), 1);
    uint32_t fl[2];
    n = 0;
    assert_int_equal(ck_pb_fixed32s(&f, fl, 2, &n), 0);
    assert_int_equal(fl[1], 0x40000000u);
    const unsigned char *view;
    assert_int_equal(ck_pb_packed_fixed32_view(&f, &view, &cnt), 0);
    assert_int_equal(cnt, 2);
    n = 0;
    assert_int_equal(ck_pb_fixed32s(&f, fl, 1, &n), CK_ESIZE);
}

static void pbwire_hostile(void **state)
{
    (void)state;
    struct ck_pb r;
    struct ck_pb_field f;
    const unsigned char trunc_varint[] = {0x08, 0x96};
    const unsigned char long_varint[] = {0x08, 0xff, 0xff, 0xff, 0xff, 0xff,
                                         0xff, 0xff, 0xff, 0xff, 0x7f};
    const unsigned char len_past[] = {0x12, 0x08, 'a'};
    const unsigned char huge_len[] = {0x12, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f};
    const unsigned char field0[] = {0x00, 0x01};
    const unsigned char group[] = {0x0b, 0x0c};
    const unsigned char fixed_past[] = {0x1d, 0x00, 0x00};
    const unsigned char bad_packed[] = {0x0a, 0x03, 1, 2, 3};
    const unsigned char bad_packed_varint[] = {0x0a, 0x02, 0x80, 0x80};
    const struct {
        const unsigned char *p;
        size_t n;
    } cases[] = {{trunc_varint, sizeof trunc_varint},
                 {long_varint, sizeof long_varint},
                 {len_past, sizeof len_past},
                 {huge_len, sizeof huge_len},
                 {field0, sizeof field0},
                 {group, sizeof group},
                 {fixed_past, sizeof fixed_past}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ck_pb_init(&r, cases[i].p, cases[i].n);
        assert_int_equal(ck_pb_next(&r, &f), CK_EFORMAT);
        assert_true(strlen(ck_error_msg()) > 0);
    }
    ck_pb_init(&r, bad_packed, sizeof bad_packed);
    assert_int_equal(ck_pb_next(&r, &f), 1);
    size_t cnt;
    assert_int_equal(ck_pb_fixed32s_count(&f, &cnt), CK_EFORMAT);
    ck_pb_init(&r, bad_packed_varint, sizeof bad_packed_varint);
    assert_int_equal(ck_pb_next(&r, &f), 1);
    assert_int_equal(ck_pb_varints_count(&f, &cnt), CK_EFORMAT);
    ck_pb_init(&r, NULL, 0);
    assert_int_equal(ck_pb_next(&r, &f), 0);
}

static void jsonin_strict(void **state)
{
    (void)state;
    struct ck_jin_doc *doc;
    const struct ck_jin *root, *v;
    uint64_t u;
    const char *ok = " {\"a\": [1, 2, {\"b\": null}], \"s\": \"x\\u00e9\\ud83d\\ude00\\n\","
                     " \"t\": true, \"n\": -1.5e3, \"big\": 18446744073709551615} ";
    assert_int_equal(ck_jin_parse(ok, strlen(ok), &doc, &root), 0);
    assert_int_equal(root->type, CK_JIN_OBJECT);
    assert_int_equal(root->n, 5);
    v = ck_jin_get(root, "a");
    assert_int_equal(v->type, CK_JIN_ARRAY);
    assert_int_equal(v->n, 3);
    assert_true(ck_jin_uint(v->first, &u) && u == 1);
    v = ck_jin_get(root, "s");
    /* x, e-acute (2 bytes), U+1F600 (4 bytes), newline */
    assert_int_equal(v->len, 1 + 2 + 4 + 1);
    assert_memory_equal(v->str, "x\xc3\xa9\xf0\x9f\x98\x80\n", 8);
    assert_true(ck_jin_get(root, "t")->b);
    assert_false(ck_jin_uint(ck_jin_get(root, "n"), &u));
    assert_true(ck_jin_uint(ck_jin_get(root, "big"), &u) && u == UINT64_MAX);
    assert_null(ck_jin_get(root, "missing"));
    ck_jin_free(doc);

    const char *bad[] = {
        "{\"a\":1,}",  "[1,]",
        "{\"a\" 1}",   "01",
        "1.",          "-",
        "1e",          "{\"a\":1}x",
        "\"\\x\"",     "\"\x01\"",
        "\"\xff\"",    "\"\\ud800\"",
        "\"\\udc00\"", "{\"a\":1,\"a\":2}",
        "tru",         "nul",
        "[1 2]",       "{1:2}",
        "\"abc",       "",
        "   ",         "{\"a\":[}",
        "// c\n{}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(ck_jin_parse(bad[i], strlen(bad[i]), &doc, &root), CK_EFORMAT);
        assert_null(doc);
    }
    /* Nesting: 64 levels parse, 65 do not. */
    char deep[200];
    for (int depth = 64; depth <= 65; depth++) {
        memset(deep, '[', (size_t)depth);
        memset(deep + depth, ']', (size_t)depth);
        int rc = ck_jin_parse(deep, 2 * (size_t)depth, &doc, &root);
        assert_int_equal(rc, depth == 64 ? 0 : CK_EFORMAT);
        ck_jin_free(doc);
    }
    /* 2^64 does not fit. */
    assert_int_equal(ck_jin_parse("18446744073709551616", 20, &doc, &root), 0);
    assert_false(ck_jin_uint(root, &u));
    ck_jin_free(doc);
}

static void reader_table(void **state)
{
    (void)state;
    for (size_t i = 0; ck_readers[i]; i++) {
        assert_non_null(ck_readers[i]->name);
        assert_non_null(ck_readers[i]->probe);
        assert_non_null(ck_readers[i]->open);
        assert_ptr_equal(ck_reader_find(ck_readers[i]->name), ck_readers[i]);
    }
    assert_null(ck_reader_find("no-such-format"));
    assert_null(ck_reader_find(NULL));
    const struct ck_reader_ops *ops;
    struct ck_tensor_set *s;
    char dir[4096], path[4200];
    ck_test_tmpdir(dir, "readers_detect");
    snprintf(path, sizeof path, "%s/garbage.bin", dir);
    FILE *f = fopen(path, "w");
    fputs("this is not a checkpoint of any kind", f);
    fclose(f);
    assert_int_equal(ck_reader_detect(path, &ops), CK_EFORMAT);
    assert_non_null(strstr(ck_error_msg(), "garbage.bin"));
    snprintf(path, sizeof path, "%s/missing", dir);
    assert_int_equal(ck_reader_detect(path, &ops), CK_ENOENT);
    assert_int_equal(ck_reader_open(path, "no-such-format", &s), CK_EUSAGE);
    assert_null(s);
    assert_int_equal(ck_reader_verify(NULL, NULL, NULL), CK_VERIFY_NONE);
}

/* A mapped file that shrinks under the reader: SIGBUS on the lost pages. The
 * process must name the file and exit 1, not dump core. In a child, whose
 * stderr comes back through a pipe. */
/* Maps path, reads a page, truncates the file, reads every page. */
static int read_then_truncate(void *arg)
{
    const char *path = arg;
    struct ck_tensor_set *s = ck_tensor_set_new("safetensors", path);
    const unsigned char *base;
    uint64_t len;
    if (!s || ck_tensor_set_map_file(s, path, &base, &len) < 0 || len != 16u << 16)
        _exit(10);
    volatile unsigned sum = base[0]; /* a page read before the truncation */
    if (truncate(path, 0) < 0)
        _exit(11);
    for (uint64_t off = 0; off < len; off += 4096)
        sum += base[off];
    ck_tensor_set_free(s);
    return 0;
}

static void truncated_mapping_names_the_file(void **state)
{
    (void)state;
    char dir[4000], path[4100];
    ck_test_tmpdir(dir, "trunc");
    snprintf(path, sizeof path, "%s/shrinks.safetensors", dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(fd >= 0);
    static unsigned char block[1 << 16];
    memset(block, 7, sizeof block);
    for (int i = 0; i < 16; i++)
        assert_int_equal(write(fd, block, sizeof block), (ssize_t)sizeof block);
    close(fd);
    int pfd[2];
    assert_int_equal(pipe(pfd), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* as ckptd inspect does: the reads under ck_tensor_guarded, the error
         * it returns printed and turned into the exit code by the caller */
        dup2(pfd[1], STDERR_FILENO);
        int err = ck_tensor_guarded(read_then_truncate, path);
        if (err != CK_ECHANGED)
            _exit(12); /* not reached: the reads raise SIGBUS, which comes back as an error */
        fprintf(stderr, "%s\n", ck_error_msg());
        _exit(ck_exit_code(err));
    }
    close(pfd[1]);
    char out[1024] = "";
    size_t got = 0;
    ssize_t n;
    while ((n = read(pfd[0], out + got, sizeof out - 1 - got)) > 0)
        got += (size_t)n;
    out[got] = 0;
    close(pfd[0]);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 1);
    assert_non_null(strstr(out, path));
    assert_non_null(strstr(out, "was truncated while it was being read"));
}

/* The PCLMULQDQ CRC-32 against zlib's on every length and alignment near the
 * block sizes, and on a stream extended in uneven pieces. */
static void crc32_matches_zlib(void **state)
{
    (void)state;
    size_t n = 1 << 16;
    unsigned char *b = malloc(n);
    assert_non_null(b);
    for (size_t i = 0; i < n; i++)
        b[i] = (unsigned char)(i * 2654435761u >> 13);
    for (size_t len = 0; len <= 1100; len++)
        for (size_t off = 0; off < 4; off++)
            assert_int_equal(ck_crc32_extend(0, b + off, len),
                             (uint32_t)crc32(0, b + off, (uInt)len));
    /* long inputs, where the 256-bit loop (VPCLMULQDQ, when the CPU has it) runs */
    for (size_t len = 4096 - 130; len < n; len = len * 2 + 17)
        for (size_t off = 0; off < 4; off++)
            assert_int_equal(ck_crc32_extend(0, b + off, len - off),
                             (uint32_t)crc32(0, b + off, (uInt)(len - off)));
    uint32_t c = 0;
    for (size_t at = 0, step = 1; at < n; at += step, step = step * 3 + 1)
        c = ck_crc32_extend(c, b + at, at + step > n ? n - at : step);
    assert_int_equal(c, (uint32_t)crc32(0, b, (uInt)n));
    assert_int_equal(ck_crc32_extend(0, "123456789", 9), 0xcbf43926u);
    free(b);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(crc32_matches_zlib),
    cmocka_unit_test(truncated_mapping_names_the_file),
    cmocka_unit_test(crc32c_known_values), cmocka_unit_test(dtype_table),
    cmocka_unit_test(numel_overflow),      cmocka_unit_test(get_f64_every_dtype),
    cmocka_unit_test(get_f64_fortran),     cmocka_unit_test(set_lifecycle),
    cmocka_unit_test(graph_helpers),       cmocka_unit_test(pbwire_decode),
    cmocka_unit_test(pbwire_hostile),      cmocka_unit_test(reader_table),
    cmocka_unit_test(jsonin_strict),
};
CK_TEST_MAIN(tests)
