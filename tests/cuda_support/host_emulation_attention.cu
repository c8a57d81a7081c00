// The kernels' own bodies run on the host (host_emulation.h), the rest of them: the K/V cache's stores and offsets,
// attention, the element-wise items, the SwiGLU tail of a short prompt and the Q|K|V stores.
#include "host_emulation.h"

#include "act_blocks.h"

namespace kvgen::cuda::host {

std::vector<float> rotate_rows(const std::vector<float>& x, int head_dim, std::vector<HostActBlock>* xq) {
    std::vector<float> out = x;
    const int rows = int(x.size() / size_t(head_dim));
    std::vector<ActBlock> blocks(xq ? x.size() / 32 : 0);
    const bool ok = dispatch_kv_rows(head_dim, [&](auto e) {
        constexpr int E = decltype(e)::value;
        run_grid(rows, 1, 32, 0, [&](const HostThread& t) {
            const size_t r = size_t(t.block_x());
            kv_rotate_row_warp<E>(t, out.data() + r * size_t(head_dim), xq ? blocks.data() + r * E : nullptr);
        });
    });
    if (!ok) throw Error(fmt::format("kv_rotate_rows: no kernel for head_dim {}", head_dim));
    if (xq) *xq = host_blocks(blocks);
    return out;
}

bool decode_reads_wide(const Config& c, KvType k, KvType v) {
    const KvLayout kv = KvLayout::of(c, 64, k, v);
    bool wide = false;
    const bool ok = dispatch_decode_attention(c.n_heads / c.n_kv_heads, kv, [&](auto nq, auto e) {
        constexpr int NQ = decltype(nq)::value, E = decltype(e)::value;
        dispatch_attention_cache<NQ, E>(kv,
                                        [&](auto cache) { wide = attention_wide<decltype(cache)::value, NQ, E>(); });
    });
    return ok && wide;
}

std::vector<float> kv_block_values(KvType t, const uint8_t* bytes, int rows, int head_dim) {
    std::vector<float> out(size_t(rows) * size_t(head_dim));
    const int64_t rb = KvLayout::row_bytes(t, head_dim);
    for (int c0 = 0; c0 < head_dim; c0 += 8) {
        const KvBlockCols cols = kv_block_cols(t, c0);
        for (int r = 0; r < rows; ++r) {
            float x[8];
            kv_block_decode(cols, kv_block_load(cols, bytes + r * rb), x);
            std::copy(x, x + 8, out.begin() + ptrdiff_t(r) * head_dim + c0);
        }
    }
    return out;
}

std::vector<float> kv_load_values(KvType t, const uint8_t* bytes, int rows, int head_dim) {
    std::vector<float> out(size_t(rows) * size_t(head_dim));
    const int64_t rb = KvLayout::row_bytes(t, head_dim);
    for (int r = 0; r < rows; ++r)
        for (int c0 = 0; c0 < head_dim; c0 += 8) {
            float x[8];
            kv_load<8>(t, bytes + r * rb, c0, x);
            std::copy(x, x + 8, out.begin() + ptrdiff_t(r) * head_dim + c0);
        }
    return out;
}

namespace {
// store_kv_rows_kernel's rows [0, rows), a warp each (store_kv_row_warp).
void host_store_rows(int64_t rows, const float* k, const float* v, const float* cos_t, const float* sin_t,
                     const float* k_offsets, int pos0, int i0, const KvLayout& kv, int half_rope, uint8_t* kc,
                     uint8_t* vc) {
    const bool ok = dispatch_kv_rows(kv.head_dim, [&](auto e) {
        run_grid(int(rows), 1, 32, 0, [&](const HostThread& t) {
            store_kv_row_warp<decltype(e)::value>(t, t.block_x(), k, v, cos_t, sin_t, k_offsets, &pos0, i0, kv,
                                                  half_rope, kc, vc);
        });
    });
    if (!ok) throw Error(fmt::format("store_kv_rows: no kernel for head_dim {}", kv.head_dim));
}

// kv_offsets_kernel: items [0, heads) from layer l on, a warp each (kv_offset_warp).
void host_kv_offsets(KvBytes& cache, int l, int n_layers) {
    const KvLayout& kv = cache.kv;
    if (!kv.k_offsets()) throw Error("kv_offsets: K carries no key offsets");
    const uint8_t* kc = cache.k.data() + kv.row_index(l, 0, 0) * kv.k_row_bytes();
    float* off = cache.k_offsets.data() + int64_t(l) * kv.n_kv_heads * kv.head_dim;
    const bool ok = dispatch_kv_rows(kv.head_dim, [&](auto e) {
        run_grid(n_layers * kv.n_kv_heads, 1, 32, 0,
                 [&](const HostThread& t) { kv_offset_warp<decltype(e)::value>(t, t.block_x(), kc, kv, off); });
    });
    if (!ok) throw Error(fmt::format("kv_offsets: no kernel for head_dim {}", kv.head_dim));
}
}  // namespace

void store_step(KvBytes& cache, int l, const float* k, const float* v, int pos0, int n) {
    const KvLayout& kv = cache.kv;
    if (!kv.quantized()) {  // store_kv_kernel's items: f16 pairs
        __half* kc = reinterpret_cast<__half*>(cache.k.data()) + kv.offset(l, 0, 0);
        __half* vc = reinterpret_cast<__half*>(cache.v.data()) + kv.offset(l, 0, 0);
        for (int64_t g = 0; g < int64_t(n) * kv.n_kv_heads * (kv.head_dim / 2); ++g)
            store_kv_item(g, k, v, nullptr, nullptr, &pos0, kv, 0, kc, vc);
        return;
    }
    uint8_t* kc = cache.k.data() + kv.row_index(l, 0, 0) * kv.k_row_bytes();
    uint8_t* vc = cache.v.data() + kv.row_index(l, 0, 0) * kv.v_row_bytes();
    const float* off = kv.k_offsets() ? cache.k_offsets.data() + int64_t(l) * kv.n_kv_heads * kv.head_dim : nullptr;
    auto rows = [&](int i0, int i1) {  // store_kv_rows_kernel over tokens [i0, i1)
        host_store_rows(int64_t(i1 - i0) * kv.n_kv_heads * 2, k, v, nullptr, nullptr, off, pos0, i0, kv, 0, kc, vc);
    };
    const bool sets = kv.k_offsets() && pos0 < kKvOffsetPositions && pos0 + n >= kKvOffsetPositions;
    const int split = sets ? kKvOffsetPositions - pos0 : 0;
    if (split > 0) {
        rows(0, split);
        host_kv_offsets(cache, l, 1);
    }
    rows(split, n);
}

void kv_write(KvBytes& cache, const void* k, const void* v, int n) {
    const KvLayout& kv = cache.kv;
    const int64_t heads = int64_t(kv.n_layers) * kv.n_kv_heads, krb = kv.k_row_bytes(), vrb = kv.v_row_bytes();
    for (int64_t lh = 0; lh < heads; ++lh) {  // cudaMemcpy2DAsync's rows
        std::memcpy(cache.k.data() + lh * kv.n_ctx * krb, static_cast<const uint8_t*>(k) + lh * n * krb,
                    size_t(n * krb));
        std::memcpy(cache.v.data() + lh * kv.n_ctx * vrb, static_cast<const uint8_t*>(v) + lh * n * vrb,
                    size_t(n * vrb));
    }
    if (kv.k_offsets() && n >= kKvOffsetPositions) host_kv_offsets(cache, 0, kv.n_layers);
}

std::vector<float> matvec_glu_int_quantized(GgmlType type, const uint8_t* gate, const uint8_t* up, int64_t rows,
                                            int64_t cols, const std::vector<float>& x, std::vector<HostActBlock>* yq) {
    if (rows % 32 != 0) throw Error("the SwiGLU product quantizes its output for rows a multiple of 32");
    const std::vector<float> sums = matvec_glu_int(type, gate, up, rows, cols, x);  // each block's outputs
    std::vector<float> y(size_t(rows), NAN);
    std::vector<ActBlock> blocks(size_t(rows / 32));
    std::vector<int> counters(size_t(rows / 32), 0);
    // matvec_glu_int_kernel's tail, block by block in a shuffled order (the device's is any): its first warp, lane 0
    // holding the block's outputs
    std::vector<int64_t> order;
    for (int64_t r0 = 0; r0 < rows; r0 += kMviGluRows) order.push_back(r0);
    std::shuffle(order.begin(), order.end(), std::mt19937(uint32_t(rows)));
    for (const int64_t r0 : order)
        run_grid(1, 1, 32, 0, [&](const HostThread& t) {
            float v[kMviGluRows];
            for (int r = 0; r < kMviGluRows; ++r) v[r] = sums[size_t(r0 + r)];
            glu_store_quantized(t, t.thread(), v, y.data(), r0, counters.data(), blocks.data());
        });
    for (int cnt : counters)
        if (cnt != 0) throw Error("matvec_glu_int: a row group's counter was not reset");
    *yq = host_blocks(blocks);
    return y;
}

std::vector<float> glu_quantized_tokens(const std::vector<float>& sums, int n, int64_t rows, int block_rows,
                                        int launch_tokens, std::vector<HostActBlock>* yq) {
    if (rows % 32 != 0) throw Error("the SwiGLU product quantizes its output for rows a multiple of 32");
    std::vector<float> y(size_t(n) * size_t(rows), NAN);
    std::vector<ActBlock> blocks(size_t(n) * size_t(rows / 32));
    std::vector<int> counters(size_t(rows / 32), 0);
    bool shaped = false;
    const auto run = [&](auto r_c, auto nt_c) {
        constexpr int R = decltype(r_c)::value, NT = decltype(nt_c)::value;
        if (R != block_rows || NT != launch_tokens) return;
        shaped = true;
        // launches of NT tokens; in each, matvec_glu_int_kernel's tail block by block in a shuffled order (the
        // device's is any): its first warp, lane t holding row r0 + t / NT of token t % NT
        for (int i0 = 0; i0 < n; i0 += NT) {
            const int m = std::min(NT, n - i0);
            std::vector<int64_t> order;
            for (int64_t r0 = 0; r0 < rows; r0 += R) order.push_back(r0);
            std::shuffle(order.begin(), order.end(), std::mt19937(uint32_t(rows + i0)));
            for (const int64_t r0 : order)
                run_grid(1, 1, 32, 0, [&](const HostThread& t) {
                    const int r = t.thread() / NT, i = t.thread() % NT;
                    const float o = r < R && i < m ? sums[size_t(i0 + i) * size_t(rows) + size_t(r0 + r)] : NAN;
                    glu_store_quantized_tokens<R, NT>(t, t.thread(), o, y.data() + int64_t(i0) * rows, rows, r0, m,
                                                      counters.data(), blocks.data() + int64_t(i0) * (rows / 32));
                });
            for (int cnt : counters)
                if (cnt != 0) throw Error("glu_store_quantized_tokens: a row group's counter was not reset");
        }
    };
    using I1 = std::integral_constant<int, 1>;
    using I2 = std::integral_constant<int, 2>;
    using I4 = std::integral_constant<int, 4>;
    using I8 = std::integral_constant<int, 8>;
    run(I1{}, I8{});
    run(I2{}, I8{});
    run(I2{}, I4{});
    run(I4{}, I4{});
    run(I4{}, I2{});
    run(I1{}, I4{});
    if (!shaped) throw Error("glu_store_quantized_tokens: no such block shape here");
    *yq = host_blocks(blocks);
    return y;
}

std::vector<float> matvec_int_residual_norm(GgmlType type, const uint8_t* bytes, int64_t rows, int64_t cols,
                                            const std::vector<float>& x, const std::vector<float>& residual,
                                            const std::vector<float>& norm_w, float eps, int block_rows,
                                            std::vector<HostActBlock>* xq) {
    if (rows % 32 != 0) throw Error("the residual product folds the norm in for rows a multiple of 32");
    if (block_rows != kMviRows && block_rows != kMviWideRows) throw Error("matvec_int_residual_norm: 4 or 8 rows");
    const std::vector<float> sums = matvec_int(type, bytes, rows, cols, x);  // each block's outputs
    std::vector<float> y = residual;
    std::vector<ActBlock> blocks(size_t(rows / 32));
    std::vector<float> group_sums(size_t(rows / 32), NAN);
    std::vector<int> counters(size_t(rows / 32 + 1), 0);
    const NormStore ns{norm_w.data(), blocks.data(), group_sums.data(), counters.data(), eps};
    // matvec_int_kernel's tail, block by block in a shuffled order (the device's is any): its first warp, lane 0
    // holding the block's rows with the residual added
    std::vector<int64_t> order;
    for (int64_t r0 = 0; r0 < rows; r0 += block_rows) order.push_back(r0);
    std::shuffle(order.begin(), order.end(), std::mt19937(uint32_t(rows + block_rows)));
    auto tail = [&](auto r) {
        constexpr int R = decltype(r)::value;
        for (const int64_t r0 : order)
            run_grid(1, 1, 32, 0, [&](const HostThread& t) {
                float v[R];
                for (int k = 0; k < R; ++k) v[k] = residual[size_t(r0 + k)] + sums[size_t(r0 + k)];
                residual_norm_store(t, t.thread(), v, y.data(), r0, rows, ns);
            });
    };
    if (block_rows == kMviRows)
        tail(std::integral_constant<int, kMviRows>{});
    else
        tail(std::integral_constant<int, kMviWideRows>{});
    for (int cnt : counters)
        if (cnt != 0) throw Error("matvec_int_residual_norm: a counter was not reset");
    *xq = host_blocks(blocks);
    return y;
}

int attention_split_positions() {
    return kAttnSplitPositions;
}
int attention_active_splits(int n_pos, int splits) {
    return cuda::attention_active_splits(n_pos, splits);
}
int attention_splits(int n_heads, const KvLayout& kv, int sm_count) {
    return cuda::attention_splits(n_heads, kv, sm_count);
}
int attention_prefill_splits(int n_heads, const KvLayout& kv, int n, int pos0, int sm_count) {
    return cuda::attention_prefill_splits(n_heads, kv, n, pos0, sm_count);
}
int64_t attention_partials(int n_heads, int head_dim, int splits, int n_batch) {
    return cuda::attention_partials(n_heads, head_dim, splits, n_batch);
}
bool flash_warp_split(int n, int n_rep) {
    return cuda::flash_warp_split(n, flash_heads_per_block(n_rep));
}
int attention_max_splits(const KvLayout& kv) {
    return cuda::attention_max_splits(kv);
}

std::vector<float> attention(const Config& c, const std::vector<float>& q_in, const std::vector<float>& k,
                             const std::vector<float>& v, int pos0, int n, int n_ctx, int splits, bool fold,
                             bool tensor_cores, KvType kt, KvType vt, std::vector<HostActBlock>* xq, bool flash_async,
                             bool warp_split) {
    const int hd = c.head_dim, n_rep = c.n_heads / c.n_kv_heads;
    // One layer's cache as store_kv writes it (no RoPE here): the positions before the queries' as one step, theirs
    // as the next.
    const KvLayout kv = KvLayout::of(c, n_ctx, kt, vt);
    if (!kv_cache_supported(kv))  // as CudaOps refuses it (the kernels read f16 where no half is quantized)
        throw Error(fmt::format("no CUDA kernels for a {} cache with head_dim {}", kv.types_name(), hd));
    KvBytes cache(kv);
    std::fill(cache.k.begin(), cache.k.end(), 0);
    std::fill(cache.v.begin(), cache.v.end(), 0);
    const size_t row = size_t(c.n_kv_heads) * size_t(hd);
    host::store_step(cache, 0, k.data(), v.data(), 0, pos0);
    host::store_step(cache, 0, k.data() + size_t(pos0) * row, v.data() + size_t(pos0) * row, pos0, n);
    const uint8_t *kc = cache.k.data(), *vc = cache.v.data();
    const float* koff = kv.k_offsets() ? cache.k_offsets.data() : nullptr;
    // the query turned to a quantized K's basis (kv_rotate_rows_kernel's body; CudaOps turns it in rope_store_kv's
    // launch)
    std::vector<float> q = q_in;
    if (kv_type_quantized(kt)) q = rotate_rows(q, hd);
    const float scale = 1.0f / std::sqrt(float(hd));
    std::vector<float> out(q.size(), NAN);
    auto unrotate = [&] {
        if (kv_type_quantized(vt)) out = rotate_rows(out, hd);
    };
    if (n > 1 && (tensor_cores || kv.quantized()) && dispatch_flash(n_rep, hd, [&](auto hdc, auto nq) {
            constexpr int HD = decltype(hdc)::value, NQ = decltype(nq)::value;
            // splits > 1: the positions split among that many blocks per query block, then flash_combine_kernel's
            // blocks; partials NaN-filled, so a row read that no split wrote shows
            const int sp = splits > 1 ? splits : 1, gy = (n + kFaRows / NQ - 1) / (kFaRows / NQ) * sp;
            std::vector<float> partials(sp > 1 ? size_t(n) * size_t(c.n_heads) * size_t(sp) * size_t(hd + 2) : 0,
                                        NAN);
            // the output also split for the output projection where the backend asks for it (an f16 V): by the
            // flash kernel, or with splits by the combine
            const bool split = !kv_type_quantized(vt);
            std::vector<__half> xh(split ? 2 * q.size() : 0, __float2half(NAN));
            // and quantized for an integer one (quantize_act's blocks), where the backend asks for it (an f16 V)
            std::vector<ActBlock> blocks(split ? q.size() / 32 : 0);
            if (!blocks.empty()) std::memset(blocks.data(), 0xee, blocks.size() * sizeof(ActBlock));
            const auto grid = [&](auto lo, auto async, auto ws) {
                constexpr bool LO = decltype(lo)::value, ASYNC = decltype(async)::value, WS = decltype(ws)::value;
                run_grid(c.n_heads / NQ, gy, kFaThreads, size_t(kFaShared<HD, LO, ASYNC>), [&](const HostThread& t) {
                    flash_prefill_body<HD, NQ, LO, HostThread, ASYNC, WS>(
                        t, q.data(), kc, vc, koff, &pos0, n, c.n_heads, n_rep, kv, scale, out.data(), sp,
                        partials.data(), split && sp == 1 ? xh.data() : nullptr,
                        split && sp == 1 ? blocks.data() : nullptr);
                });
            };
            const auto by_split = [&](auto lo, auto async) {  // as attention_prefill launches it
                if (warp_split && flash_warp_split(n, NQ))
                    grid(lo, async, std::true_type{});
                else
                    grid(lo, async, std::false_type{});
            };
            if (kv.quantized())
                by_split(std::true_type{}, std::false_type{});
            else if (flash_async)
                by_split(std::false_type{}, std::true_type{});
            else
                by_split(std::false_type{}, std::false_type{});
            if (sp > 1)
                run_grid(n * c.n_heads, 1, 128, 0, [&](const HostThread& t) {
                    combine_head(t, 128, partials.data(), sp, sp, hd, t.block_x(), out.data(),
                                 split ? blocks.data() : nullptr, split ? xh.data() : nullptr, int64_t(q.size()));
                });
            if (split) {
                std::vector<float> halves;
                for (const __half h : xh) halves.push_back(__half2float(h));
                const std::vector<float> want = split_halves(out);
                if (std::memcmp(halves.data(), want.data(), want.size() * sizeof(float)) != 0)
                    throw Error("flash attention: the split output differs from to_f16_split of the output");
                std::vector<ActBlock> want_q(blocks.size());
                for (size_t b = 0; b < blocks.size(); ++b) quantize_act_item(int64_t(b), out.data(), want_q.data());
                if (std::memcmp(blocks.data(), want_q.data(), blocks.size() * sizeof(ActBlock)) != 0)
                    throw Error("flash attention: the quantized output differs from quantize_act of the output");
            }
        })) {
        unrotate();
        return out;
    }
    // (one token: as attention_decode takes its heads, decode_heads_per_block; a prompt: attention_prefill's)
    const int heads = n == 1 ? decode_heads_per_block(n_rep, kv) : heads_per_block(n_rep);
    const bool ok = dispatch_attention_heads(heads, hd, [&](auto nq, auto e) {
        constexpr int NQ = decltype(nq)::value, E = decltype(e)::value;
        const int groups = c.n_heads / NQ;
        if (n == 1) {
            // the counters attention_decode's callers make room for: one a block of the grid's row
            if (groups != cuda::attention_counters(c.n_heads, kv)) throw Error("attention: counters for another grid");
            std::vector<float> partials(size_t(c.n_heads) * splits * (hd + 2), NAN);
            std::vector<int> counters(size_t(groups), 0);
            std::vector<ActBlock> blocks(xq ? out.size() / 32 : 0);
            ActBlock* xb = xq ? blocks.data() : nullptr;
            run_grid(groups, splits, kAttnThreads, size_t(kAttnDecodeShared<NQ, E>), [&](const HostThread& t) {
                int* cnt = fold ? counters.data() : nullptr;
                dispatch_attention_cache<NQ, E>(kv, [&](auto cache) {  // as attention_decode picks its kernel
                    attention_decode_body<NQ, E, decltype(cache)::value>(t, q.data(), kc, vc, koff, &pos0, n_rep, kv,
                                                                         splits, scale, partials.data(), cnt,
                                                                         out.data(), xb);
                });
            });
            if (fold) {
                for (int cnt : counters)
                    if (cnt != 0) throw Error("attention: a head group's counter was not reset");
            } else {
                run_grid(c.n_heads, 1, 128, 0, [&](const HostThread& t) {  // attention_combine_kernel's block
                    attention_combine_body(t, 128, partials.data(), &pos0, splits, hd, out.data(), xb);
                });
            }
            if (xq) *xq = host_blocks(blocks);
        } else {
            run_grid(groups, (n + kAttnWarps - 1) / kAttnWarps, kAttnThreads, 0, [&](const HostThread& t) {
                attention_prefill_body<NQ, E>(t, q.data(), kc, vc, &pos0, n, c.n_heads, n_rep, kv, scale, out.data());
            });
        }
    });
    if (!ok) {  // attention_generic_kernel: one thread per (query, head)
        if (!attention_head_dim_supported(hd)) throw Error(fmt::format("no attention kernel for head_dim {}", hd));
        for (int64_t g = 0; g < int64_t(n) * c.n_heads; ++g)
            attention_generic_item(g, q.data(), kc, vc, &pos0, c.n_heads, n_rep, kv, scale, out.data());
        if (xq) *xq = quantize_act(out);  // as attention_decode does after the generic kernel
    }
    unrotate();
    return out;
}

}  // namespace kvgen::cuda::host

