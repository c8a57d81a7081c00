#include "cli/bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <tuple>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "cli/backend_select.h"
#include "cli/format.h"
#include "common/build_info.h"
#include "common/error.h"
#include "cpu/cpu_features.h"
#include "engine/generator.h"
#include "model/weights.h"

namespace kvgen {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct Test {
    std::string name;  // pp512, tg128 @ d1024
    int n_prompt = 0, n_gen = 0, depth = 0;
    std::string time;                    // when its runs began, UTC, as llama-bench's test_time
    std::vector<double> seconds, tok_s;  // each timed run
};

// Fills the cache with `depth` tokens (untimed), in batches.
void fill(Backend& b, const std::vector<int32_t>& tokens, int depth) {
    b.kv_truncate(0);
    prefill(b, tokens.data(), 0, depth);
}

// Seconds for one repetition of a test: the prompt's prefill, then the generated tokens' decode steps.
double run_once(Backend& b, const std::vector<int32_t>& tokens, const Test& t, bool kv_cache) {
    fill(b, tokens, t.depth);
    const auto t0 = Clock::now();
    if (t.n_prompt > 0) prefill(b, tokens.data(), t.depth, t.depth + t.n_prompt);
    for (int k = 0; k < t.n_gen; ++k) {
        const int pos = t.depth + t.n_prompt + k;
        if (kv_cache) {
            b.forward(tokens.data() + pos, 1, pos, Pass::Decode);
        } else {  // recompute the whole sequence through the prefill path, as --no-kv-cache generation does
            b.kv_truncate(0);
            prefill(b, tokens.data(), 0, pos + 1);
        }
    }
    return seconds_since(t0);
}

std::string model_label(const Model& m, int64_t* params, uint64_t* bytes) {
    std::map<std::string, uint64_t> by_type;
    *params = 0;
    *bytes = 0;
    for (const GgufTensor& t : m.file.tensors()) {
        *params += t.n_elements();
        *bytes += t.nbytes;
        if (t.n_dims == 2) by_type[ggml_type_name(t.type)] += t.nbytes;
    }
    // What the file says it mostly is ("Q4_K - Medium", as llama-bench names it), else the type of most bytes.
    std::string main_type;
    const GgufValue* file_type = m.file.find("general.file_type");
    int64_t file_type_value = -1;
    if (file_type && file_type->is_integer() && file_type->as_f64() >= 0 && file_type->as_f64() < 1024)
        file_type_value = int64_t(file_type->as_f64());
    if (const char* name = gguf_file_type_name(file_type_value)) {
        main_type = name;
    } else {
        uint64_t most = 0;
        for (const auto& [type, b] : by_type)
            if (b > most) {
                most = b;
                main_type = type;
            }
    }
    return fmt::format("llama {} {}", human_count(double(*params)), main_type);
}

// The markdown table's size and params as llama-bench prints them: "5.19 MiB", "3.56 GiB"; "5.11 M", "6.74 B".
std::string bench_size(uint64_t bytes) {
    const double mib = double(bytes) / (1024.0 * 1024.0);
    return mib < 1024.0 ? fmt::format("{:.2f} MiB", mib) : fmt::format("{:.2f} GiB", mib / 1024.0);
}
std::string bench_params(int64_t n) {
    return n < 1000000000 ? fmt::format("{:.2f} M", double(n) / 1e6) : fmt::format("{:.2f} B", double(n) / 1e9);
}

std::string utc_now() {
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    gmtime_r(&now, &tm);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return buf;
}

// One value of a result row as csv and sql print it: bools as 1/0, floats with six decimals.
std::string value_text(const nlohmann::ordered_json& v) {
    if (v.is_string()) return v.get<std::string>();
    if (v.is_boolean()) return v.get<bool>() ? "1" : "0";
    if (v.is_number_float()) return fmt::format("{:.6f}", v.get<double>());
    return v.dump();
}

std::string replace_all(std::string s, char from, const char* to) {
    std::string out;
    for (char ch : s) out += ch == from ? std::string(to) : std::string(1, ch);
    return out;
}

// Mean and sample standard deviation.
void stats(const std::vector<double>& v, double* avg, double* sd) {
    *avg = 0;
    for (double x : v) *avg += x;
    *avg /= double(v.size());
    *sd = 0;
    for (double x : v) *sd += (x - *avg) * (x - *avg);
    *sd = v.size() > 1 ? std::sqrt(*sd / double(v.size() - 1)) : 0.0;
}

// Result rows as each test ends: the markdown table, or llama-bench's csv (a header, then every value quoted), json
// lines or sql (a table, then an INSERT per row), which stay valid as they grow; json, one document, at the end.
// Every row has the same fields; the per-run arrays are json's alone.
class RowPrinter {
  public:
    // kv_types, batch: the markdown table has type_k and type_v columns, and n_batch's.
    RowPrinter(std::string format, bool kv_types, bool batch)
        : format_(std::move(format)), kv_types_(kv_types), batch_(batch) {}

