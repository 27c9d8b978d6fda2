// skippy shim: page export and the C entry points.
//
// Compiled with -fno-access-control against the internal headers of the exact llama.cpp commit
// of the loaded libllama, so it can call private-but-exported members (state_write_meta,
// state_write_data, state_read_data, apply_ubatch) and read inline members (cells, heads,
// stream map). That couples it to the library's object layout: build.ts bakes the library's
// build id in, shim.ts refuses the shim when the loaded library differs, and
// skippy_self_test cross-checks inline reads against libllama's own accessors.
#include "_internal.h"
#include "_crc32c.h"

using namespace skippy;

namespace {

struct page_plan {
    llama_kv_cache *              kv    = nullptr;
    llama_kv_cache::cell_ranges_t cr    = { 0, {} };
    uint32_t                      count = 0;
    int32_t                       first = -1;
    int32_t                       last  = -1;
};

// Cell ranges of `seq` with positions in [p0, p1), in position order, read from the ordered
// (pos, cell) set of the sequence: O(log n + page), independent of the context length.
int32_t plan_page(llama_context * ctx, int32_t cache, int32_t seq, int32_t p0, int32_t p1,
                  page_plan & plan, err_sink e) {
    if (p0 < 0 || p1 <= p0) {
        return fail(e, SKIPPY_E_ARG, "empty or negative position range [%d, %d)", p0, p1);
    }
    uint32_t strm = 0;
    const int32_t rc = pick_cache(ctx, cache, seq, &plan.kv, &strm, e);
    if (rc != SKIPPY_OK) {
        return rc;
    }
    plan.cr.strm = strm;
    const auto & sp = plan.kv->v_cells[strm].seq_pos[seq];
    for (auto it = sp.lower_bound({ p0, 0u }); it != sp.end() && it->first < p1; ++it) {
        const int32_t  pos = it->first;
        const uint32_t idx = it->second;
        if (pos == plan.last) {
            return fail(e, SKIPPY_E_SOURCE, "position %d appears twice in the source %s", pos,
                        cache_name(cache));
        }
        plan.first = plan.first < 0 ? pos : plan.first;
        plan.last  = pos;
        auto & d   = plan.cr.data;
        if (!d.empty() && d.back().second == idx) {
            d.back().second++;
        } else {
            d.emplace_back(idx, idx + 1);
        }
        plan.count++;
    }
    if (cache == SKIPPY_CACHE_MAIN && plan.count != (uint32_t) (p1 - p0)) {
        return fail(e, SKIPPY_E_SOURCE, "the source %s holds %u of the %d positions [%d, %d)",
                    cache_name(cache), plan.count, p1 - p0, p0, p1);
    }
    if (plan.count == 0) {
        return fail(e, SKIPPY_E_SOURCE, "the source %s holds no positions in [%d, %d)",
                    cache_name(cache), p0, p1);
    }
    return SKIPPY_OK;
}

page_header header_for(const page_plan & plan, int32_t cache, int32_t seq, int32_t p0, int32_t p1,
                       size_t meta, size_t data) {
    page_header h;
    h.flags = SKIPPY_PAGE_FLAG_PLACED | (plan.kv->has_cell_ext() ? SKIPPY_PAGE_FLAG_EXT : 0) |
              (plan.kv->v_trans ? SKIPPY_PAGE_FLAG_VTRANS : 0);
    h.cache      = (uint32_t) cache;
    h.seq        = seq;
    // A sliding-window page covers what the window holds, whatever range was asked for.
    h.p0         = cache == SKIPPY_CACHE_MAIN ? p0 : plan.first;
    h.p1         = cache == SKIPPY_CACHE_MAIN ? p1 : plan.last + 1;
    h.cell_count = plan.count;
    h.n_ranges   = (uint32_t) plan.cr.data.size();
    h.n_layer    = (uint32_t) plan.kv->layers.size();
    h.kv_size    = plan.kv->v_cells[plan.cr.strm].size();
    h.meta_bytes = (uint32_t) meta;
    h.data_bytes = data;
    return h;
}

} // namespace