namespace kvgen::cuda::host {

std::vector<HostActBlock> quantize_act(const std::vector<float>& x) {
    std::vector<ActBlock> a(x.size() / 32);
    run_grid(int(a.size()), 1, 32, 0, [&](const HostThread& t) {  // quantize_act_kernel: a warp per block
        quantize_act_warp(t, x[size_t(t.block_x()) * 32 + size_t(t.thread())], t.thread(), a[size_t(t.block_x())]);
    });
    return host_blocks(a);
}

namespace {
// rmsnorm_kernel's grid on the host (blocks of `threads`), out [n][dim], with xq and xh where not null.
std::vector<float> rmsnorm_grid(const std::vector<float>& x, const std::vector<float>& w, int n, int dim, float eps,
                                int threads, ActBlock* xq, __half* xh) {
    if (threads % 32 != 0 || threads < 32 || threads > kNormThreads) throw Error("rmsnorm: a block of 32 k threads");
    std::vector<float> out(x.size(), NAN);
    run_grid(n, 1, threads, kNormWarps, [&](const HostThread& t) {
        rmsnorm_body(t, threads, x.data(), w.data(), out.data(), xq, dim, eps, xh, int64_t(x.size()));
    });
    return out;
}
}  // namespace

std::vector<float> rmsnorm(const std::vector<float>& x, const std::vector<float>& w, int n, int dim, float eps,
                           int threads) {
    return rmsnorm_grid(x, w, n, dim, eps, threads, nullptr, nullptr);
}

std::vector<float> rmsnorm_split(const std::vector<float>& x, const std::vector<float>& w, int n, int dim, float eps,
                                 int threads) {
    std::vector<__half> xh(2 * x.size(), __float2half(NAN));
    std::vector<float> out = rmsnorm_grid(x, w, n, dim, eps, threads, nullptr, xh.data());
    for (const __half h : xh) out.push_back(__half2float(h));
    return out;
}

std::vector<float> split_halves(const std::vector<float>& x) {
    const int64_t count = int64_t(x.size());
    std::vector<__half> xh(size_t(2 * count));
    for (int64_t j = 0; j < count; ++j) to_f16_split_item(j, count, x.data(), xh.data());
    std::vector<float> out;
    for (const __half h : xh) out.push_back(__half2float(h));
    return out;
}

std::vector<float> f16_split_sum(const std::vector<float>& t, int n, int64_t rows, const std::vector<float>& y0,
                                 bool accumulate, bool glu, bool split) {
    std::vector<float> y = y0;
    std::vector<__half> xh(size_t(2 * n * rows), __float2half(NAN));
    const RowSplit out = RowSplit::one(y.data(), rows);
    for (int64_t j = 0; j < int64_t(n) * rows; ++j)
        f16_split_sum_item(j, t.data(), n, rows, out, accumulate, SplitSumTail{glu, split ? xh.data() : nullptr});
    if (split)
        for (const __half h : xh) y.push_back(__half2float(h));
    return y;
}

std::vector<float> rmsnorm_quantized(const std::vector<float>& x, const std::vector<float>& w, int n, int dim,
                                     float eps, int threads) {
    std::vector<ActBlock> xq(x.size() / 32);
    return testing::append_blocks(rmsnorm_grid(x, w, n, dim, eps, threads, xq.data(), nullptr), xq);
}

namespace {
void host_rope_tables(int n, int pos0, const Config& c, const std::vector<float>& freq_factors,
                      std::vector<float>* cos_t, std::vector<float>* sin_t) {
    const int half = c.rope_dim / 2;
    const RopeFreqs r = RopeFreqs::of(c, freq_factors);
    cos_t->assign(size_t(n) * half, NAN);
    sin_t->assign(size_t(n) * half, NAN);
    for (int g = 0; g < n * half; ++g)
        rope_tables_item(g, &pos0, half, r.inv_freq.data(), r.factors.empty() ? nullptr : r.factors.data(), r.pos_div,
                         cos_t->data(), sin_t->data());
}
}  // namespace

std::vector<float> rope(const std::vector<float>& x, int n, int n_heads, int pos0, const Config& c,
                        const std::vector<float>& freq_factors) {
    std::vector<float> cs, sn, out = x;
    host_rope_tables(n, pos0, c, freq_factors, &cs, &sn);
    const int half = c.rope_dim / 2;
    for (int64_t g = 0; g < int64_t(n) * n_heads * half; ++g)
        rope_item(g, out.data(), cs.data(), sn.data(), n_heads, c.head_dim, half);
    return out;
}

std::vector<float> rope_turn_q(const std::vector<float>& x, int n, int n_heads, int pos0, const Config& c) {
    std::vector<float> cs, sn, out = x;
    host_rope_tables(n, pos0, c, {}, &cs, &sn);
    const bool ok = dispatch_kv_rows(c.head_dim, [&](auto e) {
        run_grid(n * n_heads, 1, 32, 0, [&](const HostThread& t) {
            rope_turn_q_row_warp<decltype(e)::value>(t, t.block_x(), out.data(), cs.data(), sn.data(), n_heads,
                                                     c.rope_dim / 2);
        });
    });
    if (!ok) throw Error(fmt::format("rope_turn_q: no kernel for head_dim {}", c.head_dim));
    return out;
}

std::vector<float> store_k(const Config& c, const std::vector<float>& k, int pos0, int n, int n_ctx) {
    std::vector<float> cs, sn;
    host_rope_tables(n, pos0, c, {}, &cs, &sn);
    const KvLayout kv = KvLayout::of(c, n_ctx, KvType::F16);
    std::vector<__half> kc(size_t(kv.layer_elems()), __float2half(NAN)), vc(kc);
    for (int64_t g = 0; g < int64_t(n) * c.n_kv_heads * (c.head_dim / 2); ++g)
        store_kv_item(g, k.data(), k.data(), cs.data(), sn.data(), &pos0, kv, c.rope_dim / 2, kc.data(), vc.data());
    // the per-row kernel of a quantized cache, run with f16 halves, writes the same values
    std::vector<__half> kr(kc.size(), __float2half(NAN)), vr(kr);
    host_store_rows(int64_t(n) * c.n_kv_heads * 2, k.data(), k.data(), cs.data(), sn.data(), nullptr, pos0, 0, kv,
                    c.rope_dim / 2, reinterpret_cast<uint8_t*>(kr.data()), reinterpret_cast<uint8_t*>(vr.data()));
    for (int i = 0; i < n; ++i)
        for (int h = 0; h < c.n_kv_heads; ++h)
            for (int j = 0; j < c.head_dim; ++j) {
                const size_t at = size_t(kv.row(h, pos0 + i) + j);
                if (__half2float(kr[at]) != __half2float(kc[at]))
                    throw Error("store_kv: the per-row kernel's f16 row differs from the per-pair kernel's");
            }
    std::vector<float> out(size_t(n) * c.n_kv_heads * c.head_dim);
    for (int i = 0; i < n; ++i)
        for (int h = 0; h < c.n_kv_heads; ++h)
            for (int j = 0; j < c.head_dim; ++j)
                out[(size_t(i) * c.n_kv_heads + h) * c.head_dim + j] =
                    __half2float(kc[size_t(kv.row(h, pos0 + i) + j)]);
    return out;
}

namespace {
// The rows of seg_rows / head_dim heads of one layer's f16 cache for the n positions from pos0, [n][heads][head_dim].
std::vector<float> cache_rows(const std::vector<__half>& cache, const KvLayout& kv, int n, int pos0, int64_t seg_rows) {
    const int heads = int(seg_rows / kv.head_dim);
    std::vector<float> r(size_t(n) * size_t(seg_rows));
    for (int i = 0; i < n; ++i)
        for (int h = 0; h < heads; ++h)
            for (int d = 0; d < kv.head_dim; ++d)
                r[(size_t(i) * heads + h) * kv.head_dim + d] = __half2float(cache[size_t(kv.row(h, pos0 + i) + d)]);
    return r;
}
}  // namespace

namespace {
// A Q|K|V epilogue with QkvStore run on the host over an f16 cache of n_ctx positions with c's heads, n tokens at
// positions pos0..: store(split, st) runs it for rows [0, q_end) queries, [q_end, k_end) keys, the rest values. The
// queries as written, the key and value rows read back; checked that RowSplit's k and v and every other cache value
// stay unwritten (what: the kernel, for the errors).
template <typename Store>
QkvStored qkv_stored(int n, int64_t rows, const Config& c, int pos0, int n_ctx, int64_t q_end, int64_t k_end,
                     const char* what, Store&& store) {
    std::vector<float> cs, sn;
    host_rope_tables(n, pos0, c, {}, &cs, &sn);
    const KvLayout kv = KvLayout::of(c, n_ctx, KvType::F16);
    std::vector<__half> kc(size_t(kv.layer_elems()), __float2half(NAN)), vc(kc);
    QkvStored out;
    out.q.assign(size_t(n) * size_t(q_end), NAN);
    std::vector<float> unused(size_t(n) * size_t(rows), NAN);  // RowSplit's k and v: never written
    store(RowSplit{{out.q.data(), unused.data(), unused.data()}, {q_end, k_end}},
          QkvStore{kc.data(), vc.data(), q_end, k_end, cs.data(), sn.data(), &pos0, c.rope_dim / 2, kv});
    for (float u : unused)
        if (!std::isnan(u)) throw Error(fmt::format("{} with QkvStore wrote RowSplit's k or v", what));
    // the step's rows, and nothing written elsewhere
    for (const auto& [cache, seg] : {std::pair{&kc, k_end - q_end}, std::pair{&vc, rows - k_end}})
        if (std::count_if(cache->begin(), cache->end(), [](__half e) { return !std::isnan(__half2float(e)); }) !=
            n * seg)
            throw Error(fmt::format("{} with QkvStore: cache values written outside the step's rows", what));
    out.k = cache_rows(kc, kv, n, pos0, k_end - q_end);
    out.v = cache_rows(vc, kv, n, pos0, rows - k_end);
    return out;
}
}  // namespace

QkvStored matvec_int_qkv_store(GgmlType type, const uint8_t* bytes, int64_t rows, int64_t cols,
                               const std::vector<float>& x, int n, const Config& c, int pos0, int n_ctx, int64_t q_end,
                               int64_t k_end) {
    const uint8_t* const w[1] = {bytes};
    const std::vector<float> y = matvec_int_blocks<1>(type, w, rows, cols, x, n, MviShape{})[0];  // the blocks' sums
    return qkv_stored(
        n, rows, c, pos0, n_ctx, q_end, k_end, "matvec_int", [&](const RowSplit& split, const QkvStore& st) {
            // matvec_int_kernel's epilogue, block by block in each launch: lane t of the first warp holds row r0 + t /
            // NT for token i0 + t % NT
            const bool ok = dispatch_int_type(type, [&](auto tag) {
                constexpr GgmlType T = decltype(tag)::value;
                int_launches(n, [&](auto nt, int i0, int m) {
                    constexpr int NT = decltype(nt)::value;
                    with_mvi_shape<T, 1, NT>(MviShape{}, [&](auto rows_a_block, auto) {
                        constexpr int R = decltype(rows_a_block)::value;
                        for (int64_t r0 = 0; r0 < rows; r0 += R)
                            run_grid(1, 1, 32, 0, [&](const HostThread& t) {
                                const int r = t.thread() / NT, i = t.thread() % NT;
                                const bool valid = r < R && i < m && r0 + r < rows;
                                const float v = valid ? y[size_t(i0 + i) * size_t(rows) + size_t(r0 + r)] : 0.0f;
                                qkv_store_row(t, v, valid, r0 + r, i0 + i, NT, split, rows, st);
                            });
                    });
                });
            });
            if (!ok) throw Error(fmt::format("no integer product for {}", ggml_type_name(type)));
        });
}

QkvStored f16_split_sum_qkv_store(const std::vector<float>& t, int n, int64_t rows, const Config& c, int pos0,
                                  int n_ctx, int64_t q_end, int64_t k_end) {
    return qkv_stored(n, rows, c, pos0, n_ctx, q_end, k_end, "f16_split_sum",
                      [&](const RowSplit& split, const QkvStore& st) {
                          for (int64_t p = 0; p < int64_t(n) * rows / 2; ++p)
                              f16_split_sum_qkv_item(p, t.data(), n, rows, split, st);
                      });
}

std::vector<float> get_rows(GgmlType type, const uint8_t* bytes, int64_t rows, int64_t cols,
                            const std::vector<int32_t>& ids) {
    std::vector<float> out(ids.size() * size_t(cols), NAN);
    const DeviceRows dev = device_rows(type, bytes, rows, cols);
    const int64_t cpr = cols / 32, row_bytes = dev.row_bytes;
    if (cols % 32 != 0) {  // get_rows_ragged_kernel's item (the ids here are in range)
        if (!is_float_type(type)) throw Error("rows that are not whole blocks");
        for (int64_t g = 0; g < int64_t(ids.size()) * cols; ++g)
            out[size_t(g)] = float_weight(type, dev.p + ids[size_t(g / cols)] * row_bytes, g % cols);
        return out;
    }
    const bool ok = dispatch_type(type, [&](auto tag) {
        constexpr GgmlType T = decltype(tag)::value;
        for (int64_t g = 0; g < int64_t(ids.size()) * cpr; ++g)
            get_rows_item<T>(g, dev.p, row_bytes, cpr, rows, ids.data(), out.data());
    });
    if (!ok) throw Error(fmt::format("no device decoder for {}", ggml_type_name(type)));
    return out;
}

std::vector<int> row_split_targets(int64_t rows, int64_t end0, int64_t end1, int n) {
    // Three buffers of n tokens' rows at distinct addresses of one array; a row's target is the buffer its pointer
    // lands in.
    const int64_t span = int64_t(n) * rows;
    std::vector<float> mem(size_t(3 * span));
    const RowSplit split{{mem.data(), mem.data() + span, mem.data() + 2 * span}, {end0, end1}};
    std::vector<int> out;
    for (int i = 0; i < n; ++i)
        for (int64_t r = 0; r < rows; ++r) {
            const int64_t at = split.at(r, i, rows) - mem.data();
            out.push_back(int(at / span) * 1000000 + int(at % span));
        }
    return out;
}

}  // namespace kvgen::cuda::host
