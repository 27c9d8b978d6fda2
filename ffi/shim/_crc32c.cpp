// CRC-32C with the SSE4.2 / ARMv8 CRC instructions when present, slicing-by-8 tables
// otherwise. The instruction has a latency of three cycles and a throughput of one, so long
// inputs run as three interleaved streams whose CRCs are combined with precomputed "append
// n zero bytes" operators (the method of Mark Adler's crc32c.c): about three times the
// single-stream speed, which matters because every exported page is checksummed.
#include "_crc32c.h"

#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#elif defined(__aarch64__)
#include <arm_acle.h>
#if defined(__linux__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif
#endif

namespace {

constexpr uint32_t POLY_REFLECTED = 0x82f63b78u;

struct tables {
    uint32_t t[8][256];
    tables() {
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++) {
                c = (c & 1) ? (c >> 1) ^ POLY_REFLECTED : c >> 1;
            }
            t[0][i] = c;
        }
        for (uint32_t i = 0; i < 256; i++) {
            for (int s = 1; s < 8; s++) {
                t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xff];
            }
        }
    }
};

uint32_t crc_soft(uint32_t c, const uint8_t * p, size_t n) {
    static const tables tb;
    const auto & t = tb.t;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w ^= c;
        c = t[7][w & 0xff] ^ t[6][(w >> 8) & 0xff] ^ t[5][(w >> 16) & 0xff] ^ t[4][(w >> 24) & 0xff] ^
            t[3][(w >> 32) & 0xff] ^ t[2][(w >> 40) & 0xff] ^ t[1][(w >> 48) & 0xff] ^ t[0][w >> 56];
        p += 8;
        n -= 8;
    }
    while (n--) {
        c = t[0][(c ^ *p++) & 0xff] ^ (c >> 8);
    }
    return c;
}

// GF(2) 32x32 matrices as 32 columns: the linear map "append zero bytes" on a CRC register.
uint32_t gf2_times(const uint32_t * mat, uint32_t vec) {
    uint32_t sum = 0;
    for (; vec != 0; vec >>= 1, mat++) {
        if (vec & 1) {
            sum ^= *mat;
        }
    }
    return sum;
}

void gf2_square(uint32_t * square, const uint32_t * mat) {
    for (int n = 0; n < 32; n++) {
        square[n] = gf2_times(mat, mat[n]);
    }
}

// Byte-indexed tables of the operator that appends `len` zero bytes (`len` a power of two).
struct zeros_op {
    uint32_t t[4][256];
    explicit zeros_op(size_t len) {
        uint32_t even[32], odd[32];
        odd[0] = POLY_REFLECTED; // one zero bit
        for (uint32_t n = 1, row = 1; n < 32; n++, row <<= 1) {
            odd[n] = row;
        }
        gf2_square(even, odd); // two zero bits
        gf2_square(odd, even); // four zero bits
        const uint32_t * op = even;
        for (;;) {
            gf2_square(even, odd); // 1, 4, 16, ... zero bytes
            op = even;
            if ((len >>= 1) == 0) {
                break;
            }
            gf2_square(odd, even); // 2, 8, 32, ... zero bytes
            op = odd;
            if ((len >>= 1) == 0) {
                break;
            }
        }
        for (uint32_t b = 0; b < 256; b++) {
            for (int k = 0; k < 4; k++) {
                t[k][b] = gf2_times(op, b << (8 * k));
            }
        }
    }
    uint32_t shift(uint32_t c) const {
        return t[0][c & 0xff] ^ t[1][(c >> 8) & 0xff] ^ t[2][(c >> 16) & 0xff] ^ t[3][c >> 24];
    }
};

constexpr size_t LONG_BLOCK  = 8192;
constexpr size_t SHORT_BLOCK = 256;

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) inline uint64_t step8(uint64_t c, const uint8_t * p) {
    uint64_t w;
    memcpy(&w, p, 8);
    return _mm_crc32_u64(c, w);
}
__attribute__((target("sse4.2"))) inline uint32_t step1(uint32_t c, uint8_t b) {
    return _mm_crc32_u8(c, b);
}
#define SKIPPY_CRC_TARGET __attribute__((target("sse4.2")))
#elif defined(__aarch64__)
__attribute__((target("+crc"))) inline uint64_t step8(uint64_t c, const uint8_t * p) {
    uint64_t w;
    memcpy(&w, p, 8);
    return __crc32cd((uint32_t) c, w);
}
__attribute__((target("+crc"))) inline uint32_t step1(uint32_t c, uint8_t b) {
    return __crc32cb(c, b);
}
#define SKIPPY_CRC_TARGET __attribute__((target("+crc")))
#endif

#if defined(__x86_64__) || defined(__aarch64__)
// Three streams over consecutive blocks of `block` bytes, combined by shifting.
SKIPPY_CRC_TARGET uint64_t crc_3way(uint64_t c0, const uint8_t *& p, size_t & n, size_t block,
                                    const zeros_op & z) {
    while (n >= 3 * block) {
        uint64_t c1 = 0, c2 = 0;
        for (size_t i = 0; i < block; i += 8) {
            c0 = step8(c0, p + i);
            c1 = step8(c1, p + block + i);
            c2 = step8(c2, p + 2 * block + i);
        }
        c0 = z.shift((uint32_t) c0) ^ (uint32_t) c1;
        c0 = z.shift((uint32_t) c0) ^ (uint32_t) c2;
        p += 3 * block;
        n -= 3 * block;
    }
    return c0;
}

SKIPPY_CRC_TARGET uint32_t crc_hw(uint32_t c, const uint8_t * p, size_t n) {
    static const zeros_op z_long(LONG_BLOCK);
    static const zeros_op z_short(SHORT_BLOCK);
    uint64_t c64 = c;
    c64 = crc_3way(c64, p, n, LONG_BLOCK, z_long);
    c64 = crc_3way(c64, p, n, SHORT_BLOCK, z_short);
    for (; n >= 8; p += 8, n -= 8) {
        c64 = step8(c64, p);
    }
    c = (uint32_t) c64;
    while (n--) {
        c = step1(c, *p++);
    }
    return c;
}
#endif

#if defined(__x86_64__)
bool have_hw() {
    return __builtin_cpu_supports("sse4.2");
}
#elif defined(__aarch64__)
bool have_hw() {
#if defined(__APPLE__)
    return true;
#elif defined(__linux__)
    return (getauxval(AT_HWCAP) & HWCAP_CRC32) != 0;
#else
    return false;
#endif
}
#else
uint32_t crc_hw(uint32_t c, const uint8_t * p, size_t n) {
    return crc_soft(c, p, n);
}
bool have_hw() {
    return false;
}
#endif

} // namespace

uint32_t skippy_crc32c(uint32_t crc, const uint8_t * p, size_t n) {
    static const bool hw = have_hw();
    const uint32_t c = ~crc;
    return ~(hw ? crc_hw(c, p, n) : crc_soft(c, p, n));
}
