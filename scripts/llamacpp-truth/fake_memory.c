/* LD_PRELOAD shim: the free/total memory llama.cpp sees per backend device, from RSPLAN_FAKE_MEMORY.
 *
 * RSPLAN_FAKE_MEMORY="NAME=FREE:TOTAL;NAME=FREE:TOTAL;..." with NAME a device name as ggml prints it (CPU,
 * RPC0[127.0.0.1:50052], ...) and sizes in bytes. Devices not named keep what their backend reports. It replaces
 * ggml_backend_dev_memory (ggml-backend.cpp), which llama.cpp's --fit (common/fit.cpp) and the default layer split
 * (src/llama-model.cpp) call through the shared-library boundary, so a machine without GPUs can run llama.cpp's own
 * fitting over devices of any size (rpc-server processes on the CPU stand in for GPUs).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct ggml_backend_device * ggml_backend_dev_t;
const char * ggml_backend_dev_name(ggml_backend_dev_t device);

void ggml_backend_dev_memory(ggml_backend_dev_t device, size_t * free, size_t * total) {
    static void (*real)(ggml_backend_dev_t, size_t *, size_t *) = NULL;
    if (!real) {
        real = (void (*)(ggml_backend_dev_t, size_t *, size_t *)) dlsym(RTLD_NEXT, "ggml_backend_dev_memory");
    }
    real(device, free, total);
    const char * spec = getenv("RSPLAN_FAKE_MEMORY");
    const char * name = ggml_backend_dev_name(device);
    if (!spec || !name) {
        return;
    }
    size_t n = strlen(name);
    for (const char * p = spec; p && *p; ) {
        const char * end = strchr(p, ';');
        if (strncmp(p, name, n) == 0 && p[n] == '=') {
            unsigned long long f = 0, t = 0;
            if (sscanf(p + n + 1, "%llu:%llu", &f, &t) == 2) {
                *free = (size_t) f;
                *total = (size_t) t;
            }
            return;
        }
        p = end ? end + 1 : NULL;
    }
}
