#include "engine/context_shift.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/error.h"
#include "engine/kv_cache.h"
#include "engine/kv_offset.h"
#include "model/config.h"

namespace kvgen {

void rope_rotate_rows(float* x, int n, int delta, const Config& c, const RopeFreqs& rope) {
    const int half = c.rope_dim / 2;
    const double* factors = rope.factors.empty() ? nullptr : rope.factors.data();
    std::vector<float> cs(static_cast<size_t>(half)), sn(static_cast<size_t>(half));
    for (int j = 0; j < half; ++j) {
        const double theta = rope_theta(delta, j, rope.inv_freq.data(), factors, rope.pos_div);
        cs[size_t(j)] = float(std::cos(theta));
        sn[size_t(j)] = float(std::sin(theta));
    }
    for (int i = 0; i < n; ++i) {
        float* v = x + int64_t(i) * c.head_dim;
        for (int j = 0; j < half; ++j) {
            const float a = v[2 * j], b = v[2 * j + 1];
            v[2 * j] = a * cs[size_t(j)] - b * sn[size_t(j)];
            v[2 * j + 1] = a * sn[size_t(j)] + b * cs[size_t(j)];
        }
    }
}

void shift_kv_cache(Backend& backend, const Config& c, const RopeFreqs& rope, int n_keep, int n_discard) {
    const int n = backend.n_past();
    KVGEN_ASSERT(n_keep >= 0 && n_discard > 0 && n_keep + n_discard <= n);
    const KvLayout& kv = backend.kv_layout();
    const int64_t heads = int64_t(kv.n_layers) * kv.n_kv_heads, kb = kv.k_row_bytes(), vb = kv.v_row_bytes();
    const int n_after = n - n_keep - n_discard, hd = kv.head_dim;
    std::vector<char> k(size_t(heads * n * kb)), v(size_t(heads * n * vb));
    backend.kv_read(k.data(), v.data(), n);
    // The positions that stay, packed for kv_write: [heads][n - n_discard][row bytes].
    const int m = n - n_discard;
    std::vector<char> k2(size_t(heads * m * kb)), v2(size_t(heads * m * vb));
    std::vector<float> rows(size_t(n_after) * size_t(hd)), tmp(static_cast<size_t>(hd));
    // note: with key offsets (kv_offset.h), a row past the first kKvOffsetPositions holds k - offset: it is decoded
    // with the offset of the rows before the shift and encoded with that of the rows after it, which differ when
    // moved rows take some of the first positions.
    const bool offsets = kv.k_offsets();
    std::vector<float> off_old(static_cast<size_t>(hd)), off_new(static_cast<size_t>(hd));
    auto offset_of = [&](const char* rows0, int n_rows, std::vector<float>& off) -> const float* {
        if (!offsets || n_rows < kKvOffsetPositions) return nullptr;
        kv_offset_of_rows(kv.k_type, rows0, kb, hd, kv.k_offset_dim0, off.data());
        return off.data();
    };
    for (int64_t lh = 0; lh < heads; ++lh) {
        const char* ks = k.data() + lh * n * kb;
        const char* vs = v.data() + lh * n * vb;
        char* kd = k2.data() + lh * m * kb;
        char* vd = v2.data() + lh * m * vb;
        std::memcpy(kd, ks, size_t(n_keep * kb));
        std::memcpy(vd, vs, size_t(n_keep * vb));
        std::memcpy(vd + n_keep * vb, vs + (n_keep + n_discard) * vb, size_t(n_after * vb));
        const float* old_off = offset_of(ks, n, off_old);
        for (int t = 0; t < n_after; ++t) {
            const int from = n_keep + n_discard + t;
            kv_decode_row(kv.k_type, ks + from * kb, rows.data() + int64_t(t) * hd, hd,
                          from >= kKvOffsetPositions ? old_off : nullptr);
        }
        rope_rotate_rows(rows.data(), n_after, -n_discard, c, rope);
        // the new first rows, then the offset they give, then the rows past them
        const int first = std::clamp(kKvOffsetPositions - n_keep, 0, n_after);
        for (int t = 0; t < first; ++t)
            kv_encode_row(kv.k_type, rows.data() + int64_t(t) * hd, kd + (n_keep + t) * kb, hd, tmp.data());
        const float* new_off = offset_of(kd, m, off_new);
        for (int t = first; t < n_after; ++t)
            kv_encode_row(kv.k_type, rows.data() + int64_t(t) * hd, kd + (n_keep + t) * kb, hd, tmp.data(), new_off);
    }
    backend.kv_write(k2.data(), v2.data(), m);
}

}  // namespace kvgen
