// What the shim reports about the process and a context: the loaded libllama's build id, a
// self-test of the shim's inline view of llama.cpp's objects, and per-sequence facts that the
// readiness check is built on.
#include "_internal.h"

#include <dlfcn.h>

#include <cstdio>
#include <string>

#if defined(__APPLE__)
#include <mach-o/dyld.h>
#include <mach-o/loader.h>
#else
#include <elf.h>
#include <link.h>
#endif

using namespace skippy;

namespace {

std::string hex(const uint8_t * p, size_t n) {
    static const char * digits = "0123456789abcdef";
    std::string s;
    for (size_t i = 0; i < n; i++) {
        s += digits[p[i] >> 4];
        s += digits[p[i] & 15];
    }
    return s;
}

#if defined(__APPLE__)
std::string loaded_build_id() {
    Dl_info info{};
    if (dladdr((const void *) &llama_get_memory, &info) == 0 || info.dli_fbase == nullptr) {
        return "";
    }
    const auto * mh = (const mach_header_64 *) info.dli_fbase;
    const auto * lc = (const load_command *) (mh + 1);
    for (uint32_t i = 0; i < mh->ncmds; i++) {
        if (lc->cmd == LC_UUID) {
            return hex(((const uuid_command *) lc)->uuid, 16);
        }
        lc = (const load_command *) ((const uint8_t *) lc + lc->cmdsize);
    }
    return "";
}
#else
struct phdr_search {
    const void * base;
    std::string  id;
    int          n_llama;
};

int visit(struct dl_phdr_info * info, size_t, void * data) {
    auto * s = (phdr_search *) data;
    const char * name = info->dlpi_name ? info->dlpi_name : "";
    if (strstr(name, "libllama") != nullptr && strstr(name, "libllama-common") == nullptr) {
        s->n_llama++;
    }
    if ((const void *) info->dlpi_addr != s->base) {
        return 0;
    }
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) & ph = info->dlpi_phdr[i];
        if (ph.p_type != PT_NOTE) {
            continue;
        }
        const uint8_t * p   = (const uint8_t *) (info->dlpi_addr + ph.p_vaddr);
        const uint8_t * end = p + ph.p_memsz;
        while (p + sizeof(ElfW(Nhdr)) <= end) {
            const auto * nh = (const ElfW(Nhdr) *) p;
            const uint8_t * desc = p + sizeof(ElfW(Nhdr)) + ((nh->n_namesz + 3) & ~3u);
            if (nh->n_type == NT_GNU_BUILD_ID && nh->n_namesz == 4 && memcmp(p + sizeof(ElfW(Nhdr)), "GNU", 4) == 0) {
                s->id = hex(desc, nh->n_descsz);
            }
            p = desc + ((nh->n_descsz + 3) & ~3u);
        }
    }
    return 0;
}

std::string loaded_build_id() {
    Dl_info info{};
    // The link map's l_addr is the load bias, which dl_iterate_phdr reports as dlpi_addr.
    phdr_search s{ nullptr, "", 0 };
    struct link_map * lm = nullptr;
    if (dladdr1((const void *) &llama_get_memory, &info, (void **) &lm, RTLD_DL_LINKMAP) != 0 && lm) {
        s.base = (const void *) lm->l_addr;
    }
    dl_iterate_phdr(visit, &s);
    return s.n_llama > 1 ? "multiple" : s.id;
}
#endif

// Compares inline reads of one cache with libllama's exported accessors.
int32_t test_cache(const char * name, llama_kv_cache * kv, err_sink e) {
    if (kv->get_n_stream() != kv->n_stream || kv->v_cells.size() != kv->n_stream ||
        kv->v_heads.size() != kv->n_stream) {
        return fail(e, SKIPPY_E_SELFTEST, "%s: stream count differs between shim and libllama", name);
    }
    if (kv->seq_to_stream.empty() || kv->get_size() != kv->v_cells[kv->seq_to_stream[0]].size()) {
        return fail(e, SKIPPY_E_SELFTEST, "%s: cell count differs between shim and libllama", name);
    }
    const auto ids = kv->get_layer_ids();
    if (ids.size() != kv->layers.size() || kv->layers.empty()) {
        return fail(e, SKIPPY_E_SELFTEST, "%s: layer count differs between shim and libllama", name);
    }
    for (size_t i = 0; i < ids.size(); i++) {
        if (ids[i] != kv->layers[i].il || kv->layers[i].k_stream.size() != kv->n_stream) {
            return fail(e, SKIPPY_E_SELFTEST, "%s: layer table differs between shim and libllama", name);
        }
    }
    if (kv->type_k() != kv->layers[0].k->type) {
        return fail(e, SKIPPY_E_SELFTEST, "%s: K type differs between shim and libllama", name);
    }
    const auto & cells = kv->v_cells[kv->seq_to_stream[0]];
    if (kv->seq_pos_max(0) != cells.seq_pos_max(0) || kv->seq_pos_min(0) != cells.seq_pos_min(0) ||
        cells.get_used() > cells.size()) {
        return fail(e, SKIPPY_E_SELFTEST, "%s: sequence positions differ between shim and libllama", name);
    }
    return SKIPPY_OK;
}

