// Append-import of one page: checks everything it can before touching the cache, places the
// cells at their source cell indices with apply_ubatch (never state_read_meta, whose
// single-sequence branch begins by wiping the sequence), then reads the K/V rows with
// llama.cpp's own state_read_data. Same cell indices as the source keep the attention
// summation order, so pages arriving in any order give bit-identical results.
#include "_internal.h"

#include <algorithm>
#include <climits>
#include <vector>

using namespace skippy;

namespace {

struct parsed_page {
    page_header                 h;
    std::vector<uint32_t>       idxs;
    std::vector<llama_pos>      pos;
    std::vector<llama_kv_cell_ext> exts;
    size_t                      data_off = 0;
};

int32_t parse_frame(const uint8_t * buf, uint64_t len, parsed_page & pg, err_sink e) {
    if (len < SKIPPY_PAGE_HEADER_BYTES) {
        return fail(e, SKIPPY_E_FORMAT, "page of %llu bytes is shorter than its header", (unsigned long long) len);
    }
    pg.h = read_header(buf);
    const page_header & h = pg.h;
    if (h.magic != SKIPPY_PAGE_MAGIC || h.header_bytes != SKIPPY_PAGE_HEADER_BYTES) {
        return fail(e, SKIPPY_E_FORMAT, "not a KV page (bad magic or header size)");
    }
    if (h.version != SKIPPY_PAGE_VERSION) {
        return fail(e, SKIPPY_E_FORMAT, "page format version %u, this shim reads %d", h.version, SKIPPY_PAGE_VERSION);
    }
    const uint64_t body = (uint64_t) h.n_ranges * 8 + h.meta_bytes + h.data_bytes;
    if (h.n_ranges > h.cell_count || body != len - SKIPPY_PAGE_HEADER_BYTES) {
        return fail(e, SKIPPY_E_FORMAT, "page length %llu does not match its header", (unsigned long long) len);
    }
    if (page_crc(buf, len) != h.crc) {
        return fail(e, SKIPPY_E_CHECKSUM, "page for positions [%d, %d) fails its checksum", h.p0, h.p1);
    }
    if (h.p0 < 0 || h.p1 <= h.p0 || h.cell_count == 0 || h.cell_count > (uint32_t) (h.p1 - h.p0)) {
        return fail(e, SKIPPY_E_FORMAT, "page range [%d, %d) with %u cells is invalid", h.p0, h.p1, h.cell_count);
    }
    return SKIPPY_OK;
}

// Reads the source cell ranges and llama.cpp's per-cell metadata.
int32_t parse_cells(const uint8_t * buf, parsed_page & pg, bool ext, err_sink e) {
    const page_header & h = pg.h;
    const uint8_t * p = buf + SKIPPY_PAGE_HEADER_BYTES;
    if (h.flags & SKIPPY_PAGE_FLAG_PLACED) {
        for (uint32_t r = 0; r < h.n_ranges; r++, p += 8) {
            const uint32_t from = get<uint32_t>(p, 0), to = get<uint32_t>(p, 4);
            if (to <= from || to - from > h.cell_count - pg.idxs.size()) {
                return fail(e, SKIPPY_E_FORMAT, "page cell ranges do not add up to %u cells", h.cell_count);
            }
            for (uint32_t i = from; i < to; i++) {
                pg.idxs.push_back(i);
            }
        }
        if (pg.idxs.size() != h.cell_count) {
            return fail(e, SKIPPY_E_FORMAT, "page cell ranges do not add up to %u cells", h.cell_count);
        }
    }
    const size_t cell_bytes = 4 + 4 + (ext ? sizeof(llama_kv_cell_ext) : 0) + 4;
    if ((uint64_t) h.cell_count * cell_bytes != h.meta_bytes) {
        return fail(e, SKIPPY_E_MISMATCH, "page cell metadata has %u bytes, expected %zu per cell",
                    h.meta_bytes, cell_bytes);
    }
    for (uint32_t i = 0; i < h.cell_count; i++, p += cell_bytes) {
        const llama_pos pos = get<int32_t>(p, 0);
        if (get<uint32_t>(p, 4) != 1 || pos < h.p0 || pos >= h.p1 || (!pg.pos.empty() && pos <= pg.pos.back())) {
            return fail(e, SKIPPY_E_FORMAT, "page cell %u is outside [%d, %d) or out of order", i, h.p0, h.p1);
        }
        pg.pos.push_back(pos);
        if (ext) {
            pg.exts.push_back(get<llama_kv_cell_ext>(p, 8));
        }
    }
    pg.data_off = SKIPPY_PAGE_HEADER_BYTES + (size_t) h.n_ranges * 8 + h.meta_bytes;
    if (!(h.flags & SKIPPY_PAGE_FLAG_PLACED)) {
        // Pages exported without the shim carry no cell indices: a prefill into an empty
        // cache puts position p in cell p, which is what a whole-blob import does too.
        for (const llama_pos pos : pg.pos) {
            pg.idxs.push_back((uint32_t) pos);
        }
    }
    return SKIPPY_OK;
}

// Walks the K/V section exactly as state_read_data will, so that a mismatch is refused
// before any cell changes.
int32_t check_rows(const uint8_t * buf, uint64_t len, const parsed_page & pg, llama_kv_cache * kv,
                   uint32_t strm, err_sink e) {
    const uint64_t n = pg.h.cell_count;
    uint64_t off = pg.data_off;
    auto need = [&](uint64_t size) { return size <= len - off; };
    if (!need(8) || get<uint32_t>(buf, off + 4) != kv->layers.size()) {
        return fail(e, SKIPPY_E_MISMATCH, "page has a different number of KV layers than this cache (%zu)", kv->layers.size());
    }
    off += 8;
    for (const auto & layer : kv->layers) {
        const uint64_t row = ggml_row_size(layer.k_stream[strm]->type, kv->hparams.n_embd_k_gqa(layer.il));
        if (!need(12) || get<int32_t>(buf, off) != (int32_t) layer.k_stream[strm]->type || get<uint64_t>(buf, off + 4) != row) {
            return fail(e, SKIPPY_E_MISMATCH, "K type or row size of layer %u differs from this cache (%s)",
                        layer.il, ggml_type_name(layer.k_stream[strm]->type));
        }
        off += 12;
        if (!need(row * n)) {
            return fail(e, SKIPPY_E_FORMAT, "page K rows of layer %u are truncated", layer.il);
        }
        off += row * n;
    }
    for (const auto & layer : kv->layers) {
        ggml_tensor * v = layer.v_stream[strm];
        if (v == nullptr) {
            continue;
        }
        const uint32_t n_embd_v = kv->hparams.n_embd_v_gqa(layer.il);
        const uint64_t head = 12; // {i32 type, u64 row} or {i32 type, u32 elem, u32 n_embd}
        const uint64_t meta = kv->v_trans ? (uint64_t) ggml_type_size(v->type) : ggml_row_size(v->type, n_embd_v);
        bool ok = need(head) && get<int32_t>(buf, off) == (int32_t) v->type;
        ok = ok && (kv->v_trans ? get<uint32_t>(buf, off + 4) == meta && get<uint32_t>(buf, off + 8) == n_embd_v
                                : get<uint64_t>(buf, off + 4) == meta);
        if (!ok) {
            return fail(e, SKIPPY_E_MISMATCH, "V type or row size of layer %u differs from this cache (%s)",
                        layer.il, ggml_type_name(v->type));
        }
        off += head;
        const uint64_t bytes = kv->v_trans ? meta * n_embd_v * n : meta * n;
        if (!need(bytes)) {
            return fail(e, SKIPPY_E_FORMAT, "page V rows of layer %u are truncated", layer.il);
        }
        off += bytes;
    }
    if (off != len) {
        return fail(e, SKIPPY_E_FORMAT, "page has %llu bytes after its K/V rows", (unsigned long long) (len - off));
    }
    return SKIPPY_OK;
}

// Destination checks: room, no overlap, every target cell free and named once.
int32_t check_room(const parsed_page & pg, llama_kv_cache * kv, uint32_t strm, int32_t seq, err_sink e) {
    const auto & cells = kv->v_cells[strm];
    if (cells.size() < pg.h.kv_size) {
        return fail(e, SKIPPY_E_TOO_SMALL, "this cache has %u cells, the source had %u (n_ctx too small)",
                    cells.size(), pg.h.kv_size);
    }
    const auto & sp = cells.seq_pos[seq];
    const auto it = sp.lower_bound({ pg.h.p0, 0u });
    if (it != sp.end() && it->first < pg.h.p1) {
        return fail(e, SKIPPY_E_OVERLAP, "position %d of [%d, %d) is already staged", it->first, pg.h.p0, pg.h.p1);
    }
    std::vector<uint32_t> sorted(pg.idxs);
    std::sort(sorted.begin(), sorted.end());
    for (size_t i = 0; i < sorted.size(); i++) {
        if (sorted[i] >= cells.size() || (i > 0 && sorted[i] == sorted[i - 1])) {
            return fail(e, SKIPPY_E_FORMAT, "page names cell %u twice or beyond the cache", sorted[i]);
        }
        if (!cells.is_empty(sorted[i])) {
            return fail(e, SKIPPY_E_OCCUPIED, "cell %u that a position of [%d, %d) goes to is in use",
                        sorted[i], pg.h.p0, pg.h.p1);
        }
    }
    return SKIPPY_OK;
}

int32_t place_and_read(const uint8_t * buf, uint64_t len, const parsed_page & pg, llama_kv_cache * kv,
                       uint32_t strm, int32_t seq, err_sink e) {
    auto & cells = kv->v_cells[strm];
    const uint32_t n = pg.h.cell_count;
    llama_seq_id dest = seq;
    std::vector<llama_pos> pos(pg.pos);
    std::vector<int32_t> n_seq_id(n, 1);
    std::vector<llama_seq_id *> seq_ids(n, &dest);
    std::vector<int32_t> seq_idx(LLAMA_MAX_SEQ, -1);
    seq_idx[seq] = 0;
    llama_ubatch ub{};
    ub.b_equal_seqs = 1;
    ub.n_tokens = ub.n_seq_tokens = n;
    ub.n_seqs = ub.n_seqs_unq = 1;
    ub.n_pos = 1;
    ub.pos = pos.data();
    ub.n_seq_id = n_seq_id.data();
    ub.seq_id = seq_ids.data();
    ub.seq_id_unq = &dest;
    ub.seq_idx = seq_idx.data();
    llama_kv_cache::slot_info sinfo;
    sinfo.s0 = sinfo.s1 = strm;
    sinfo.strm = { (llama_seq_id) strm };
    sinfo.idxs = { pg.idxs };
    const uint32_t head = kv->v_heads[strm];
    kv->apply_ubatch(sinfo, ub);
    for (size_t i = 0; i < pg.exts.size(); i++) {
        cells.ext_set(pg.idxs[i], pg.exts[i]);
    }
    buf_reader r(buf + pg.data_off, len - pg.data_off);
    bool ok = false;
    try {
        ok = kv->state_read_data(r, strm, n, sinfo) && r.n == r.len;
    } catch (...) {
        ok = false;
    }
    if (!ok) {
        for (const uint32_t idx : pg.idxs) {
            if (!cells.is_empty(idx)) {
                cells.rm(idx);
            }
        }
        kv->v_heads[strm] = head;
        return fail(e, SKIPPY_E_NATIVE, "llama.cpp refused the K/V rows of [%d, %d)", pg.h.p0, pg.h.p1);
    }
    // The source's search head sits after the cell of its newest position; so does ours,
    // whatever order the pages came in, so later decodes pick the same cells.
    kv->v_heads[strm] = cells.seq_pos[seq].rbegin()->second + 1;
    return SKIPPY_OK;
}

int32_t import_page(llama_context * ctx, int32_t cache, int32_t seq, const uint8_t * buf,
                    uint64_t len, err_sink e) {
    parsed_page pg;
    int32_t rc = parse_frame(buf, len, pg, e);
    if (rc != SKIPPY_OK) {
        return rc;
    }
    if (pg.h.cache != (uint32_t) cache) {
        return fail(e, SKIPPY_E_ARG, "page was exported from the %s, not the %s",
                    cache_name((int32_t) pg.h.cache), cache_name(cache));
    }
    llama_kv_cache * kv = nullptr;
    uint32_t strm = 0;
    rc = pick_cache(ctx, cache, seq, &kv, &strm, e);
    if (rc != SKIPPY_OK) {
        return rc;
    }
    const bool ext = kv->has_cell_ext();
    if (((pg.h.flags & SKIPPY_PAGE_FLAG_EXT) != 0) != ext) {
        return fail(e, SKIPPY_E_MISMATCH, "page cell format differs from this cache (M-RoPE or token ids)");
    }
    if (((pg.h.flags & SKIPPY_PAGE_FLAG_VTRANS) != 0) != kv->v_trans) {
        return fail(e, SKIPPY_E_MISMATCH, "page V layout differs: flash attention is %s here and %s at the source",
                    kv->v_trans ? "off" : "on", kv->v_trans ? "on" : "off");
    }
    rc = parse_cells(buf, pg, ext, e);
    rc = rc == SKIPPY_OK ? check_rows(buf, len, pg, kv, strm, e) : rc;
    rc = rc == SKIPPY_OK ? check_room(pg, kv, strm, seq, e) : rc;
    if (rc != SKIPPY_OK) {
        return rc;
    }
    llama_synchronize(ctx);
    return place_and_read(buf, len, pg, kv, strm, seq, e);
}

} // namespace

extern "C" int32_t skippy_page_import(struct llama_context * ctx, int32_t cache, int32_t seq,
                                      const uint8_t * buf, uint64_t len, char * err, uint64_t err_cap) {
    const err_sink e{ err, err_cap };
    if (ctx == nullptr || buf == nullptr) {
        return fail(e, SKIPPY_E_ARG, "no context or no page");
    }
    try {
        return import_page(ctx, cache, seq, buf, len, e);
    } catch (const std::exception & x) {
        return fail(e, SKIPPY_E_NATIVE, "page import failed: %s", x.what());
    }
}
