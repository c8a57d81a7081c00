#pragma once
// GGUF: a header, typed key/value metadata, tensor infos, then aligned tensor data (all little-endian).
// GgufFile is a read-only, strictly validated view of one file; it owns the mapping (or the bytes it parsed).
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "gguf/ggml_types.h"

namespace kvgen {

enum class GgufValueType : uint32_t {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    BOOL = 7,
    STRING = 8,
    ARRAY = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
};
constexpr uint32_t kGgufValueTypeCount = 13;

const char* gguf_value_type_name(GgufValueType t);
// Bytes of one scalar of this type in the file; 0 for STRING and ARRAY.
size_t gguf_scalar_size(GgufValueType t);

class GgufValue {
public:
    GgufValue() = default;
    static GgufValue uint(GgufValueType t, uint64_t v);  // U8 U16 U32 U64
    static GgufValue sint(GgufValueType t, int64_t v);   // I8 I16 I32 I64
    static GgufValue real(GgufValueType t, double v);    // F32 F64
    static GgufValue boolean(bool v);
    static GgufValue string(std::string v);
    static GgufValue string_array(std::vector<std::string> v);
    static GgufValue numeric_array(GgufValueType elem, std::vector<uint8_t> raw_le, uint64_t count);
    static GgufValue array_of(GgufValueType elem, std::vector<GgufValue> items);  // STRING or ARRAY elements
    template <typename T>
    static GgufValue numbers(GgufValueType elem, const std::vector<T>& v);

    GgufValueType type() const { return type_; }
    bool is_integer() const;
    bool is_float() const { return type_ == GgufValueType::F32 || type_ == GgufValueType::F64; }
    bool is_array() const { return type_ == GgufValueType::ARRAY; }

    // Conversions throw kvgen::Error naming the value's type when they do not apply or the value does not fit.
    uint64_t as_u64() const;
    int64_t as_i64() const;
    double as_f64() const;  // any number
    bool as_bool() const;
    const std::string& as_string() const;

    // Arrays.
    GgufValueType elem_type() const { return elem_; }
    uint64_t size() const { return count_; }
    const std::vector<GgufValue>& items() const { return items_; }  // STRING and ARRAY elements
    const std::vector<uint8_t>& raw() const { return raw_; }        // numeric elements, packed little-endian
    double number_at(uint64_t i) const;                              // numeric element i as a double
    int64_t integer_at(uint64_t i) const;                            // integer (or bool) element i
    std::vector<std::string> strings() const;                        // a string array, copied

    // Short human-readable rendering: scalars in full (strings cut at max_chars), arrays as type[n].
    std::string describe(size_t max_chars = 60) const;

private:
    GgufValueType type_ = GgufValueType::U8;
    GgufValueType elem_ = GgufValueType::U8;
    uint64_t bits_ = 0;  // unsigned value, two's-complement signed value, or the bits of a double
    std::string str_;
    std::vector<GgufValue> items_;
    std::vector<uint8_t> raw_;
    uint64_t count_ = 0;
};

struct GgufTensor {
    std::string name;
    uint32_t type = 0;  // ggml type id
    int n_dims = 0;
    int64_t ne[4] = {1, 1, 1, 1};  // ne[0] is contiguous
    uint64_t offset = 0;           // from the start of the data section
    uint64_t nbytes = 0;
    const uint8_t* data = nullptr;

    int64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
    std::string shape_string() const;  // "[576, 49152]"
};

class GgufFile {
public:
    static GgufFile open(const std::string& path);                                     // mmap, read-only
    static GgufFile parse(std::vector<uint8_t> bytes, std::string name = "<buffer>");  // the same parser, no file

    GgufFile(GgufFile&&) noexcept;
    GgufFile& operator=(GgufFile&&) noexcept;
    GgufFile(const GgufFile&) = delete;
    GgufFile& operator=(const GgufFile&) = delete;
    ~GgufFile();

    const std::string& path() const { return path_; }
    uint32_t version() const { return version_; }
    uint64_t file_size() const { return size_; }
    uint32_t alignment() const { return alignment_; }
    uint64_t data_offset() const { return data_offset_; }

    const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return kv_; }
    const GgufValue* find(std::string_view key) const;
    const std::vector<GgufTensor>& tensors() const { return tensors_; }
    const GgufTensor* tensor(std::string_view name) const;

private:
    GgufFile() = default;
    void parse_all();
    void release();

    std::string path_;
    const uint8_t* base_ = nullptr;
    uint64_t size_ = 0;
    void* map_ = nullptr;  // mmap'ed region, or nullptr when the bytes are owned
    std::vector<uint8_t> owned_;

    uint32_t version_ = 0;
    uint32_t alignment_ = 32;
    uint64_t data_offset_ = 0;
    std::vector<std::pair<std::string, GgufValue>> kv_;
    std::unordered_map<std::string, size_t> kv_index_;
    std::vector<GgufTensor> tensors_;
    std::unordered_map<std::string, size_t> tensor_index_;
};

template <typename T>
GgufValue GgufValue::numbers(GgufValueType elem, const std::vector<T>& v) {
    static_assert(std::is_arithmetic<T>::value, "numbers() takes arithmetic elements");
    std::vector<uint8_t> raw(v.size() * sizeof(T));
    if (!v.empty()) std::memcpy(raw.data(), v.data(), raw.size());
    return numeric_array(elem, std::move(raw), v.size());
}

}  // namespace kvgen
