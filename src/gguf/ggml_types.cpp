#include "gguf/ggml_types.h"

#include <algorithm>
#include <cctype>
#include <iterator>

namespace kvgen {

namespace {

struct Entry {
    uint32_t id;
    GgmlTypeInfo info;
};

// note: block sizes of the types kvgen does not compute with are still needed to validate tensor extents.
constexpr Entry kTypes[] = {
    {0, {"F32", 1, 4, true}},         {1, {"F16", 1, 2, true}},         {2, {"Q4_0", 32, 18, true}},
    {3, {"Q4_1", 32, 20, true}},      {6, {"Q5_0", 32, 22, true}},      {7, {"Q5_1", 32, 24, true}},
    {8, {"Q8_0", 32, 34, true}},      {9, {"Q8_1", 32, 36, false}},     {10, {"Q2_K", 256, 84, true}},
    {11, {"Q3_K", 256, 110, true}},   {12, {"Q4_K", 256, 144, true}},   {13, {"Q5_K", 256, 176, true}},
    {14, {"Q6_K", 256, 210, true}},   {15, {"Q8_K", 256, 292, false}},  {16, {"IQ2_XXS", 256, 66, false}},
    {17, {"IQ2_XS", 256, 74, false}}, {18, {"IQ3_XXS", 256, 98, false}}, {19, {"IQ1_S", 256, 50, false}},
    {20, {"IQ4_NL", 32, 18, false}},  {21, {"IQ3_S", 256, 110, false}}, {22, {"IQ2_S", 256, 82, false}},
    {23, {"IQ4_XS", 256, 136, false}}, {24, {"I8", 1, 1, false}},       {25, {"I16", 1, 2, false}},
    {26, {"I32", 1, 4, false}},       {27, {"I64", 1, 8, false}},       {28, {"F64", 1, 8, false}},
    {29, {"IQ1_M", 256, 56, false}},  {30, {"BF16", 1, 2, true}},       {34, {"TQ1_0", 256, 54, false}},
    {35, {"TQ2_0", 256, 66, false}},  {39, {"MXFP4", 32, 17, false}},
};

// The order users see in messages: float types first, then the legacy and k-quants.
constexpr uint32_t kSupportedOrder[] = {0, 1, 30, 2, 3, 6, 7, 8, 10, 11, 12, 13, 14};

// general.file_type values for the types kvgen computes with (7-9 are Q8_0, Q5_0, Q5_1; 5 and 6 were retired).
constexpr struct {
    int64_t value;
    const char* name;
} kFileTypes[] = {
    {0, "all F32"},       {1, "F16"},           {2, "Q4_0"},          {3, "Q4_1"},          {4, "Q4_1, some F16"},
    {7, "Q8_0"},          {8, "Q5_0"},          {9, "Q5_1"},          {10, "Q2_K - Medium"}, {11, "Q3_K - Small"},
    {12, "Q3_K - Medium"}, {13, "Q3_K - Large"}, {14, "Q4_K - Small"}, {15, "Q4_K - Medium"}, {16, "Q5_K - Small"},
    {17, "Q5_K - Medium"}, {18, "Q6_K"},         {21, "Q2_K - Small"}, {32, "BF16"},
};

}  // namespace

const char* gguf_file_type_name(int64_t file_type) {
    for (const auto& f : kFileTypes)
        if (f.value == file_type) return f.name;
    return nullptr;
}

const GgmlTypeInfo* ggml_type_info(uint32_t id) {
    for (const Entry& e : kTypes) {
        if (e.id == id) return &e.info;
    }
    return nullptr;
}

std::string ggml_type_name(uint32_t id) {
    const GgmlTypeInfo* info = ggml_type_info(id);
    return info ? std::string(info->name) : "type " + std::to_string(id);
}

bool ggml_type_supported(uint32_t id) {
    const GgmlTypeInfo* info = ggml_type_info(id);
    return info && info->supported;
}

std::string ggml_supported_types() {
    std::string s;
    for (uint32_t id : kSupportedOrder) {
        if (!s.empty()) s += ", ";
        s += ggml_type_info(id)->name;
    }
    return s;
}

bool ggml_type_from_name(const std::string& name, GgmlType* out) {
    std::string upper;
    std::transform(name.begin(), name.end(), std::back_inserter(upper),
                   [](unsigned char c) { return char(std::toupper(c)); });
    for (const Entry& e : kTypes) {
        if (upper == e.info.name) {
            *out = GgmlType(e.id);
            return true;
        }
    }
    return false;
}

}  // namespace kvgen