int32_t self_test(llama_context * ctx, err_sink e) {
    llama_memory_i * mem = llama_get_memory(ctx);
    const mem_view v = view_of(ctx);
    int32_t rc = SKIPPY_OK;
    if (v.kind == SKIPPY_MEM_HYBRID) {
        auto * h = static_cast<llama_memory_hybrid *>(mem);
        if (h->mem_attn.get() != v.main || h->mem_recr.get() != v.recr) {
            return fail(e, SKIPPY_E_SELFTEST, "hybrid memory layout differs between shim and libllama");
        }
    } else if (v.kind == SKIPPY_MEM_ISWA) {
        auto * i = static_cast<llama_kv_cache_iswa *>(mem);
        if (i->kv_base.get() != v.main || i->kv_swa.get() != v.swa) {
            return fail(e, SKIPPY_E_SELFTEST, "iswa memory layout differs between shim and libllama");
        }
    }
    if (v.main != nullptr) {
        rc = test_cache("attention cache", v.main, e);
    }
    if (rc == SKIPPY_OK && v.swa != nullptr) {
        rc = test_cache("sliding-window cache", v.swa, e);
    }
    if (rc == SKIPPY_OK && v.recr != nullptr && v.recr->size != v.recr->cells.size()) {
        rc = fail(e, SKIPPY_E_SELFTEST, "recurrent memory layout differs between shim and libllama");
    }
    return rc;
}

void cache_facts(llama_kv_cache * kv, int32_t seq, int32_t * out, int count, int min, int max, int size) {
    if (kv == nullptr || seq < 0 || (size_t) seq >= kv->seq_to_stream.size()) {
        out[min] = out[max] = -1;
        return;
    }
    const auto & cells = kv->v_cells[kv->seq_to_stream[seq]];
    out[count] = (int32_t) cells.seq_pos[seq].size();
    out[min]   = cells.seq_pos_min(seq);
    out[max]   = cells.seq_pos_max(seq);
    out[size]  = (int32_t) cells.size();
}

} // namespace

extern "C" {

const char * skippy_shim_built_for(void) {
    return SKIPPY_LLAMA_BUILD_ID;
}

const char * skippy_shim_loaded_build_id(void) {
    static const std::string id = loaded_build_id();
    return id.c_str();
}

int32_t skippy_self_test(struct llama_context * ctx, char * err, uint64_t err_cap) {
    const err_sink e{ err, err_cap };
    if (ctx == nullptr) {
        return fail(e, SKIPPY_E_ARG, "no context");
    }
    try {
        return self_test(ctx, e);
    } catch (const std::exception & x) {
        return fail(e, SKIPPY_E_SELFTEST, "self-test threw: %s", x.what());
    }
}

int32_t skippy_seq_facts(struct llama_context * ctx, int32_t seq, int32_t * out, char * err, uint64_t err_cap) {
    const err_sink e{ err, err_cap };
    if (ctx == nullptr || out == nullptr) {
        return fail(e, SKIPPY_E_ARG, "no context or no output");
    }
    try {
        for (int i = 0; i < SKIPPY_FACTS_LEN; i++) {
            out[i] = 0;
        }
        const mem_view v = view_of(ctx);
        out[SKIPPY_FACT_KIND] = v.kind;
        cache_facts(v.main, seq, out, SKIPPY_FACT_MAIN_COUNT, SKIPPY_FACT_MAIN_MIN, SKIPPY_FACT_MAIN_MAX, SKIPPY_FACT_MAIN_SIZE);
        cache_facts(v.swa, seq, out, SKIPPY_FACT_SWA_COUNT, SKIPPY_FACT_SWA_MIN, SKIPPY_FACT_SWA_MAX, SKIPPY_FACT_SWA_SIZE);
        out[SKIPPY_FACT_RECR_MAX] = v.recr != nullptr ? v.recr->seq_pos_max(seq) : -1;
        out[SKIPPY_FACT_V_TRANS]  = v.main != nullptr && v.main->v_trans ? 1 : 0;
        out[SKIPPY_FACT_N_LAYER]  = v.main != nullptr ? (int32_t) v.main->layers.size() : 0;
        return SKIPPY_OK;
    } catch (const std::exception & x) {
        return fail(e, SKIPPY_E_NATIVE, "sequence facts failed: %s", x.what());
    }
}

} // extern "C"
