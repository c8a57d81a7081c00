#pragma once
// GgufWriter lays out a GGUF v3 file (metadata, tensor infos, aligned data) and writes it, to memory or atomically
// to a file (a temporary beside it, renamed into place). Callers fill each tensor's bytes through a callback, so a
// multi-gigabyte file is produced without holding it in memory.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "gguf/gguf.h"

namespace kvgen {

class GgufWriter {
public:
    // fill(tensor index, destination, byte count): writes one tensor's data.
    using FillFn = std::function<void(size_t, uint8_t*, uint64_t)>;

    explicit GgufWriter(uint32_t alignment = 32);

    void set(const std::string& key, GgufValue value);  // a new key is appended; an existing one is replaced
    void add_tensor(const std::string& name, GgmlType type, const std::vector<int64_t>& ne);  // ne[0] contiguous

    size_t n_tensors() const { return tensors_.size(); }
    const GgufTensor& tensor_info(size_t i) const { return tensors_[i]; }
    uint64_t data_offset() const;  // where the data section starts
    uint64_t total_size() const;

    std::vector<uint8_t> to_bytes(const FillFn& fill) const;
    // Fills tensors on n_threads threads (each call to fill gets a distinct tensor).
    void write_file(const std::string& path, const FillFn& fill, int n_threads = 1) const;

private:
    void write_header(uint8_t* dst) const;
    uint64_t header_bytes() const;

    uint32_t alignment_;
    std::vector<std::pair<std::string, GgufValue>> kv_;
    std::vector<GgufTensor> tensors_;  // offsets relative to the data section
    uint64_t data_bytes_ = 0;
};

}  // namespace kvgen
