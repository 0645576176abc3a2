// probe: what llama.cpp allocates for one GGUF and one set of context flags, as JSON on stdout.
//
// It loads the model with llama_model_params.no_alloc = true (the dry run that llama-fit-params uses: no tensor
// data is read, weights and KV cache are only sized), creates a llama_context, and prints:
//   - "breakdown": llama_get_memory_breakdown(ctx) per buffer type (ggml_backend_buft_name): model, context and
//     compute bytes, exact integers (compute under no_alloc = the size of the FIRST reserved pp graph);
//   - "allocations": every buffer llama.cpp really allocated (ggml_backend_buft_alloc_buffer and
//     ggml_backend_alloc_ctx_tensors_from_buft are interposed by this executable), with its buffer type, bytes,
//     the phase (load / context) and the log line it preceded: these are the buffers no_alloc does NOT simulate
//     (the output buffer, the recurrent-state cache) plus zero-size dummy buffers;
//   - "output_buffer": the output buffer's type and exact bytes (the real allocation followed by llama.cpp's
//     "output buffer size" log line);
//   - "resolved": what the context resolved (n_ctx, n_batch, n_ubatch, n_seq_max, n_rs_seq, n_vocab, ...);
//   - "log": llama.cpp's log lines about buffers, caches and graphs (all lines with --full-log);
//   - "flags" (as given) and "llama_commit" (llama_commit() of libllama-common).
//
// Flags follow llama.cpp's names: -m FILE, -c N, -np N, -b N, -ub N, -fa on|off|auto, -ctk T, -ctv T, -kvu,
// --n-rs-seq N, -ngl N, --n-outputs-max N, --n-outputs-max-per-seq N, --load-mtp, --ctx-mtp (MTP context type),
// --embeddings, --swa-full, -nkvo, --no-extra-bufts, --decode N (with --alloc: N tokens into sequence 0, then
// "state_seq": llama_state_seq_get_size_ext of sequence 0 with flags 0 and PARTIAL_ONLY), --no-mmap (with --alloc: load_mode NONE, the weights
// read into allocated buffers instead of mapped; the dry run never maps), --rpc HOST:PORT,... (RPC devices, as llama.cpp's --rpc),
// -ts A,B,... (tensor split), --n-cpu-moe N (the experts of the first N layers on the CPU), -ot / --override-tensor
// PATTERN=BUFT,... (common/arg.cpp: BUFT a device's buffer type name, CPU or e.g. RPC0[127.0.0.1:50052]; with
// --n-cpu-moe in command-line order, the first match wins), --full-log (every log line in the JSON), --log-stderr (echo
// the log to stderr as it comes: what llama.cpp said before an abort), --alloc (a real run instead of the dry run:
// no_alloc off and the model memory-mapped, so compute = the largest of the reserved graphs; a skeleton's weights
// read as zeros, but the mapping is touched in full: small models only). Unset flags keep llama_context_default_params()
// / llama_model_default_params() (n_ctx 512, n_batch 2048, n_ubatch 512, n_seq_max 1, f16 K/V, fa auto).
//
// Exit codes: 0 = context created (JSON with "ok": true); 3 = llama.cpp refused the model or the context (JSON
// with "ok": false and "error", plus the log: a refusal is a result too); 2 = bad command line (message on stderr).
//
// Build (see build.sh next to this file, which runs exactly this):
//   LLAMA=build/llama.cpp   # or $LLAMA_CPP_DIR: vendor/llama.cpp of llama-cpp-python 0.3.36, built
//   g++ -O1 -std=c++17 -rdynamic probe.cpp -o probe -I$LLAMA/include -I$LLAMA/src -I$LLAMA/ggml/include \
//       -I$LLAMA/common -L$LLAMA/build/bin -lllama -lllama-common -lggml -lggml-base -ldl \
//       -Wl,-rpath,$LLAMA/build/bin

#include "llama.h"
#include "llama-ext.h"
#include "ggml-backend.h"

#include <dlfcn.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <sstream>
#include <string>
#include <vector>

const char * llama_commit(void);  // common/build-info.h (libllama-common)

