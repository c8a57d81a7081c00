#pragma once
#include <string>

namespace kvgen {

// Wraps a user prompt in the model's chat format, recognised from tokenizer.chat_template: ChatML (with the
// template's default system message, if it has one), Llama 2, Llama 3, Zephyr and Phi-3. Throws kvgen::Error for
// a template it does not recognise. The result holds control-token text, to be tokenized with specials parsed.
std::string apply_chat_template(const std::string& tmpl, const std::string& prompt);

}  // namespace kvgen
