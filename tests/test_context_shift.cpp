// Context shift: the moved keys are the model's keys rotated to their new positions (the CPU RoPE by the shift),
// values and kept positions are untouched, and a generation far longer than the context runs to the end without
// recomputing a kept token.
#include <cstring>

#include "cpu/cpu_backend.h"
#include "cpu/ops.h"
#include "engine/context_shift.h"
#include "engine/generator.h"
#include "engine/kv_cache.h"
#include "engine/kv_offset.h"
#include "model/weights.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

using namespace kvgen;

namespace {

std::unique_ptr<Backend> backend_for(const Model& model, int n_ctx, KvType kv) {
    Settings s;
    s.n_ctx = n_ctx;
    s.n_threads = 2;
    s.kv_type_k = s.kv_type_v = kv;
    return cpu::make_backend(model, s);
}

}  // namespace

TEST_CASE("a context shift moves each key to its new position by the CPU RoPE and leaves values as they were",
          "[context-shift]") {
    const Model model = Model::load(test::shared("testdata/ref/open-gqa-Q4_K_M.gguf"));
    const Config& c = model.config;
    const RopeFreqs rope = RopeFreqs::of(model);
    std::vector<int32_t> tokens;
    for (int i = 0; i < 40; ++i) tokens.push_back(int32_t(1 + (i * 131) % 4000));
    const int n = int(tokens.size()), n_discard = 12, m = n - n_discard;
    std::vector<char> f32_shifted;  // the f32 cache's keys after the shift, for the quantized ones to approach
    // note: with n_keep 5 the moved rows take some of the first kKvOffsetPositions positions, so a quantized K's
    // offsets change; with 20 they stay
    for (const int n_keep : {5, 20})
        for (KvType t : {KvType::F16, KvType::F32, KvType::Q8_0, KvType::Q4_0}) {
            if (n_keep == 20 && t == KvType::F16) continue;
            INFO(kv_type_name(t) << " n_keep " << n_keep);
            auto b = backend_for(model, 64, t);
            prefill(*b, tokens.data(), 0, n);
            const KvLayout& kv = b->kv_layout();
            REQUIRE(kv.k_offsets() == kv_type_quantized(t));
            const int64_t heads = int64_t(kv.n_layers) * kv.n_kv_heads, kb = kv.k_row_bytes(), vb = kv.v_row_bytes();
            std::vector<char> k0(size_t(heads * n * kb)), v0(size_t(heads * n * vb));
            b->kv_read(k0.data(), v0.data(), n);
            shift_kv_cache(*b, c, rope, n_keep, n_discard);
            REQUIRE(b->n_past() == m);
            std::vector<char> k1(size_t(heads * m * kb)), v1(size_t(heads * m * vb));
            b->kv_read(k1.data(), v1.data(), m);
            // the expected keys: each moved row decoded (its offset added back past the first rows), turned by
            // -n_discard positions with the CPU's own RoPE tables and rope(), and stored again: the new first rows as
            // they are, then the rest less the offset those new first rows give
            const int half = c.rope_dim / 2, hd = c.head_dim;
            std::vector<float> cs(static_cast<size_t>(half)), sn(static_cast<size_t>(half)),
                row(static_cast<size_t>(hd)), tmp(static_cast<size_t>(hd));
            std::vector<float> off_old(static_cast<size_t>(hd)), off_new(static_cast<size_t>(hd));
            cpu::rope_tables(cs.data(), sn.data(), -n_discard, 1, rope);
            std::vector<char> want(size_t(m * kb));
            int k_mismatch = 0, v_mismatch = 0;
            for (int64_t lh = 0; lh < heads; ++lh) {
                const char* k_head = k0.data() + lh * n * kb;
                if (kv.k_offsets()) kv_offset_of_rows(t, k_head, kb, hd, kv.k_offset_dim0, off_old.data());
                for (const bool past_first : {false, true}) {
                    if (past_first && kv.k_offsets())
                        kv_offset_of_rows(t, want.data(), kb, hd, kv.k_offset_dim0, off_new.data());
                    for (int p = 0; p < m; ++p) {
                        if ((p >= kKvOffsetPositions) != past_first) continue;
                        const int from = p < n_keep ? p : p + n_discard;
                        const char* k_old = k_head + from * kb;
                        if (p < n_keep) {
                            std::memcpy(want.data() + p * kb, k_old, size_t(kb));
                        } else {
                            const bool off = kv.k_offsets();
                            kv_decode_row(t, k_old, row.data(), hd,
                                          off && from >= kKvOffsetPositions ? off_old.data() : nullptr);
                            cpu::rope(row.data(), cs.data(), sn.data(), 1, 1, c);
                            kv_encode_row(t, row.data(), want.data() + p * kb, hd, tmp.data(),
                                          off && past_first ? off_new.data() : nullptr);
                        }
                    }
                }
                for (int p = 0; p < m; ++p) {
                    const int from = p < n_keep ? p : p + n_discard;
                    k_mismatch += std::memcmp(want.data() + p * kb, k1.data() + (lh * m + p) * kb, size_t(kb)) != 0;
                    v_mismatch +=
                        std::memcmp(v0.data() + (lh * n + from) * vb, v1.data() + (lh * m + p) * vb, size_t(vb)) != 0;
                }
            }
            CHECK(k_mismatch == 0);
            CHECK(v_mismatch == 0);
            if (t == KvType::F32) f32_shifted = k1;
            if (kv_type_quantized(t)) {
                // and what the shifted rows decode to (each past the first with the offset of the new first rows)
                // is the f32 cache's shifted keys, up to the type's rounding
                REQUIRE(f32_shifted.size() == size_t(heads * m * hd * 4));
                double err = 0, norm = 0;
                for (int64_t lh = 0; lh < heads; ++lh) {
                    const char* rows = k1.data() + lh * m * kb;
                    kv_offset_of_rows(t, rows, kb, hd, kv.k_offset_dim0, off_new.data());
                    for (int p = 0; p < m; ++p) {
                        kv_decode_row(t, rows + p * kb, row.data(), hd,
                                      p >= kKvOffsetPositions ? off_new.data() : nullptr);
                        const float* want_row = reinterpret_cast<const float*>(f32_shifted.data()) + (lh * m + p) * hd;
                        for (int j = 0; j < hd; ++j) {
                            err += double(row[size_t(j)] - want_row[j]) * (row[size_t(j)] - want_row[j]);
                            norm += double(want_row[j]) * want_row[j];
                        }
                    }
                }
                INFO("relative RMS error of the shifted keys against f32's: " << std::sqrt(err / norm));
                // measured 0.008 (q8_0) and 0.10-0.12 (q4_0); decoded without the offsets 0.13-0.14 and 0.16-0.19
                CHECK(std::sqrt(err / norm) < (t == KvType::Q8_0 ? 0.012 : 0.15));
            }
            // and a shifted f32 key is the key computed at its new position, up to float rounding: RoPE is a rotation
            if (t == KvType::F32) {
                auto direct = backend_for(model, 64, t);
                std::vector<int32_t> kept(tokens.begin(), tokens.begin() + n_keep);
                kept.insert(kept.end(), tokens.begin() + n_keep + n_discard, tokens.end());
                // only layer 0's keys depend on nothing but the token and its position
                prefill(*direct, kept.data(), 0, m);
                std::vector<char> kd(size_t(heads * m * kb)), vd(size_t(heads * m * vb));
                direct->kv_read(kd.data(), vd.data(), m);
                double max_err = 0, max_mag = 0;
                for (int h = 0; h < kv.n_kv_heads; ++h)
                    for (int64_t e = 0; e < int64_t(m) * hd; ++e) {
                        const float a = reinterpret_cast<const float*>(k1.data() + h * m * kb)[e];
                        const float d = reinterpret_cast<const float*>(kd.data() + h * m * kb)[e];
                        max_err = std::max(max_err, double(std::fabs(a - d)));
                        max_mag = std::max(max_mag, double(std::fabs(d)));
                    }
                INFO("layer 0 keys: shifted vs computed at the new positions differ by up to " << max_err << " of "
                                                                                               << max_mag);
                CHECK(max_err <= 1e-5 * max_mag);
            }
        }
}

