// Layer capture: the final recurrent rows of one sequence, layer by layer, while the last
// ubatch still computes.
//
// How llama.cpp calls an eval callback (ggml_backend_sched_compute_splits): per graph split, it
// asks the callback about each node in order (ask = true) until one answers true, computes the
// nodes up to and including that one as one graph view, synchronizes the backend, then calls
// the callback again for that node (ask = false; false there aborts the graph). Every node
// answered true therefore ends a sub-graph; answering false for all computes the split at once.
// llama_context sets the scheduler's callback from cparams.cb_eval whenever it rebuilds the
// graph, so the capture writes both.
//
// Which nodes write the state (llm_build_mamba_base::build_mamba2_layer): per recurrent layer
// il, a GGML_OP_CPY into a view of the conv tensor r_l[il] (the last d_conv-1 columns of
// conv_x), then, after the SSM scan, a GGML_OP_CPY into a view of s_l[il]. ggml_cpy's result
// is itself a view of that destination, so the node's view_src is r_l[il] / s_l[il]. build_rs
// also copies "extra" states (other sequences' cells, [head + n_seqs, head + n_rs)) into the
// same tensors before; the final write is the one whose byte range covers the sequence's own
// cell. With n_rs_seq = 0 (checked) each final write happens once per ubatch, and nothing
// later in the graph writes that layer's state again, so its rows are final once it has run.
//
// The ubatch is the last one of the sequence's prompt when find_slot (run by apply() before
// the graph is computed) has already set the sequence's recurrent cell to final_pos.
//
// The last page (skippy_capture_arm_page): in a hybrid model, the attention layers write the
// ubatch's K and V rows into the attention cache with GGML_OP_SET_ROWS (llama_kv_cache::cpy_k /
// cpy_v), whose result is a view of layers[ikv].k / .v. apply() placed the ubatch's cells
// (positions, sequence) before the graph runs, so once the LAST attention layer's K and V
// writes of the final ubatch are computed, every row of the page [p0, p1) is final: the
// callback exports it then, with the same export_page the public entry point uses, while the
// recurrent layers after that attention layer still compute.
#include "_internal.h"

#include "llama-context.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

using namespace skippy;

namespace {

constexpr size_t ENTRY_HEAD = sizeof(int32_t) + sizeof(uint64_t); // {i32 type, u64 row bytes}
constexpr uint8_t GOT_CONV  = 1;
constexpr uint8_t GOT_SSM   = 2;
constexpr uint8_t GOT_K     = 1;
constexpr uint8_t GOT_V     = 2;

// Contexts with an open capture: one capture per context.
std::mutex                               open_mutex;
std::unordered_set<const llama_context *> open_contexts;

int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

} // namespace

struct skippy_capture {
    llama_context *          ctx = nullptr;
    llama_memory_recurrent * mem = nullptr;

    std::vector<int32_t> layer_of;                       // entry k -> trunk layer il
    std::unordered_map<const ggml_tensor *, int32_t> id; // r_l / s_l tensor -> 2k / 2k+1
    size_t   conv_row = 0, ssm_row = 0;
    int32_t  conv_type = 0, ssm_type = 0;
    uint32_t n_layer   = 0;
    std::vector<uint8_t> buf; // L conv entries, then L SSM entries

    // Set by arm (before the decode is queued), read by the decode thread.
    std::atomic<bool> armed{ false };
    int32_t  seq       = 0;
    int32_t  final_pos = 0;
    uint32_t flags     = 0;

    // Written by the decode thread; read from any thread through the accessors.
    std::vector<uint8_t>                 got;
    std::unique_ptr<std::atomic<int64_t>[]> ready_ns;
    std::atomic<int32_t>                 n_ready{ 0 };
    std::atomic<int32_t>                 error{ SKIPPY_OK };
    char                                 message[256] = { 0 };
    std::atomic<int64_t>                 asked{ 0 }, observed{ 0 }, copy_ns{ 0 };