    void add(const nlohmann::ordered_json& r, const std::string& md_cells) {
        std::string out;
        if (format_ == "json") {
            json_.push_back(r);
            return;
        }
        if (rows_++ == 0) out = header(r);
        if (format_ == "md") {
            out += md_cells;
        } else if (format_ == "jsonl") {
            out += r.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
        } else if (format_ == "csv") {
            std::vector<std::string> cells;
            for (const std::string& c : columns_)
                cells.push_back("\"" + replace_all(value_text(r[c]), '"', "\"\"") + "\"");
            out += fmt::format("{}\n", fmt::join(cells, ","));
        } else {
            std::vector<std::string> cells;
            for (const std::string& c : columns_)
                cells.push_back(r[c].is_string() ? "'" + replace_all(value_text(r[c]), '\'', "''") + "'"
                                                 : value_text(r[c]));
            out += fmt::format("INSERT INTO kvgen_bench ({}) VALUES ({});\n", fmt::join(columns_, ", "),
                               fmt::join(cells, ", "));
        }
        emit(out);
    }

    void finish() {
        if (format_ == "json")
            emit(json_.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n");
    }

    // The reader went away (kvgen --bench ... | head): nothing more to measure.
    bool closed() const { return closed_; }

  private:
    void emit(const std::string& text) {
        int error = 0;
        if (closed_ || write_stdout(text, &error)) return;
        if (error != 0) throw Error(fmt::format("standard output: write failed: {}", std::strerror(error)));
        closed_ = true;
    }

    std::string header(const nlohmann::ordered_json& r) {
        if (format_ == "md")
            return fmt::format("| model | size | params | backend | threads | {}{}test | t/s |\n"
                               "| --- | ---: | ---: | --- | ---: | {}{}---: | ---: |\n",
                               batch_ ? "n_batch | " : "", kv_types_ ? "type_k | type_v | " : "",
                               batch_ ? "---: | " : "", kv_types_ ? "---: | ---: | " : "");
        for (const auto& [key, v] : r.items())
            if (!v.is_array()) columns_.push_back(key);
        if (format_ == "csv") return fmt::format("{}\n", fmt::join(columns_, ","));
        if (format_ != "sql") return "";
        std::vector<std::string> defs;
        for (const std::string& c : columns_) {
            const auto& v = r[c];
            const char* type = v.is_string() ? "TEXT" : v.is_number_float() ? "REAL" : "INTEGER";
            defs.push_back(fmt::format("  {} {}", c, type));
        }
        return fmt::format("CREATE TABLE IF NOT EXISTS kvgen_bench (\n{}\n);\n", fmt::join(defs, ",\n"));
    }

    std::string format_;
    bool kv_types_, batch_;
    int rows_ = 0;
    bool closed_ = false;
    std::vector<std::string> columns_;
    nlohmann::ordered_json json_ = nlohmann::ordered_json::array();
};

}  // namespace

std::vector<int> parse_int_list(const std::string& text, const char* option, int min_value) {
    std::vector<int> out;
    std::stringstream ss(text);
    std::string item;
    while (std::getline(ss, item, ',')) {
        size_t used = 0;
        int v = 0;
        try {
            v = std::stoi(item, &used);
        } catch (const std::exception&) {
            used = 0;
        }
        if (item.empty() || used != item.size() || v < min_value)
            throw Error(fmt::format("{} '{}': expected a comma-separated list of integers >= {}", option, text,
                                    min_value));
        out.push_back(v);
    }
    if (!text.empty() && text.back() == ',')  // getline leaves no item after the last comma
        throw Error(fmt::format("{} '{}': expected a comma-separated list of integers >= {}", option, text,
                                min_value));
    if (out.empty()) throw Error(fmt::format("{}: empty list", option));
    return out;
}

void run_bench(const BenchOptions& opt) {
    if (opt.output != "md" && opt.output != "json" && opt.output != "jsonl" && opt.output != "csv" &&
        opt.output != "sql")
        throw Error(fmt::format("-o '{}': expected md, csv, json, jsonl or sql", opt.output));
    std::vector<Test> plan;
    for (int d : opt.depths) {
        const std::string at = d > 0 ? fmt::format(" @ d{}", d) : "";
        for (int p : opt.n_prompt)
            if (p > 0) plan.push_back({fmt::format("pp{}{}", p, at), p, 0, d, {}, {}, {}});
        for (int n : opt.n_gen)
            if (n > 0) plan.push_back({fmt::format("tg{}{}", n, at), 0, n, d, {}, {}, {}});
        for (const auto& [p, n] : opt.prompt_gen)
            plan.push_back({fmt::format("pp{}+tg{}{}", p, n, at), p, n, d, {}, {}, {}});
    }
    if (plan.empty()) throw Error("--bench: every -p and -n is 0 and there is no -pg, so there is nothing to measure");
    int need = 1;
    for (const Test& t : plan) {
        const int64_t positions = int64_t(t.depth) + t.n_prompt + t.n_gen;
        if (positions > kMaxCtx)
            throw Error(fmt::format("{} needs {} positions, more than a context holds ({})", t.name, positions,
                                    kMaxCtx));
        need = std::max(need, int(positions));
    }
    if (opt.model_paths.empty()) throw Error("--bench: no model");
    // Every device is looked for before the model loads (a missing one fails first).
    const std::vector<BenchDevice> asked =
        opt.devices.empty() ? std::vector<BenchDevice>{{opt.run.device, "--device cuda"}} : opt.devices;
    std::vector<std::string> resolved;  // cpu or cuda, where each runs
    for (const BenchDevice& d : asked) resolved.push_back(resolve_device(d.device, d.asked_by));
    // The settings each model is measured with, in turn: every device, batch size, KV types and thread count given
    // (llama-bench's order); `first` marks the first thread count of each of the others.
    const std::vector<int> thread_counts = opt.threads.empty() ? std::vector<int>{opt.run.n_threads} : opt.threads;
    if (thread_counts.size() > 1 && std::find(resolved.begin(), resolved.end(), "cuda") != resolved.end())
        spdlog::warn("-t {}: the CUDA backend does not use CPU threads; measuring it once",
                     fmt::join(thread_counts, ","));
    const std::vector<int> batches = opt.batches.empty() ? std::vector<int>{opt.run.n_batch} : opt.batches;
    const std::vector<std::pair<KvType, KvType>> kv_types =
        opt.kv_types.empty() ? std::vector<std::pair<KvType, KvType>>{{opt.run.kv_type_k, opt.run.kv_type_v}}
                             : opt.kv_types;
    struct Instance {
        Settings run;
        bool first;
    };
    std::vector<Instance> instances;
    for (size_t d = 0; d < asked.size(); ++d)
        for (int batch : batches)
            for (const auto& [k, v] : kv_types)
                for (size_t i = 0; i < thread_counts.size(); ++i) {
                    if (resolved[d] == "cuda" && i > 0) break;  // the GPU backend runs no CPU threads
                    Settings run = opt.run;
                    run.device = asked[d].device;
                    run.n_ctx = need;
                    run.n_batch = batch;
                    run.kv_type_k = k;
                    run.kv_type_v = v;
                    run.n_threads = thread_counts[i];
                    instances.push_back({run, i == 0});
                }
    // Several models, devices, batch sizes or KV types: each is set up once (its backend and KV cache made, then
    // freed) before the first run, so a file or setting that does not suit one of them fails before any row is
    // printed. (Thread counts cannot fail.)
    for (size_t i = 1; i < opt.model_paths.size(); ++i) Model::load(opt.model_paths[i]);
    // with several models, a set-up's error names the model it was for
    auto set_up = [&](const Model& model, const Settings& run, const std::string& path) {
        try {
            return make_backend(model, run);
        } catch (const Error& e) {
            if (opt.model_paths.size() < 2) throw;
            throw Error(fmt::format("{}: {}", path, e.what()));
        }
    };
    for (size_t i = 0; i < opt.model_paths.size(); ++i) {
        std::unique_ptr<Model> model;
        for (size_t j = 0; j < instances.size(); ++j) {
            if ((i == 0 && j == 0) || !instances[j].first) continue;  // the first run's own set-up fails before any row
            if (!model) model = std::make_unique<Model>(Model::load(opt.model_paths[i]));
            set_up(*model, instances[j].run, opt.model_paths[i]);
        }
    }

    // The markdown table shows the batch size when not the default and the KV cache's element types (as llama-bench
    // names them) when one is not f16.
    bool show_kv_types = false, show_batch = false;
    for (const auto& [k, v] : kv_types) show_kv_types = show_kv_types || k != KvType::F16 || v != KvType::F16;
    for (int batch : batches) show_batch = show_batch || batch != Settings{}.n_batch;
    RowPrinter printer(opt.output, show_kv_types, show_batch);
    for (const std::string& path : opt.model_paths) {
        const Model model = Model::load(path);
        int64_t params = 0;
        uint64_t bytes = 0;
        const std::string label = model_label(model, &params, &bytes);
        std::mt19937 rng(1234);
        std::uniform_int_distribution<int32_t> dist(0, model.config.n_vocab - 1);
        std::vector<int32_t> tokens(static_cast<size_t>(need));
        for (int32_t& t : tokens) t = dist(rng);

        for (const Instance& instance : instances) {
            const Settings& run = instance.run;
            const std::string type_k = kv_type_name(run.kv_type_k), type_v = kv_type_name(run.kv_type_v);
            SelectedBackend selected = set_up(model, run, path);
            Backend& backend = *selected.backend;
            const std::string backend_base = selected.device == "cuda" ? "CUDA" : "CPU";
            std::string backend_name = opt.kv_cache ? backend_base : backend_base + " (no KV cache)";
            if (run.math != MathMode::Exact) backend_name += fmt::format(" --math {}", math_mode_name(run.math));
            if (selected.device == "cuda" && !cuda_options_name(run).empty())
                backend_name += " " + cuda_options_name(run);
            std::fprintf(stderr, "kvgen: bench %s on %s\n", path.c_str(), selected.description.c_str());

            for (Test t : plan) {
                if (printer.closed()) return;
                std::fprintf(stderr, "kvgen: bench %s: warm-up + %d runs\n", t.name.c_str(), opt.repetitions);
                t.time = utc_now();
                run_once(backend, tokens, t, opt.kv_cache);
                const int n = t.n_prompt + t.n_gen;
                for (int r = 0; r < opt.repetitions; ++r) {
                    t.seconds.push_back(run_once(backend, tokens, t, opt.kv_cache));
                    t.tok_s.push_back(n / t.seconds.back());
                }

                // csv, json, jsonl and sql print the same fields: llama-bench's names where it has the field, then
                // kvgen's own (the test's name, whether the cache was on, the math mode, the device as the log
                // describes it).
                double avg, sd, avg_ns, sd_ns;
                stats(t.tok_s, &avg, &sd);
                std::vector<double> ns;
                for (double x : t.seconds) ns.push_back(std::round(x * 1e9));
                stats(ns, &avg_ns, &sd_ns);
                nlohmann::ordered_json r;
                r["build_commit"] = build_commit();
                r["build_number"] = build_number();
                r["cpu_info"] = cpu::model_name();
                r["gpu_info"] = selected.gpu_name;
                r["backends"] = backend_base;
                r["model_filename"] = path;
                r["model_type"] = label;
                r["model_size"] = bytes;
                r["model_n_params"] = params;
                r["n_batch"] = run.n_batch;
                r["n_threads"] = selected.n_threads;
                r["type_k"] = type_k;
                r["type_v"] = type_v;
                r["n_gpu_layers"] = selected.device == "cuda" ? model.config.n_layers : 0;
                r["use_mmap"] = true;
                r["n_prompt"] = t.n_prompt;
                r["n_gen"] = t.n_gen;
                r["n_depth"] = t.depth;
                r["test_time"] = t.time;
                r["avg_ns"] = int64_t(std::llround(avg_ns));
                r["stddev_ns"] = int64_t(std::llround(sd_ns));
                r["avg_ts"] = avg;
                r["stddev_ts"] = sd;
                r["samples_ns"] = nlohmann::ordered_json::array();
                for (double x : ns) r["samples_ns"].push_back(int64_t(x));
                r["samples_ts"] = t.tok_s;
                r["test"] = t.name;
                r["kv_cache"] = opt.kv_cache;
                r["math"] = math_mode_name(run.math);
                r["device"] = selected.description;
                const std::string cells = (show_batch ? fmt::format("{} | ", run.n_batch) : "") +
                                          (show_kv_types ? fmt::format("{} | {} | ", type_k, type_v) : "");
                printer.add(r, fmt::format("| {} | {} | {} | {} | {} | {}{} | {:.2f} ± {:.2f} |\n", label,
                                           bench_size(bytes), bench_params(params), backend_name,
                                           selected.n_threads, cells, t.name, avg, sd));
            }
        }
    }
    printer.finish();
}

}  // namespace kvgen
