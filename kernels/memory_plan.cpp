#include "memory_plan.h"

#include <algorithm>

#include "common/error.h"
#include "weight_layout.h"

namespace kvgen::cuda {

namespace {

constexpr size_t kAlign = 256;

size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

}  // namespace

std::vector<const WeightView*> device_weights(const Model& m) {
    std::vector<const WeightView*> out{&m.weights.token_embd};
    if (!m.weights.tied_output) out.push_back(&m.weights.output);
    for (const LayerWeights& L : m.weights.layers)
        for (const WeightView* w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) out.push_back(w);
    return out;
}

MemoryPlan plan_memory(const Model& m, const KvLayout& kv, int n_batch, int n_logits, int64_t partial_floats,
                       int64_t chunk_elems, bool gemm_overlap) {
    const Config& c = m.config;
    MemoryPlan p;
    size_t end = 0;
    auto place = [&end](int64_t count, size_t elem_bytes) {
        const Region r{align_up(end), size_t(std::max<int64_t>(count, 0)) * elem_bytes};
        end = r.offset + r.bytes;
        return r;
    };

    // Q, K and V of a layer go back to back, without padding, when they share type and row size; rows stay aligned
    // for the decoders' loads, since the group starts aligned and every device row size of a type is a multiple of
    // them. A matrix takes its device layout's bytes (weight_layout.h).
    const std::vector<const WeightView*> ws = device_weights(m);
    const size_t first_layer = ws.size() - 7 * m.weights.layers.size();
    for (size_t i = 0; i < ws.size(); ++i) {
        const WeightView& w = *ws[i];
        const size_t bytes = size_t(w.rows) * size_t(device_row_bytes(w.type, w.cols));
        const size_t in_layer = i >= first_layer ? (i - first_layer) % 7 : 7;  // 0 wq, 1 wk, 2 wv, ...
        if (in_layer == 0) {
            const WeightView &wq = w, &wk = *ws[i + 1], &wv = *ws[i + 2];
            p.fused_qkv.push_back(wq.type == wk.type && wk.type == wv.type && wq.row_bytes == wk.row_bytes &&
                                  wk.row_bytes == wv.row_bytes);
        }
        if ((in_layer == 1 || in_layer == 2) && p.fused_qkv.back()) {
            p.matrices.push_back(Region{end, bytes});
            end += bytes;
        } else {
            p.matrices.push_back(place(int64_t(bytes), 1));
        }
    }
    const int half = c.rope_dim / 2;
    p.norms = place((2 * int64_t(c.n_layers) + 1) * c.n_embd, 4);
    p.rope_inv_freq = place(half, 8);
    p.rope_factors = place(m.weights.rope_freqs.tensor ? half : 0, 8);
    p.weights = align_up(end);

    KVGEN_ASSERT(kv.k_type != KvType::F32 && kv.v_type != KvType::F32);
    p.k_cache = place(int64_t(kv.k_bytes()), 1);
    p.v_cache = place(int64_t(kv.v_bytes()), 1);
    p.k_offsets = place(kv.k_offsets() ? int64_t(kv.n_layers) * kv.n_kv_heads * kv.head_dim : 0, 4);
    p.kv_cache = align_up(end) - p.weights;

    const int64_t nb = n_batch, e = c.n_embd, qd = int64_t(c.n_heads) * c.head_dim;
    const int64_t kvd = int64_t(c.n_kv_heads) * c.head_dim, ff = c.n_ff;
    p.x = place(nb * e, 4);
    p.q = place(nb * qd, 4);
    p.k = place(nb * kvd, 4);
    p.v = place(nb * kvd, 4);
    p.att = place(nb * qd, 4);
    p.ffn = place(nb * ff, 4);
    p.up = place(nb * ff, 4);
    p.logits = place(int64_t(n_logits) * c.n_vocab, 4);
    p.xn = place(nb * e, 4);
    p.partials = place(partial_floats, 4);
    p.cos = place(nb * half, 4);
    p.sin = place(nb * half, 4);
    int64_t wh = 0;  // the largest chunk of a layer matrix that the prefill GEMM decodes to f16 (gemm_weight)
    auto scratch = [chunk_elems, gemm_overlap](const WeightView& w) {
        return gemm_scratch_elems(w.type, w.rows, w.cols, chunk_elems, gemm_overlap);
    };
    if (n_batch > 1)
        for (const LayerWeights& L : m.weights.layers)
            for (const WeightView* w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down})
                wh = std::max(wh, scratch(*w));
    if (n_logits > 1) wh = std::max(wh, scratch(m.weights.output));
    // A short prompt's products with weights of a split_prompt_type take their activations split in two
    // (f16_split_product): twice its tokens in xh, and the products of both halves in ys.
    const int64_t split_tokens = 2 * std::min(nb, int64_t(kSplitBatchTokens));
    int64_t split_rows = 0;
    if (n_batch > 1) {
        for (const LayerWeights& L : m.weights.layers)
            for (const WeightView* w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down})
                if (split_prompt_weight(w->type, w->cols)) split_rows = std::max({split_rows, qd + 2 * kvd, ff, e});
        if (n_logits > 1 && split_prompt_weight(m.weights.output.type, m.weights.output.cols))
            split_rows = std::max(split_rows, int64_t(c.n_vocab));
    }
    p.xh = place(n_batch > 1 ? std::max(nb, split_rows > 0 ? split_tokens : 0) * std::max({e, qd, ff}) : 0, 2);
    p.ys = place(split_tokens * split_rows, 4);
    p.wh = place(wh, 2);
    p.step = place(2 + nb, 4);
    p.xq = place(std::min(nb, int64_t(kIntBatchTokens)) * ((std::max({e, qd, ff}) + 31) / 32), kActBlockBytes);
    p.counters = place(c.n_heads, 4);
    // (a short prompt's tokens too: at most kIntBatchTokens, on the tensor cores, in the integer SwiGLU product)
    p.hq = place(ff % 32 == 0 ? std::min(nb, int64_t(kIntBatchTokens)) * (ff / 32) : 0, kActBlockBytes);
    p.hq_counters = place(ff % 32 == 0 ? int64_t(kIntBatchGroups) * (ff / 32) : 0, 4);
    const int64_t groups = e % 32 == 0 ? e / 32 : 0;
    p.xnq = place(groups, kActBlockBytes);
    p.norm_sums = place(groups, 4);
    p.norm_counters = place(groups > 0 ? groups + 1 : 0, 4);
    p.total = align_up(end);
    p.buffers = p.total - p.weights - p.kv_cache;
    return p;
}

}  // namespace kvgen::cuda
