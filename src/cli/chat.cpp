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

ChatFormat ChatFormat::of(const std::string& tmpl, const std::string& system) {
    if (tmpl.empty()) throw Error("--chat: the model has no tokenizer.chat_template (give a raw prompt instead)");
    if (has(tmpl, "<|im_start|>")) return {Kind::ChatML, system.empty() ? default_chatml_system(tmpl) : system};
    if (has(tmpl, "<|start_header_id|>")) return {Kind::Llama3, system};
    if (has(tmpl, "<|user|>") && has(tmpl, "<|end|>")) return {Kind::Phi3, system};
    if (has(tmpl, "<|user|>")) return {Kind::Zephyr, system};
    if (has(tmpl, "[INST]")) return {Kind::Llama2, system};
    throw Error("--chat: unrecognised chat template (known: ChatML, Llama 2, Llama 3, Zephyr, Phi-3); "
                "give a raw prompt without --chat");
}

ChatFormat ChatFormat::of(const GgufFile& f, const std::string& system) {
    const GgufValue* t = f.find("tokenizer.chat_template");
    return of(t && t->type() == GgufValueType::STRING ? t->as_string() : "", system);
}

std::string ChatFormat::first_turn(const std::string& message) const {
    const bool sys = !system.empty();
    switch (kind) {
        case Kind::ChatML: return (sys ? "<|im_start|>system\n" + system + "<|im_end|>\n" : "") + next_turn(message);
        case Kind::Llama3:
            return (sys ? "<|start_header_id|>system<|end_header_id|>\n\n" + system + "<|eot_id|>" : "") +
                   next_turn(message);
        case Kind::Phi3: return (sys ? "<|system|>\n" + system + "<|end|>\n" : "") + next_turn(message);
        case Kind::Zephyr: return (sys ? "<|system|>\n" + system + "</s>\n" : "") + next_turn(message);
        case Kind::Llama2:  // the system turn sits inside the first instruction; BOS comes from the tokenizer
            return "[INST] " + (sys ? "<<SYS>>\n" + system + "\n<</SYS>>\n\n" : std::string()) + message + " [/INST]";
    }
    return "";
}

std::string ChatFormat::next_turn(const std::string& message) const {
    switch (kind) {
        case Kind::ChatML: return "<|im_start|>user\n" + message + "<|im_end|>\n<|im_start|>assistant\n";
        case Kind::Llama3:
            return "<|start_header_id|>user<|end_header_id|>\n\n" + message +
                   "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n";
        case Kind::Phi3: return "<|user|>\n" + message + "<|end|>\n<|assistant|>\n";
        case Kind::Zephyr: return "<|user|>\n" + message + "</s>\n<|assistant|>\n";
        case Kind::Llama2: return "<s>[INST] " + message + " [/INST]";
    }
    return "";
}

std::string ChatFormat::answer_end() const {
    switch (kind) {
        case Kind::ChatML: return "<|im_end|>\n";
        case Kind::Llama3: return "<|eot_id|>";
        case Kind::Phi3: return "<|end|>\n";
        case Kind::Zephyr: return "</s>\n";
        case Kind::Llama2: return " </s>";
    }
    return "";
}

int ChatFormat::n_head_tokens(const Tokenizer& tok, bool add_bos) const {
    const std::vector<int32_t> a = tok.encode(first_turn(""), add_bos, true);
    const std::vector<int32_t> b = tok.encode(first_turn("x"), add_bos, true);
    size_t n = 0;
    while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
    return int(n);
}

std::string apply_chat_template(const std::string& tmpl, const std::string& prompt, const std::string& system) {
    return ChatFormat::of(tmpl, system).first_turn(prompt);
}

std::string apply_chat_template(const GgufFile& f, const std::string& prompt, const std::string& system) {
    return ChatFormat::of(f, system).first_turn(prompt);
}

}  // namespace kvgen
