/*
 * skippy shim: page-granular KV export and append-import below llama.cpp's public API.
 *
 * Built on this machine against the internal headers of the exact llama.cpp commit of the
 * loaded libllama (see build.ts) and linked to that prebuilt library. Every function is
 * C-callable, never throws, and reports failures as a negative SKIPPY_E_* code plus a
 * one-line message written into the caller's `err` buffer (never state bytes).
 *
 * ABI changelog (bump SKIPPY_SHIM_ABI_VERSION and the mirror in shim.ts together):
 *   1. First version: memory kind, self-test, page size/export/import, sequence facts,
 *      build identity.
 *   2. skippy_checksum_crc32c: the hardware CRC-32C that pages already use, exported so state
 *      chunks and frames are checksummed natively instead of in JavaScript.
 *      skippy_recurrent_layout / _export / _import: byte windows of a sequence's recurrent
 *      snapshot, so it is exported and imported chunk by chunk (see _recurrent.cpp).
 *      Layer capture: a native cb_eval that copies each recurrent layer's final conv/SSM rows
 *      of one sequence while the rest of the last ubatch still computes (skippy_capture_*).
 *   3. skippy_capture_arm_page / _page_state / _page / _page_error / _page_ready_ns and
 *      SKIPPY_CAPINFO_PAGE_LAYER: the capture also exports the final ubatch's KV page as soon
 *      as the last attention layer has written its rows, while later layers still compute.
 */
#ifndef SKIPPY_SHIM_H
#define SKIPPY_SHIM_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SKIPPY_SHIM_ABI_VERSION 3

/* The shim is compiled with hidden visibility; only these entry points are exported. */
#define SKIPPY_API __attribute__((visibility("default")))

/* Memory kinds (exact type of llama_get_memory(ctx)). */
#define SKIPPY_MEM_NONE        0
#define SKIPPY_MEM_KV          1 /* llama_kv_cache */
#define SKIPPY_MEM_HYBRID      2 /* llama_memory_hybrid: attention cache + recurrent */
#define SKIPPY_MEM_ISWA        3 /* llama_kv_cache_iswa: base (global) + sliding-window cache */
#define SKIPPY_MEM_RECURRENT   4 /* llama_memory_recurrent */
#define SKIPPY_MEM_UNSUPPORTED 5 /* anything else (hybrid-iswa, dsa, indexer caches, ...) */

/* Which attention cache a page call addresses. */
#define SKIPPY_CACHE_MAIN 0 /* dense cache, hybrid attention cache, iswa base cache */
#define SKIPPY_CACHE_SWA  1 /* iswa sliding-window cache */

/* Result codes (negative). */
#define SKIPPY_OK           0
#define SKIPPY_E_ARG       -1 /* bad argument (range, sequence id, cache selector) */
#define SKIPPY_E_KIND      -2 /* the context's memory cannot do this */
#define SKIPPY_E_CAPACITY  -3 /* the output buffer is too small */
#define SKIPPY_E_FORMAT    -4 /* the page is malformed or truncated */
#define SKIPPY_E_CHECKSUM  -5 /* the page checksum does not match */
#define SKIPPY_E_MISMATCH  -6 /* layer count, K/V type, row size, V layout or cell format differ */
#define SKIPPY_E_TOO_SMALL -7 /* the destination cache has fewer cells than the source */
#define SKIPPY_E_OVERLAP   -8 /* the destination already holds positions of this page */
#define SKIPPY_E_OCCUPIED  -9 /* a destination cell the page must go to is in use */
#define SKIPPY_E_SOURCE   -10 /* the source does not hold exactly the requested positions */
#define SKIPPY_E_NATIVE   -11 /* llama.cpp failed or threw */
#define SKIPPY_E_SELFTEST -12 /* the shim's view of llama.cpp's objects is inconsistent */

/* Page wire format (little-endian), version SKIPPY_PAGE_VERSION:
 *   64-byte header (offsets below), then n_ranges x {u32 from, u32 to} source cell ranges,
 *   then llama.cpp's own cell metadata bytes (state_write_meta), then its K/V rows
 *   (state_write_data). crc32c covers header bytes [0, 56) and everything after the header. */
#define SKIPPY_PAGE_MAGIC   0x50564B53u /* "SKVP" */
#define SKIPPY_PAGE_VERSION 1
#define SKIPPY_PAGE_HEADER_BYTES 64
#define SKIPPY_PAGE_FLAG_PLACED 1u  /* source cell ranges present */
#define SKIPPY_PAGE_FLAG_EXT    2u  /* cells carry llama_kv_cell_ext */
#define SKIPPY_PAGE_FLAG_VTRANS 4u  /* V rows transposed (flash attention off) */

