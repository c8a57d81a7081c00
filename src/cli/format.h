#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace kvgen {

// 1024-based sizes with three significant digits: "800 KiB", "3.12 GiB", "45.3 MiB", "512 B".
std::string human_bytes(double bytes);
// Parameter counts: "134.5M", "6.74B".
std::string human_count(double n);
// A file being written. A regular file (or a new one) is written to a temporary beside it and renamed into place by
// commit(), so that readers see the old file or the whole new one (through a symbolic link, its target is replaced
// and the link kept); anything else that exists (a FIFO with a reader, /dev/null, a terminal) is written directly;
// "-" is stdout. Destroyed without commit(), the temporary is removed and the target left as it was. Write errors
// (a full disk) throw kvgen::Error naming the path.
class OutputFile {
public:
    explicit OutputFile(const std::string& path);
    ~OutputFile();
    OutputFile(const OutputFile&) = delete;
    OutputFile& operator=(const OutputFile&) = delete;
    void write(const void* data, size_t n);
    void commit();

private:
    std::string path_, target_, tmp_;
    int fd_ = -1;
    int slot_ = -1;  // register_temporary's
    unsigned mode_ = 0644;
};

// Writes text to stdout and flushes it. False when that failed: the reader went away (kvgen ... | head), or another
// failure (a full disk), whose errno goes to *error (the caller ends with an error).
bool write_stdout(const std::string& text, int* error);

// Writes text to path through an OutputFile.
void write_text_file(const std::string& path, const std::string& text);
// A whole file as bytes (a prompt file; "-" is standard input); throws kvgen::Error naming the path when it cannot
// be read.
std::string read_text_file(const std::string& path);
// Throws kvgen::Error now if path ("-" excepted) could not be created later.
void check_writable(const std::string& path);

}  // namespace kvgen