    // The last page: the last attention layer's K and V tensors (null without an attention
    // cache), the range armed by skippy_capture_arm_page (p1 <= p0: none), and its result.
    const ggml_tensor *  page_k = nullptr;
    const ggml_tensor *  page_v = nullptr;
    int32_t              page_il = -1;
    int32_t              page_p0 = 0, page_p1 = 0;
    uint64_t             page_max = 0;
    uint8_t              page_got = 0;
    std::vector<uint8_t> page_buf;
    std::atomic<int64_t> page_state{ 0 }; // 0: pending or not armed; > 0: page bytes; < 0: code
    std::atomic<int64_t> page_ready_ns{ 0 };
    char                 page_message[256] = { 0 };

    size_t layers() const { return layer_of.size(); }
    uint8_t * conv_entry(size_t k) { return buf.data() + k * (ENTRY_HEAD + conv_row); }
    uint8_t * ssm_entry(size_t k) {
        return buf.data() + layers() * (ENTRY_HEAD + conv_row) + k * (ENTRY_HEAD + ssm_row);
    }
};

namespace {

// The sequence's recurrent cell when it sits at final_pos (this ubatch is the last), else -1.
int32_t final_cell(const skippy_capture * c) {
    const auto & cells = c->mem->cells;
    if (c->seq < 0 || (size_t) c->seq >= cells.size()) {
        return -1;
    }
    const int32_t tail = cells[c->seq].tail;
    if (tail < 0 || (size_t) tail >= cells.size()) {
        return -1;
    }
    const auto & cell = cells[tail];
    return cell.pos == c->final_pos && cell.has_seq_id(c->seq) ? tail : -1;
}

// Entry id (2k conv, 2k+1 SSM) of a node that writes the sequence's final row, else -1.
int32_t final_write(const skippy_capture * c, const ggml_tensor * t, int32_t * cell_out) {
    if (t->op != GGML_OP_CPY || t->view_src == nullptr) {
        return -1;
    }
    const auto it = c->id.find(t->view_src);
    if (it == c->id.end()) {
        return -1;
    }
    const int32_t cell = final_cell(c);
    if (cell < 0) {
        return -1;
    }
    const size_t row = (it->second & 1) ? c->ssm_row : c->conv_row;
    const size_t at  = (size_t) cell * row;
    if (at < t->view_offs || at + row > t->view_offs + ggml_nbytes(t)) {
        return -1; // the extra-state copy, or another sequence's write
    }
    *cell_out = cell;
    return it->second;
}

void set_error(skippy_capture * c, int32_t code, const char * what) {
    snprintf(c->message, sizeof(c->message), "%s", what);
    c->error.store(code, std::memory_order_release);
}

// K (GOT_K) or V (GOT_V) for a node that writes the last attention layer's rows in the final
// ubatch while a page is armed, else 0.
uint8_t page_write(const skippy_capture * c, const ggml_tensor * t) {
    if (c->page_p1 <= c->page_p0 || t->op != GGML_OP_SET_ROWS || t->view_src == nullptr ||
        c->page_state.load(std::memory_order_relaxed) != 0) {
        return 0;
    }
    const uint8_t bit = t->view_src == c->page_k ? GOT_K : t->view_src == c->page_v ? GOT_V : 0;
    return bit != 0 && final_cell(c) >= 0 ? bit : 0;
}

// Both writes seen: exports the page into page_buf (the rows it reads are computed).
void export_last_page(skippy_capture * c) {
    char         msg[256] = { 0 };
    const err_sink e{ msg, sizeof(msg) };
    int64_t      n;
    try {
        n = export_page(c->ctx, SKIPPY_CACHE_MAIN, c->seq, c->page_p0, c->page_p1, nullptr, 0, e, false);
        if (n > 0 && (uint64_t) n > c->page_max) {
            n = fail(e, SKIPPY_E_CAPACITY, "the page needs %lld bytes, more than the %llu armed",
                     (long long) n, (unsigned long long) c->page_max);
        }
        if (n > 0) {
            c->page_buf.resize((size_t) n);
            n = export_page(c->ctx, SKIPPY_CACHE_MAIN, c->seq, c->page_p0, c->page_p1, c->page_buf.data(),
                            c->page_buf.size(), e, false);
        }
    } catch (const std::exception & x) {
        n = fail(e, SKIPPY_E_NATIVE, "exporting the page in the callback threw: %s", x.what());
    }
    snprintf(c->page_message, sizeof(c->page_message), "%s", msg);
    c->page_ready_ns.store(now_ns(), std::memory_order_relaxed);
    c->page_state.store(n != 0 ? n : SKIPPY_E_NATIVE, std::memory_order_release);
}

bool on_eval(ggml_tensor * t, bool ask, void * user_data) {
    auto * c = static_cast<skippy_capture *>(user_data);
    if (!c->armed.load(std::memory_order_acquire)) {
        return !ask; // never observe; never abort
    }
    int32_t cell = -1;
    if (ask) {
        c->asked.fetch_add(1, std::memory_order_relaxed);
        return final_write(c, t, &cell) >= 0 || page_write(c, t) != 0;
    }
    if (const uint8_t bit = page_write(c, t)) {
        c->observed.fetch_add(1, std::memory_order_relaxed);
        c->page_got |= bit;
        if (c->page_got == (GOT_K | GOT_V)) {
            export_last_page(c);
        }
        return true;
    }
    const int32_t e = final_write(c, t, &cell);
    if (e < 0) {
        return true;
    }
    c->observed.fetch_add(1, std::memory_order_relaxed);
    const size_t k   = (size_t) (e >> 1);
    const bool   ssm = (e & 1) != 0;
    if (c->flags & SKIPPY_CAPTURE_COPY) {
        const size_t row = ssm ? c->ssm_row : c->conv_row;
        uint8_t *    dst = (ssm ? c->ssm_entry(k) : c->conv_entry(k)) + ENTRY_HEAD;
        const int64_t t0 = now_ns();
        ggml_backend_tensor_get(t->view_src, dst, (size_t) cell * row, row);
        c->copy_ns.fetch_add(now_ns() - t0, std::memory_order_relaxed);
    }
    const uint8_t bit = ssm ? GOT_SSM : GOT_CONV;
    if (c->got[k] & bit) {
        set_error(c, SKIPPY_E_SOURCE, "a recurrent row was written twice in the final ubatch");
        return true;
    }
    c->got[k] |= bit;
    if (c->got[k] == (GOT_CONV | GOT_SSM)) {
        c->ready_ns[k].store(now_ns(), std::memory_order_release);
        c->n_ready.fetch_add(1, std::memory_order_acq_rel);
    }
    return true;
}

// The callback is on the context only while armed, so unarmed decodes run the graph exactly as
// without a capture (no per-node questions, no per-split synchronization).
void install(skippy_capture * c) {
    c->ctx->cparams.cb_eval           = on_eval;
    c->ctx->cparams.cb_eval_user_data = c;
    ggml_backend_sched_set_eval_callback(c->ctx->get_sched(), on_eval, c);
}

void uninstall(skippy_capture * c) {
    llama_context * ctx = c->ctx;
    if (ctx->cparams.cb_eval == on_eval && ctx->cparams.cb_eval_user_data == c) {
        ctx->cparams.cb_eval           = nullptr;
        ctx->cparams.cb_eval_user_data = nullptr;
        ggml_backend_sched_set_eval_callback(ctx->get_sched(), nullptr, nullptr);
    }
}

// Compares inline reads of the context with libllama's exported accessors.
int32_t check_context(llama_context * ctx, err_sink e) {
    if (&ctx->cparams != &ctx->get_cparams() || ctx->sched.get() != ctx->get_sched() ||
        ctx->memory.get() != llama_get_memory(ctx)) {
        return fail(e, SKIPPY_E_SELFTEST, "llama_context layout differs between shim and libllama");
    }
    const auto & p = ctx->cparams;
    if (p.n_ctx != llama_n_ctx(ctx) || p.n_batch != llama_n_batch(ctx) ||
        p.n_ubatch != llama_n_ubatch(ctx) || p.n_seq_max != llama_n_seq_max(ctx)) {
        return fail(e, SKIPPY_E_SELFTEST, "llama_cparams layout differs between shim and libllama");
    }
    return SKIPPY_OK;
}

int32_t open_capture(llama_context * ctx, skippy_capture * c, err_sink e) {
    const mem_view v = view_of(ctx);
    if (v.recr == nullptr) {
        return fail(e, SKIPPY_E_KIND, "this context's memory (kind %d) has no recurrent state", v.kind);
    }
    int32_t rc = check_context(ctx, e);
    if (rc != SKIPPY_OK) {
        return rc;
    }
    if (ctx->cparams.cb_eval != nullptr) {
        return fail(e, SKIPPY_E_KIND, "the context already has an eval callback");
    }
    {
        std::lock_guard<std::mutex> lock(open_mutex);
        if (open_contexts.count(ctx) != 0) {
            return fail(e, SKIPPY_E_KIND, "the context already has a layer capture");
        }
    }
    llama_memory_recurrent * m = v.recr;
    if (m->n_rs_seq != 0) {
        return fail(e, SKIPPY_E_KIND, "rollback snapshots (n_rs_seq = %u) write several rows per layer",
                    m->n_rs_seq);
    }
    if (m->r_l.size() != m->s_l.size() || m->size != m->cells.size()) {
        return fail(e, SKIPPY_E_SELFTEST, "recurrent memory layout differs between shim and libllama");
    }
    c->ctx     = ctx;
    c->mem     = m;
    c->n_layer = (uint32_t) m->r_l.size();
    for (size_t il = 0; il < m->r_l.size(); il++) {
        ggml_tensor * r = m->r_l[il];
        ggml_tensor * s = m->s_l[il];
        if (il < m->p_l.size() && m->p_l[il] != nullptr) {
            return fail(e, SKIPPY_E_KIND, "layer %zu carries a second conv row (PLE)", il);
        }
        if (r == nullptr && s == nullptr) {
            continue;
        }
        if (r == nullptr || s == nullptr) {
            return fail(e, SKIPPY_E_KIND, "layer %zu has only one of the conv and SSM states", il);
        }
        if (c->layer_of.empty()) {
            c->conv_row  = r->nb[1];
            c->ssm_row   = s->nb[1];
            c->conv_type = (int32_t) r->type;
            c->ssm_type  = (int32_t) s->type;
        } else if (r->nb[1] != c->conv_row || s->nb[1] != c->ssm_row || (int32_t) r->type != c->conv_type ||
                   (int32_t) s->type != c->ssm_type) {
            return fail(e, SKIPPY_E_KIND, "recurrent rows differ between layers");
        }
        const int32_t k = (int32_t) c->layer_of.size();
        c->id[r]        = 2 * k;
        c->id[s]        = 2 * k + 1;
        c->layer_of.push_back((int32_t) il);
    }
    const size_t n = c->layers();
    if (n == 0) {
        return fail(e, SKIPPY_E_KIND, "the recurrent memory has no layers");
    }
    if (v.main != nullptr) {
        for (const auto & l : v.main->layers) {
            if (c->page_k == nullptr || l.il > (uint32_t) c->page_il) {
                c->page_k  = l.k;
                c->page_v  = l.v;
                c->page_il = (int32_t) l.il;
            }
        }
    }
    try {
        c->buf.assign(n * (2 * ENTRY_HEAD + c->conv_row + c->ssm_row), 0);
    } catch (...) {
        return fail(e, SKIPPY_E_CAPACITY, "cannot allocate %zu bytes for the capture",
                    n * (2 * ENTRY_HEAD + c->conv_row + c->ssm_row));
    }
    for (size_t k = 0; k < n; k++) {
        const uint64_t cr = c->conv_row, sr = c->ssm_row;
        put(c->conv_entry(k), 0, c->conv_type);
        put(c->conv_entry(k), 4, cr);
        put(c->ssm_entry(k), 0, c->ssm_type);
        put(c->ssm_entry(k), 4, sr);
    }
    c->got.assign(n, 0);
    c->ready_ns.reset(new std::atomic<int64_t>[n]);
    for (size_t k = 0; k < n; k++) {
        c->ready_ns[k].store(0);
    }
    std::lock_guard<std::mutex> lock(open_mutex);
    if (!open_contexts.insert(ctx).second) {
        return fail(e, SKIPPY_E_KIND, "the context already has a layer capture");
    }
    return SKIPPY_OK;
}

bool entry_ok(const skippy_capture * c, int32_t k) {
    return c != nullptr && k >= 0 && (size_t) k < c->layers();
}

} // namespace

