#include "cli/prompt_cache.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include "cli/format.h"
#include "common/error.h"
#include "common/hash.h"

namespace kvgen {

namespace {

constexpr char kMagic[8] = {'K', 'V', 'G', 'P', 'C', 'A', 'C', 'H'};
// 2: K rows of a quantized cache past the first kKvOffsetPositions carry key offsets (engine/kv_offset.h).
// 3: the --math mode that computed the rows.
constexpr uint32_t kVersion = 3;

struct Header {
    char magic[8];
    uint32_t version;
    uint32_t k_type, v_type;  // KvType
    uint32_t n_layers, n_kv_heads, head_dim;
    uint32_t n_tokens;
    uint32_t k_offset_dim0;  // the first dimension of the key offsets (head_dim: none)
    uint32_t math;           // MathMode
    uint32_t unused;
    uint64_t model;     // model_fingerprint
    double compute_ms;  // what computing the rows took
};

uint64_t hash_value(const GgufValue& v, uint64_t h) {
    const uint32_t type = uint32_t(v.type());
    h = fnv1a(&type, sizeof(type), h);
    if (v.type() == GgufValueType::STRING) return fnv1a(v.as_string().data(), v.as_string().size(), h);
    for (const GgufValue& item : v.items()) h = hash_value(item, h);
    return fnv1a(v.raw().data(), v.raw().size(), h);
}

// A checksum of the file's body, 8 bytes at a step (FNV-1a per byte would take a second per gigabyte).
uint64_t checksum(const char* p, size_t n) {
    uint64_t h = kFnvOffset ^ n;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        std::memcpy(&w, p + i, 8);
        h = (h ^ w) * 0x100000001b3ull;
        h ^= h >> 29;
    }
    return fnv1a(p + i, n - i, h);
}

// The whole file in one read; false with errno set when it cannot be read (ENOENT: it does not exist).
bool read_whole(const std::string& path, std::string* out) {
    // note: O_NONBLOCK, so that a FIFO given as the file is refused below instead of waiting for a writer.
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return false;
    struct stat st{};
    bool ok = ::fstat(fd, &st) == 0;
    if (ok && !S_ISREG(st.st_mode)) {
        errno = S_ISDIR(st.st_mode) ? EISDIR : EINVAL;
        ok = false;
    }
    if (ok) {
        out->resize(size_t(st.st_size));
        size_t done = 0;
        while (ok && done < out->size()) {
            const ssize_t got = ::read(fd, out->data() + done, out->size() - done);
            if (got < 0 && errno == EINTR) continue;
            if (got <= 0) {
                if (got == 0) errno = EIO;  // shorter than fstat said
                ok = false;
            } else {
                done += size_t(got);
            }
        }
    }
    const int e = errno;
    ::close(fd);
    errno = e;
    return ok;
}

// Whether bytes could be the start of a prompt-cache file (a file cut short in its magic included).
bool is_cache_start(const std::string& bytes) {
    return std::memcmp(bytes.data(), kMagic, std::min(bytes.size(), sizeof(kMagic))) == 0;
}

// The bytes a file of n tokens takes.
uint64_t file_bytes(const KvLayout& kv, uint64_t n) {
    const uint64_t heads = uint64_t(kv.n_layers) * uint64_t(kv.n_kv_heads);
    return sizeof(Header) + n * 4 + heads * n * uint64_t(kv.k_row_bytes() + kv.v_row_bytes()) + 8;
}

}  // namespace

uint64_t model_fingerprint(const Model& model) {
    const GgufFile& f = model.file;
    uint64_t h = kFnvOffset;
    for (const auto& [key, value] : f.metadata()) h = hash_value(value, fnv1a(key.data(), key.size(), h));
    for (const GgufTensor& t : f.tensors()) {
        h = fnv1a(t.name.data(), t.name.size(), h);
        h = fnv1a(&t.type, sizeof(t.type), h);
        h = fnv1a(t.ne, sizeof(t.ne), h);
        // note: three samples of the data tell apart two fine-tunes with the same shapes, without reading gigabytes.
        const uint64_t sample = std::min<uint64_t>(64, t.nbytes);
        for (uint64_t at : {uint64_t(0), (t.nbytes - sample) / 2, t.nbytes - sample}) h = fnv1a(t.data + at, sample, h);
    }
    return h;
}

std::string prompt_cache_foreign(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return "";  // none (or unreadable: writing it will say why)
    struct stat st{};
    std::string why;
    if (::fstat(fd, &st) == 0) {
        if (S_ISDIR(st.st_mode)) {
            why = "it is a directory";
        } else if (!S_ISREG(st.st_mode)) {
            why = "not a regular file";
        } else {
            std::string start(sizeof(kMagic), '\0');
            const ssize_t got = ::read(fd, start.data(), start.size());
            start.resize(size_t(std::max<ssize_t>(got, 0)));
            if (!is_cache_start(start)) why = "not a kvgen prompt-cache file";
        }
    }
    ::close(fd);
    return why;
}