TEST_CASE("with -c 128 a 600-token generation shifts several times, runs to the end and never recomputes a kept "
          "token",
          "[context-shift]") {
    const Model model = Model::load(test::shared("testdata/ref/open-gqa-Q4_K_M.gguf"));
    const Tokenizer tok = Tokenizer::from_gguf(model.file);
    const RopeFreqs rope = RopeFreqs::of(model);
    const auto prompt = tok.encode("A long story begins here, and it goes on for much longer than the context.", true);
    for (KvType t : {KvType::F16, KvType::Q4_0}) {
        INFO(kv_type_name(t));
        auto b = backend_for(model, 128, t);
        GenerateOptions g;
        g.n_predict = 600;
        g.sampler.temp = 0.0f;
        g.n_keep = 4;
        g.shift_cache = [&](int n_keep, int n_discard) {
            CHECK(n_keep == 4);
            shift_kv_cache(*b, model.config, rope, n_keep, n_discard);
        };
        const GenerateStats st =
            Generator(*b).run(prompt, g, [](int32_t, const float*) { return true; }, nullptr, model.config.n_vocab);
        CHECK(st.tokens.size() == 600);
        CHECK(st.stop == "n_predict");
        CHECK(st.n_shifts >= 8);
        // every token went through the forward pass once: the prompt, then each generated token but the last
        CHECK(st.n_evaluated == int(prompt.size()) + 599);
        CHECK(b->n_past() < 128);
    }
    // without a shift, the same run stops at the context
    auto b = backend_for(model, 128, KvType::F16);
    GenerateOptions g;
    g.n_predict = 600;
    g.sampler.temp = 0.0f;
    const GenerateStats st =
        Generator(*b).run(prompt, g, [](int32_t, const float*) { return true; }, nullptr, model.config.n_vocab);
    CHECK(st.stop == "context");
    CHECK(int(prompt.size() + st.tokens.size()) == 128);
}
