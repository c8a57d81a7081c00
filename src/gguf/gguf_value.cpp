#include <cmath>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "common/error.h"
#include "gguf/gguf.h"

namespace kvgen {

const char* gguf_value_type_name(GgufValueType t) {
    static const char* const names[kGgufValueTypeCount] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                                           "bool", "string", "array", "u64", "i64", "f64"};
    const auto i = uint32_t(t);
    return i < kGgufValueTypeCount ? names[i] : "unknown";
}

size_t gguf_scalar_size(GgufValueType t) {
    switch (t) {
        case GgufValueType::U8:
        case GgufValueType::I8:
        case GgufValueType::BOOL: return 1;
        case GgufValueType::U16:
        case GgufValueType::I16: return 2;
        case GgufValueType::U32:
        case GgufValueType::I32:
        case GgufValueType::F32: return 4;
        case GgufValueType::U64:
        case GgufValueType::I64:
        case GgufValueType::F64: return 8;
        default: return 0;
    }
}

namespace {

bool is_unsigned(GgufValueType t) {
    return t == GgufValueType::U8 || t == GgufValueType::U16 || t == GgufValueType::U32 || t == GgufValueType::U64;
}
bool is_signed(GgufValueType t) {
    return t == GgufValueType::I8 || t == GgufValueType::I16 || t == GgufValueType::I32 || t == GgufValueType::I64;
}

// Reads element i of a packed little-endian numeric array as (is_float, integer value, float value).
void load_element(GgufValueType t, const uint8_t* p, int64_t* iv, double* fv) {
    switch (t) {
        case GgufValueType::U8: *iv = p[0]; break;
        case GgufValueType::BOOL: *iv = p[0] != 0; break;
        case GgufValueType::I8: *iv = int8_t(p[0]); break;
        case GgufValueType::U16: { uint16_t v; std::memcpy(&v, p, 2); *iv = v; break; }
        case GgufValueType::I16: { int16_t v; std::memcpy(&v, p, 2); *iv = v; break; }
        case GgufValueType::U32: { uint32_t v; std::memcpy(&v, p, 4); *iv = v; break; }
        case GgufValueType::I32: { int32_t v; std::memcpy(&v, p, 4); *iv = v; break; }
        case GgufValueType::U64: { uint64_t v; std::memcpy(&v, p, 8); *iv = int64_t(v); break; }
        case GgufValueType::I64: { int64_t v; std::memcpy(&v, p, 8); *iv = v; break; }
        case GgufValueType::F32: { float v; std::memcpy(&v, p, 4); *fv = v; return; }
        case GgufValueType::F64: { double v; std::memcpy(&v, p, 8); *fv = v; return; }
        default: KVGEN_ASSERT(false);
    }
    *fv = double(*iv);
}

}  // namespace

GgufValue GgufValue::uint(GgufValueType t, uint64_t v) {
    KVGEN_ASSERT(is_unsigned(t));
    GgufValue x;
    x.type_ = t;
    x.bits_ = v;
    return x;
}

GgufValue GgufValue::sint(GgufValueType t, int64_t v) {
    KVGEN_ASSERT(is_signed(t));
    GgufValue x;
    x.type_ = t;
    x.bits_ = uint64_t(v);
    return x;
}

GgufValue GgufValue::real(GgufValueType t, double v) {
    KVGEN_ASSERT(t == GgufValueType::F32 || t == GgufValueType::F64);
    GgufValue x;
    x.type_ = t;
    if (t == GgufValueType::F32) v = double(float(v));
    std::memcpy(&x.bits_, &v, 8);
    return x;
}

GgufValue GgufValue::boolean(bool v) {
    GgufValue x;
    x.type_ = GgufValueType::BOOL;
    x.bits_ = v ? 1 : 0;
    return x;
}

GgufValue GgufValue::string(std::string v) {
    GgufValue x;
    x.type_ = GgufValueType::STRING;
    x.str_ = std::move(v);
    return x;
}

GgufValue GgufValue::string_array(std::vector<std::string> v) {
    std::vector<GgufValue> items;
    items.reserve(v.size());
    for (auto& s : v) items.push_back(string(std::move(s)));
    return array_of(GgufValueType::STRING, std::move(items));
}

GgufValue GgufValue::numeric_array(GgufValueType elem, std::vector<uint8_t> raw_le, uint64_t count) {
    KVGEN_ASSERT(gguf_scalar_size(elem) != 0 && raw_le.size() == count * gguf_scalar_size(elem));
    GgufValue x;
    x.type_ = GgufValueType::ARRAY;
    x.elem_ = elem;
    x.raw_ = std::move(raw_le);
    x.count_ = count;
    return x;
}

