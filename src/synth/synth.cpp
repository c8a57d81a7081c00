#include "synth/synth.h"

#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "common/error.h"
#include "common/half.h"
#include "gguf/ggml_types.h"
#include "model/quant_blocks.h"

namespace kvgen {

namespace {

class Rng {  // splitmix64: fast, seedable, good enough for random weights
public:
    explicit Rng(uint64_t seed) : s_(seed) {}
    uint64_t next() {
        uint64_t z = (s_ += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }
    void bytes(uint8_t* p, size_t n) {
        size_t i = 0;
        for (; i + 8 <= n; i += 8) {
            const uint64_t r = next();
            std::memcpy(p + i, &r, 8);
        }
        if (i < n) {
            const uint64_t r = next();
            std::memcpy(p + i, &r, n - i);
        }
    }
    float uniform() { return float(next() >> 40) * (1.0f / 16777216.0f); }  // [0, 1)
    int range(int lo, int hi) { return lo + int(next() % uint64_t(hi - lo + 1)); }

private:
    uint64_t s_;
};

uint16_t f16(float x) { return fp32_to_fp16(x); }

// Per-block scale jitter in [0.75, 1.25) so blocks differ, as real weights do.
float jitter(Rng& r) { return 0.75f + 0.5f * r.uniform(); }

// Symmetric types whose quants are not centred (q - 8 in -8..7 has mean -0.5) get a random sign on each scale, so
// the weights average to zero as real ones do.
float sign(Rng& r) { return (r.next() & 1) ? 1.0f : -1.0f; }

// Uniform quants have these standard deviations: 4 bits 4.61, 5 bits 9.23, 8 bits 73.9, 2 bits 1.118, 3 bits 2.29,
// 6 bits 18.5; scales are chosen so that d * scale * std(q) is about sigma.
template <typename Block, typename Fn>
void fill_blocks(uint8_t* dst, int64_t n_blocks, uint64_t seed, Fn&& set_scales) {
    Rng r(seed);
    auto* b = reinterpret_cast<Block*>(dst);
    r.bytes(dst, size_t(n_blocks) * sizeof(Block));
    for (int64_t i = 0; i < n_blocks; ++i) set_scales(b[i], r);
}

void fill_k4_scales(uint8_t* out, Rng& r) {
    uint8_t sc[8], m[8];
    for (int j = 0; j < 8; ++j) sc[j] = m[j] = uint8_t(r.range(32, 63));
    k4_pack_scales(sc, m, out);
}

}  // namespace

const std::vector<SynthShape>& synth_shapes() {
    static const std::vector<SynthShape> shapes = {
        {"tiny", 256, 2, 4, 2, 512, 2048, 10000.0f, false},
        {"smollm2-135m", 576, 30, 9, 3, 1536, 8192, 100000.0f, true},
        {"tinyllama-1.1b", 2048, 22, 32, 4, 5632, 2048, 10000.0f, false},
        {"llama2-7b", 4096, 32, 32, 32, 11008, 4096, 10000.0f, false},
        {"llama2-13b", 5120, 40, 40, 40, 13824, 4096, 10000.0f, false},
    };
    return shapes;
}

bool synth_shape(const std::string& name, SynthShape* out) {
    for (const SynthShape& s : synth_shapes()) {
        if (s.name == name) {
            *out = s;
            return true;
        }
    }
    return false;
}

std::vector<std::string> synth_types() {
    return {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
            "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q4_K_M"};
}

void synth_random_rows(GgmlType type, uint8_t* dst, int64_t rows, int64_t cols, float sigma, uint64_t seed) {
    const GgmlTypeInfo* info = ggml_type_info(type);
    KVGEN_ASSERT(info && info->supported && cols % info->block_size == 0);
    const int64_t n = rows * cols;
    const int64_t nb = n / info->block_size;
    switch (type) {
        case GgmlType::F32:
        case GgmlType::F16:
        case GgmlType::BF16: {
            // note: a table of 4096 uniform values per tensor keeps this at memory speed for 26 GB files.
            Rng r(seed);
            float table[4096];
            for (float& t : table) t = (2.0f * r.uniform() - 1.0f) * sigma * 1.7320508f;
            uint16_t table16[4096];
            for (int k = 0; k < 4096; ++k)
                table16[k] = type == GgmlType::F16 ? fp32_to_fp16(table[k]) : fp32_to_bf16(table[k]);
            for (int64_t j = 0; j < n;) {
                uint64_t bits = r.next();
                for (int k = 0; k < 5 && j < n; ++k, ++j, bits >>= 12) {
                    const unsigned idx = unsigned(bits & 4095u);
                    if (type == GgmlType::F32) std::memcpy(dst + 4 * j, &table[idx], 4);
                    else std::memcpy(dst + 2 * j, &table16[idx], 2);
                }
            }
            return;
        }
        case GgmlType::Q4_0:
            return fill_blocks<BlockQ4_0>(dst, nb, seed, [&](BlockQ4_0& b, Rng& r) {
                b.d = f16(sign(r) * sigma / 4.61f * jitter(r));
            });
        case GgmlType::Q4_1:
            return fill_blocks<BlockQ4_1>(dst, nb, seed, [&](BlockQ4_1& b, Rng& r) {
                const float d = sigma / 4.61f * jitter(r);
                b.d = f16(d);
                b.m = f16(-7.5f * d);
            });
        case GgmlType::Q5_0:
            return fill_blocks<BlockQ5_0>(dst, nb, seed, [&](BlockQ5_0& b, Rng& r) {
                b.d = f16(sign(r) * sigma / 9.23f * jitter(r));
            });
        case GgmlType::Q5_1:
            return fill_blocks<BlockQ5_1>(dst, nb, seed, [&](BlockQ5_1& b, Rng& r) {
                const float d = sigma / 9.23f * jitter(r);
                b.d = f16(d);
                b.m = f16(-15.5f * d);
            });
        case GgmlType::Q8_0:
            return fill_blocks<BlockQ8_0>(dst, nb, seed, [&](BlockQ8_0& b, Rng& r) {
                b.d = f16(sign(r) * sigma / 73.9f * jitter(r));
            });
        case GgmlType::Q2_K:
            return fill_blocks<BlockQ2_K>(dst, nb, seed, [&](BlockQ2_K& b, Rng& r) {
                for (uint8_t& s : b.scales) {
                    const int sc = r.range(8, 15);
                    s = uint8_t(sc | (sc << 4));  // min = scale: centres q in 0..3 around 1.5 with dmin = 1.5 d
                }
                const float d = sigma / (11.5f * 1.118f) * jitter(r);
                b.d = f16(d);
                b.dmin = f16(1.5f * d);
            });
        case GgmlType::Q3_K:
            return fill_blocks<BlockQ3_K>(dst, nb, seed, [&](BlockQ3_K& b, Rng& r) {
                uint8_t sc[16];
                for (uint8_t& s : sc) s = uint8_t((r.next() & 1) ? r.range(48, 63) : r.range(1, 16));  // |s - 32| in 16..31
                q3k_pack_scales(sc, b.scales);
                b.d = f16(sigma / (23.5f * 2.29f) * jitter(r));
            });
        case GgmlType::Q4_K:
            return fill_blocks<BlockQ4_K>(dst, nb, seed, [&](BlockQ4_K& b, Rng& r) {
                fill_k4_scales(b.scales, r);
                const float d = sigma / (47.5f * 4.61f) * jitter(r);
                b.d = f16(d);
                b.dmin = f16(7.5f * d);
            });
        case GgmlType::Q5_K:
            return fill_blocks<BlockQ5_K>(dst, nb, seed, [&](BlockQ5_K& b, Rng& r) {
                fill_k4_scales(b.scales, r);
                const float d = sigma / (47.5f * 9.23f) * jitter(r);
                b.d = f16(d);
                b.dmin = f16(15.5f * d);
            });
        case GgmlType::Q6_K:
            return fill_blocks<BlockQ6_K>(dst, nb, seed, [&](BlockQ6_K& b, Rng& r) {
                for (int8_t& s : b.scales) s = int8_t(sign(r) * float(r.range(16, 63)));
                b.d = f16(sigma / (39.5f * 18.5f) * jitter(r));
            });
        default: break;
    }
    KVGEN_ASSERT(false);
}

namespace {

// llama.cpp's choice for Q4_K_M: attn_v and ffn_down in Q6_K for the first and last eighth of the layers and every
// third one between.
bool more_bits(int l, int n_layers) {
    return l < n_layers / 8 || l >= 7 * n_layers / 8 || (l - n_layers / 8) % 3 == 2;
}

// A k-quant needs rows that are a multiple of 256; like llama.cpp, fall back to a 32-block type of similar size.
GgmlType fit_type(GgmlType t, int64_t cols) {
    if (cols % ggml_type_info(t)->block_size == 0) return t;
    switch (t) {
        case GgmlType::Q2_K:
        case GgmlType::Q3_K:
        case GgmlType::Q4_K: return GgmlType::Q5_0;
        case GgmlType::Q5_K: return GgmlType::Q5_1;
        default: return GgmlType::Q8_0;
    }
}

uint64_t tensor_seed(uint64_t seed, size_t i) { return seed * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull * (i + 1); }

}  // namespace

GgufWriter synth_layout(const SynthOptions& opt, const GgufFile& vocab) {
    const SynthShape& s = opt.shape;
    if (s.n_embd <= 0 || s.n_layers <= 0 || s.n_heads <= 0 || s.n_kv_heads <= 0 || s.n_ff <= 0 || s.n_ctx <= 0)
        throw Error("synth: every dimension must be positive");
    if (s.n_embd % s.n_heads != 0 || s.n_heads % s.n_kv_heads != 0)
        throw Error(fmt::format("synth: n_embd {} must be a multiple of n_heads {}, and n_heads of n_kv_heads {}",
                                s.n_embd, s.n_heads, s.n_kv_heads));
    if ((s.n_embd / s.n_heads) % 2 != 0) throw Error("synth: head_dim must be even");
    const bool mix = opt.type == "Q4_K_M";
    GgmlType base = GgmlType::Q4_K;
    if (!mix && (!ggml_type_from_name(opt.type, &base) || !ggml_type_supported(uint32_t(base))))
        throw Error(fmt::format("synth: unknown type '{}' (one of: {})", opt.type, fmt::join(synth_types(), ", ")));
    if (s.n_embd % 32 != 0 || s.n_ff % 32 != 0)
        throw Error(fmt::format("synth: n_embd {} and n_ff {} must be multiples of 32", s.n_embd, s.n_ff));

    const GgufValue* tokens = vocab.find("tokenizer.ggml.tokens");
    if (!tokens || !tokens->is_array() || tokens->size() == 0)
        throw Error(fmt::format("{}: no tokenizer.ggml.tokens to copy a vocabulary from", vocab.path()));
    const int64_t n_vocab = int64_t(tokens->size());

    GgufWriter w;
    auto u32 = [](uint64_t v) { return GgufValue::uint(GgufValueType::U32, v); };
    auto f32 = [](double v) { return GgufValue::real(GgufValueType::F32, v); };
    w.set("general.architecture", GgufValue::string("llama"));
    w.set("general.name", GgufValue::string(fmt::format("synthetic {} {}", s.name.empty() ? "custom" : s.name,
                                                        opt.type)));
    // general.file_type as llama.cpp's quantizer records it, for the types whose files here are what it makes
    // (one type throughout, or Q4_K_M's mixture); the k-quants alone have none.
    const std::pair<const char*, int> file_types[] = {{"F32", 0},  {"F16", 1},  {"BF16", 32}, {"Q4_0", 2},
                                                      {"Q4_1", 3}, {"Q5_0", 8}, {"Q5_1", 9},   {"Q8_0", 7},
                                                      {"Q6_K", 18}, {"Q4_K_M", 15}};
    for (const auto& [name, value] : file_types)
        if (opt.type == name) w.set("general.file_type", u32(uint64_t(value)));
    w.set("llama.context_length", u32(uint64_t(s.n_ctx)));
    w.set("llama.embedding_length", u32(uint64_t(s.n_embd)));
    w.set("llama.block_count", u32(uint64_t(s.n_layers)));
    w.set("llama.feed_forward_length", u32(uint64_t(s.n_ff)));
    w.set("llama.attention.head_count", u32(uint64_t(s.n_heads)));
    w.set("llama.attention.head_count_kv", u32(uint64_t(s.n_kv_heads)));
    w.set("llama.rope.dimension_count", u32(uint64_t(s.n_embd / s.n_heads)));
    w.set("llama.rope.freq_base", f32(s.rope_base));
    w.set("llama.attention.layer_norm_rms_epsilon", f32(1e-5));
    w.set("llama.vocab_size", u32(uint64_t(n_vocab)));
    for (const auto& [key, v] : vocab.metadata())
        if (key.rfind("tokenizer.", 0) == 0) w.set(key, v);

    const int64_t n_embd = s.n_embd, n_ff = s.n_ff;
    const int64_t head_dim = n_embd / s.n_heads, kv_dim = head_dim * s.n_kv_heads;
    size_t overrides_used = 0;
    auto add = [&](const std::string& name, GgmlType t, std::vector<int64_t> ne) {
        for (const auto& [tensor, type_name] : opt.tensor_types) {
            if (tensor != name) continue;
            if (!ggml_type_from_name(type_name, &t))
                throw Error(fmt::format("synth: --tensor-type {}: unknown type '{}'", name, type_name));
            if (ne[0] % ggml_type_info(t)->block_size != 0)
                throw Error(fmt::format("synth: --tensor-type {}: rows of {} are not whole {} blocks", name, ne[0],
                                        type_name));
            ++overrides_used;
        }
        w.add_tensor(name, t, ne);
    };
    auto matrix = [&](const std::string& name, int64_t cols, int64_t rows, GgmlType t) {
        add(name, fit_type(t, cols), {cols, rows});
    };
    const GgmlType body = mix ? GgmlType::Q4_K : base;
    matrix("token_embd.weight", n_embd, n_vocab, body);
    add("output_norm.weight", GgmlType::F32, {n_embd});
    if (!s.tied) matrix("output.weight", n_embd, n_vocab, mix ? GgmlType::Q6_K : base);
    for (int l = 0; l < s.n_layers; ++l) {
        const std::string p = fmt::format("blk.{}.", l);
        const GgmlType wide = mix && more_bits(l, s.n_layers) ? GgmlType::Q6_K : body;
        add(p + "attn_norm.weight", GgmlType::F32, {n_embd});
        matrix(p + "attn_q.weight", n_embd, n_embd, body);
        matrix(p + "attn_k.weight", n_embd, kv_dim, body);
        matrix(p + "attn_v.weight", n_embd, kv_dim, wide);
        matrix(p + "attn_output.weight", n_embd, n_embd, body);
        add(p + "ffn_norm.weight", GgmlType::F32, {n_embd});
        matrix(p + "ffn_gate.weight", n_embd, n_ff, body);
        matrix(p + "ffn_up.weight", n_embd, n_ff, body);
        matrix(p + "ffn_down.weight", n_ff, n_embd, wide);
    }
    if (overrides_used != opt.tensor_types.size())
        throw Error("synth: a --tensor-type names a tensor this shape does not have");
    return w;
}

void synth_fill(const SynthOptions& opt, const GgufTensor& info, size_t i, uint8_t* dst, uint64_t nbytes) {
    const uint64_t seed = tensor_seed(opt.seed, i);
    if (!ggml_type_supported(info.type)) {  // a --tensor-type kvgen cannot compute with: any bytes will do
        Rng(seed).bytes(dst, size_t(nbytes));
        return;
    }
    if (info.n_dims == 1 && info.type == uint32_t(GgmlType::F32)) {  // norm weights: near 1
        Rng r(seed);
        float* y = reinterpret_cast<float*>(dst);
        for (int64_t j = 0; j < info.ne[0]; ++j) y[j] = 0.9f + 0.2f * r.uniform();
        return;
    }
    const float sigma = info.n_dims == 1 ? 0.5f : 1.0f / std::sqrt(float(info.ne[0]));
    synth_random_rows(GgmlType(info.type), dst, info.n_elements() / info.ne[0], info.ne[0], sigma, seed);
}

}  // namespace kvgen
