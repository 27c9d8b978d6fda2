// Recurrent snapshot windows: export or import any byte range [from, to) of the snapshot blob
// of one sequence (the bytes llama_state_seq_get_data_ext(PARTIAL_ONLY) returns: u32 magic,
// i32 seq id, then llama_memory_recurrent::state_write), through llama.cpp's own
// state_write / state_read_meta / state_read_data, without ever materializing the rest.
//
// Why: a Nemotron 3 Super snapshot is 172 MB. Exported whole it costs one full copy into a
// fresh buffer before the first byte can be sent, and imported whole one more join and one
// more copy after the last byte arrived. Windows let the prefiller export chunk k+1 while
// chunk k is on the wire, and the decoder write each chunk into the recurrent tensors as it
// arrives, so only the last chunk's import remains on the handoff's tail.
#include "_internal.h"

#include <algorithm>
#include <vector>

using namespace skippy;

namespace {

constexpr uint32_t SEQ_MAGIC = 0xaf143cd8;

// Bytes before the data section of a one-sequence snapshot: magic, seq id, cell count, and
// per cell {i32 pos, u32 n_seq_id = 0} (state_write_meta with a sequence id).
size_t header_bytes(uint32_t cell_count) {
    return 12 + 8 * (size_t) cell_count;
}

// Copies the part of each write that falls inside [from, to) of the virtual stream into dst.
struct window_writer : llama_io_write_i {
    uint8_t * dst;
    size_t    from, to;
    size_t    n = 0;
    window_writer(uint8_t * d, size_t f, size_t t) : dst(d), from(f), to(t) {}
    void write(const void * src, size_t size) override {
        const size_t a = std::max(n, from), b = std::min(n + size, to);
        if (a < b) {
            memcpy(dst + (a - from), (const uint8_t *) src + (a - n), b - a);
        }
        n += size;
    }
    void write_tensor(ggml_tensor * t, size_t offset, size_t size) override {
        const size_t a = std::max(n, from), b = std::min(n + size, to);
        if (a < b) {
            ggml_backend_tensor_get(t, dst + (a - from), offset + (a - n), b - a);
        }
        n += size;
    }
    size_t n_bytes() override { return n; }
};

// Records where rows (write_tensor) and metadata (write) lie, copying only metadata.
struct layout_writer : llama_io_write_i {
    size_t                                 n = 0;
    std::vector<std::pair<size_t, size_t>> rows;   // offset, size
    std::vector<uint8_t>                   meta;   // every write()'s bytes, in order
    std::vector<std::pair<size_t, size_t>> metas;  // offset in stream, offset in `meta`
    void write(const void * src, size_t size) override {
        metas.emplace_back(n, meta.size());
        meta.insert(meta.end(), (const uint8_t *) src, (const uint8_t *) src + size);
        n += size;
    }
    void write_tensor(ggml_tensor *, size_t, size_t size) override {
        rows.emplace_back(n, size);
        n += size;
    }
    size_t n_bytes() override { return n; }
};

// Reads the data section from a window of it; outside the window, metadata comes from this
// context's own layout (and inside it must equal it), rows are left alone.
struct window_reader : llama_io_read_i {
    const layout_writer & own;   // this context's data section, offsets from `base`
    size_t                base;  // blob offset of the data section
    const uint8_t *       src;
    size_t                from, to;  // blob offsets of the window
    size_t                n;         // blob offset of the next read
    bool                  mismatch = false;
    size_t                meta_at  = 0;
    window_reader(const layout_writer & l, size_t b, const uint8_t * s, size_t f, size_t t)
        : own(l), base(b), src(s), from(f), to(t), n(b) {}
    void read(void * dst, size_t size) override {
        // The expected bytes of this read: the data section writes line up with its reads.
        while (meta_at < own.metas.size() && own.metas[meta_at].first + base < n) {
            meta_at++;
        }
        if (meta_at >= own.metas.size() || own.metas[meta_at].first + base != n) {
            throw std::runtime_error("snapshot layout differs from this context's");
        }
        const uint8_t * want = own.meta.data() + own.metas[meta_at].second;
        memcpy(dst, want, size);
        const size_t a = std::max(n, from), b = std::min(n + size, to);
        if (a < b && memcmp(src + (a - from), want + (a - n), b - a) != 0) {
            mismatch = true;
            throw std::runtime_error("snapshot metadata differs from this context's");
        }
        n += size;
    }
    void read_tensor(ggml_tensor * t, size_t offset, size_t size) override {
        const size_t a = std::max(n, from), b = std::min(n + size, to);
        if (a < b) {
            ggml_backend_tensor_set(t, src + (a - from), offset + (a - n), b - a);
        }
        n += size;
    }
    size_t n_bytes() override { return n - base; }
};

// Contexts that keep rollback snapshots (n_rs_seq > 0, for speculation) are windowed too: their
// one-sequence snapshot is byte for byte the one of a context without them (measured on the
// tiny hybrid and hybrid-moe-mtp after the same prefill: state_write writes the live group
// only), and llama.cpp's own state_read_data places the rows, so the layout this file follows
// is llama.cpp's in both cases (ffi/recurrent_window_test.ts checks it against the whole import).
int32_t recurrent_of(llama_context * ctx, llama_memory_recurrent ** out, err_sink e) {
    const mem_view v = view_of(ctx);
    if (v.recr == nullptr) {
        return fail(e, SKIPPY_E_KIND, "this context has no recurrent state");
    }
    *out = v.recr;
    return SKIPPY_OK;
}

// The cell holding `seq`'s state, or -1.
int32_t cell_of(const llama_memory_recurrent * r, int32_t seq) {
    for (uint32_t i = 0; i < r->size; i++) {
        if (r->cells[i].has_seq_id(seq)) {
            return (int32_t) i;
        }
    }
    return -1;
}

// This context's own data section for one cell (rows are not read).
layout_writer own_data_layout(const llama_memory_recurrent * r, uint32_t cell) {
    layout_writer w;
    r->state_write_data(w, { { cell, cell + 1 } });
    return w;
}

}  // namespace