namespace {

struct alloc_rec {
    std::string buft;
    size_t      bytes;
    std::string fn;
    std::string phase;
    size_t      log_index;  // number of log lines emitted before this allocation
    int         depth;      // > 0: made inside another recorded allocation (a part of it)
};

std::vector<std::string> g_log;        // complete lines
std::string              g_log_partial;
std::vector<alloc_rec>   g_allocs;
std::string              g_phase = "init";
bool                     g_log_stderr = false;  // --log-stderr: echo llama.cpp's log as it comes (for aborts)
int                      g_depth = 0;

void log_cb(ggml_log_level level, const char * text, void * /*ud*/) {
    (void) level;
    if (g_log_stderr) {
        fputs(text, stderr);
    }
    g_log_partial += text;
    size_t pos;
    while ((pos = g_log_partial.find('\n')) != std::string::npos) {
        g_log.push_back(g_log_partial.substr(0, pos));
        g_log_partial.erase(0, pos + 1);
    }
}

template <typename F> F next_fn(const char * name) {
    void * p = dlsym(RTLD_NEXT, name);
    if (!p) {
        fprintf(stderr, "probe: cannot find %s in the loaded ggml libraries\n", name);
        exit(4);
    }
    return (F) p;
}

std::string json_str(const std::string & s) {
    std::string o = "\"";
    for (unsigned char c : s) {
        switch (c) {
            case '"':  o += "\\\""; break;
            case '\\': o += "\\\\"; break;
            case '\n': o += "\\n";  break;
            case '\t': o += "\\t";  break;
            case '\r': o += "\\r";  break;
            default:
                if (c < 0x20) {
                    char b[8];
                    snprintf(b, sizeof(b), "\\u%04x", c);
                    o += b;
                } else {
                    o += (char) c;
                }
        }
    }
    return o + "\"";
}

}  // namespace

// -- interposed ggml allocation entry points (this executable is linked with -rdynamic, so libllama's calls
//    resolve here first); each forwards to the real function and records what was allocated.
extern "C" ggml_backend_buffer_t ggml_backend_buft_alloc_buffer(ggml_backend_buffer_type_t buft, size_t size) {
    using fn_t = ggml_backend_buffer_t (*)(ggml_backend_buffer_type_t, size_t);
    static fn_t real = next_fn<fn_t>("ggml_backend_buft_alloc_buffer");
    g_depth++;
    ggml_backend_buffer_t buf = real(buft, size);
    g_depth--;
    g_allocs.push_back({ggml_backend_buft_name(buft), buf ? ggml_backend_buffer_get_size(buf) : 0,
                        "ggml_backend_buft_alloc_buffer", g_phase, g_log.size(), g_depth});
    return buf;
}

extern "C" ggml_backend_buffer_t ggml_backend_alloc_ctx_tensors_from_buft(struct ggml_context * ctx,
                                                                          ggml_backend_buffer_type_t buft) {
    using fn_t = ggml_backend_buffer_t (*)(struct ggml_context *, ggml_backend_buffer_type_t);
    static fn_t real = next_fn<fn_t>("ggml_backend_alloc_ctx_tensors_from_buft");
    g_depth++;
    ggml_backend_buffer_t buf = real(ctx, buft);
    g_depth--;
    g_allocs.push_back({ggml_backend_buft_name(buft), buf ? ggml_backend_buffer_get_size(buf) : 0,
                        "ggml_backend_alloc_ctx_tensors_from_buft", g_phase, g_log.size(), g_depth});
    return buf;
}

