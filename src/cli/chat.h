#pragma once
#include <string>

#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace kvgen {

// A chat format's text around the turns of a conversation, recognised from tokenizer.chat_template: ChatML, Llama 2,
// Llama 3, Zephyr and Phi-3. The text holds control-token text, to be tokenized with specials parsed.
struct ChatFormat {
    enum class Kind { ChatML, Llama2, Llama3, Zephyr, Phi3 } kind;
    std::string system;  // the system turn's message ("" for none)

    // Throws kvgen::Error for a template it does not recognise. An empty `system` takes a ChatML template's own
    // default system message (SmolLM2 has one); the other formats then have no system turn.
    static ChatFormat of(const std::string& tmpl, const std::string& system);
    static ChatFormat of(const GgufFile& f, const std::string& system);  // tokenizer.chat_template

    // The first user turn (after the system turn) and every later one, each ending where the answer starts.
    std::string first_turn(const std::string& message) const;
    std::string next_turn(const std::string& message) const;
    // What ends an answer: the end-of-turn text that follows the model's words.
    std::string answer_end() const;
    // The tokens every first turn starts with (BOS when add_bos, the system turn, the user turn's opening): what a
    // context shift keeps by default in a chat.
    int n_head_tokens(const Tokenizer& tok, bool add_bos) const;
};

// Wraps a user prompt in the model's chat format, recognised from tokenizer.chat_template: ChatML, Llama 2, Llama 3,
// Zephyr and Phi-3. `system` is the system turn; when empty, a ChatML template's own default system message (if it
// has one) is used, and the other formats have none. Throws kvgen::Error for a template it does not recognise. The
// result holds control-token text, to be tokenized with specials parsed.
std::string apply_chat_template(const std::string& tmpl, const std::string& prompt, const std::string& system = "");

// The same, with the template read from the file's tokenizer.chat_template (an error when it has none).
std::string apply_chat_template(const GgufFile& f, const std::string& prompt, const std::string& system);

}  // namespace kvgen