namespace skippy {

int64_t export_page(llama_context * ctx, int32_t cache, int32_t seq, int32_t p0, int32_t p1,
                    uint8_t * buf, uint64_t cap, err_sink e, bool sync) {
    page_plan plan;
    const int32_t rc = plan_page(ctx, cache, seq, p0, p1, plan, e);
    if (rc != SKIPPY_OK) {
        return rc;
    }
    // Metadata is {pos, n_seq_id = 1, [ext], seq_id} per cell (state_write_meta for one
    // sequence); counting it by running state_write_meta would allocate per cell.
    const size_t meta = plan.count * (12 + (plan.kv->has_cell_ext() ? sizeof(llama_kv_cell_ext) : 0));
    count_writer data;
    plan.kv->state_write_data(data, plan.cr);
    const size_t ranges = plan.cr.data.size() * 8;
    const size_t total  = SKIPPY_PAGE_HEADER_BYTES + ranges + meta + data.n;
    if (buf == nullptr) {
        return (int64_t) total;
    }
    if (cap < total) {
        return fail(e, SKIPPY_E_CAPACITY, "the page needs %zu bytes, the buffer holds %llu", total,
                    (unsigned long long) cap);
    }
    if (sync) {
        llama_synchronize(ctx);
    }
    uint8_t * p = buf + SKIPPY_PAGE_HEADER_BYTES;
    for (const auto & r : plan.cr.data) {
        put(p, 0, r.first);
        put(p, 4, r.second);
        p += 8;
    }
    buf_writer w(p, meta + data.n);
    plan.kv->state_write_meta(w, plan.cr, seq);
    if (w.n != meta) {
        return fail(e, SKIPPY_E_NATIVE, "cell metadata took %zu bytes, expected %zu", w.n, meta);
    }
    plan.kv->state_write_data(w, plan.cr);
    write_header(buf, header_for(plan, cache, seq, p0, p1, meta, data.n));
    put(buf, 56, page_crc(buf, total));
    return (int64_t) total;
}

} // namespace skippy

extern "C" {

uint32_t skippy_shim_abi_version(void) {
    return SKIPPY_SHIM_ABI_VERSION;
}

uint32_t skippy_checksum_crc32c(uint32_t crc, const uint8_t * buf, uint64_t len) {
    return buf == nullptr ? crc : skippy_crc32c(crc, buf, (size_t) len);
}

int32_t skippy_memory_kind(struct llama_context * ctx) {
    try {
        return ctx != nullptr ? view_of(ctx).kind : SKIPPY_MEM_NONE;
    } catch (...) {
        return SKIPPY_MEM_UNSUPPORTED;
    }
}

int64_t skippy_page_size(struct llama_context * ctx, int32_t cache, int32_t seq, int32_t p0,
                         int32_t p1, char * err, uint64_t err_cap) {
    const err_sink e{ err, err_cap };
    try {
        return export_page(ctx, cache, seq, p0, p1, nullptr, 0, e, true);
    } catch (const std::exception & x) {
        return fail(e, SKIPPY_E_NATIVE, "page size failed: %s", x.what());
    }
}

int64_t skippy_page_export(struct llama_context * ctx, int32_t cache, int32_t seq, int32_t p0,
                           int32_t p1, uint8_t * buf, uint64_t cap, char * err, uint64_t err_cap) {
    const err_sink e{ err, err_cap };
    if (buf == nullptr) {
        return fail(e, SKIPPY_E_ARG, "no output buffer");
    }
    try {
        return export_page(ctx, cache, seq, p0, p1, buf, cap, e, true);
    } catch (const std::exception & x) {
        return fail(e, SKIPPY_E_NATIVE, "page export failed: %s", x.what());
    }
}

} // extern "C"
