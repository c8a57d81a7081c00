#pragma once
// Where a prompt comes from (-p, -f FILE, -f -, a piped standard input) and the escapes llama.cpp processes in it.
#include <string>
#include <string_view>

namespace kvgen {

// llama.cpp's escapes: \n \r \t \' \" \\ and \xHH (two hex digits). Any other backslash sequence, and a \x
// without two hex digits, stays as written.
std::string process_escapes(std::string_view text);

// A prompt file's text, "-" meaning standard input. As llama.cpp's -f, one trailing newline is dropped (a file
// written by an editor, or `echo ... |`, ends with one the user did not mean as part of the prompt).
std::string read_prompt_file(const std::string& path);

// True when standard input is a pipe or a file rather than a terminal: `echo hi | kvgen` reads its prompt there.
bool stdin_is_piped();

}  // namespace kvgen