/* Facts about one sequence, written by skippy_seq_facts into int32_t[SKIPPY_FACTS_LEN]. */
#define SKIPPY_FACT_KIND       0
#define SKIPPY_FACT_MAIN_COUNT 1 /* cells of the sequence in the main attention cache */
#define SKIPPY_FACT_MAIN_MIN   2 /* lowest position there, -1 when none */
#define SKIPPY_FACT_MAIN_MAX   3
#define SKIPPY_FACT_SWA_COUNT  4
#define SKIPPY_FACT_SWA_MIN    5
#define SKIPPY_FACT_SWA_MAX    6
#define SKIPPY_FACT_RECR_MAX   7 /* recurrent position, -1 when none or not recurrent */
#define SKIPPY_FACT_MAIN_SIZE  8 /* cells in the main cache (n_ctx per stream) */
#define SKIPPY_FACT_SWA_SIZE   9
#define SKIPPY_FACT_V_TRANS   10
#define SKIPPY_FACT_N_LAYER   11 /* KV layers in the main cache */
#define SKIPPY_FACTS_LEN      16

struct llama_context;

SKIPPY_API uint32_t skippy_shim_abi_version(void);
/* GNU build-id / LC_UUID of the libllama this shim was compiled against (hex). */
SKIPPY_API const char * skippy_shim_built_for(void);
/* Build id of the libllama actually loaded in this process ("" when not found,
 * "multiple" when more than one libllama is mapped). */
SKIPPY_API const char * skippy_shim_loaded_build_id(void);

SKIPPY_API int32_t skippy_memory_kind(struct llama_context * ctx);
/* Compares the shim's inline view of the context's memory objects with what libllama's own
 * exported accessors report. SKIPPY_OK or SKIPPY_E_SELFTEST (with the first difference). */
SKIPPY_API int32_t skippy_self_test(struct llama_context * ctx, char * err, uint64_t err_cap);

/* Exact bytes of the page for positions [p0, p1) of `seq`, or a negative code. */
SKIPPY_API int64_t skippy_page_size(struct llama_context * ctx, int32_t cache, int32_t seq, int32_t p0,
                         int32_t p1, char * err, uint64_t err_cap);
/* Writes that page into buf; returns the bytes written or a negative code. */
SKIPPY_API int64_t skippy_page_export(struct llama_context * ctx, int32_t cache, int32_t seq, int32_t p0,
                           int32_t p1, uint8_t * buf, uint64_t cap, char * err, uint64_t err_cap);
/* Appends a page to `seq` without touching other cells, at the source cell indices carried in
 * the page (or, when it carries none, at cell index = position). Refuses before changing
 * anything when the page is malformed, does not match this cache, or overlaps. */
SKIPPY_API int32_t skippy_page_import(struct llama_context * ctx, int32_t cache, int32_t seq,
                           const uint8_t * buf, uint64_t len, char * err, uint64_t err_cap);
/* Continues CRC-32C `crc` (0 to start) over `len` bytes of `buf` (hardware instructions where
 * the CPU has them): the same function as core/crc32c.ts. Needs no context. */
SKIPPY_API uint32_t skippy_checksum_crc32c(uint32_t crc, const uint8_t * buf, uint64_t len);
/* The recurrent snapshot of `seq` is the blob llama_state_seq_get_data_ext(PARTIAL_ONLY)
 * returns. _layout writes out[0] = its bytes, out[1] = its row regions, then each region's
 * offset and size (regions in blob order: conv rows per recurrent layer, then SSM rows);
 * returns the region count. _export writes bytes [from, to) of it into buf. _import takes
 * bytes [from, from + len) of a source's blob into `seq` of this context: the window at 0 must
 * hold the whole header and allocates the cell (llama.cpp's state_read_meta); every window's
 * rows go into place through state_read_data, its metadata checked against this context's. */
SKIPPY_API int64_t skippy_recurrent_layout(struct llama_context * ctx, int32_t seq, uint64_t * out,
                                           uint64_t out_cap, char * err, uint64_t err_cap);
SKIPPY_API int64_t skippy_recurrent_export(struct llama_context * ctx, int32_t seq, uint64_t from,
                                           uint64_t to, uint8_t * buf, uint64_t cap, char * err,
                                           uint64_t err_cap);
SKIPPY_API int32_t skippy_recurrent_import(struct llama_context * ctx, int32_t seq, uint64_t from,
                                           const uint8_t * buf, uint64_t len, char * err,
                                           uint64_t err_cap);
/* Fills out[SKIPPY_FACTS_LEN]. */
SKIPPY_API int32_t skippy_seq_facts(struct llama_context * ctx, int32_t seq, int32_t * out, char * err,
                         uint64_t err_cap);

/* Layer capture (see _capture.cpp). A capture is opened on a hybrid or recurrent context (one
 * per context); arming installs the shim's own eval callback there (llama_context_params.cb_eval
 * and the scheduler) and disarming removes it, so unarmed decodes run exactly as without one.
 * Arm and disarm only while no decode runs on the context. Armed for (seq, final_pos), it observes only the graph nodes
 * that write the final conv and SSM rows of each recurrent layer into the recurrent memory,
 * and only in the ubatch that leaves the sequence's recurrent cell at final_pos; after each
 * such node is computed it copies that layer's rows of the sequence (ggml_backend_tensor_get)
 * into its own buffer, as the entries llama_state_seq_get_data_ext(PARTIAL_ONLY) writes
 * ({i32 type, u64 row bytes, row}): all conv entries, then all SSM entries. A layer is ready
 * when both its rows are; the count of ready layers is an atomic the caller may poll from any
 * thread while the decode runs. Refused: n_rs_seq > 0, extra per-layer rows (PLE), a context
 * that already has an eval callback. Close the capture before freeing its context. */
