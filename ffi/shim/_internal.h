// Private to the shim: llama.cpp internals it reaches, error reporting, io adapters and the
// page header. Compiled with -fno-access-control (see build.ts), which lets this code name
// private members of llama.cpp's classes without editing llama.cpp's headers.
#pragma once

#include "skippy_shim.h"

#include "llama.h"
#include "llama-io.h"
#include "llama-kv-cache.h"
#include "llama-kv-cache-iswa.h"
#include "llama-memory-hybrid.h"
#include "llama-memory-recurrent.h"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>

#include "ggml-backend.h"

namespace skippy {

// The caller's message buffer; messages never contain state bytes.
struct err_sink {
    char *   buf;
    uint64_t cap;
};

int32_t fail(err_sink e, int32_t code, const char * fmt, ...) __attribute__((format(printf, 3, 4)));

struct mem_view {
    int32_t                  kind = SKIPPY_MEM_NONE;
    llama_kv_cache *         main = nullptr;
    llama_kv_cache *         swa  = nullptr;
    llama_memory_recurrent * recr = nullptr;
};

// Exact-type view of llama_get_memory(ctx).
mem_view view_of(llama_context * ctx);

const char * cache_name(int32_t cache);

// Resolves the addressed attention cache and the stream of `seq` in it.
int32_t pick_cache(llama_context * ctx, int32_t cache, int32_t seq, llama_kv_cache ** out,
                   uint32_t * strm, err_sink e);

struct count_writer : llama_io_write_i {
    size_t n = 0;
    void write(const void *, size_t size) override { n += size; }
    void write_tensor(ggml_tensor *, size_t, size_t size) override { n += size; }
    size_t n_bytes() override { return n; }
};

struct buf_writer : llama_io_write_i {
    uint8_t * p;
    size_t    cap;
    size_t    n = 0;
    buf_writer(uint8_t * dst, size_t size) : p(dst), cap(size) {}
    void reserve(size_t size) {
        if (size > cap - n) {
            throw std::runtime_error("page buffer too small");
        }
    }
    void write(const void * src, size_t size) override {
        reserve(size);
        memcpy(p + n, src, size);
        n += size;
    }
    void write_tensor(ggml_tensor * t, size_t offset, size_t size) override {
        reserve(size);
        ggml_backend_tensor_get(t, p + n, offset, size);
        n += size;
    }
    size_t n_bytes() override { return n; }
};

struct buf_reader : llama_io_read_i {
    const uint8_t * p;
    size_t          len;
    size_t          n = 0;
    buf_reader(const uint8_t * src, size_t size) : p(src), len(size) {}
    void take(size_t size) {
        if (size > len - n) {
            throw std::runtime_error("page truncated");
        }
    }
    void read(void * dst, size_t size) override {
        take(size);
        memcpy(dst, p + n, size);
        n += size;
    }
    void read_tensor(ggml_tensor * t, size_t offset, size_t size) override {
        take(size);
        ggml_backend_tensor_set(t, p + n, offset, size);
        n += size;
    }
    size_t n_bytes() override { return n; }
};

struct page_header {
    uint32_t magic        = SKIPPY_PAGE_MAGIC;
    uint16_t version      = SKIPPY_PAGE_VERSION;
    uint16_t header_bytes = SKIPPY_PAGE_HEADER_BYTES;
    uint32_t flags        = 0;
    uint32_t cache        = 0;
    int32_t  seq          = 0;
    int32_t  p0           = 0;
    int32_t  p1           = 0;
    uint32_t cell_count   = 0;
    uint32_t n_ranges     = 0;
    uint32_t n_layer      = 0;
    uint32_t kv_size      = 0;
    uint32_t meta_bytes   = 0;
    uint64_t data_bytes   = 0;
    uint32_t crc          = 0;
};

template <typename T> void put(uint8_t * p, size_t off, T v) { memcpy(p + off, &v, sizeof(T)); }
template <typename T> T get(const uint8_t * p, size_t off) {
    T v;
    memcpy(&v, p + off, sizeof(T));
    return v;
}

void        write_header(uint8_t * p, const page_header & h);
page_header read_header(const uint8_t * p);
// crc32c of header bytes [0, 56) and of everything after the header.
uint32_t    page_crc(const uint8_t * p, size_t len);

// Page of positions [p0, p1) of `seq` in `cache` (skippy_shim.cpp): with buf == nullptr its
// size, else written into buf. `sync` synchronizes the context first; the layer capture
// passes false, because it exports from inside a running graph, after the nodes it reads.
int64_t export_page(llama_context * ctx, int32_t cache, int32_t seq, int32_t p0, int32_t p1,
                    uint8_t * buf, uint64_t cap, err_sink e, bool sync);

} // namespace skippy