GgufValue GgufValue::array_of(GgufValueType elem, std::vector<GgufValue> items) {
    KVGEN_ASSERT(elem == GgufValueType::STRING || elem == GgufValueType::ARRAY);
    for (const auto& it : items) KVGEN_ASSERT(it.type() == elem);
    GgufValue x;
    x.type_ = GgufValueType::ARRAY;
    x.elem_ = elem;
    x.count_ = items.size();
    x.items_ = std::move(items);
    return x;
}

bool GgufValue::is_integer() const { return is_unsigned(type_) || is_signed(type_); }

uint64_t GgufValue::as_u64() const {
    if (is_unsigned(type_)) return bits_;
    if (is_signed(type_)) {
        if (int64_t(bits_) < 0) throw Error(fmt::format("value {} is negative", int64_t(bits_)));
        return bits_;
    }
    throw Error(fmt::format("value has type {}, expected an integer", gguf_value_type_name(type_)));
}

int64_t GgufValue::as_i64() const {
    if (is_signed(type_)) return int64_t(bits_);
    if (is_unsigned(type_)) {
        if (bits_ > uint64_t(std::numeric_limits<int64_t>::max())) throw Error("value does not fit in int64");
        return int64_t(bits_);
    }
    throw Error(fmt::format("value has type {}, expected an integer", gguf_value_type_name(type_)));
}

double GgufValue::as_f64() const {
    if (is_float()) {
        double v;
        std::memcpy(&v, &bits_, 8);
        return v;
    }
    if (is_unsigned(type_)) return double(bits_);
    if (is_signed(type_)) return double(int64_t(bits_));
    throw Error(fmt::format("value has type {}, expected a number", gguf_value_type_name(type_)));
}

bool GgufValue::as_bool() const {
    if (type_ == GgufValueType::BOOL) return bits_ != 0;
    throw Error(fmt::format("value has type {}, expected bool", gguf_value_type_name(type_)));
}

const std::string& GgufValue::as_string() const {
    if (type_ == GgufValueType::STRING) return str_;
    throw Error(fmt::format("value has type {}, expected string", gguf_value_type_name(type_)));
}

double GgufValue::number_at(uint64_t i) const {
    if (type_ != GgufValueType::ARRAY || raw_.empty() || i >= count_)
        throw Error(fmt::format("value is not a numeric array with element {}", i));
    int64_t iv = 0;
    double fv = 0;
    load_element(elem_, raw_.data() + i * gguf_scalar_size(elem_), &iv, &fv);
    return fv;
}

int64_t GgufValue::integer_at(uint64_t i) const {
    if (type_ != GgufValueType::ARRAY || raw_.empty() || i >= count_ || elem_ == GgufValueType::F32 ||
        elem_ == GgufValueType::F64)
        throw Error(fmt::format("value is not an integer array with element {}", i));
    int64_t iv = 0;
    double fv = 0;
    load_element(elem_, raw_.data() + i * gguf_scalar_size(elem_), &iv, &fv);
    return iv;
}

std::vector<std::string> GgufValue::strings() const {
    if (type_ != GgufValueType::ARRAY || elem_ != GgufValueType::STRING)
        throw Error(fmt::format("value has type {}, expected an array of strings", gguf_value_type_name(type_)));
    std::vector<std::string> out;
    out.reserve(items_.size());
    for (const auto& it : items_) out.push_back(it.str_);
    return out;
}

std::string GgufValue::describe(size_t max_chars) const {
    switch (type_) {
        case GgufValueType::STRING: {
            std::string s;
            for (char c : str_) {
                if (s.size() >= max_chars) return s + "...";
                if (c == '\n') s += "\\n";
                else if (static_cast<unsigned char>(c) < 0x20) s += fmt::format("\\x{:02x}", c);
                else s += c;
            }
            return s;
        }
        case GgufValueType::ARRAY: return fmt::format("{}[{}]", gguf_value_type_name(elem_), count_);
        case GgufValueType::BOOL: return bits_ ? "true" : "false";
        case GgufValueType::F32:
        case GgufValueType::F64: return fmt::format("{}", as_f64());
        default: return is_signed(type_) ? fmt::format("{}", int64_t(bits_)) : fmt::format("{}", bits_);
    }
}

std::string GgufTensor::shape_string() const {
    std::string s = "[";
    for (int d = 0; d < n_dims; ++d) s += (d ? ", " : "") + std::to_string(ne[d]);
    return s + "]";
}

}  // namespace kvgen