extern "C" {

int64_t skippy_recurrent_layout(struct llama_context * ctx, int32_t seq, uint64_t * out,
                                uint64_t out_cap, char * err, uint64_t err_cap) {
    err_sink e{ err, err_cap };
    try {
        llama_memory_recurrent * r = nullptr;
        if (const int32_t rc = recurrent_of(ctx, &r, e); rc != SKIPPY_OK) {
            return rc;
        }
        if (cell_of(r, seq) < 0) {
            return fail(e, SKIPPY_E_SOURCE, "sequence %d holds no recurrent state", seq);
        }
        layout_writer w;
        w.write(&SEQ_MAGIC, sizeof(SEQ_MAGIC));
        w.write(&seq, sizeof(seq));
        r->state_write(w, seq, 0);
        if (out_cap < 2 + 2 * w.rows.size()) {
            return fail(e, SKIPPY_E_CAPACITY, "layout needs %zu entries", 2 + 2 * w.rows.size());
        }
        out[0] = w.n;
        out[1] = w.rows.size();
        for (size_t i = 0; i < w.rows.size(); i++) {
            out[2 + 2 * i]     = w.rows[i].first;
            out[2 + 2 * i + 1] = w.rows[i].second;
        }
        return (int64_t) w.rows.size();
    } catch (const std::exception & x) {
        return fail(e, SKIPPY_E_NATIVE, "recurrent layout failed: %s", x.what());
    }
}

int64_t skippy_recurrent_export(struct llama_context * ctx, int32_t seq, uint64_t from,
                                uint64_t to, uint8_t * buf, uint64_t cap, char * err,
                                uint64_t err_cap) {
    err_sink e{ err, err_cap };
    try {
        llama_memory_recurrent * r = nullptr;
        if (const int32_t rc = recurrent_of(ctx, &r, e); rc != SKIPPY_OK) {
            return rc;
        }
        if (to < from || to - from > cap) {
            return fail(e, SKIPPY_E_CAPACITY, "window of %llu bytes, buffer of %llu",
                        (unsigned long long) (to - from), (unsigned long long) cap);
        }
        if (cell_of(r, seq) < 0) {
            return fail(e, SKIPPY_E_SOURCE, "sequence %d holds no recurrent state", seq);
        }
        window_writer w(buf, from, to);
        w.write(&SEQ_MAGIC, sizeof(SEQ_MAGIC));
        w.write(&seq, sizeof(seq));
        r->state_write(w, seq, 0);
        if (to > w.n) {
            return fail(e, SKIPPY_E_ARG, "window ends at %llu, past the snapshot's %zu bytes",
                        (unsigned long long) to, w.n);
        }
        return (int64_t) (to - from);
    } catch (const std::exception & x) {
        return fail(e, SKIPPY_E_NATIVE, "recurrent export failed: %s", x.what());
    }
}

int32_t skippy_recurrent_import(struct llama_context * ctx, int32_t seq, uint64_t from,
                                const uint8_t * buf, uint64_t len, char * err, uint64_t err_cap) {
    err_sink e{ err, err_cap };
    try {
        llama_memory_recurrent * r = nullptr;
        if (const int32_t rc = recurrent_of(ctx, &r, e); rc != SKIPPY_OK) {
            return rc;
        }
        size_t at = 0;  // window bytes consumed by the header
        if (from == 0) {
            // The header: allocate the cell exactly as llama.cpp's own import does.
            if (len < 12 || get<uint32_t>(buf, 0) != SEQ_MAGIC) {
                return fail(e, SKIPPY_E_FORMAT, "not a recurrent snapshot header");
            }
            const uint32_t cells = get<uint32_t>(buf, 8);
            if (cells != 1 || len < header_bytes(cells)) {
                return fail(e, SKIPPY_E_FORMAT, "snapshot header of %u cells in %llu bytes", cells,
                            (unsigned long long) len);
            }
            if (cell_of(r, seq) >= 0) {
                return fail(e, SKIPPY_E_OCCUPIED, "sequence %d already holds recurrent state", seq);
            }
            buf_reader meta(buf + 12, 8 * (size_t) cells);
            if (!r->state_read_meta(meta, cells, seq)) {
                r->seq_rm(seq, -1, -1);
                return fail(e, SKIPPY_E_NATIVE, "no recurrent cell for sequence %d", seq);
            }
            at = header_bytes(cells);
        }
        const int32_t cell = cell_of(r, seq);
        if (cell < 0) {
            return fail(e, SKIPPY_E_SOURCE, "the snapshot header of sequence %d was not imported", seq);
        }
        if (at == len) {
            return SKIPPY_OK;
        }
        const layout_writer own = own_data_layout(r, (uint32_t) cell);
        const size_t base = header_bytes(1);
        if (from + len > base + own.n) {
            return fail(e, SKIPPY_E_FORMAT, "window ends at %llu, past the snapshot's %zu bytes",
                        (unsigned long long) (from + len), base + own.n);
        }
        // state_read_data writes rows at `head`: point it at this sequence's cell.
        r->head = (uint32_t) cell;
        window_reader reader(own, base, buf, from, from + len);
        if (!r->state_read_data(reader, 1)) {
            return fail(e, SKIPPY_E_MISMATCH, "llama.cpp refused the snapshot window");
        }
        return SKIPPY_OK;
    } catch (const std::exception & x) {
        return fail(e, SKIPPY_E_MISMATCH, "recurrent import failed: %s", x.what());
    }
}

}  // extern "C"
