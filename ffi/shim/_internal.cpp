// Shared pieces of the shim: exact-type memory views, error messages, the page header.
#include "_internal.h"

#include "_crc32c.h"

#include <cstdarg>
#include <cstdio>
#include <typeinfo>

namespace skippy {

int32_t fail(err_sink e, int32_t code, const char * fmt, ...) {
    if (e.buf != nullptr && e.cap > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(e.buf, (size_t) e.cap, fmt, ap);
        va_end(ap);
    }
    return code;
}

mem_view view_of(llama_context * ctx) {
    mem_view v;
    llama_memory_i * mem = llama_get_memory(ctx);
    if (mem == nullptr) {
        return v;
    }
    const std::type_info & t = typeid(*mem);
    if (t == typeid(llama_kv_cache)) {
        v.kind = SKIPPY_MEM_KV;
        v.main = static_cast<llama_kv_cache *>(mem);
    } else if (t == typeid(llama_memory_hybrid)) {
        auto * h = static_cast<llama_memory_hybrid *>(mem);
        v.kind   = SKIPPY_MEM_HYBRID;
        v.main   = h->get_mem_attn();
        v.recr   = h->get_mem_recr();
    } else if (t == typeid(llama_kv_cache_iswa)) {
        auto * i = static_cast<llama_kv_cache_iswa *>(mem);
        v.kind   = SKIPPY_MEM_ISWA;
        v.main   = i->get_base();
        v.swa    = i->get_swa();
    } else if (t == typeid(llama_memory_recurrent)) {
        v.kind = SKIPPY_MEM_RECURRENT;
        v.recr = static_cast<llama_memory_recurrent *>(mem);
    } else {
        v.kind = SKIPPY_MEM_UNSUPPORTED;
    }
    return v;
}

const char * cache_name(int32_t cache) {
    return cache == SKIPPY_CACHE_SWA ? "sliding-window cache" : "attention cache";
}

int32_t pick_cache(llama_context * ctx, int32_t cache, int32_t seq, llama_kv_cache ** out,
                   uint32_t * strm, err_sink e) {
    if (cache != SKIPPY_CACHE_MAIN && cache != SKIPPY_CACHE_SWA) {
        return fail(e, SKIPPY_E_ARG, "unknown cache selector %d", cache);
    }
    const mem_view v = view_of(ctx);
    llama_kv_cache * kv = cache == SKIPPY_CACHE_SWA ? v.swa : v.main;
    if (kv == nullptr) {
        return fail(e, SKIPPY_E_KIND, "this context's memory (kind %d) has no %s", v.kind,
                    cache_name(cache));
    }
    if (kv->other != nullptr) {
        return fail(e, SKIPPY_E_KIND, "the %s shares its cells with another cache", cache_name(cache));
    }
    if (seq < 0 || (uint32_t) seq >= kv->n_seq_max || (size_t) seq >= kv->seq_to_stream.size()) {
        return fail(e, SKIPPY_E_ARG, "sequence id %d is outside [0, %u)", seq, kv->n_seq_max);
    }
    *out  = kv;
    *strm = kv->seq_to_stream[seq];
    return SKIPPY_OK;
}

void write_header(uint8_t * p, const page_header & h) {
    memset(p, 0, SKIPPY_PAGE_HEADER_BYTES);
    put(p, 0, h.magic);
    put(p, 4, h.version);
    put(p, 6, h.header_bytes);
    put(p, 8, h.flags);
    put(p, 12, h.cache);
    put(p, 16, h.seq);
    put(p, 20, h.p0);
    put(p, 24, h.p1);
    put(p, 28, h.cell_count);
    put(p, 32, h.n_ranges);
    put(p, 36, h.n_layer);
    put(p, 40, h.kv_size);
    put(p, 44, h.meta_bytes);
    put(p, 48, h.data_bytes);
    put(p, 56, h.crc);
}

page_header read_header(const uint8_t * p) {
    page_header h;
    h.magic        = get<uint32_t>(p, 0);
    h.version      = get<uint16_t>(p, 4);
    h.header_bytes = get<uint16_t>(p, 6);
    h.flags        = get<uint32_t>(p, 8);
    h.cache        = get<uint32_t>(p, 12);
    h.seq          = get<int32_t>(p, 16);
    h.p0           = get<int32_t>(p, 20);
    h.p1           = get<int32_t>(p, 24);
    h.cell_count   = get<uint32_t>(p, 28);
    h.n_ranges     = get<uint32_t>(p, 32);
    h.n_layer      = get<uint32_t>(p, 36);
    h.kv_size      = get<uint32_t>(p, 40);
    h.meta_bytes   = get<uint32_t>(p, 44);
    h.data_bytes   = get<uint64_t>(p, 48);
    h.crc          = get<uint32_t>(p, 56);
    return h;
}

uint32_t page_crc(const uint8_t * p, size_t len) {
    const uint32_t c = skippy_crc32c(0, p, 56);
    return skippy_crc32c(c, p + SKIPPY_PAGE_HEADER_BYTES, len - SKIPPY_PAGE_HEADER_BYTES);
}

} // namespace skippy
