#include "cli/chat.h"

#include "common/error.h"

namespace kvgen {

namespace {

bool has(const std::string& s, const char* what) { return s.find(what) != std::string::npos; }

// A literal system turn the template inserts when the conversation has none (SmolLM2 does this).
std::string default_chatml_system(const std::string& tmpl) {
    const std::string open = "<|im_start|>system\n";
    for (size_t at = tmpl.find(open); at != std::string::npos; at = tmpl.find(open, at + 1)) {
        const size_t start = at + open.size();
        const size_t end = tmpl.find("<|im_end|>", start);
        if (end == std::string::npos) break;
        const std::string text = tmpl.substr(start, end - start);
        if (!has(text, "{{") && !has(text, "{%") && !text.empty()) return text;
    }
    return "";
}

}  // namespace

std::string apply_chat_template(const std::string& tmpl, const std::string& prompt) {
    if (tmpl.empty()) throw Error("--chat: the model has no tokenizer.chat_template (give a raw prompt instead)");
    if (has(tmpl, "<|im_start|>")) {  // ChatML
        std::string out;
        const std::string sys = default_chatml_system(tmpl);
        if (!sys.empty()) out += "<|im_start|>system\n" + sys + "<|im_end|>\n";
        return out + "<|im_start|>user\n" + prompt + "<|im_end|>\n<|im_start|>assistant\n";
    }
    if (has(tmpl, "<|start_header_id|>"))  // Llama 3
        return "<|start_header_id|>user<|end_header_id|>\n\n" + prompt +
               "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n";
    if (has(tmpl, "<|user|>") && has(tmpl, "<|end|>"))  // Phi-3
        return "<|user|>\n" + prompt + "<|end|>\n<|assistant|>\n";
    if (has(tmpl, "<|user|>"))  // Zephyr
        return "<|user|>\n" + prompt + "</s>\n<|assistant|>\n";
    if (has(tmpl, "[INST]"))  // Llama 2 / Mistral
        return "[INST] " + prompt + " [/INST]";
    throw Error("--chat: unrecognised chat template (known: ChatML, Llama 2, Llama 3, Zephyr, Phi-3); "
                "give a raw prompt without --chat");
}

}  // namespace kvgen
