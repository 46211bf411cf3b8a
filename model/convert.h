/* Tensor elements as float32 or float64, whatever their stored dtype, byte
 * order and element order: what the writers (mldef data files are float32 or
 * float64) and the inference engine (float32 compute) read weights through.
 *
 * Elements are counted in C order, also for a Fortran-order tensor (numpy's
 * fortran_order), exactly as ck_tensor_get_f64 counts them; values are what
 * ck_tensor_get_f64 returns (the real part of a complex, the raw integer of a
 * TF quantized type, 1/0 for bool), rounded to nearest-even for float32.
 *
 * Reads are by range so a 1 GiB tensor streams through a small buffer:
 * ck_tensor_stream_f32 does the loop and drops the file mapping's pages
 * behind it, so resident memory stays at the buffer's size. Fast paths:
 * little-endian float32 in C order is a copy; float16, bfloat16 and float64
 * are converted in tight loops; everything else element by element.
 *
 * Nothing here allocates; dst buffers are the caller's. */
#ifndef CK_CONVERT_H
#define CK_CONVERT_H

#include "model/tensor.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* What a conversion lost, counted over the elements converted (the caller
 * zeroes it once and passes it to every chunk, so it sums over a tensor).
 * The "converted, say so in the log" rule uses ck_convert_lossy. */
struct ck_convert_report {
    uint64_t converted;    /* elements read */
    uint64_t inexact;      /* elements whose output differs from the stored value (rounded
                              float64, int32/int64 beyond 2^24, a float outside float32's range) */
    uint64_t nonfinite;    /* elements that are NaN or +-Inf in the output */
    uint64_t imag_dropped; /* complex elements with a non-zero imaginary part */
};

/* How a dtype converts to float32, from the dtype alone. */
enum ck_convert_kind {
    CK_CONVERT_NONE = 0, /* not numeric (string, invalid): cannot be converted */
    CK_CONVERT_SAME,     /* already float32 (maybe byte-swapped or reordered) */
    CK_CONVERT_EXACT,    /* every value is representable: bool, 8/16-bit ints, f16, bf16, f8 */
    CK_CONVERT_ROUNDS,   /* values may round: 32/64-bit ints, f64; complex keeps its real part */
    CK_CONVERT_RAW,      /* TF quantized: the raw integers, exactly, without their scale */
};
enum ck_convert_kind ck_convert_kind_f32(enum ck_dtype t);

/* True when the report says the output differs from the stored values. */
bool ck_convert_lossy(const struct ck_convert_report *r);

/* Elements [first, first+count) of t (C-order index) into dst[0..count).
 * rep may be NULL. CK_ENOENT when t has no data, CK_EFORMAT for a dtype that
 * is not numeric or data whose size disagrees with the shape, CK_ESIZE when
 * the range is past the end. Errors name the tensor. */
int ck_tensor_read_f32(const struct ck_tensor *t, uint64_t first, uint64_t count, float *dst,
                       struct ck_convert_report *rep);
/* Same into float64 (exact for every dtype but 64-bit ints beyond 2^53). */
int ck_tensor_read_f64(const struct ck_tensor *t, uint64_t first, uint64_t count, double *dst,
                       struct ck_convert_report *rep);

/* Streams all of t as float32 through buf (bufcount elements, at least 1):
 * fills it, calls fn(ctx, buf, n), repeats; after each chunk tells the kernel
 * the mapping's pages behind are no longer needed (s may be NULL: no drop).
 * A negative return of fn stops the stream and is returned. */
typedef int (*ck_convert_sink)(void *ctx, const float *v, size_t n);
int ck_tensor_stream_f32(const struct ck_tensor_set *s, const struct ck_tensor *t, float *buf,
                         size_t bufcount, ck_convert_sink fn, void *ctx,
                         struct ck_convert_report *rep);

/* float32 to IEEE half and bfloat16, round to nearest even (for writers that
 * store those dtypes and for tests). */
uint16_t ck_f32_to_f16(float f);
uint16_t ck_f32_to_bf16(float f);

#endif