#define SKIPPY_CAPTURE_COPY 1u /* copy rows (without it only readiness times are recorded) */

/* Indices into the int64_t[SKIPPY_CAPINFO_LEN] of skippy_capture_info. */
#define SKIPPY_CAPINFO_LAYERS    0 /* recurrent layers captured (entries per part) */
#define SKIPPY_CAPINFO_N_LAYER   1 /* trunk layers (the snapshot's n_layer field) */
#define SKIPPY_CAPINFO_CONV_ROW  2 /* conv row bytes (equal for every layer, else refused) */
#define SKIPPY_CAPINFO_SSM_ROW   3 /* SSM row bytes */
#define SKIPPY_CAPINFO_BYTES     4 /* bytes of all entries (conv entries then SSM entries) */
#define SKIPPY_CAPINFO_ASKED     5 /* nodes offered to the callback since the last arm */
#define SKIPPY_CAPINFO_OBSERVED  6 /* nodes observed (each one splits the graph) since arm */
#define SKIPPY_CAPINFO_CONV_TYPE 7 /* ggml type of the conv rows */
#define SKIPPY_CAPINFO_SSM_TYPE  8
#define SKIPPY_CAPINFO_COPY_NS   9 /* ns the callback spent copying rows since arm */
#define SKIPPY_CAPINFO_PAGE_LAYER 10 /* trunk index of the last attention layer (-1: none) */
#define SKIPPY_CAPINFO_LEN      16

struct skippy_capture;

/* Opens a capture on ctx, or returns NULL with the reason in err. */
SKIPPY_API struct skippy_capture * skippy_capture_open(struct llama_context * ctx, char * err,
                                                      uint64_t err_cap);
/* Removes the callback from the context and frees the capture. */
SKIPPY_API void skippy_capture_close(struct skippy_capture * c);
/* Arms for the next decode(s): resets readiness, installs the callback; SKIPPY_CAPTURE_* flags. */
SKIPPY_API int32_t skippy_capture_arm(struct skippy_capture * c, int32_t seq, int32_t final_pos,
                                      uint32_t flags, char * err, uint64_t err_cap);
/* After skippy_capture_arm: also export the attention cache's page of positions [p0, p1) of
 * the armed sequence (p1 - 1 must be the armed final position) the moment the last attention
 * layer's K and V writes of the final ubatch are computed, into the capture's own buffer, at
 * most max_bytes (larger: the page state is SKIPPY_E_CAPACITY and nothing is exported). */
SKIPPY_API int32_t skippy_capture_arm_page(struct skippy_capture * c, int32_t p0, int32_t p1,
                                           uint64_t max_bytes, char * err, uint64_t err_cap);
/* 0 while the armed page is pending (or none is armed), its byte count once exported, or a
 * negative code when it could not be (message via skippy_capture_page_error). Never blocks. */
SKIPPY_API int64_t skippy_capture_page_state(const struct skippy_capture * c);
SKIPPY_API const char * skippy_capture_page_error(const struct skippy_capture * c);
/* The exported page (page_state bytes), or NULL; valid until the next arm or close. */
SKIPPY_API const uint8_t * skippy_capture_page(const struct skippy_capture * c);
/* steady-clock nanoseconds at which the page was exported or failed (0 = not yet). */
SKIPPY_API int64_t skippy_capture_page_ready_ns(const struct skippy_capture * c);
/* Stops observing and removes the callback. */
SKIPPY_API void skippy_capture_disarm(struct skippy_capture * c);
/* Layers ready so far (0..layers), or a negative code when the capture failed (message via
 * skippy_capture_error). Never blocks. */
SKIPPY_API int32_t skippy_capture_ready(const struct skippy_capture * c);
SKIPPY_API const char * skippy_capture_error(const struct skippy_capture * c);
/* Trunk layer index of recurrent entry k, and whether (1) it is ready. */
SKIPPY_API int32_t skippy_capture_layer(const struct skippy_capture * c, int32_t k);
SKIPPY_API int32_t skippy_capture_is_ready(const struct skippy_capture * c, int32_t k);
/* steady-clock nanoseconds at which entry k became ready (0 = not ready). */
SKIPPY_API int64_t skippy_capture_ready_ns(const struct skippy_capture * c, int32_t k);
SKIPPY_API int64_t skippy_capture_now_ns(void);
/* Start of all entries (conv entries, then SSM entries); layout from skippy_capture_info. */
SKIPPY_API const uint8_t * skippy_capture_entries(const struct skippy_capture * c);
SKIPPY_API void skippy_capture_info(const struct skippy_capture * c, int64_t * out);

#ifdef __cplusplus
}
#endif

#endif /* SKIPPY_SHIM_H */
