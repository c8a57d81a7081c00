#pragma once
#include <cstdint>
#include <string>

namespace kvgen {

// 1024-based sizes with three significant digits: "800 KiB", "3.12 GiB", "45.3 MiB", "512 B".
std::string human_bytes(double bytes);
// Parameter counts: "134.5M", "6.74B".
std::string human_count(double n);
// Writes text to path atomically (a temporary beside it, renamed into place); "-" means stdout.
void write_text_file(const std::string& path, const std::string& text);
// A whole file as bytes (a prompt file; "-" is standard input); throws kvgen::Error naming the path when it cannot
// be read.
std::string read_text_file(const std::string& path);
// Throws kvgen::Error now if path ("-" excepted) could not be created later.
void check_writable(const std::string& path);

}  // namespace kvgen