namespace {

[[noreturn]] void usage(const std::string & msg) {
    fprintf(stderr, "probe: %s\n", msg.c_str());
    fprintf(stderr,
            "usage: probe -m FILE [-c N] [-np N] [-b N] [-ub N] [-fa on|off|auto] [-ctk T] [-ctv T] [-kvu]\n"
            "             [--n-rs-seq N] [-ngl N] [--n-outputs-max N] [--n-outputs-max-per-seq N] [--load-mtp]\n"
            "             [--ctx-mtp] [--embeddings] [--swa-full] [-nkvo] [--no-extra-bufts] [--no-mmap] [--rpc HOST:PORT,...]\n"
            "             [-ts A,B,...] [--n-cpu-moe N] [-ot PATTERN=BUFT,...] [--alloc [--decode N]] [--full-log]\n"
            "             [--log-stderr]\n");
    exit(2);
}

uint32_t parse_u32(const std::string & flag, const char * v) {
    errno = 0;
    char * end = nullptr;
    const unsigned long long x = strtoull(v, &end, 10);
    if (errno || end == v || *end || v[0] == '-' || x > 0xffffffffULL) {
        usage("bad value for " + flag + ": '" + v + "' (want an unsigned 32-bit integer)");
    }
    return (uint32_t) x;
}

ggml_type parse_type(const std::string & flag, const char * v) {
    for (int t = 0; t < GGML_TYPE_COUNT; t++) {
        const char * name = ggml_type_name((ggml_type) t);
        if (name && strcmp(name, v) == 0) {
            return (ggml_type) t;
        }
    }
    usage("bad value for " + flag + ": unknown ggml type '" + v + "'");
}

std::vector<std::string> split_list(const std::string & v) {
    std::vector<std::string> out;
    std::stringstream ss(v);
    std::string item;
    while (std::getline(ss, item, ',')) {
        out.push_back(item);
    }
    return out;
}

// common/arg.cpp add_rpc_devices: one RPC backend registry per server, its devices become GPUs
void add_rpc_devices(const std::string & servers) {
    ggml_backend_load_all();
    ggml_backend_reg_t rpc_reg = ggml_backend_reg_by_name("RPC");
    if (!rpc_reg) {
        usage("--rpc: this llama.cpp build has no RPC backend");
    }
    typedef ggml_backend_reg_t (*add_server_t)(const char * endpoint);
    auto add = (add_server_t) ggml_backend_reg_get_proc_address(rpc_reg, "ggml_backend_rpc_add_server");
    if (!add) {
        usage("--rpc: ggml_backend_rpc_add_server not found");
    }
    for (const auto & server : split_list(servers)) {
        ggml_backend_register(add(server.c_str()));
    }
}

// common/common.h string_split: every part, empty ones too
std::vector<std::string> split_keep_empty(const std::string & v) {
    std::vector<std::string> out;
    size_t start = 0;
    for (size_t pos; (pos = v.find(',', start)) != std::string::npos; start = pos + 1) {
        out.push_back(v.substr(start, pos - start));
    }
    out.push_back(v.substr(start));
    return out;
}

bool keep_line(const std::string & l) {
    if (l.find("llama_graph_n_input_tensors") != std::string::npos) {
        return false;  // one line per graph input use: noise at real size
    }
    static const char * keys[] = {"buffer size", "graph", "size =", "n_ctx", "n_batch", "n_ubatch", "n_seq_max",
                                  "n_rs_seq", "flash_attn", "kv_unified", "causal_attn", "error", "failed",
                                  "offload", "cannot be used", "CPU_REPACK", "does not match", "n_outputs",
                                  "too large", "exceeds", "refus", "warning", "not supported"};
    for (const char * k : keys) {
        if (l.find(k) != std::string::npos) {
            return true;
        }
    }
    return false;
}

}  // namespace

