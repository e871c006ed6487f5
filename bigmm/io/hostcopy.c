/* Row copies with non-temporal stores, for bigmm.io.hostcopy.
 *
 * Each row's bytes are loaded as usual and stored with streaming stores from the first
 * 16-byte boundary of the destination on, in whole cache lines (the head before that boundary
 * and the tail after the last whole line go through memcpy). The stores bypass the caches, so
 * the destination's lines are not read first: a copy moves its bytes through memory twice,
 * not three times. On other architectures every row is one memcpy.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) || defined(_M_X64)
#include <emmintrin.h>
#define BIGMM_STREAM 1
#endif

static void copy_row(char *d, const char *s, size_t n)
{
#ifdef BIGMM_STREAM
    size_t head = (size_t)(-(uintptr_t)d & 15u);
    if (n < head + 64) {
        memcpy(d, s, n);
        return;
    }
    memcpy(d, s, head);
    d += head;
    s += head;
    n -= head;
    size_t body = n & ~(size_t)63;
    for (size_t i = 0; i < body; i += 64) {
        __m128i x0 = _mm_loadu_si128((const __m128i *)(s + i));
        __m128i x1 = _mm_loadu_si128((const __m128i *)(s + i + 16));
        __m128i x2 = _mm_loadu_si128((const __m128i *)(s + i + 32));
        __m128i x3 = _mm_loadu_si128((const __m128i *)(s + i + 48));
        _mm_stream_si128((__m128i *)(d + i), x0);
        _mm_stream_si128((__m128i *)(d + i + 16), x1);
        _mm_stream_si128((__m128i *)(d + i + 32), x2);
        _mm_stream_si128((__m128i *)(d + i + 48), x3);
    }
    memcpy(d + body, s + body, n - body);
#else
    memcpy(d, s, n);
#endif
}

/* rows rows of row_bytes bytes each: row r from src + r * src_stride to dst + r * dst_stride.
 * The stores are fenced before it returns, so that the bytes are visible to whoever the
 * caller hands the destination to next. */
void bigmm_copy_rows(char *dst, ptrdiff_t dst_stride, const char *src, ptrdiff_t src_stride,
                     size_t rows, size_t row_bytes)
{
    for (size_t r = 0; r < rows; r++)
        copy_row(dst + (ptrdiff_t)r * dst_stride, src + (ptrdiff_t)r * src_stride, row_bytes);
#ifdef BIGMM_STREAM
    _mm_sfence();
#endif
}

/* 1 where the stores stream (x86-64), else 0. */
int bigmm_streams(void)
{
#ifdef BIGMM_STREAM
    return 1;
#else
    return 0;
#endif
}