extern "C" {

skippy_capture * skippy_capture_open(llama_context * ctx, char * err, uint64_t err_cap) {
    const err_sink e{ err, err_cap };
    if (ctx == nullptr) {
        fail(e, SKIPPY_E_ARG, "no context");
        return nullptr;
    }
    auto * c = new (std::nothrow) skippy_capture();
    if (c == nullptr) {
        fail(e, SKIPPY_E_CAPACITY, "out of memory");
        return nullptr;
    }
    int32_t rc;
    try {
        rc = open_capture(ctx, c, e);
    } catch (const std::exception & x) {
        rc = fail(e, SKIPPY_E_NATIVE, "opening the capture threw: %s", x.what());
    }
    if (rc != SKIPPY_OK) {
        delete c;
        return nullptr;
    }
    return c;
}

void skippy_capture_close(skippy_capture * c) {
    if (c == nullptr) {
        return;
    }
    c->armed.store(false);
    uninstall(c);
    {
        std::lock_guard<std::mutex> lock(open_mutex);
        open_contexts.erase(c->ctx);
    }
    delete c;
}

int32_t skippy_capture_arm(skippy_capture * c, int32_t seq, int32_t final_pos, uint32_t flags, char * err,
                           uint64_t err_cap) {
    const err_sink e{ err, err_cap };
    if (c == nullptr) {
        return fail(e, SKIPPY_E_ARG, "no capture");
    }
    if (seq < 0 || (size_t) seq >= c->mem->cells.size() || final_pos < 0) {
        return fail(e, SKIPPY_E_ARG, "sequence %d or position %d out of range", seq, final_pos);
    }
    const auto & p = c->ctx->cparams;
    if (p.cb_eval != nullptr && !(p.cb_eval == on_eval && p.cb_eval_user_data == c)) {
        return fail(e, SKIPPY_E_KIND, "the context has another eval callback");
    }
    c->armed.store(false);
    c->seq       = seq;
    c->final_pos = final_pos;
    c->flags     = flags;
    std::fill(c->got.begin(), c->got.end(), 0);
    for (size_t k = 0; k < c->layers(); k++) {
        c->ready_ns[k].store(0, std::memory_order_relaxed);
    }
    c->n_ready.store(0);
    c->error.store(SKIPPY_OK);
    c->message[0] = 0;
    c->asked.store(0);
    c->observed.store(0);
    c->copy_ns.store(0);
    c->page_p0  = 0;
    c->page_p1  = 0;
    c->page_got = 0;
    c->page_state.store(0);
    c->page_ready_ns.store(0);
    c->page_message[0] = 0;
    c->armed.store(true, std::memory_order_release);
    install(c);
    return SKIPPY_OK;
}

int32_t skippy_capture_arm_page(skippy_capture * c, int32_t p0, int32_t p1, uint64_t max_bytes, char * err,
                                uint64_t err_cap) {
    const err_sink e{ err, err_cap };
    if (c == nullptr) {
        return fail(e, SKIPPY_E_ARG, "no capture");
    }
    if (!c->armed.load(std::memory_order_acquire)) {
        return fail(e, SKIPPY_E_ARG, "arm the capture first");
    }
    if (c->page_k == nullptr || c->page_v == nullptr) {
        return fail(e, SKIPPY_E_KIND, "this context has no attention cache");
    }
    if (p0 < 0 || p1 <= p0 || p1 - 1 != c->final_pos) {
        return fail(e, SKIPPY_E_ARG, "the page [%d, %d) must end at the armed final position %d", p0, p1,
                    c->final_pos);
    }
    c->page_p0  = p0;
    c->page_p1  = p1;
    c->page_max = max_bytes;
    return SKIPPY_OK;
}

int64_t skippy_capture_page_state(const skippy_capture * c) {
    return c != nullptr ? c->page_state.load(std::memory_order_acquire) : SKIPPY_E_ARG;
}

const char * skippy_capture_page_error(const skippy_capture * c) {
    return c != nullptr && c->page_state.load(std::memory_order_acquire) < 0 ? c->page_message : "";
}

const uint8_t * skippy_capture_page(const skippy_capture * c) {
    return c != nullptr && c->page_state.load(std::memory_order_acquire) > 0 ? c->page_buf.data() : nullptr;
}

int64_t skippy_capture_page_ready_ns(const skippy_capture * c) {
    return c != nullptr ? c->page_ready_ns.load(std::memory_order_acquire) : 0;
}

void skippy_capture_disarm(skippy_capture * c) {
    if (c != nullptr) {
        c->armed.store(false, std::memory_order_release);
        uninstall(c);
    }
}

int32_t skippy_capture_ready(const skippy_capture * c) {
    if (c == nullptr) {
        return SKIPPY_E_ARG;
    }
    const int32_t err = c->error.load(std::memory_order_acquire);
    return err != SKIPPY_OK ? err : c->n_ready.load(std::memory_order_acquire);
}

const char * skippy_capture_error(const skippy_capture * c) {
    return c != nullptr && c->error.load(std::memory_order_acquire) != SKIPPY_OK ? c->message : "";
}

int32_t skippy_capture_layer(const skippy_capture * c, int32_t k) {
    return entry_ok(c, k) ? c->layer_of[k] : -1;
}

int32_t skippy_capture_is_ready(const skippy_capture * c, int32_t k) {
    return entry_ok(c, k) && c->ready_ns[k].load(std::memory_order_acquire) != 0 ? 1 : 0;
}

int64_t skippy_capture_ready_ns(const skippy_capture * c, int32_t k) {
    return entry_ok(c, k) ? c->ready_ns[k].load(std::memory_order_acquire) : 0;
}

int64_t skippy_capture_now_ns(void) {
    return now_ns();
}

const uint8_t * skippy_capture_entries(const skippy_capture * c) {
    return c != nullptr ? c->buf.data() : nullptr;
}

void skippy_capture_info(const skippy_capture * c, int64_t * out) {
    if (c == nullptr || out == nullptr) {
        return;
    }
    for (int i = 0; i < SKIPPY_CAPINFO_LEN; i++) {
        out[i] = 0;
    }
    out[SKIPPY_CAPINFO_LAYERS]    = (int64_t) c->layers();
    out[SKIPPY_CAPINFO_N_LAYER]   = c->n_layer;
    out[SKIPPY_CAPINFO_CONV_ROW]  = (int64_t) c->conv_row;
    out[SKIPPY_CAPINFO_SSM_ROW]   = (int64_t) c->ssm_row;
    out[SKIPPY_CAPINFO_BYTES]     = (int64_t) c->buf.size();
    out[SKIPPY_CAPINFO_ASKED]     = c->asked.load();
    out[SKIPPY_CAPINFO_OBSERVED]  = c->observed.load();
    out[SKIPPY_CAPINFO_CONV_TYPE] = c->conv_type;
    out[SKIPPY_CAPINFO_SSM_TYPE]  = c->ssm_type;
    out[SKIPPY_CAPINFO_COPY_NS]   = c->copy_ns.load();
    out[SKIPPY_CAPINFO_PAGE_LAYER] = c->page_il;
}

} // extern "C"
