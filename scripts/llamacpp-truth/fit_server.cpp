// llama-server's start-up --fit, alone: the flags llama-fit-params prints, but chosen the way llama-server chooses
// them, with its speculative draft (--spec-type mtp) measured as the extra model.
//
// llama-fit-params (tools/fit-params/fit-params.cpp) calls common_fit_params with no extra model and its own
// n_outputs_max; llama-server (tools/server/server-context.cpp load_model, then common/common.cpp
// common_init_result) sets n_outputs_max / n_outputs_max_per_seq from server_output_limits and passes the draft
// context (common_base_params_to_speculative, ctx_type MTP, n_rs_seq 0, shares_model) as a common_fit_extra_model.
// This driver does those steps with llama.cpp's own functions and prints the result as llama-fit-params does.
// Built by build.sh beside the probe; used by fit_compare.py --server.

#include "arg.h"
#include "common.h"
#include "fit.h"
#include "log.h"
#include "speculative.h"
#include "llama.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>

int main(int argc, char ** argv) {
    common_params params;
    common_init();
    if (!common_params_parse(argc, argv, params, LLAMA_EXAMPLE_SERVER)) {
        return 2;
    }
    llama_backend_init();
    llama_numa_init(params.numa);

    // tools/server/server.cpp main: -np auto is 4 slots with a unified KV cache
    if (params.n_parallel < 0) {
        params.n_parallel = 4;
        params.kv_unified = true;
    }

    // tools/server/server-context.cpp server_output_limits (no embeddings, no pooling)
    auto lim = common_speculative_get_output_limits(params.n_batch, params.n_parallel,
                                                    common_speculative_n_max(&params.speculative));
    params.n_outputs_max         = std::max<int32_t>(1, lim.total);
    params.n_outputs_max_per_seq = std::max<int32_t>(1, lim.per_seq);

    auto mparams = common_model_params_to_llama(params);
    auto cparams = common_context_params_to_llama(params);

    // common/common.cpp common_init_result, the fit_params block
    const bool has_draft = params.speculative.has_dft();
    const bool spec_mtp  = std::find(params.speculative.types.begin(), params.speculative.types.end(),
        COMMON_SPECULATIVE_TYPE_DRAFT_MTP) != params.speculative.types.end();
    common_params params_dft = common_base_params_to_speculative(params);
    auto mparams_dft = common_model_params_to_llama(params_dft);
    auto cparams_dft = common_context_params_to_llama(params_dft);
    if (spec_mtp) {
        cparams_dft.ctx_type = LLAMA_CONTEXT_TYPE_MTP;
    }
    cparams_dft.n_rs_seq = 0;
    const common_fit_extra_model extra = {
        /*.path_model   =*/ params_dft.model.path.c_str(),
        /*.mparams      =*/ &mparams_dft,
        /*.cparams      =*/ &cparams_dft,
        /*.shares_model =*/ !has_draft,
    };
    const common_params_fit_status status = common_fit_params(params.model.path.c_str(), &mparams, &cparams,
        params.tensor_split, params.tensor_buft_overrides.data(), params.fit_params_target.data(),
        params.fit_params_min_ctx, has_draft || spec_mtp ? &extra : nullptr,
        params.verbosity >= LOG_LEVEL_DEBUG ? GGML_LOG_LEVEL_DEBUG : GGML_LOG_LEVEL_ERROR);
    if (status != COMMON_PARAMS_FIT_STATUS_SUCCESS) {
        LOG_ERR("%s: failed to fit CLI arguments to free memory, exiting...\n", __func__);
        return 1;
    }
    common_log_flush(common_log_main());

    // printed as tools/fit-params/fit-params.cpp prints it
    printf("-c %" PRIu32 " -ngl %" PRIi32, cparams.n_ctx, mparams.n_gpu_layers);
    size_t nd = llama_max_devices();
    while (nd > 1 && mparams.tensor_split[nd - 1] == 0.0f) {
        nd--;
    }
    if (nd > 1) {
        for (size_t id = 0; id < nd; id++) {
            printf("%s%" PRIu32, id == 0 ? " -ts " : ",", uint32_t(mparams.tensor_split[id]));
        }
    }
    const size_t ntbo = llama_max_tensor_buft_overrides();
    bool any_tbo = false;
    for (size_t itbo = 0; itbo < ntbo && mparams.tensor_buft_overrides[itbo].pattern != nullptr; itbo++) {
        printf("%s%s=%s", itbo == 0 ? " -ot \"" : ",", mparams.tensor_buft_overrides[itbo].pattern,
               ggml_backend_buft_name(mparams.tensor_buft_overrides[itbo].buft));
        any_tbo = true;
    }
    printf("%s\n", any_tbo ? "\"" : "");
    return 0;
}