int main(int argc, char ** argv) {
    llama_model_params   mp = llama_model_default_params();
    llama_context_params cp = llama_context_default_params();
    mp.no_alloc  = true;
    mp.load_mode = LLAMA_LOAD_MODE_NONE;  // as llama-fit-params: the dry run maps nothing
    mp.n_gpu_layers = 0;
    std::string model;
    bool full_log = false;
    bool no_mmap  = false;  // --no-mmap: load_mode NONE under --alloc too (llama.cpp's --load-mode none)
    uint32_t n_decode = 0;  // --decode N: with --alloc, decode N tokens into sequence 0 and report its state sizes
    size_t state_full = 0, state_partial = 0;
    std::vector<std::pair<std::string, std::string>> flags;  // as given, for the record
    std::vector<float> tensor_split(128, 0.0f);
    // -ot / --override-tensor and --n-cpu-moe entries in command-line order: (pattern, buffer type name), resolved
    // once every device is registered (an -ot may name an RPC device given later on the command line)
    std::vector<std::pair<std::string, std::string>> ot_entries;
    std::vector<llama_model_tensor_buft_override> overrides;

    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        auto val = [&]() -> const char * {
            if (i + 1 >= argc) {
                usage("missing value after " + a);
            }
            flags.emplace_back(a, argv[i + 1]);
            return argv[++i];
        };
        auto flag = [&]() { flags.emplace_back(a, "true"); };
        if (a == "-m") {
            model = val();
        } else if (a == "-c") {
            cp.n_ctx = parse_u32(a, val());
        } else if (a == "-np") {
            cp.n_seq_max = parse_u32(a, val());
        } else if (a == "-b") {
            cp.n_batch = parse_u32(a, val());
        } else if (a == "-ub") {
            cp.n_ubatch = parse_u32(a, val());
        } else if (a == "-fa") {
            const std::string v = val();
            if (v == "on") {
                cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
            } else if (v == "off") {
                cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
            } else if (v == "auto") {
                cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_AUTO;
            } else {
                usage("bad value for -fa: '" + v + "' (want on, off or auto)");
            }
        } else if (a == "-ctk") {
            cp.type_k = parse_type(a, val());
        } else if (a == "-ctv") {
            cp.type_v = parse_type(a, val());
        } else if (a == "-kvu") {
            flag();
            cp.kv_unified = true;
        } else if (a == "--n-rs-seq") {
            cp.n_rs_seq = parse_u32(a, val());
        } else if (a == "-ngl") {
            mp.n_gpu_layers = (int32_t) parse_u32(a, val());
        } else if (a == "--n-outputs-max") {
            cp.n_outputs_max = parse_u32(a, val());
        } else if (a == "--n-outputs-max-per-seq") {
            cp.n_outputs_max_per_seq = parse_u32(a, val());
        } else if (a == "--load-mtp") {
            flag();
            mp.load_mtp = true;
        } else if (a == "--ctx-mtp") {
            flag();
            cp.ctx_type = LLAMA_CONTEXT_TYPE_MTP;
        } else if (a == "--embeddings") {
            flag();
            cp.embeddings = true;
        } else if (a == "--swa-full") {
            flag();
            cp.swa_full = true;
        } else if (a == "-nkvo") {
            flag();
            cp.offload_kqv = false;
        } else if (a == "--alloc") {
            flag();
            mp.no_alloc  = false;
            mp.load_mode = llama_model_default_params().load_mode;
        } else if (a == "--decode") {
            n_decode = parse_u32(a, val());
        } else if (a == "--no-mmap") {
            flag();
            no_mmap = true;
        } else if (a == "--no-extra-bufts") {
            flag();
            mp.use_extra_bufts = false;
        } else if (a == "--rpc") {
            add_rpc_devices(val());
        } else if (a == "-ts") {
            const auto parts = split_list(val());
            for (size_t k = 0; k < parts.size() && k < tensor_split.size(); k++) {
                tensor_split[k] = strtof(parts[k].c_str(), nullptr);
            }
            mp.tensor_split = tensor_split.data();
        } else if (a == "--n-cpu-moe") {
            const uint32_t n = parse_u32(a, val());
            for (uint32_t k = 0; k < n; k++) {
                ot_entries.emplace_back("blk\\." + std::to_string(k) + "\\.ffn_(up|down|gate|gate_up)_(ch|)exps", "CPU");
            }
        } else if (a == "-ot" || a == "--override-tensor") {
            // common/arg.cpp parse_tensor_buffer_overrides: PATTERN=BUFT,... split at every ',' (empty parts
            // kept), each at its first '='
            const std::string v = val();
            for (const auto & item : split_keep_empty(v)) {
                const auto pos = item.find('=');
                if (pos == std::string::npos) {
                    usage("bad value for " + a + ": '" + item + "' (want PATTERN=BUFFER_TYPE)");
                }
                ot_entries.emplace_back(item.substr(0, pos), item.substr(pos + 1));
            }
        } else if (a == "--full-log") {
            full_log = true;
        } else if (a == "--log-stderr") {
            g_log_stderr = true;
        } else {
            usage("unknown argument '" + a + "'");
        }
    }
    if (model.empty()) {
        usage("-m FILE is required");
    }
    if (n_decode > 0 && mp.no_alloc) {
        usage("--decode N needs --alloc (a dry run computes nothing)");
    }
    if (FILE * f = fopen(model.c_str(), "rb")) {
        fclose(f);
    } else {
        usage("cannot open model file '" + model + "': " + strerror(errno));
    }

    if (no_mmap) {
        mp.load_mode = LLAMA_LOAD_MODE_NONE;
    }
    llama_log_set(log_cb, nullptr);
    llama_backend_init();
    if (!ot_entries.empty()) {
        // common/arg.cpp parse_tensor_buffer_overrides: the buffer types of every device, by name
        ggml_backend_load_all();
        std::map<std::string, ggml_backend_buffer_type_t> buft_list;
        for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
            if (auto * buft = ggml_backend_dev_buffer_type(ggml_backend_dev_get(i))) {
                buft_list[ggml_backend_buft_name(buft)] = buft;
            }
        }
        for (const auto & [pattern, buft] : ot_entries) {
            const auto it = buft_list.find(buft);
            if (it == buft_list.end()) {
                std::string have;
                for (const auto & kv : buft_list) {
                    have += (have.empty() ? "" : ", ") + kv.first;
                }
                usage("unknown buffer type '" + buft + "' in -ot (have: " + have + ")");
            }
            overrides.push_back({pattern.c_str(), it->second});
        }
        overrides.push_back({nullptr, nullptr});
        mp.tensor_buft_overrides = overrides.data();
    }

    std::string error;
    llama_model *   mdl = nullptr;
    llama_context * ctx = nullptr;
    g_phase = "load";
    mdl = llama_model_load_from_file(model.c_str(), mp);
    if (!mdl) {
        error = "llama_model_load_from_file failed";
    } else {
        g_phase = "context";
        ctx = llama_init_from_model(mdl, cp);
        if (!ctx) {
            error = "llama_init_from_model failed";
        } else if (n_decode > 0) {
            // --decode N (a real run): N tokens into sequence 0, one batch, then the sequence's state sizes as
            // llama-server's checkpoints take them (common_prompt_checkpoint::update_tgt / update_dft)
            llama_batch batch = llama_batch_init((int32_t) n_decode, 0, 1);
            for (uint32_t t = 0; t < n_decode; t++) {
                batch.token[t]     = (llama_token) (1 + t % 64);
                batch.pos[t]       = (llama_pos) t;
                batch.n_seq_id[t]  = 1;
                batch.seq_id[t][0] = 0;
                batch.logits[t]    = t + 1 == n_decode;
            }
            batch.n_tokens = (int32_t) n_decode;
            if (llama_decode(ctx, batch) != 0) {
                error = "llama_decode failed";
            } else {
                state_full    = llama_state_seq_get_size_ext(ctx, 0, 0);
                state_partial = llama_state_seq_get_size_ext(ctx, 0, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
            }
            llama_batch_free(batch);
        }
    }
    g_phase = "done";
    if (!g_log_partial.empty()) {
        g_log.push_back(g_log_partial);
        g_log_partial.clear();
    }

    std::string o = "{\n";
    o += "  \"probe\": \"scripts/llamacpp-truth/probe.cpp\",\n";
    o += "  \"llama_commit\": " + json_str(llama_commit()) + ",\n";
    o += "  \"model_file\": " + json_str(model) + ",\n";
    o += "  \"flags\": {";
    for (size_t i = 0; i < flags.size(); i++) {
        o += (i ? ", " : "") + json_str(flags[i].first) + ": " + json_str(flags[i].second);
    }
    o += "},\n";
    o += "  \"ok\": " + std::string(ctx ? "true" : "false") + ",\n";
    o += "  \"error\": " + (error.empty() ? std::string("null") : json_str(error)) + ",\n";
    if (n_decode > 0 && error.empty()) {
        o += "  \"state_seq\": {\"decoded\": " + std::to_string(n_decode) + ", \"full\": " + std::to_string(state_full) +
             ", \"partial_only\": " + std::to_string(state_partial) + "},\n";
    }

    if (ctx) {
        const llama_vocab * vocab = llama_model_get_vocab(mdl);
        char buf[512];
        snprintf(buf, sizeof(buf),
                 "  \"resolved\": {\"n_ctx\": %u, \"n_ctx_seq\": %u, \"n_batch\": %u, \"n_ubatch\": %u, "
                 "\"n_seq_max\": %u, \"n_rs_seq\": %u, \"n_vocab\": %d, \"n_embd\": %d, \"n_layer\": %d, "
                 "\"model_size\": %" PRIu64 ", \"n_params\": %" PRIu64 "},\n",
                 llama_n_ctx(ctx), llama_n_ctx_seq(ctx), llama_n_batch(ctx), llama_n_ubatch(ctx),
                 llama_n_seq_max(ctx), llama_n_rs_seq(ctx), llama_vocab_n_tokens(vocab), llama_model_n_embd(mdl),
                 llama_model_n_layer(mdl), llama_model_size(mdl), llama_model_n_params(mdl));
        o += buf;

        // the breakdown, by buffer type name (two buffer types never share a name in one process)
        std::map<std::string, llama_memory_breakdown_data> by_name;
        for (const auto & [buft, mb] : llama_get_memory_breakdown(ctx)) {
            auto & d = by_name[ggml_backend_buft_name(buft)];
            d.model   += mb.model;
            d.context += mb.context;
            d.compute += mb.compute;
        }
        o += "  \"breakdown\": {";
        size_t k = 0;
        for (const auto & [name, mb] : by_name) {
            snprintf(buf, sizeof(buf), "%s\n    %s: {\"model\": %zu, \"context\": %zu, \"compute\": %zu}",
                     k++ ? "," : "", json_str(name).c_str(), mb.model, mb.context, mb.compute);
            o += buf;
        }
        o += "\n  },\n";
    } else {
        o += "  \"resolved\": null,\n  \"breakdown\": null,\n";
    }

    // the output buffer: the last top-level real allocation before its log line
    std::string out_buft;
    long long   out_bytes = -1;
    for (size_t li = 0; li < g_log.size() && out_bytes < 0; li++) {
        if (g_log[li].find("output buffer size") == std::string::npos) {
            continue;
        }
        for (size_t ai = g_allocs.size(); ai-- > 0;) {
            if (g_allocs[ai].log_index <= li && g_allocs[ai].depth == 0 && g_allocs[ai].phase == "context") {
                out_buft  = g_allocs[ai].buft;
                out_bytes = (long long) g_allocs[ai].bytes;
                break;
            }
        }
    }
    if (out_bytes >= 0) {
        o += "  \"output_buffer\": {\"buft\": " + json_str(out_buft) + ", \"bytes\": " + std::to_string(out_bytes) +
             "},\n";
    } else {
        o += "  \"output_buffer\": null,\n";
    }

    // real allocations one by one; the zero-size dummy buffers no_alloc gives weights and KV caches, counted
    std::map<std::string, size_t> dummies;
    o += "  \"allocations\": [";
    size_t n_real = 0;
    for (size_t i = 0; i < g_allocs.size(); i++) {
        const auto & r = g_allocs[i];
        if (r.bytes == 0) {
            dummies[r.phase + " " + r.buft]++;
            continue;
        }
        o += std::string(n_real++ ? "," : "") + "\n    {\"buft\": " + json_str(r.buft) + ", \"bytes\": " +
             std::to_string(r.bytes) + ", \"fn\": " + json_str(r.fn) + ", \"phase\": " + json_str(r.phase) +
             ", \"log_index\": " + std::to_string(r.log_index) + ", \"depth\": " + std::to_string(r.depth) + "}";
    }
    o += "\n  ],\n";
    o += "  \"dummy_allocations\": {";
    size_t kd = 0;
    for (const auto & [key, count] : dummies) {
        o += std::string(kd++ ? ", " : "") + json_str(key) + ": " + std::to_string(count);
    }
    o += "},\n";

    o += "  \"log\": [";
    size_t n = 0;
    for (size_t i = 0; i < g_log.size(); i++) {
        if (full_log || keep_line(g_log[i])) {
            o += std::string(n++ ? "," : "") + "\n    " + json_str(g_log[i]);
        }
    }
    o += "\n  ]\n}\n";
    fputs(o.c_str(), stdout);
    fflush(stdout);

    if (ctx) {
        llama_free(ctx);
    }
    if (mdl) {
        llama_model_free(mdl);
    }
    llama_backend_free();
    return ctx ? 0 : 3;
}
