// CRC-32C (Castagnoli), the same function as transport's crc32c: crc32c("123456789") is
// 0xe3069283. Hardware instructions where the CPU has them, slicing-by-8 otherwise.
#pragma once

#include <cstddef>
#include <cstdint>

// Continues `crc` (0 to start) over `n` bytes.
uint32_t skippy_crc32c(uint32_t crc, const uint8_t * p, size_t n);
