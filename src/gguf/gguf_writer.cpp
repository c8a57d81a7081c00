#include "gguf/gguf_writer.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "common/error.h"

namespace kvgen {

namespace {

uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

class Sink {  // counts bytes when out is null, so one routine both measures and writes
public:
    explicit Sink(uint8_t* out) : out_(out) {}
    void bytes(const void* p, size_t n) {
        if (out_) std::memcpy(out_ + n_, p, n);
        n_ += n;
    }
    void skip(size_t n) { n_ += n; }
    template <typename T>
    void pod(T v) {
        bytes(&v, sizeof(T));
    }
    void str(const std::string& s) {
        pod<uint64_t>(s.size());
        bytes(s.data(), s.size());
    }
    uint64_t size() const { return n_; }

private:
    uint8_t* out_;
    uint64_t n_ = 0;
};

void put_payload(Sink& s, const GgufValue& v) {
    switch (v.type()) {
        case GgufValueType::U8: s.pod<uint8_t>(uint8_t(v.as_u64())); break;
        case GgufValueType::I8: s.pod<int8_t>(int8_t(v.as_i64())); break;
        case GgufValueType::U16: s.pod<uint16_t>(uint16_t(v.as_u64())); break;
        case GgufValueType::I16: s.pod<int16_t>(int16_t(v.as_i64())); break;
        case GgufValueType::U32: s.pod<uint32_t>(uint32_t(v.as_u64())); break;
        case GgufValueType::I32: s.pod<int32_t>(int32_t(v.as_i64())); break;
        case GgufValueType::U64: s.pod<uint64_t>(v.as_u64()); break;
        case GgufValueType::I64: s.pod<int64_t>(v.as_i64()); break;
        case GgufValueType::F32: s.pod<float>(float(v.as_f64())); break;
        case GgufValueType::F64: s.pod<double>(v.as_f64()); break;
        case GgufValueType::BOOL: s.pod<uint8_t>(v.as_bool() ? 1 : 0); break;
        case GgufValueType::STRING: s.str(v.as_string()); break;
        case GgufValueType::ARRAY:
            s.pod<uint32_t>(uint32_t(v.elem_type()));
            s.pod<uint64_t>(v.size());
            if (!v.raw().empty()) {
                s.bytes(v.raw().data(), v.raw().size());
            } else {
                for (const GgufValue& it : v.items()) put_payload(s, it);
            }
            break;
    }
}

}  // namespace

GgufWriter::GgufWriter(uint32_t alignment) : alignment_(alignment) {
    KVGEN_ASSERT(alignment != 0 && (alignment & (alignment - 1)) == 0);
    if (alignment != 32) set("general.alignment", GgufValue::uint(GgufValueType::U32, alignment));
}

void GgufWriter::set(const std::string& key, GgufValue value) {
    for (auto& kv : kv_) {
        if (kv.first == key) {
            kv.second = std::move(value);
            return;
        }
    }
    kv_.emplace_back(key, std::move(value));
}

void GgufWriter::add_tensor(const std::string& name, GgmlType type, const std::vector<int64_t>& ne) {
    const GgmlTypeInfo* info = ggml_type_info(type);
    KVGEN_ASSERT(info && !ne.empty() && ne.size() <= 4 && ne[0] % info->block_size == 0);
    GgufTensor t;
    t.name = name;
    t.type = uint32_t(type);
    t.n_dims = int(ne.size());
    int64_t rows = 1;
    for (size_t d = 0; d < ne.size(); ++d) {
        KVGEN_ASSERT(ne[d] > 0);
        t.ne[d] = ne[d];
        if (d > 0) rows *= ne[d];
    }
    t.nbytes = uint64_t(ggml_row_bytes(*info, ne[0])) * uint64_t(rows);
    t.offset = align_up(data_bytes_, alignment_);
    data_bytes_ = t.offset + t.nbytes;
    tensors_.push_back(std::move(t));
}

void GgufWriter::write_header(uint8_t* dst) const {
    Sink s(dst);
    s.bytes("GGUF", 4);
    s.pod<uint32_t>(3);
    s.pod<uint64_t>(tensors_.size());
    s.pod<uint64_t>(kv_.size());
    for (const auto& kv : kv_) {
        s.str(kv.first);
        s.pod<uint32_t>(uint32_t(kv.second.type()));
        put_payload(s, kv.second);
    }
    for (const GgufTensor& t : tensors_) {
        s.str(t.name);
        s.pod<uint32_t>(uint32_t(t.n_dims));
        for (int d = 0; d < t.n_dims; ++d) s.pod<uint64_t>(uint64_t(t.ne[d]));
        s.pod<uint32_t>(t.type);
        s.pod<uint64_t>(t.offset);
    }
}

uint64_t GgufWriter::header_bytes() const {
    Sink s(nullptr);
    s.bytes("GGUF", 4);
    s.pod<uint32_t>(3);
    s.pod<uint64_t>(0);
    s.pod<uint64_t>(0);
    for (const auto& kv : kv_) {
        s.str(kv.first);
        s.pod<uint32_t>(0);
        put_payload(s, kv.second);
    }
    for (const GgufTensor& t : tensors_) {
        s.str(t.name);
        s.pod<uint32_t>(0);
        s.skip(8 * size_t(t.n_dims));
        s.pod<uint32_t>(0);
        s.pod<uint64_t>(0);
    }
    return s.size();
}

uint64_t GgufWriter::data_offset() const { return align_up(header_bytes(), alignment_); }

uint64_t GgufWriter::total_size() const { return data_offset() + align_up(data_bytes_, alignment_); }

std::vector<uint8_t> GgufWriter::to_bytes(const FillFn& fill) const {
    std::vector<uint8_t> out(size_t(total_size()), 0);
    write_header(out.data());
    const uint64_t base = data_offset();
    for (size_t i = 0; i < tensors_.size(); ++i) fill(i, out.data() + base + tensors_[i].offset, tensors_[i].nbytes);
    return out;
}

void GgufWriter::write_file(const std::string& path, const FillFn& fill, int n_threads) const {
    const uint64_t size = total_size();
    std::string tmp = path + ".tmp.XXXXXX";
    const int fd = ::mkstemp(tmp.data());
    if (fd < 0) throw Error(fmt::format("{}: cannot create: {}", path, std::strerror(errno)));
    auto fail = [&](const char* what, int e) {
        ::close(fd);
        ::unlink(tmp.c_str());
        throw Error(fmt::format("{}: {}: {}", path, what, std::strerror(e)));
    };
    // Reserve the space first, so a full disk is an error here rather than a SIGBUS while filling the mapping.
    if (const int e = ::posix_fallocate(fd, 0, off_t(size)); e != 0) fail("cannot reserve space", e);
    void* map = ::mmap(nullptr, size_t(size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) fail("cannot map for writing", errno);
    auto* dst = static_cast<uint8_t*>(map);
    std::memset(dst, 0, size_t(data_offset()));
    write_header(dst);
    const uint64_t base = data_offset();
    std::atomic<size_t> next{0};
    auto worker = [&] {
        for (size_t i = next++; i < tensors_.size(); i = next++) {
            const GgufTensor& t = tensors_[i];
            fill(i, dst + base + t.offset, t.nbytes);
        }
    };
    std::vector<std::thread> pool;
    for (int k = 1; k < n_threads; ++k) pool.emplace_back(worker);
    worker();
    for (auto& th : pool) th.join();
    ::munmap(map, size_t(size));
    if (::fchmod(fd, 0644) != 0 || ::close(fd) != 0) {
        ::unlink(tmp.c_str());
        throw Error(fmt::format("{}: cannot finish writing: {}", path, std::strerror(errno)));
    }
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
        const int e = errno;
        ::unlink(tmp.c_str());
        throw Error(fmt::format("{}: cannot rename into place: {}", path, std::strerror(e)));
    }
}

}  // namespace kvgen
