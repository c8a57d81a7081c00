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

std::string apply_chat_template(const std::string& tmpl, const std::string& prompt, const std::string& system) {
    if (tmpl.empty()) throw Error("--chat: the model has no tokenizer.chat_template (give a raw prompt instead)");
    if (has(tmpl, "<|im_start|>")) {  // ChatML
        const std::string sys = system.empty() ? default_chatml_system(tmpl) : system;
        const std::string turn = sys.empty() ? "" : "<|im_start|>system\n" + sys + "<|im_end|>\n";
        return turn + "<|im_start|>user\n" + prompt + "<|im_end|>\n<|im_start|>assistant\n";
    }
    if (has(tmpl, "<|start_header_id|>")) {  // Llama 3
        const std::string turn =
            system.empty() ? "" : "<|start_header_id|>system<|end_header_id|>\n\n" + system + "<|eot_id|>";
        return turn + "<|start_header_id|>user<|end_header_id|>\n\n" + prompt +
               "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n";
    }
    if (has(tmpl, "<|user|>") && has(tmpl, "<|end|>")) {  // Phi-3
        const std::string turn = system.empty() ? "" : "<|system|>\n" + system + "<|end|>\n";
        return turn + "<|user|>\n" + prompt + "<|end|>\n<|assistant|>\n";
    }
    if (has(tmpl, "<|user|>")) {  // Zephyr
        const std::string turn = system.empty() ? "" : "<|system|>\n" + system + "</s>\n";
        return turn + "<|user|>\n" + prompt + "</s>\n<|assistant|>\n";
    }
    if (has(tmpl, "[INST]")) {  // Llama 2 / Mistral: the system turn sits inside the first instruction
        const std::string turn = system.empty() ? "" : "<<SYS>>\n" + system + "\n<</SYS>>\n\n";
        return "[INST] " + turn + prompt + " [/INST]";
    }
    throw Error("--chat: unrecognised chat template (known: ChatML, Llama 2, Llama 3, Zephyr, Phi-3); "
                "give a raw prompt without --chat");
}

std::string apply_chat_template(const GgufFile& f, const std::string& prompt, const std::string& system) {
    const GgufValue* t = f.find("tokenizer.chat_template");
    return apply_chat_template(t && t->type() == GgufValueType::STRING ? t->as_string() : "", prompt, system);
}

}  // namespace kvgen
