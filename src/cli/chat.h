#pragma once
#include <string>

#include "gguf/gguf.h"

namespace kvgen {

// Wraps a user prompt in the model's chat format, recognised from tokenizer.chat_template: ChatML, Llama 2, Llama 3,
// Zephyr and Phi-3. `system` is the system turn; when empty, a ChatML template's own default system message (if it
// has one) is used, and the other formats have none. Throws kvgen::Error for a template it does not recognise. The
// result holds control-token text, to be tokenized with specials parsed.
std::string apply_chat_template(const std::string& tmpl, const std::string& prompt, const std::string& system = "");

// The same, with the template read from the file's tokenizer.chat_template (an error when it has none).
std::string apply_chat_template(const GgufFile& f, const std::string& prompt, const std::string& system);

}  // namespace kvgen
