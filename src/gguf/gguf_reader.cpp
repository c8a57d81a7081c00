// The strict GGUF parser. Every length, count and offset is checked against the bytes that remain before anything
// is allocated or read, with 64-bit arithmetic that cannot overflow; each failure names the file and byte offset.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "common/error.h"
#include "gguf/gguf.h"

namespace kvgen {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "kvgen reads GGUF (little-endian) in place");

namespace {

constexpr int kMaxArrayDepth = 8;
constexpr uint64_t kMaxDims = 4;

class Cursor {
public:
    Cursor(const uint8_t* base, uint64_t size, const std::string& name) : base_(base), size_(size), name_(name) {}

    uint64_t offset() const { return off_; }
    uint64_t remaining() const { return size_ - off_; }

    [[noreturn]] void fail(const std::string& what, uint64_t at) const {
        throw Error(fmt::format("{}: {} (offset {})", name_, what, at));
    }

    void need(uint64_t n, const char* what) const {
        if (n > remaining())
            fail(fmt::format("file ends inside {} ({} bytes needed, {} left)", what, n, remaining()), off_);
    }

    template <typename T>
    T read(const char* what) {
        need(sizeof(T), what);
        T v;
        std::memcpy(&v, base_ + off_, sizeof(T));
        off_ += sizeof(T);
        return v;
    }

    std::string read_string(const char* what) {
        const uint64_t at = off_;
        const uint64_t len = read<uint64_t>(what);
        if (len > remaining())
            fail(fmt::format("{} length {} runs past the end of the file ({} bytes left)", what, len, remaining()), at);
        std::string s(reinterpret_cast<const char*>(base_ + off_), size_t(len));
        off_ += len;
        return s;
    }

    const uint8_t* take(uint64_t n, const char* what) {
        need(n, what);
        const uint8_t* p = base_ + off_;
        off_ += n;
        return p;
    }

private:
    const uint8_t* base_;
    uint64_t size_;
    uint64_t off_ = 0;
    const std::string& name_;
};

GgufValueType read_type(Cursor& c, const char* what) {
    const uint64_t at = c.offset();
    const uint32_t t = c.read<uint32_t>(what);
    if (t >= kGgufValueTypeCount) c.fail(fmt::format("unknown {} {}", what, t), at);
    return GgufValueType(t);
}

// The fewest bytes one serialized value of this type can occupy: bounds an array's count before it is believed.
uint64_t min_value_size(GgufValueType t) {
    if (t == GgufValueType::STRING) return 8;   // length
    if (t == GgufValueType::ARRAY) return 12;   // element type + count
    return gguf_scalar_size(t);
}

GgufValue read_value(Cursor& c, GgufValueType t, int depth) {
    switch (t) {
        case GgufValueType::U8: return GgufValue::uint(t, c.read<uint8_t>("a u8 value"));
        case GgufValueType::U16: return GgufValue::uint(t, c.read<uint16_t>("a u16 value"));
        case GgufValueType::U32: return GgufValue::uint(t, c.read<uint32_t>("a u32 value"));
        case GgufValueType::U64: return GgufValue::uint(t, c.read<uint64_t>("a u64 value"));
        case GgufValueType::I8: return GgufValue::sint(t, c.read<int8_t>("an i8 value"));
        case GgufValueType::I16: return GgufValue::sint(t, c.read<int16_t>("an i16 value"));
        case GgufValueType::I32: return GgufValue::sint(t, c.read<int32_t>("an i32 value"));
        case GgufValueType::I64: return GgufValue::sint(t, c.read<int64_t>("an i64 value"));
        case GgufValueType::F32: return GgufValue::real(t, c.read<float>("an f32 value"));
        case GgufValueType::F64: return GgufValue::real(t, c.read<double>("an f64 value"));
        case GgufValueType::BOOL: {
            const uint64_t at = c.offset();
            const uint8_t b = c.read<uint8_t>("a bool value");
            if (b > 1) c.fail(fmt::format("bool value {} is neither 0 nor 1", b), at);
            return GgufValue::boolean(b != 0);
        }
        case GgufValueType::STRING: return GgufValue::string(c.read_string("string"));
        case GgufValueType::ARRAY: break;
    }
    const uint64_t at = c.offset();
    if (depth >= kMaxArrayDepth) c.fail(fmt::format("arrays nested deeper than {}", kMaxArrayDepth), at);
    const GgufValueType elem = read_type(c, "array element type");
    const uint64_t count_at = c.offset();
    const uint64_t count = c.read<uint64_t>("an array count");
    const uint64_t min_size = min_value_size(elem);
    if (count > c.remaining() / min_size)
        c.fail(fmt::format("array of {} {} values cannot fit in the {} bytes left", count,
                           gguf_value_type_name(elem), c.remaining()),
               count_at);
    if (elem != GgufValueType::STRING && elem != GgufValueType::ARRAY) {
        const uint64_t nbytes = count * min_size;
        const uint8_t* p = c.take(nbytes, "array data");
        if (elem == GgufValueType::BOOL) {
            for (uint64_t i = 0; i < count; ++i)
                if (p[i] > 1) c.fail(fmt::format("bool array element {} is {}", i, p[i]), count_at + 8 + i);
        }
        return GgufValue::numeric_array(elem, std::vector<uint8_t>(p, p + nbytes), count);
    }
    std::vector<GgufValue> items;
    items.reserve(size_t(count));
    for (uint64_t i = 0; i < count; ++i) {
        if (elem == GgufValueType::ARRAY) {
            items.push_back(read_value(c, GgufValueType::ARRAY, depth + 1));
        } else {
            items.push_back(GgufValue::string(c.read_string("string")));
        }
    }
    return GgufValue::array_of(elem, std::move(items));
}

// a * b, or false when it does not fit in int64.
bool mul_ok(uint64_t a, uint64_t b, uint64_t* out) {
    if (a != 0 && b > uint64_t(std::numeric_limits<int64_t>::max()) / a) return false;
    *out = a * b;
    return true;
}

}  // namespace