PromptCacheLoad load_prompt_cache(const std::string& path, Backend& backend, uint64_t model, MathMode math,
                                  const std::vector<int32_t>& prompt) {
    PromptCacheLoad r;
    const auto t0 = std::chrono::steady_clock::now();
    std::string bytes;
    if (!read_whole(path, &bytes)) {
        if (errno == EISDIR || errno == EINVAL) {
            r.problem = prompt_cache_foreign(path);  // a directory or not a regular file: says which
        } else if (errno != ENOENT) {
            r.problem = fmt::format("cannot read it: {}", std::strerror(errno));
        }
        return r;
    }
    const KvLayout& kv = backend.kv_layout();
    Header h{};
    if (bytes.size() < sizeof(Header) + 8) {
        r.problem = "not a kvgen prompt-cache file (too short)";
        return r;
    }
    std::memcpy(&h, bytes.data(), sizeof(h));
    uint64_t sum = 0;
    std::memcpy(&sum, bytes.data() + bytes.size() - 8, 8);
    if (std::memcmp(h.magic, kMagic, sizeof(kMagic)) != 0) {
        r.problem = "not a kvgen prompt-cache file";
    } else if (h.version != kVersion) {
        r.problem = fmt::format("format version {} (this kvgen reads {})", h.version, kVersion);
    } else if (h.model != model) {
        r.problem = "written for another model";
    } else if (h.k_type != uint32_t(kv.k_type) || h.v_type != uint32_t(kv.v_type)) {
        r.problem = fmt::format("its KV cache type is {} (this run: {})",
                                h.k_type <= 3 && h.v_type <= 3 ? kv_types_name(KvType(h.k_type), KvType(h.v_type))
                                                               : std::string("unknown"),
                                kv.types_name());
    } else if (h.n_layers != uint32_t(kv.n_layers) || h.n_kv_heads != uint32_t(kv.n_kv_heads) ||
               h.head_dim != uint32_t(kv.head_dim)) {
        r.problem = "another head layout";
    } else if (h.math != uint32_t(math)) {
        r.problem = fmt::format("its rows were computed with --math {} (this run: {})",
                                h.math <= uint32_t(MathMode::F32) ? math_mode_name(MathMode(h.math)) : "unknown",
                                math_mode_name(math));
    } else if (h.k_offset_dim0 != uint32_t(std::min(kv.k_offset_dim0, kv.head_dim))) {
        // note: which dimensions carry key offsets follows from the context size (KvLayout::of)
        r.problem = "its quantized keys' offsets cover other dimensions (written with another --ctx-size)";
    } else if (bytes.size() != file_bytes(kv, h.n_tokens)) {
        r.problem = "truncated or damaged (its size does not match its header)";
    } else if (checksum(bytes.data(), bytes.size() - 8) != sum) {
        r.problem = "damaged (its checksum does not match)";
    }
    if (!r.problem.empty()) return r;

    const int n_file = int(h.n_tokens);
    const auto* tokens = reinterpret_cast<const int32_t*>(bytes.data() + sizeof(Header));
    int n = 0;
    const int limit = std::min(n_file, int(prompt.size()) - 1);
    while (n < limit && std::memcmp(&tokens[n], &prompt[size_t(n)], 4) == 0) ++n;
    n = std::min(n, backend.n_ctx());
    r.n_file = n_file;
    r.n_reused = n;
    if (n > 0) {
        // The first n rows of each layer-and-head, packed for Backend::kv_write.
        const int64_t heads = int64_t(kv.n_layers) * kv.n_kv_heads, kb = kv.k_row_bytes(), vb = kv.v_row_bytes();
        const char* k_file = bytes.data() + sizeof(Header) + size_t(n_file) * 4;
        const char* v_file = k_file + heads * n_file * kb;
        std::string k(size_t(heads * n * kb), '\0'), v(size_t(heads * n * vb), '\0');
        for (int64_t lh = 0; lh < heads; ++lh) {
            std::memcpy(k.data() + lh * n * kb, k_file + lh * n_file * kb, size_t(n * kb));
            std::memcpy(v.data() + lh * n * vb, v_file + lh * n_file * vb, size_t(n * vb));
        }
        backend.kv_write(k.data(), v.data(), n);
    } else {
        backend.kv_truncate(0);
    }
    r.saved_ms = n_file > 0 ? h.compute_ms * n / n_file : 0;
    r.load_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    return r;
}

void save_prompt_cache(const std::string& path, Backend& backend, uint64_t model, MathMode math,
                       const std::vector<int32_t>& tokens, double compute_ms) {
    const KvLayout& kv = backend.kv_layout();
    const int n = int(tokens.size());
    KVGEN_ASSERT(n <= kv.n_ctx);
    Header h{};
    std::memcpy(h.magic, kMagic, sizeof(kMagic));
    h.version = kVersion;
    h.k_type = uint32_t(kv.k_type);
    h.v_type = uint32_t(kv.v_type);
    h.n_layers = uint32_t(kv.n_layers);
    h.n_kv_heads = uint32_t(kv.n_kv_heads);
    h.head_dim = uint32_t(kv.head_dim);
    h.n_tokens = uint32_t(n);
    h.k_offset_dim0 = uint32_t(std::min(kv.k_offset_dim0, kv.head_dim));
    h.math = uint32_t(math);
    h.model = model;
    h.compute_ms = compute_ms;
    std::string bytes(size_t(file_bytes(kv, uint64_t(n))), '\0');
    char* p = bytes.data();
    std::memcpy(p, &h, sizeof(h));
    std::memcpy(p + sizeof(h), tokens.data(), size_t(n) * 4);
    const int64_t heads = int64_t(kv.n_layers) * kv.n_kv_heads;
    char* k = p + sizeof(h) + size_t(n) * 4;
    backend.kv_read(k, k + heads * n * kv.k_row_bytes(), n);
    const uint64_t sum = checksum(bytes.data(), bytes.size() - 8);
    std::memcpy(bytes.data() + bytes.size() - 8, &sum, 8);
    write_text_file(path, bytes);
}

}  // namespace kvgen