GgufFile GgufFile::open(const std::string& path) {
    // note: O_NONBLOCK, so that a FIFO is refused below instead of waiting for a writer (the file is mapped)
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) throw Error(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
        const int e = errno;
        ::close(fd);
        throw Error(fmt::format("{}: cannot stat: {}", path, std::strerror(e)));
    }
    if (S_ISDIR(st.st_mode)) {
        ::close(fd);
        throw Error(fmt::format("{}: is a directory, not a GGUF file", path));
    }
    if (!S_ISREG(st.st_mode)) {
        ::close(fd);
        throw Error(fmt::format("{}: not a regular file", path));
    }
    if (st.st_size == 0) {
        ::close(fd);
        throw Error(fmt::format("{}: empty file, not a GGUF file (offset 0)", path));
    }
    void* map = ::mmap(nullptr, size_t(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
    const int e = errno;
    ::close(fd);
    if (map == MAP_FAILED) throw Error(fmt::format("{}: cannot map: {}", path, std::strerror(e)));

    GgufFile f;
    f.path_ = path;
    f.map_ = map;
    f.base_ = static_cast<const uint8_t*>(map);
    f.size_ = uint64_t(st.st_size);
    f.parse_all();
    return f;
}

GgufFile GgufFile::parse(std::vector<uint8_t> bytes, std::string name) {
    GgufFile f;
    f.path_ = std::move(name);
    f.owned_ = std::move(bytes);
    f.base_ = f.owned_.data();
    f.size_ = f.owned_.size();
    f.parse_all();
    return f;
}

GgufFile::GgufFile(GgufFile&& o) noexcept { *this = std::move(o); }

GgufFile& GgufFile::operator=(GgufFile&& o) noexcept {
    if (this != &o) {
        release();
        path_ = std::move(o.path_);
        base_ = o.base_;
        size_ = o.size_;
        map_ = o.map_;
        owned_ = std::move(o.owned_);  // the buffer moves with its pointer, so base_ and tensor data stay valid
        version_ = o.version_;
        alignment_ = o.alignment_;
        data_offset_ = o.data_offset_;
        kv_ = std::move(o.kv_);
        kv_index_ = std::move(o.kv_index_);
        tensors_ = std::move(o.tensors_);
        tensor_index_ = std::move(o.tensor_index_);
        o.map_ = nullptr;
        o.base_ = nullptr;
        o.size_ = 0;
    }
    return *this;
}

GgufFile::~GgufFile() { release(); }

void GgufFile::release() {
    if (map_) ::munmap(map_, size_t(size_));
    map_ = nullptr;
}

const GgufValue* GgufFile::find(std::string_view key) const {
    auto it = kv_index_.find(std::string(key));
    return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

const GgufTensor* GgufFile::tensor(std::string_view name) const {
    auto it = tensor_index_.find(std::string(name));
    return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

void GgufFile::parse_all() {
    Cursor c(base_, size_, path_);

    // Header.
    if (size_ < 4) c.fail(fmt::format("file of {} bytes is too small to be GGUF", size_), 0);
    if (std::memcmp(base_, "GGUF", 4) != 0) {
        std::string magic;
        for (int i = 0; i < 4; ++i) {
            const char ch = char(base_[i]);
            magic += (ch >= 0x20 && ch < 0x7f) ? std::string(1, ch) : fmt::format("\\x{:02x}", base_[i]);
        }
        c.fail(fmt::format("not a GGUF file (magic '{}', expected 'GGUF')", magic), 0);
    }
    c.take(4, "the magic");
    version_ = c.read<uint32_t>("the version");
    if (version_ == 1) c.fail("GGUF version 1 is not supported (only versions 2 and 3 are)", 4);
    if (version_ != 2 && version_ != 3) {
        if ((version_ & 0xffffu) == 0)
            c.fail(fmt::format("GGUF version {:#x} looks byte-swapped (big-endian files are not supported)", version_), 4);
        c.fail(fmt::format("GGUF version {} is not supported (only versions 2 and 3 are)", version_), 4);
    }
    const uint64_t n_tensors = c.read<uint64_t>("the tensor count");
    const uint64_t n_kv = c.read<uint64_t>("the metadata count");
    // Each tensor info takes at least 24 bytes, each key/value pair at least 13.
    if (n_tensors > c.remaining() / 24)
        c.fail(fmt::format("tensor count {} cannot fit in a file of {} bytes", n_tensors, size_), 8);
    if (n_kv > c.remaining() / 13)
        c.fail(fmt::format("metadata count {} cannot fit in a file of {} bytes", n_kv, size_), 16);

    // Metadata.
    kv_.reserve(size_t(n_kv));
    for (uint64_t i = 0; i < n_kv; ++i) {
        const uint64_t at = c.offset();
        std::string key = c.read_string("a metadata key");
        if (key.empty()) c.fail(fmt::format("metadata key {} is empty", i), at);
        if (kv_index_.count(key)) c.fail(fmt::format("duplicate metadata key '{}'", key), at);
        const GgufValueType t = read_type(c, "metadata value type");
        GgufValue v = read_value(c, t, 0);
        kv_index_.emplace(key, kv_.size());
        kv_.emplace_back(std::move(key), std::move(v));
    }
    if (const GgufValue* a = find("general.alignment")) {
        if (a->type() != GgufValueType::U32)
            c.fail(fmt::format("general.alignment has type {} (expected u32)", gguf_value_type_name(a->type())), 24);
        const uint64_t al = a->as_u64();
        if (al == 0 || (al & (al - 1)) != 0)
            c.fail(fmt::format("general.alignment {} is not a power of two", al), 24);
        alignment_ = uint32_t(al);
    }

    // Tensor infos.
    tensors_.reserve(size_t(n_tensors));
    std::vector<uint64_t> offset_fields;  // where each tensor's offset was read, for messages
    offset_fields.reserve(size_t(n_tensors));
    for (uint64_t i = 0; i < n_tensors; ++i) {
        const uint64_t at = c.offset();
        GgufTensor t;
        t.name = c.read_string("a tensor name");
        if (t.name.empty()) c.fail(fmt::format("tensor {} has an empty name", i), at);
        if (tensor_index_.count(t.name)) c.fail(fmt::format("duplicate tensor name '{}'", t.name), at);
        const uint64_t dims_at = c.offset();
        const uint32_t n_dims = c.read<uint32_t>("a tensor's dimension count");
        if (n_dims == 0 || n_dims > kMaxDims)
            c.fail(fmt::format("tensor '{}' has {} dimensions (1 to {} allowed)", t.name, n_dims, kMaxDims), dims_at);
        t.n_dims = int(n_dims);
        uint64_t n_elements = 1;
        for (uint32_t d = 0; d < n_dims; ++d) {
            const uint64_t dim_at = c.offset();
            const uint64_t ne = c.read<uint64_t>("a tensor dimension");
            if (ne == 0) c.fail(fmt::format("tensor '{}' dimension {} is 0", t.name, d), dim_at);
            if (!mul_ok(n_elements, ne, &n_elements))
                c.fail(fmt::format("tensor '{}' dimensions overflow (dimension {} is {})", t.name, d, ne), dim_at);
            t.ne[d] = int64_t(ne);
        }
        const uint64_t type_at = c.offset();
        t.type = c.read<uint32_t>("a tensor type");
        const GgmlTypeInfo* info = ggml_type_info(t.type);
        if (!info) c.fail(fmt::format("tensor '{}' has unknown type id {}", t.name, t.type), type_at);
        if (t.ne[0] % info->block_size != 0)
            c.fail(fmt::format("tensor '{}' of type {} has row length {}, not a multiple of its block size {}", t.name,
                               info->name, t.ne[0], info->block_size),
                   dims_at + 4);
        uint64_t row_bytes = 0, nbytes = 0;
        if (!mul_ok(uint64_t(t.ne[0] / info->block_size), uint64_t(info->type_size), &row_bytes) ||
            !mul_ok(row_bytes, n_elements / uint64_t(t.ne[0]), &nbytes))
            c.fail(fmt::format("tensor '{}' byte size overflows", t.name), dims_at);
        t.nbytes = nbytes;
        const uint64_t off_at = c.offset();
        t.offset = c.read<uint64_t>("a tensor offset");
        if (t.offset % alignment_ != 0)
            c.fail(fmt::format("tensor '{}' offset {} is not a multiple of the alignment {}", t.name, t.offset,
                               alignment_),
                   off_at);
        tensor_index_.emplace(t.name, tensors_.size());
        tensors_.push_back(std::move(t));
        offset_fields.push_back(off_at);
    }

    // Tensor data: starts at the next multiple of the alignment; every tensor must lie inside the file.
    const uint64_t end_of_infos = c.offset();
    data_offset_ = (end_of_infos + alignment_ - 1) / alignment_ * alignment_;
    if (tensors_.empty()) return;
    if (data_offset_ > size_) c.fail("file ends before the tensor data section", end_of_infos);
    const uint64_t data_size = size_ - data_offset_;
    for (size_t i = 0; i < tensors_.size(); ++i) {
        GgufTensor& t = tensors_[i];
        if (t.offset > data_size || t.nbytes > data_size - t.offset)
            c.fail(fmt::format("tensor '{}' data ({} bytes at data offset {}) runs past the end of the file", t.name,
                               t.nbytes, t.offset),
                   offset_fields[i]);
        t.data = base_ + data_offset_ + t.offset;
    }
}

}  // namespace kvgen
